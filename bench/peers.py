"""``make bench-peers`` (``python -m bench.peers``): impala_lab against a peer, on the same seeds.

The peer is Stable-Baselines3's PPO with RL Zoo's tuned CartPole-v1 settings (8 envs, n_steps
32, batch 256, 20 epochs, gae_lambda 0.8, gamma 0.98, ent_coef 0, learning rate and clip range
decayed linearly from 1e-3 and 0.2 to 0 over 1e5 steps, MlpPolicy defaults), run two ways
(`PPO_VARIANTS`):

- ``ppo_zoo``: as RL Zoo runs it: the 8 envs in a ``DummyVecEnv`` (stepped one after the
  other in the training process) and one torch thread;
- ``ppo_two_cores``: with the machine's cores, as impala_lab uses them: the 8 envs in a
  ``SubprocVecEnv`` (SB3 gives each env a process of its own; the OS spreads them over the
  cores) and torch's default thread count (one per core).

The algorithm and its settings are the same both ways; only where the envs step and how many
threads torch may use differ. Each seed, drawn at random per run and printed, gets one run of
each PPO variant and one ``impala-lab train --env CartPole-v1 --stop-return 475`` run
(`solves.time_to_solve`), each in a fresh process, in an order that rotates from seed to
seed. All report the seconds from their process's start (the clock is read at the top of the
program, before torch or TensorFlow is imported) and the env steps until the mean return of
the last 100 episodes reaches 475. The summary gives, per system, n, the solve rate, the
median and worst seconds and a bootstrap 95% interval of the median seconds (a seed that did
not reach 475 counts as infinitely slow); each pair of systems is called "X faster" when
their intervals do not overlap, else "inconclusive".

    python -m bench.peers                 # 3 seeds
    python -m bench.peers --seeds 10      # enough for intervals that can separate
    python -m bench.peers --variants ppo_zoo   # one PPO variant only

PPO runs in its own virtualenv, ``bench/.peers-venv`` (git-ignored), never in the project's
``.venv``: built on first use with ``pip install stable-baselines3 torch`` (pinned in
`REQUIREMENTS`, from PyPI; torch's Linux wheels pull CUDA libraries, a few GB), reused after,
rebuilt when `REQUIREMENTS` or the Python version change (`requirements_hash`). It writes
``docs/results/peers_results.json`` and ``docs/results/peers_results.md``. Not part of ``make
test``.

This module imports only the standard library at its top: the PPO worker (``--ppo-worker``)
runs it with the peers venv's interpreter, which has no impala_lab.
"""

from __future__ import annotations

import time

_PROCESS_START = time.monotonic()  # the PPO worker's clock starts before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench.peers_venv import (  # noqa: E402, F401  (re-exported for callers and tests)
    EXTRAS,
    REQUIREMENTS,
    STAMP,
    VENV,
    dir_size_mb,
    ensure_extra,
    ensure_venv,
    requirements_hash,
    venv_is_current,
    venv_python,
)

HERE = Path(__file__).resolve().parent
# What the bench measured lives beside the docs that quote it, not among the bench's code.
RESULTS = HERE.parent / "docs" / "results"
REPO = HERE.parent
ENV = "CartPole-v1"
STOP_RETURN = 475.0

# RL Zoo's hyperparams/ppo.yml, CartPole-v1 (lin_X: X * progress_remaining over n_timesteps).
PPO_SETTINGS = {"n_envs": 8, "n_timesteps": 100_000, "policy": "MlpPolicy", "n_steps": 32,
                "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2}

# How each PPO variant runs: where its envs step and torch's thread count (None: torch's
# default, one per core).
PPO_VARIANTS: dict[str, dict[str, Any]] = {
    "ppo_zoo": {"vec_env": "dummy", "torch_threads": 1,
                "label": "PPO zoo", "text": "RL Zoo's way: DummyVecEnv, one torch thread"},
    "ppo_two_cores": {"vec_env": "subproc", "torch_threads": None,
                      "label": "PPO 2 cores", "text": "both cores: SubprocVecEnv (a process "
                      "per env), torch's default threads"},
}
SYSTEMS = (*PPO_VARIANTS, "impala_lab")
LABELS = {**{k: v["label"] for k, v in PPO_VARIANTS.items()}, "impala_lab": "impala_lab"}


# ---------------------------------------------------------------------- PPO (peers venv)
def ppo_worker(seed: int, max_seconds: float, stop_return: float = STOP_RETURN,
               variant: str = "ppo_zoo") -> dict[str, Any]:
    """RL Zoo's PPO on CartPole-v1 until the trailing-100 mean reaches ``stop_return``, its
    envs and torch threads as ``variant`` (a `PPO_VARIANTS` name) says.

    Runs in the peers venv. The callback reads the returns that each env's ``Monitor`` puts
    in ``info["episode"]`` at an episode's end, checks after every vectorized step and stops
    training there; it also stops at ``max_seconds`` from the process start. The schedules
    decay over RL Zoo's 1e5 steps; a run that has not reached the target by then ends.
    """
    import importlib.metadata as md
    from collections import deque

    import torch

    how = PPO_VARIANTS[variant]
    if how["torch_threads"] is not None:
        torch.set_num_threads(how["torch_threads"])
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import_s = round(time.monotonic() - _PROCESS_START, 2)  # torch and SB3 imported

    s = PPO_SETTINGS
    returns: deque[float] = deque(maxlen=100)
    out: dict[str, Any] = {"seed": seed, "variant": variant, "solved": False,
                           "seconds_to_target": None, "env_steps_to_target": None,
                           "stop_reason": "max_env_steps"}

    def linear(start: float) -> Any:
        return lambda progress_remaining: progress_remaining * start

    vec_env_cls = DummyVecEnv if how["vec_env"] == "dummy" else SubprocVecEnv
    env = make_vec_env(ENV, n_envs=s["n_envs"], seed=seed, vec_env_cls=vec_env_cls)
    model = PPO(s["policy"], env, n_steps=s["n_steps"], batch_size=s["batch_size"],
                n_epochs=s["n_epochs"], gae_lambda=s["gae_lambda"], gamma=s["gamma"],
                ent_coef=s["ent_coef"], learning_rate=linear(s["learning_rate"]),
                clip_range=linear(s["clip_range"]), seed=seed, device="cpu", verbose=0)
    callback = stop_at_target(BaseCallback, returns, out, stop_return, max_seconds,
                              _PROCESS_START)
    model.learn(total_timesteps=s["n_timesteps"], callback=callback)
    env.close()
    out.update(final_env_steps=int(model.num_timesteps),
               final_return_mean=(round(sum(returns) / len(returns), 2) if returns else None),
               seconds_total=round(time.monotonic() - _PROCESS_START, 2), import_s=import_s,
               versions={name: md.version(name) for name in
                         ("stable-baselines3", "torch", "gymnasium", "numpy")},
               torch_threads=torch.get_num_threads(), vec_env=vec_env_cls.__name__)
    return out


def stop_at_target(base: type, returns: Any, out: dict[str, Any], stop_return: float,
                   max_seconds: float, start: float) -> Any:
    """An SB3 callback (``base`` is SB3's ``BaseCallback``, imported by the worker) that
    appends each finished episode's return (``Monitor``'s ``info["episode"]``) to ``returns``
    (a deque of 100) and stops training once their mean reaches ``stop_return``, recording
    the seconds since ``start`` and the env steps in ``out``, or at ``max_seconds``."""

    class StopAtTarget(base):  # type: ignore[misc, valid-type]
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                episode = info.get("episode")
                if episode is not None:
                    returns.append(float(episode["r"]))
            now = time.monotonic() - start
            if len(returns) == returns.maxlen and sum(returns) / len(returns) >= stop_return:
                out.update(solved=True, seconds_to_target=round(now, 2),
                           env_steps_to_target=int(self.num_timesteps), stop_reason="target")
                return False
            if now >= max_seconds:
                out["stop_reason"] = "max_seconds"
                return False
            return True

    return StopAtTarget()


def ppo_command(seed: int, max_seconds: float, variant: str, venv: Path = VENV) -> list[str]:
    """The argv of one PPO run in the peers venv."""
    if variant not in PPO_VARIANTS:
        raise ValueError(f"unknown PPO variant {variant!r}: choose one of "
                         f"{', '.join(PPO_VARIANTS)}")
    # -m from the repository root, not the file's path: that would put bench/ first on
    # sys.path, where bench/profile.py hides the standard library's profile (torch imports it).
    return [str(venv_python(venv)), "-m", "bench.peers", "--ppo-worker", str(seed),
            "--ppo-variant", variant, "--max-seconds", str(max_seconds)]


def run_ppo(seed: int, max_seconds: float, variant: str = "ppo_zoo", venv: Path = VENV
            ) -> dict[str, Any]:
    """`ppo_worker` in a fresh process of the peers venv; ``wall_s`` around it."""
    return run_worker(ppo_command(seed, max_seconds, variant, venv), max_seconds + 180,
                      f"seed {seed}")


def run_worker(cmd: list[str], timeout: float, label: str) -> dict[str, Any]:
    """A PPO worker's command (from the repository root) in a fresh process: the JSON object
    on its last line of stdout, with ``wall_s`` measured around the process. A non-zero exit
    or no output raises a RuntimeError naming the worker by ``label`` with its stderr's end."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"PPO worker ({label}) exited with {proc.returncode}:\n"
                           f"{proc.stderr[-2000:]}")
    return {**json.loads(lines[-1]), "wall_s": round(wall, 2)}


# ---------------------------------------------------------------------- the table
def _seconds(r: dict[str, Any] | None) -> float:
    """A run's seconds to the target; infinite when it failed or never reached it."""
    if not r or not r.get("solved") or r.get("seconds_to_target") is None:
        return math.inf
    return float(r["seconds_to_target"])


def _median_or_none(values: list[float | None]) -> float | None:
    """Median with a missing value (target not reached) counted as infinitely slow."""
    xs = [math.inf if v is None else v for v in values]
    if not xs:
        return None
    m = statistics.median(xs)
    return m if math.isfinite(m) else None


def median_interval(values: list[float], num_resamples: int = 4000, seed: int | None = None,
                    level: float = 0.95) -> tuple[float, float]:
    """A percentile bootstrap interval of the median of ``values`` (inf allowed: an
    unsolved seed); standard library only, as the peers venv has no numpy of ours."""
    import random

    if not values:
        return math.nan, math.nan
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(num_resamples))
    tail = (1.0 - level) / 2
    return (medians[int(tail * (num_resamples - 1))],
            medians[math.ceil((1 - tail) * (num_resamples - 1))])


def summarize(runs: list[dict[str, Any]], systems: tuple[str, ...] = SYSTEMS,
              seed: int | None = None) -> dict[str, Any]:
    """Per system over the seeds: n, solved, median and worst seconds, the median's 95%
    interval and the median env steps; a seed that did not reach the target (or failed)
    counts as infinitely slow (a median over such seeds is None)."""
    out: dict[str, Any] = {}
    for system in systems:
        rs = [r.get(system) or {} for r in runs if system in r]
        secs = [_seconds(r) for r in rs]
        worst = max(secs, default=math.inf)
        out[system] = {"n": len(rs), "num_solved": sum(bool(r.get("solved")) for r in rs),
                       "median_s": _median_or_none([r.get("seconds_to_target") for r in rs]),
                       "worst_s": worst if math.isfinite(worst) else None,
                       "median_s_ci95": list(median_interval(secs, seed=seed)),
                       "median_env_steps": _median_or_none(
                           [r.get("env_steps_to_target") for r in rs])}
    return out


def comparisons(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each pair of systems: "A faster" when A's interval of the median seconds lies wholly
    below B's, "B faster" the other way round, else "inconclusive"; n per side."""
    out = []
    names = list(summary)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (a_low, a_high), (b_low, b_high) = (summary[a]["median_s_ci95"],
                                                summary[b]["median_s_ci95"])
            verdict = (f"{LABELS[a]} faster" if a_high < b_low else
                       f"{LABELS[b]} faster" if b_high < a_low else "inconclusive")
            out.append({"a": a, "b": b, "n_a": summary[a]["n"], "n_b": summary[b]["n"],
                        "ci95_a": [a_low, a_high], "ci95_b": [b_low, b_high],
                        "verdict": verdict})
    return out


def _cell(r: dict[str, Any] | None, cap: float) -> tuple[str, str]:
    if not r:
        return "error", "error"
    if not r.get("solved"):
        return f"> {cap:g} (not reached)", "n/a"
    return f"{r['seconds_to_target']:.1f}", f"{r['env_steps_to_target']:,}"


def _median_cells(m: dict[str, Any]) -> tuple[str, str]:
    s = "n/a" if m["median_s"] is None else f"{m['median_s']:.1f}"
    e = "n/a" if m["median_env_steps"] is None else f"{m['median_env_steps']:,.0f}"
    return s, e


def _fmt_interval(ci: list[float]) -> str:
    return "[" + ", ".join("inf" if not math.isfinite(v) else f"{v:.1f}" for v in ci) + "]"


def headers(systems: tuple[str, ...]) -> tuple[str, ...]:
    """The table's columns: the seed, then seconds and env steps per system."""
    return ("seed", *(f"{LABELS[s]} {what}" for s in systems for what in ("s", "env steps")))


def table_rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per seed, then the medians: the cells of both tables."""
    cap = results["max_seconds"]
    systems = tuple(results["summary"])
    rows = []
    for r in results["runs"]:
        rows.append((str(r["seed"]), *(c for s in systems for c in _cell(r.get(s), cap))))
    m = results["summary"]
    n = len(results["runs"])
    rows.append((f"median ({n} seed{'' if n == 1 else 's'})",
                 *(c for s in systems for c in _median_cells(m[s]))))
    return rows


def summary_lines(results: dict[str, Any]) -> list[str]:
    """Per system n, solved, median [95%] and worst seconds; then each pair's verdict."""
    lines = []
    for s, m in results["summary"].items():
        worst = "not reached" if m["worst_s"] is None else f"{m['worst_s']:.1f} s"
        median = "n/a" if m["median_s"] is None else f"{m['median_s']:.1f} s"
        lines.append(f"{LABELS[s]}: n={m['n']}, solved {m['num_solved']}/{m['n']}, median "
                     f"{median} {_fmt_interval(m['median_s_ci95'])}, worst {worst}")
    for c in comparisons(results["summary"]):
        lines.append(f"{LABELS[c['a']]} (n={c['n_a']}) vs {LABELS[c['b']]} (n={c['n_b']}): "
                     f"{c['verdict']}")
    return lines


def format_table(results: dict[str, Any]) -> str:
    """The printed side-by-side table, with the summary under it."""
    rows = [headers(tuple(results["summary"])), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"seconds from process start to a trailing-100 mean of "
                 f"{results['stop_return']:g}, cap {results['max_seconds']:g} s; median "
                 "[bootstrap 95% interval]:")
    lines += summary_lines(results)
    return "\n".join(lines)


def format_markdown(results: dict[str, Any]) -> str:
    """The same table in markdown, with the summary and the settings under it."""
    cols = headers(tuple(results["summary"]))
    lines = ["| " + " | ".join(cols) + " |", "| --- " * len(cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    lines += [""] + [f"- {line}" for line in summary_lines(results)]
    v = results.get("ppo_versions") or {}
    load = results.get("loadavg") or {}

    def first(key: str) -> str:
        xs = load.get(key)
        return f"{xs[0]:.1f}" if xs else "?"

    ways = "; ".join(f"{LABELS[k]}: {PPO_VARIANTS[k]['text']}" for k in results["summary"]
                     if k in PPO_VARIANTS)
    lines += ["", f"CartPole-v1 to a trailing-100 mean of {results['stop_return']:g}, seconds "
              "from each process's start, a fresh process per run, on "
              f"{results.get('machine', {}).get('nproc', '?')} CPUs (load average "
              f"{first('start')} at the start, {first('end')} at the end). PPO: "
              f"Stable-Baselines3 {v.get('stable-baselines3', '?')} (torch "
              f"{v.get('torch', '?')}) with RL Zoo's CartPole-v1 settings, run two ways "
              f"({ways}); impala_lab: `impala-lab train --env CartPole-v1 --stop-return 475` "
              "(tuned preset, 2 worker processes and the learner). Seeds drawn at random for "
              "this run; the systems' order rotates from seed to seed."]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the run
def run_order(systems: tuple[str, ...], index: int) -> tuple[str, ...]:
    """The systems' order for the ``index``-th seed: rotated by one from seed to seed."""
    k = index % len(systems)
    return systems[k:] + systems[:k]


def _run_seed(seed: int, order: tuple[str, ...], runners: dict[str, Any],
              results: dict[str, Any], log: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"seed": seed}
    for system in order:
        log(f"bench.peers: seed {seed}: {system} ... (load {os.getloadavg()[0]:.2f})",
            flush=True)
        try:
            r = runners[system](seed)
        except Exception as exc:  # one failed run must not cost the others
            results["errors"][f"{system} seed {seed}"] = f"{type(exc).__name__}: {exc}"
            log(f"bench.peers: {system} seed {seed} FAILED: {exc}", flush=True)
            r = None
        else:
            log(f"bench.peers: seed {seed}: {system}: solved={r['solved']} "
                f"seconds_to_target={r['seconds_to_target']} "
                f"env_steps_to_target={r['env_steps_to_target']} wall={r['wall_s']} s",
                flush=True)
            if system in PPO_VARIANTS:
                results["ppo_versions"] = r.get("versions")
        row[system] = r
    return row


def run(num_seeds: int, max_seconds: float, out: Path = HERE, rebuild: bool = False,
        log: Any = print, variants: tuple[str, ...] = tuple(PPO_VARIANTS)) -> dict[str, Any]:
    """Builds (or reuses) the venv, runs each PPO variant and impala_lab on ``num_seeds``
    random seeds, in rotating order, and writes peers_results.json and .md under ``out``."""
    sys.path.insert(0, str(REPO))
    from bench import machine, solves
    from impala_lab.stats import jsonable

    t_all = time.perf_counter()
    venv = ensure_venv(rebuild=rebuild, log=log)
    seeds = solves.draw_seeds(num_seeds)
    log(f"bench.peers: seeds drawn at random for this run: {', '.join(map(str, seeds))}",
        flush=True)
    machine_facts = machine.machine_info()
    systems = (*variants, "impala_lab")
    results: dict[str, Any] = {
        "machine": machine_facts, "venv": venv, "seeds": seeds, "max_seconds": max_seconds,
        "stop_return": STOP_RETURN, "ppo_settings": PPO_SETTINGS,
        "ppo_variants": {k: PPO_VARIANTS[k] for k in variants}, "runs": [], "errors": {},
        "loadavg": {"start": machine_facts["loadavg_at_start"]}}
    runners = {**{v: (lambda s, v=v: run_ppo(s, max_seconds, v)) for v in variants},
               "impala_lab": lambda s: solves.time_to_solve(s, max_seconds, STOP_RETURN)}
    for i, seed in enumerate(seeds):
        results["runs"].append(_run_seed(seed, run_order(systems, i), runners, results, log))
    results["summary"] = summarize(results["runs"], systems)
    results["comparisons"] = comparisons(results["summary"])
    results["loadavg"]["end"] = list(os.getloadavg())
    results["total_s"] = round(time.perf_counter() - t_all, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers_results.json").write_text(json.dumps(jsonable(results), indent=2))
    (out / "peers_results.md").write_text(format_markdown(results) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10,
                        help="seeds drawn at random, each run by every system (default 10)")
    parser.add_argument("--max-seconds", type=float, default=120.0,
                        help="cap per run, seconds from its process start (default 120)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for peers_results.json and .md (default docs/results/)")
    parser.add_argument("--rebuild-venv", action="store_true",
                        help=f"rebuild {VENV.relative_to(REPO)} even if it is current")
    parser.add_argument("--variants", default=",".join(PPO_VARIANTS),
                        help="PPO variants to run, comma-separated (default: all of "
                        f"{', '.join(PPO_VARIANTS)})")
    parser.add_argument("--ppo-worker", type=int, metavar="SEED", help=argparse.SUPPRESS)
    parser.add_argument("--ppo-variant", default="ppo_zoo", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ppo_worker is not None:  # in the peers venv: one PPO run, one JSON line
        print(json.dumps(ppo_worker(args.ppo_worker, args.max_seconds,
                                    variant=args.ppo_variant)), flush=True)
        return 0
    if args.seeds < 1 or not args.max_seconds > 0:
        parser.error("--seeds must be >= 1 and --max-seconds > 0")
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in PPO_VARIANTS for v in variants):
        parser.error(f"--variants {args.variants!r} is invalid: choose from "
                     f"{', '.join(PPO_VARIANTS)}, comma-separated")
    results = run(args.seeds, args.max_seconds, args.out, args.rebuild_venv,
                  variants=tuple(variants))
    print()
    print(format_table(results))
    for name, err in results["errors"].items():
        print(f"ERROR in {name}: {err}")
    print(f"\ntotal {results['total_s']} s; wrote {args.out / 'peers_results.json'} and "
          f"{args.out / 'peers_results.md'}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
