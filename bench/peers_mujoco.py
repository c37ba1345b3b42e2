"""``python -m bench.peers_mujoco`` (part of ``make bench-peers``): MuJoCo against PPO.

Each system gets the same wall-clock budget per run (``--budget``, 20 minutes by default),
counted from its process's start, and the bench asks what return it reaches within it.

The peer is Stable-Baselines3's PPO with RL Zoo's tuned settings for the env (RL Zoo's
``hyperparams/ppo.yml``, its ``HalfCheetah-v4`` and ``Hopper-v4`` entries, run here on the v5
envs: one env, ``VecNormalize`` of observations and rewards with the algorithm's gamma, 256x256
ReLU networks for the policy and the value, log-std starting at -2), run as RL Zoo runs it:
the env in a ``DummyVecEnv`` and one torch thread. impala_lab runs ``impala-lab train --env
ENV`` (the env's tuned preset, as a newcomer runs it) on the machine's cores.

Per env, seeds are drawn at random for the run and printed; each seed gets one run of each
system, each in a fresh process, alternating which goes first. Each run reports the trailing
mean return (the last 100 episodes) and the env steps at a quarter, half, three quarters and
all of the budget, the seconds and env steps at which it first reached the env's target
(`bench.continuous.ENVS`: HalfCheetah-v5 1500, Hopper-v5 1000), if it did, and its best
trailing mean (over full windows of 100 episodes) with its fall from that best at the end.

The summary gives, per env and system, n, the median return at the budget with a bootstrap
95% interval, the worst, the median env steps, how many runs reached the target and each
seed's fall from its own best; the two systems' medians are called "higher" only when the
intervals do not overlap, else "inconclusive".

    python -m bench.peers_mujoco                          # both envs, 3 seeds, 20 minutes
    python -m bench.peers_mujoco --envs Hopper-v5 --budget 300
    python -m bench.peers_mujoco --envs HalfCheetah-v5 --seeds 5 --max-pairs 2   # a piece
    python -m bench.peers_mujoco --envs HalfCheetah-v5 --resume --max-pairs 2    # the next

The results files are rewritten after every run, so a bench cut off midway leaves the pairs it
finished; ``--resume`` reads them back and runs the seeds still missing (the seeds were drawn
once, by the first piece), ``--max-pairs`` stops after that many seeds, so a bench of hours
runs in pieces that each hold the machine's bench lock for a bounded time.

PPO runs in ``bench/.peers-venv`` (`bench.peers`), with the mujoco extra installed into it
(`bench.peers_venv.EXTRAS`). Writes ``docs/results/peers_mujoco_<envs>_<budget>s.json`` and
``.md`` (`results_name`): each env may run alone, in a session of its own.
Standard library only at the top: the PPO worker runs in the peers venv.
"""

from __future__ import annotations

import time

_PROCESS_START = time.monotonic()  # the PPO worker's clock starts before torch is imported

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench import peers  # noqa: E402  (standard library only at its top)

TARGETS = {"HalfCheetah-v5": 1500.0, "Hopper-v5": 1000.0}  # as bench.continuous.ENVS
_ZOO_NETS = {"log_std_init": -2, "ortho_init": False, "activation_fn": "relu",
             "net_arch": {"pi": [256, 256], "vf": [256, 256]}}
# RL Zoo's hyperparams/ppo.yml; "normalize: true" is VecNormalize with the algorithm's gamma.
PPO_SETTINGS: dict[str, dict[str, Any]] = {
    "HalfCheetah-v5": {"n_envs": 1, "n_timesteps": 1_000_000, "policy": "MlpPolicy",
                       "batch_size": 64, "n_steps": 512, "gamma": 0.98,
                       "learning_rate": 2.0633e-05, "ent_coef": 0.000401762, "clip_range": 0.1,
                       "n_epochs": 20, "gae_lambda": 0.92, "max_grad_norm": 0.8,
                       "vf_coef": 0.58096, "normalize": True, "policy_kwargs": _ZOO_NETS},
    "Hopper-v5": {"n_envs": 1, "n_timesteps": 1_000_000, "policy": "MlpPolicy",
                  "batch_size": 32, "n_steps": 512, "gamma": 0.999,
                  "learning_rate": 9.80828e-05, "ent_coef": 0.00229519, "clip_range": 0.2,
                  "n_epochs": 5, "gae_lambda": 0.99, "max_grad_norm": 0.7,
                  "vf_coef": 0.835671, "normalize": True, "policy_kwargs": _ZOO_NETS},
}
SYSTEMS = ("ppo_zoo", "impala_lab")
LABELS = {"ppo_zoo": "SB3 PPO, RL Zoo's settings", "impala_lab": "impala_lab, tuned preset"}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # of the budget, where each run's return is read
MIN_SEEDS_TO_COMPARE = 3  # a bootstrap interval of one or two values says nothing


def checkpoint_times(budget: float) -> list[float]:
    """The seconds from process start at which a run's trailing return is read."""
    return [round(f * budget, 3) for f in FRACTIONS]


def ppo_worker(env_id: str, seed: int, budget: float) -> dict[str, Any]:
    """RL Zoo's PPO on ``env_id`` for ``budget`` seconds from this process's start (in the
    peers venv; one torch thread, a DummyVecEnv under VecNormalize)."""
    from collections import deque

    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    s = PPO_SETTINGS[env_id]
    target = TARGETS[env_id]
    returns: deque[float] = deque(maxlen=100)
    marks = checkpoint_times(budget)
    out: dict[str, Any] = {"env": env_id, "seed": seed, "checkpoints": [], "reached": False,
                           "seconds_to_target": None, "env_steps_to_target": None}

    def trailing() -> float | None:
        return round(sum(returns) / len(returns), 2) if returns else None

    class Budget(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's, under VecNormalize: the raw return
                    returns.append(float(info["episode"]["r"]))
                    if len(returns) == returns.maxlen:
                        out["best_return_mean"] = max(out.get("best_return_mean", -math.inf),
                                                      trailing())
            now = time.monotonic() - _PROCESS_START
            if (not out["reached"] and len(returns) == returns.maxlen
                    and sum(returns) / len(returns) >= target):
                out.update(reached=True, seconds_to_target=round(now, 2),
                           env_steps_to_target=int(self.num_timesteps))
            while len(out["checkpoints"]) < len(marks) and now >= marks[len(out["checkpoints"])]:
                out["checkpoints"].append({"s": marks[len(out["checkpoints"])],
                                           "return_mean": trailing(),
                                           "episodes": len(returns),
                                           "env_steps": int(self.num_timesteps)})
            return len(out["checkpoints"]) < len(marks)

    kwargs = dict(s["policy_kwargs"], activation_fn=torch.nn.ReLU)
    venv = VecNormalize(make_vec_env(env_id, n_envs=s["n_envs"], seed=seed), gamma=s["gamma"])
    model = PPO(s["policy"], venv, n_steps=s["n_steps"], batch_size=s["batch_size"],
                n_epochs=s["n_epochs"], gae_lambda=s["gae_lambda"], gamma=s["gamma"],
                ent_coef=s["ent_coef"], learning_rate=s["learning_rate"],
                clip_range=s["clip_range"], max_grad_norm=s["max_grad_norm"],
                vf_coef=s["vf_coef"], policy_kwargs=kwargs, seed=seed, device="cpu",
                verbose=0)
    model.learn(total_timesteps=10**9, callback=Budget())
    venv.close()
    return out


def run_ppo(env_id: str, seed: int, budget: float) -> dict[str, Any]:
    """`ppo_worker` in a fresh process of the peers venv."""
    cmd = [str(peers.venv_python(peers.VENV)), "-m", "bench.peers_mujoco", "--ppo-worker",
           str(seed), "--envs", env_id, "--budget", str(budget)]
    return peers.run_worker(cmd, budget + 300, f"{env_id}, seed {seed}")


def _last_row(path: Path) -> dict[str, str] | None:
    """metrics.csv's last complete row (the CLI appends and flushes one per report)."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return None
    return rows[-1] if rows else None


def _number(row: dict[str, str] | None, key: str) -> float | None:
    try:
        x = float((row or {}).get(key) or "nan")
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def run_impala(env_id: str, seed: int, budget: float, poll_s: float = 0.25) -> dict[str, Any]:
    """``impala-lab train --env ENV --seed SEED`` in a fresh process, read from its
    metrics.csv at each checkpoint and ended (SIGTERM) at ``budget`` seconds from its start.
    ``--stop-return`` with a long ``--train-after-target`` only records when the target was
    first reached (result.json's seconds from process start); the run goes on to the budget."""
    target = TARGETS[env_id]
    marks = checkpoint_times(budget)
    out: dict[str, Any] = {"env": env_id, "seed": seed, "checkpoints": []}
    with tempfile.TemporaryDirectory(prefix="bench-mujoco-") as tmp:
        cmd = [sys.executable, "-m", "impala_lab.cli.main", "train", "--env", env_id,
               "--seed", str(seed), "--stop-return", str(target), "--train-after-target",
               str(budget), "--max-seconds", str(budget), "--quiet", "--out", tmp]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=peers.REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            while len(out["checkpoints"]) < len(marks) and proc.poll() is None:
                mark = marks[len(out["checkpoints"])]
                time.sleep(max(0.0, min(poll_s, mark - (time.monotonic() - t0))))
                if time.monotonic() - t0 >= mark:
                    row = _last_row(Path(tmp) / "metrics.csv")
                    steps = _number(row, "num_steps_sampled")
                    out["checkpoints"].append({
                        "s": mark, "return_mean": _number(row, "episode_return_mean"),
                        "episodes": int(_number(row, "episode_return_count") or 0),
                        "env_steps": None if steps is None else int(steps)})
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                _, stderr = proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
        if len(out["checkpoints"]) < len(marks):
            raise RuntimeError(f"impala-lab ({env_id}, seed {seed}) ended after "
                               f"{time.monotonic() - t0:.0f} s, before the budget, with "
                               f"{proc.returncode}:\n{(stderr or '')[-2000:]}")
        result = json.loads((Path(tmp) / "result.json").read_text())
        out["best_return_mean"] = best_full_window(Path(tmp) / "metrics.csv")
    seconds = result.get("seconds_to_target")
    reached = seconds is not None and seconds <= budget
    out.update(reached=reached, seconds_to_target=seconds if reached else None,
               env_steps_to_target=result.get("env_steps_to_target") if reached else None,
               wall_s=round(time.monotonic() - t0, 2))
    return out


def best_full_window(path: Path) -> float | None:
    """The best trailing mean in metrics.csv over rows whose window held 100 episodes."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return None
    full = [_number(r, "episode_return_mean") for r in rows
            if (_number(r, "episode_return_count") or 0) >= 100]
    return max((x for x in full if x is not None), default=None)


def fall_from_best(run: dict[str, Any]) -> float | None:
    """How far the run ended below its own best trailing mean, as a fraction of that best
    (0 when it ended at its best; None without a full window or with a best <= 0)."""
    best, final = run.get("best_return_mean"), run["checkpoints"][-1]["return_mean"]
    if best is None or final is None or best <= 0:
        return None
    return round(max(0.0, best - final) / best, 4)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system: n, the median return at each checkpoint (at the budget with a bootstrap
    95% interval), the worst at the budget, the median env steps there, and how many runs
    reached the target (with their median seconds); a run with no episode yet counts as
    -inf."""
    out: dict[str, Any] = {}
    for system in SYSTEMS:
        rs = [r[system] for r in runs if r.get(system)]
        finals = [_final(r) for r in rs]
        reached = [r for r in rs if r.get("reached")]
        out[system] = {
            "n": len(rs), "num_reached": len(reached),
            "median_return": statistics.median(finals) if finals else None,
            "median_return_ci95": list(peers.median_interval(finals)) if finals else None,
            "worst_return": min(finals, default=None),
            "median_env_steps": statistics.median(r["checkpoints"][-1]["env_steps"] or 0
                                                  for r in rs) if rs else None,
            "median_return_at": {str(c["s"]): statistics.median(_at(r, i) for r in rs)
                                 for i, c in enumerate(rs[0]["checkpoints"])} if rs else {},
            "median_seconds_to_target": (statistics.median(r["seconds_to_target"]
                                                           for r in reached)
                                         if reached else None),
            "falls_from_best": [fall_from_best(r) for r in rs]}
    a, b = out["ppo_zoo"], out["impala_lab"]
    if min(a["n"], b["n"]) < MIN_SEEDS_TO_COMPARE:
        out["verdict"] = f"not compared (fewer than {MIN_SEEDS_TO_COMPARE} seeds a side)"
    elif a["median_return_ci95"] and b["median_return_ci95"]:
        (a_lo, a_hi), (b_lo, b_hi) = a["median_return_ci95"], b["median_return_ci95"]
        out["verdict"] = (f"{LABELS['impala_lab']} higher" if b_lo > a_hi else
                          f"{LABELS['ppo_zoo']} higher" if a_lo > b_hi else "inconclusive")
    return out


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _at(run: dict[str, Any], i: int) -> float:
    x = run["checkpoints"][i]["return_mean"]
    return -math.inf if x is None else x


def _final(run: dict[str, Any]) -> float:
    return _at(run, len(run["checkpoints"]) - 1)


def markdown(results: dict[str, Any]) -> str:
    """The README's table: a row per env and system."""
    budget = results["budget"]
    marks = checkpoint_times(budget)
    rows = [f"| env | system | trailing return at {budget:g} s, median [95%] | worst | "
            + " | ".join(f"median at {m:g} s" for m in marks[:-1])
            + " | median env steps | reached the target (median s) |",
            "| --- | --- | --- | --- | " + "--- | " * (len(marks) - 1) + "--- | --- |"]
    for env_id, s in results["summaries"].items():
        for system in SYSTEMS:
            m = s[system]
            if not m["n"]:
                rows.append(f"| {env_id} | {LABELS[system]} | every run failed (see errors) |"
                            + " |" * (len(marks) + 2))
                continue
            lo, hi = m["median_return_ci95"]
            at = [m["median_return_at"][str(t)] for t in marks[:-1]]
            when = ("" if m["median_seconds_to_target"] is None
                    else f" ({m['median_seconds_to_target']:.0f} s)")
            rows.append(f"| {env_id} | {LABELS[system]} | {m['median_return']:.0f} [{lo:.0f}, "
                        f"{hi:.0f}] | {m['worst_return']:.0f} | "
                        + " | ".join(f"{x:.0f}" for x in at)
                        + f" | {m['median_env_steps'] / 1e6:.2f}M | {TARGETS[env_id]:g}: "
                        f"{m['num_reached']}/{m['n']}{when} |")
    for env_id, s in results["summaries"].items():
        rows.append(f"\n{env_id}: return at {budget:g} s, by the 95% intervals of the medians: "
                    f"{s.get('verdict', 'not compared')} (n = {s['ppo_zoo']['n']} and "
                    f"{s['impala_lab']['n']}); seeds (drawn at random): "
                    f"{', '.join(map(str, results['seeds'][env_id]))}.")
        for system in SYSTEMS:
            falls = s[system].get("falls_from_best") or []
            if falls:
                text = ", ".join("n/a" if f is None else f"{100 * f:.0f}%" for f in falls)
                rows.append(f"{LABELS[system]}: each seed's fall from its own best trailing "
                            f"mean at {budget:g} s: {text}.")
    return "\n".join(rows)


def results_name(envs: list[str], budget: float) -> str:
    """The results files' name: the envs and the budget, so that runs of one env at a time
    (the whole bench takes hours) or of another budget never overwrite each other."""
    slug = "_".join(e.split("-")[0].lower() for e in envs)
    return f"peers_mujoco_{slug}_{budget:g}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers_mujoco",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default=",".join(TARGETS),
                        help=f"comma-separated, from {', '.join(TARGETS)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds drawn at random per env")
    parser.add_argument("--budget", type=float, default=1200.0,
                        help="seconds per run, from its process's start")
    parser.add_argument("--out", type=Path, default=peers.RESULTS, help="results directory")
    parser.add_argument("--resume", action="store_true",
                        help="read the results files back and run the seeds still missing")
    parser.add_argument("--max-pairs", type=int, default=None,
                        help="stop after this many seeds (both systems) in this call")
    parser.add_argument("--ppo-worker", type=int, metavar="SEED", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    unknown = [e for e in envs if e not in TARGETS]
    if unknown or not envs:
        parser.error(f"--envs={args.envs!r}: choose from {', '.join(TARGETS)}")
    if not args.budget > 0:
        parser.error(f"--budget={args.budget:g}: give a positive number of seconds")
    if args.ppo_worker is not None:  # in the peers venv: one PPO run, one JSON line
        print(json.dumps(ppo_worker(envs[0], args.ppo_worker, args.budget)), flush=True)
        return 0
    sys.path.insert(0, str(peers.REPO))
    from bench import solves

    venv = peers.ensure_venv()
    extra = peers.ensure_extra(peers.VENV, "mujoco")
    name = results_name(envs, args.budget)
    saved = args.out / f"{name}.json"
    if args.resume and saved.is_file():
        results = json.loads(saved.read_text())
        print(f"bench.peers_mujoco: resuming {saved}", flush=True)
    else:
        results = {"budget": args.budget, "targets": TARGETS, "ppo_settings": PPO_SETTINGS,
                   "seeds": {}, "runs": {}, "summaries": {}, "errors": {}}
    results.update(venv=venv, venv_extra=extra)
    pairs = 0
    for env_id in envs:
        if env_id not in results["seeds"]:
            results["seeds"][env_id] = solves.draw_seeds(args.seeds)
            results["runs"][env_id] = []
        seeds = results["seeds"][env_id]
        print(f"bench.peers_mujoco: {env_id}: seeds drawn at random for this bench: "
              f"{', '.join(map(str, seeds))}", flush=True)
        runners = {"ppo_zoo": lambda s, e=env_id: run_ppo(e, s, args.budget),
                   "impala_lab": lambda s, e=env_id: run_impala(e, s, args.budget)}
        rows = results["runs"][env_id]
        for i, seed in enumerate(seeds):
            if any(r["seed"] == seed for r in rows):
                continue
            if args.max_pairs is not None and pairs >= args.max_pairs:
                break
            row: dict[str, Any] = {"seed": seed}
            rows.append(row)
            for system in peers.run_order(SYSTEMS, i):
                print(f"bench.peers_mujoco: {env_id} seed {seed}: {system} ... (load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)
                row[f"loadavg_before_{system}"] = list(os.getloadavg())
                try:
                    row[system] = runners[system](seed)
                except Exception as exc:  # one failed run must not cost the others
                    results["errors"][f"{env_id} {system} seed {seed}"] = str(exc)
                    print(f"bench.peers_mujoco: FAILED: {exc}", flush=True)
                    continue
                row[f"loadavg_after_{system}"] = list(os.getloadavg())
                print(f"    returns at {[c['s'] for c in row[system]['checkpoints']]} s: "
                      f"{[_rounded(c['return_mean']) for c in row[system]['checkpoints']]}; "
                      f"best {row[system].get('best_return_mean')}, reached "
                      f"{TARGETS[env_id]:g} at {row[system]['seconds_to_target']} s",
                      flush=True)
                results["summaries"][env_id] = summarize(rows)
                save(results, args.out, name)  # a cut-off keeps every finished run
            pairs += 1
    print("\n" + save(results, args.out, name))
    return 1 if results["errors"] else 0


def save(results: dict[str, Any], out: Path, name: str) -> str:
    """Write ``name``.json and .md under ``out`` (the pairs done so far); the table."""
    from impala_lab.stats import jsonable

    results["loadavg_at_end"] = list(os.getloadavg())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(jsonable(results), indent=2))
    table = markdown(results)
    (out / f"{name}.md").write_text(table + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
