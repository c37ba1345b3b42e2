"""``python -m bench.peers_pendulum`` (part of ``make bench-peers``): Box actions against PPO.

The peer is Stable-Baselines3's PPO with RL Zoo's tuned Pendulum-v1 settings (4 envs, n_steps
1024, batch 64, 10 epochs, gae_lambda 0.95, gamma 0.9, ent_coef 0, learning rate 1e-3, clip
range 0.2, gSDE exploration resampled every 4 steps, MlpPolicy defaults), run as RL Zoo runs
it: the envs in a ``DummyVecEnv`` and one torch thread. impala_lab runs ``impala-lab train
--env Pendulum-v1 --stop-return -250`` (the tuned preset). Each seed, drawn at random per run
and printed, gets one run of each, alternating which goes first, each in a fresh process; both
report the seconds from their process's start and the env steps until the mean return of the
last 100 episodes reaches -250. RL Zoo trains 1e5 steps; nothing in these settings decays, so
PPO here runs on until the target or ``--max-seconds``, like impala_lab.

The summary gives, per system, n, the solve rate, the median and worst seconds with a
bootstrap 95% interval of the median (a seed that did not reach the target counts as
infinitely slow), the median env steps, and the per-seed ratio of seconds and env steps.

    python -m bench.peers_pendulum --seeds 10

PPO runs in ``bench/.peers-venv`` (see `bench.peers`). Writes
``docs/results/peers_pendulum.json`` and ``.md``.
"""

from __future__ import annotations

import time

_PROCESS_START = time.monotonic()  # the PPO worker's clock starts before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench import peers  # noqa: E402  (standard library only at its top)

ENV = "Pendulum-v1"
STOP_RETURN = -250.0
# RL Zoo's hyperparams/ppo.yml, Pendulum-v1 (batch_size is SB3's default, 64).
PPO_SETTINGS = {"n_envs": 4, "n_timesteps": 100_000, "policy": "MlpPolicy", "n_steps": 1024,
                "batch_size": 64, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10,
                "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True,
                "sde_sample_freq": 4}
SYSTEMS = ("ppo_zoo", "impala_lab")


def ppo_worker(seed: int, max_seconds: float) -> dict[str, Any]:
    """RL Zoo's PPO on Pendulum-v1 until the trailing-100 mean reaches -250 or
    ``max_seconds`` pass (in the peers venv; one torch thread, a DummyVecEnv)."""
    from collections import deque

    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    s = PPO_SETTINGS
    returns: deque[float] = deque(maxlen=100)
    out: dict[str, Any] = {"seed": seed, "solved": False, "seconds_to_target": None,
                           "env_steps_to_target": None, "stop_reason": "max_seconds"}

    env = make_vec_env(ENV, n_envs=s["n_envs"], seed=seed)
    model = PPO(s["policy"], env, n_steps=s["n_steps"], batch_size=s["batch_size"],
                n_epochs=s["n_epochs"], gae_lambda=s["gae_lambda"], gamma=s["gamma"],
                ent_coef=s["ent_coef"], learning_rate=s["learning_rate"],
                clip_range=s["clip_range"], use_sde=s["use_sde"],
                sde_sample_freq=s["sde_sample_freq"], seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=10**9, callback=peers.stop_at_target(
        BaseCallback, returns, out, STOP_RETURN, max_seconds, _PROCESS_START))
    env.close()
    out.update(final_env_steps=int(model.num_timesteps),
               final_return_mean=(round(sum(returns) / len(returns), 2) if returns else None))
    return out


def run_ppo(seed: int, max_seconds: float, venv: Path = peers.VENV) -> dict[str, Any]:
    """`ppo_worker` in a fresh process of the peers venv; ``wall_s`` around it."""
    cmd = [str(peers.venv_python(venv)), "-m", "bench.peers_pendulum", "--ppo-worker",
           str(seed), "--max-seconds", str(max_seconds)]
    return peers.run_worker(cmd, max_seconds + 180, f"seed {seed}")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system: n, solved, median/worst seconds, the median's 95% interval, median env
    steps; and per seed (both solved) PPO over impala_lab in seconds and in env steps."""
    out: dict[str, Any] = peers.summarize(runs, SYSTEMS)
    pairs = [(r["ppo_zoo"], r["impala_lab"]) for r in runs
             if (r.get("ppo_zoo") or {}).get("solved") and (r.get("impala_lab") or {}).get(
                 "solved")]
    for key, field in (("seconds_ratio", "seconds_to_target"),
                       ("env_steps_ratio", "env_steps_to_target")):
        ratios = [p[field] / i[field] for p, i in pairs]
        out[key] = {"n": len(ratios), "median": statistics.median(ratios) if ratios else None,
                    "ci95": list(peers.median_interval(ratios)) if ratios else None}
    return out


def markdown(results: dict[str, Any]) -> str:
    """The README's table."""
    s = results["summary"]
    rows = ["| system | solved | median s to -250 [95%] | worst s | median env steps |",
            "| --- | --- | --- | --- | --- |"]
    for system, label in (("ppo_zoo", "SB3 PPO, RL Zoo's Pendulum-v1 settings"),
                          ("impala_lab", "impala_lab, tuned preset")):
        m = s[system]
        lo, hi = m["median_s_ci95"]
        interval = f"[{lo:.1f}, {hi:.1f}]" if math.isfinite(hi) else f"[{lo:.1f}, never]"
        med = "never" if m["median_s"] is None else f"{m['median_s']:.1f}"
        worst = "never" if m["worst_s"] is None else f"{m['worst_s']:.1f}"
        steps = "never" if m["median_env_steps"] is None else f"{m['median_env_steps']:,.0f}"
        rows.append(f"| {label} | {m['num_solved']}/{m['n']} | {med} {interval} | {worst} | "
                    f"{steps} |")
    verdict = peers.comparisons({k: s[k] for k in SYSTEMS})[0]["verdict"]
    rows.append(f"\nMedian seconds, by their 95% intervals: {verdict} (n = "
                f"{s['ppo_zoo']['n']} and {s['impala_lab']['n']}).")
    for key, what in (("seconds_ratio", "seconds"), ("env_steps_ratio", "env steps")):
        r = s[key]
        if r["median"] is not None:
            rows.append(f"\nPer seed, PPO / impala_lab in {what}: median {r['median']:.2f}x "
                        f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] over {r['n']} seeds.")
    rows.append(f"\nSeeds (drawn at random): {', '.join(map(str, results['seeds']))}; cap "
                f"{results['max_seconds']:g} s per run.")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers_pendulum",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds drawn at random")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="cap per run")
    parser.add_argument("--out", type=Path, default=peers.RESULTS, help="results directory")
    parser.add_argument("--ppo-worker", type=int, metavar="SEED", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ppo_worker is not None:  # in the peers venv: one PPO run, one JSON line
        print(json.dumps(ppo_worker(args.ppo_worker, args.max_seconds)), flush=True)
        return 0
    sys.path.insert(0, str(peers.REPO))
    from bench import solves
    from impala_lab.stats import jsonable

    venv = peers.ensure_venv()
    seeds = solves.draw_seeds(args.seeds)
    print(f"bench.peers_pendulum: seeds drawn at random for this run: "
          f"{', '.join(map(str, seeds))}", flush=True)
    results: dict[str, Any] = {"seeds": seeds, "max_seconds": args.max_seconds,
                               "stop_return": STOP_RETURN, "ppo_settings": PPO_SETTINGS,
                               "venv": venv, "runs": [], "errors": {}}
    runners = {"ppo_zoo": lambda s: run_ppo(s, args.max_seconds),
               "impala_lab": lambda s: solves.time_to_solve(
                   s, args.max_seconds, STOP_RETURN, ("--env", ENV))}
    args.out.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        results["runs"].append(peers._run_seed(seed, peers.run_order(SYSTEMS, i), runners,
                                               results, print))
        # Written after every seed: a bench cut off midway keeps the pairs it finished.
        results["summary"] = summarize(results["runs"])
        results["loadavg_at_end"] = list(os.getloadavg())
        (args.out / "peers_pendulum.json").write_text(json.dumps(jsonable(results), indent=2))
        table = markdown(results)
        (args.out / "peers_pendulum.md").write_text(table + "\n")
    print("\n" + table)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
