"""``python -m bench --only cores`` (or ``python -m bench.cores``): where the cores go.

    python -m bench --only cores                    # tuned CartPole-v1 and MinAtar Breakout
    python -m bench.cores --envs CartPole-v1 --seconds 20

Per env: the tuned preset (``ImpalaConfig.tuned``, process backend, the machine's cores) is
built in this process, trains until its learner has stepped and the workers run at speed
(``--warmup`` seconds), then trains ``--seconds`` more while the bench reads the CPU time
(user + system, from ``/proc``) of

- the driver's main thread (the driver loop: requests, replay, the learner queue's ``put``,
  weight broadcasts, stats),
- the learner thread (``LearnerThread``: the minibatch ring, ``learn_on_batch``; TensorFlow
  runs most small kernels in the calling thread),
- TensorFlow's own threads (named ``tf_*``: its inter- and intra-op pools),
- the driver process's other threads,
- each worker process (env steps and the numpy policy),

before and after the window. Each figure is given as cores used (CPU seconds over wall
seconds) and as a share of the machine's cores; what no one used is "idle". The env steps
sampled and trained per second over the same window say which side keeps up.

Linux only (``/proc``). Results go to ``docs/results/cores.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
ENVS = ("CartPole-v1", "MinAtar/Breakout-v1")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat_path: str) -> float | None:
    """utime + stime of a /proc ``stat`` file (a process's or a thread's), in seconds; None
    when it is gone."""
    try:
        with open(stat_path) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of proc(5)


def thread_times(pid: int) -> dict[int, tuple[str, float]]:
    """Every thread of ``pid``: its id, name (``comm``) and CPU seconds so far."""
    out: dict[int, tuple[str, float]] = {}
    root = f"/proc/{pid}/task"
    for name in os.listdir(root):
        seconds = cpu_seconds(f"{root}/{name}/stat")
        try:
            with open(f"{root}/{name}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if seconds is not None:
            out[int(name)] = (comm, seconds)
    return out


def snapshot(main_tid: int, learner_tid: int | None, worker_pids: list[int]
             ) -> dict[str, float]:
    """CPU seconds so far per part of the run (see the module's docstring)."""
    parts = {"driver main thread": 0.0, "learner thread": 0.0, "TensorFlow threads": 0.0,
             "other driver threads": 0.0}
    for tid, (comm, seconds) in thread_times(os.getpid()).items():
        key = ("driver main thread" if tid == main_tid else
               "learner thread" if tid == learner_tid else
               "TensorFlow threads" if comm.startswith("tf_") else "other driver threads")
        parts[key] += seconds
    for i, pid in enumerate(worker_pids):
        parts[f"worker {i}"] = cpu_seconds(f"/proc/{pid}/stat") or 0.0
    return parts


def shares(before: dict[str, float], after: dict[str, float], wall_s: float,
           num_cores: int) -> dict[str, dict[str, float]]:
    """Cores used by each part over the window, its share of ``num_cores``, and the idle rest."""
    out = {}
    for key in after:
        cores = max(0.0, after[key] - before.get(key, 0.0)) / wall_s
        out[key] = {"cores": round(cores, 3), "share": round(cores / num_cores, 3)}
    used = sum(v["cores"] for v in out.values())
    idle = max(0.0, num_cores - used)
    out["idle"] = {"cores": round(idle, 3), "share": round(idle / num_cores, 3)}
    return out


def unavailable(env: str) -> str:
    """Why ``env`` cannot be made here ("" when it can): its package is not installed."""
    import gymnasium as gym

    import impala_lab  # noqa: F401  (registers MinAtar's ids when minatar is installed)
    from impala_lab.config_checks import env_package_hint, register_env_family

    register_env_family(env)  # ale-py registers the ALE/ ids when imported
    try:
        gym.spec(env)
    except gym.error.Error:
        return env_package_hint(env) or "gymnasium does not know this env id"
    return ""


def measure(env: str, seconds: float, warmup_s: float, seed: int = 0) -> dict[str, Any]:
    """One tuned run of ``env``: the cores each part used over ``seconds`` after a warm-up."""
    from impala_lab import Impala, ImpalaConfig

    config = ImpalaConfig.tuned(env, seed=seed)
    with Impala(config) as run:
        run.train(max_seconds=warmup_s)
        workers = run.backend.worker_pids()
        before_stats = run.stats()
        before = snapshot(threading.get_native_id(), run.learner.native_id, workers)
        t0 = time.monotonic()
        final = run.train(max_seconds=seconds)
        wall = time.monotonic() - t0
        after = snapshot(threading.get_native_id(), run.learner.native_id, workers)
        restarted = run.backend.worker_pids() != workers
    num_cores = len(os.sched_getaffinity(0))
    sampled = final["num_steps_sampled"] - before_stats["num_steps_sampled"]
    trained = final["num_steps_trained"] - before_stats["num_steps_trained"]
    return {"env": env, "seed": seed, "num_cores": num_cores, "wall_s": round(wall, 2),
            "num_workers": config.num_workers,
            "num_envs_per_worker": config.num_envs_per_worker,
            "num_sgd_iter": config.num_sgd_iter,
            "sampled_per_s": round(sampled / wall), "trained_per_s": round(trained / wall),
            "learner_queue_mean": final["learner_queue"]["mean"],
            "learner_dequeue_time_ms": final["timing_breakdown"]["learner_dequeue_time_ms"],
            "learner_grad_time_ms": final["timing_breakdown"]["learner_grad_time_ms"],
            "a_worker_restarted": restarted,
            "parts": shares(before, after, wall, num_cores)}


def markdown(results: list[dict[str, Any]]) -> str:
    """A table per env: each part's cores and share, then the throughput line."""
    lines = []
    for r in results:
        lines += [f"**{r['env']}** (tuned preset, {r['num_workers']} workers x "
                  f"{r['num_envs_per_worker']} envs, {r['wall_s']:g} s on {r['num_cores']} "
                  "cores)", "", "| part | cores used | share of the cores |",
                  "| --- | --- | --- |"]
        for part, v in r["parts"].items():
            lines.append(f"| {part} | {v['cores']:.2f} | {v['share']:.0%} |")
        lines += ["", f"Sampled {r['sampled_per_s']:,} and trained {r['trained_per_s']:,} env "
                  f"steps/s (num_sgd_iter {r['num_sgd_iter']}); learner queue mean "
                  f"{r['learner_queue_mean']:.2f}; the learner waited "
                  f"{r['learner_dequeue_time_ms']:.1f} ms per batch and computed "
                  f"{r['learner_grad_time_ms']:.1f} ms.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cores",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated env ids")
    parser.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds before the window")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        parser.error("bench.cores reads /proc: it runs on Linux only")
    if not (args.seconds > 0 and args.warmup > 0):
        parser.error(f"--seconds={args.seconds:g} and --warmup={args.warmup:g}: both must be "
                     "positive")
    results, skipped = [], []
    for env in [e.strip() for e in args.envs.split(",") if e.strip()]:
        missing = unavailable(env)
        if missing:
            print(f"[bench.cores] {env}: skipped: {missing}", flush=True)
            skipped.append({"env": env, "why": missing})
            continue
        print(f"[bench.cores] {env}: warm-up {args.warmup:g} s, then {args.seconds:g} s "
              "measured", flush=True)
        results.append(measure(env, args.seconds, args.warmup))
    table = markdown(results)
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cores.json").write_text(json.dumps({"runs": results, "skipped": skipped,
                                                     "loadavg_at_end": list(os.getloadavg())},
                                                    indent=1))
    (args.out / "cores.md").write_text(table)
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
