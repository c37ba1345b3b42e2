"""``python -m bench.throughput``: the IMPALA paper's table 1 at this machine's scale.

Env steps per second, learner training, for the architectures the paper compares, side by
side in one run on one env (CartPole-v1's tuned preset: the same model, the same learner, the
same [50, 8] samples per worker):

  sync A2C          `impala_lab.classroom.sync_loop.SyncLoop`: 2 process workers sample, the driver
  waits
                    for both, the learner trains once, the weights go out, again (the paper's
                    "batched A2C, sync traj.": the actors wait for the learner every step)
  IMPALA, N procs   the asynchronous pipeline, process backend, N = 1, 2 and 4 workers
  IMPALA, Ray       the same pipeline with 2 Ray actors (a local Ray started by the run)

Each architecture warms up (``--warmup`` s: worker start, the learner's first trace), then its
env steps sampled and samples trained are counted over ``--seconds``; ``--rounds`` rounds
visit every architecture in turn (so a slow drift of the machine touches them all) and the
table holds the medians. Writes ``docs/results/throughput_results.{json,md}``.

    python -m bench.throughput                   # about 4 minutes here
    python -m bench.throughput --env MinAtar/Breakout-v1 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = Path(__file__).resolve().parent
# What the bench measured lives beside the docs that quote it, not among the bench's code.
RESULTS = HERE.parent / "docs" / "results"

#: name -> (kind, overrides of the tuned config)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "sync A2C (2 procs)": ("sync", {"num_workers": 2, "backend": "process"}),
    "IMPALA (1 proc)": ("async", {"num_workers": 1, "backend": "process"}),
    "IMPALA (2 procs)": ("async", {"num_workers": 2, "backend": "process"}),
    "IMPALA (4 procs)": ("async", {"num_workers": 4, "backend": "process"}),
    "IMPALA on Ray (2 actors)": ("async", {"num_workers": 2, "backend": "ray"}),
}


def measure(env: str, kind: str, overrides: dict[str, Any], warmup: float,
            seconds: float) -> dict[str, float]:
    """Env steps/s sampled and samples/s trained of one architecture over ``seconds``."""
    from impala_lab.config import ImpalaConfig

    config = ImpalaConfig.tuned(env, seed=0, **overrides)
    if kind == "sync":
        from impala_lab.classroom.sync_loop import SyncLoop

        with SyncLoop(config) as loop:
            loop.run(warmup)
            steps0, updates0, t0 = loop.num_steps_sampled, loop.num_updates, time.perf_counter()
            loop.run(seconds)
            dt = time.perf_counter() - t0
            sampled = (loop.num_steps_sampled - steps0) / dt
            # every env step sampled is trained on once, right away
            return {"env_steps_per_s": sampled, "trained_per_s": sampled,
                    "updates_per_s": (loop.num_updates - updates0) / dt, "policy_lag": 0.0}
    from impala_lab.driver.impala import Impala

    with Impala(config) as run:
        run.train(max_seconds=warmup, report_interval=1.0)
        n0, m0, v0, t0 = (run.num_steps_sampled, run.num_steps_trained, run.policy.version,
                          time.perf_counter())
        final = run.train(max_seconds=seconds, report_interval=1.0)
        dt = time.perf_counter() - t0
        return {"env_steps_per_s": (run.num_steps_sampled - n0) / dt,
                "trained_per_s": (run.num_steps_trained - m0) / dt,
                "updates_per_s": (run.policy.version - v0) / dt,
                "policy_lag": final["policy_lag_at_training"]["mean"]}


def table_markdown(results: dict[str, Any]) -> str:
    rows = ["| architecture | env steps/s | samples trained/s | learner updates/s | "
            "policy lag at training | vs sync A2C |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    base = results["median"]["sync A2C (2 procs)"]["env_steps_per_s"]
    for name, m in results["median"].items():
        rows.append(f"| {name} | {m['env_steps_per_s']:,.0f} | {m['trained_per_s']:,.0f} | "
                    f"{m['updates_per_s']:.1f} | {m['policy_lag']:.1f} | "
                    f"{m['env_steps_per_s'] / base:.2f}x |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds before measuring")
    parser.add_argument("--only", default=",".join(ARCHITECTURES),
                        help="comma-separated architecture names")
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput_results")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")]
    rounds: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    load_start = os.getloadavg()
    for r in range(args.rounds):
        for name in names:
            kind, overrides = ARCHITECTURES[name]
            m = measure(args.env, kind, overrides, args.warmup, args.seconds)
            rounds[name].append(m)
            print(f"round {r + 1}: {name}: {m['env_steps_per_s']:,.0f} env steps/s, "
                  f"{m['trained_per_s']:,.0f} trained/s", flush=True)
    median = {n: {k: statistics.median(m[k] for m in ms) for k in ms[0]}
              for n, ms in rounds.items()}
    results = {"env": args.env, "command": "python -m bench.throughput " + " ".join(
        argv if argv is not None else sys.argv[1:]), "rounds": rounds, "median": median,
        "seconds": args.seconds, "warmup": args.warmup, "cpus": os.cpu_count(),
        "load_average": {"start": load_start, "end": os.getloadavg()}}
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = (f"Throughput on {args.env} ({os.cpu_count()} CPU cores; medians of "
            f"{args.rounds} rounds of {args.seconds:g} s after {args.warmup:g} s of warm-up; "
            f"`{results['command'].strip()}`)\n\n{table_markdown(results)}\n")
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
