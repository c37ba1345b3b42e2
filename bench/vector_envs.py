"""``python -m bench --only vector_envs`` (or ``python -m bench.vector_envs``): vectorised envs.

Today's path steps each of a worker's envs with its own ``Env.step`` call; ``vector_env=True``
steps them all as one gymnasium vector env (CartPole-v1's ``CartPoleVectorEnv``, reset in the
ending step: `impala_lab.envs.vector`). Three measurements on CartPole-v1, each path's runs
alternating with the other's so that a drift of the machine touches both:

1. **Sampling ceiling**: 2 process workers, no learner, each re-requested as soon as it
   returns (`bench.pipeline`'s bare workers), per-env path against vector path, at each of
   ``--envs-per-worker`` (``--rounds`` windows of ``--seconds`` each; medians). The issue's
   aim: 3x at some width.
2. **End to end**: the tuned run (`ImpalaConfig.tuned`, 2 process workers, learner
   training) with the preset's envs per worker, against the same run with ``vector_env=True``
   and ``--e2e-envs`` envs per worker: env steps sampled and trained per second.
3. **Time to solve**: ``impala-lab train --env CartPole-v1 --stop-return 475`` on seeds drawn
   at random for this run (printed), each seed once per setting, alternating which goes
   first: seconds from process start and env steps to 475, with the median's bootstrap 95%
   interval per side; "faster" only where the intervals do not overlap.

Writes ``docs/results/vector_envs.json`` and ``.md``.

    python -m bench --only vector_envs                 # about 8 minutes here
    python -m bench.vector_envs --quick                # short windows, 2 seeds (CI)
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

from bench import pipeline, solves
from bench.peers import median_interval

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
PATHS = ("per-env", "vector")


def ceiling(envs_per_worker: list[int], rounds: int, seconds: float, log: Any
            ) -> list[dict[str, Any]]:
    """Sampling-only env steps/s of 2 process workers, both paths, per width."""
    rows = []
    for n in envs_per_worker:
        workers = {p: pipeline._SamplingWorkers(2, num_envs_per_worker=n,
                                                vector_env=(p == "vector")) for p in PATHS}
        rates: dict[str, list[float]] = {p: [] for p in PATHS}
        try:
            for r in range(rounds):
                for p in (PATHS if r % 2 == 0 else PATHS[::-1]):
                    steps, elapsed = workers[p].window(seconds)
                    rates[p].append(steps / elapsed)
        finally:
            for w in workers.values():
                w.close()
        med = {p: statistics.median(v) for p, v in rates.items()}
        rows.append({"envs_per_worker": n, "rounds": rates,
                     **{f"{p}_steps_per_s": round(med[p]) for p in PATHS},
                     "ratio": round(med["vector"] / med["per-env"], 2)})
        log(f"[bench.vector_envs] ceiling, {n} envs per worker: per-env "
            f"{med['per-env']:,.0f}, vector {med['vector']:,.0f} env steps/s "
            f"({rows[-1]['ratio']:.2f}x)")
    return rows


def end_to_end(vector_envs: int, rounds: int, seconds: float, warmup_s: float, log: Any
               ) -> dict[str, Any]:
    """The tuned run against the same run with vector envs, alternating training windows."""
    from impala_lab.driver.impala import Impala

    configs = {"per-env": pipeline.tuned_config(),
               "vector": pipeline.tuned_config(vector_env=True, num_envs_per_worker=vector_envs)}
    runs = {p: Impala(c) for p, c in configs.items()}
    out: dict[str, Any] = {}
    try:
        for run in runs.values():
            run.train(max_seconds=warmup_s, report_interval=1.0)
        sampled: dict[str, list[float]] = {p: [] for p in PATHS}
        trained: dict[str, list[float]] = {p: [] for p in PATHS}
        for r in range(rounds):
            for p in (PATHS if r % 2 == 0 else PATHS[::-1]):
                s, t, _, _ = pipeline._train_window(runs[p], seconds)
                sampled[p].append(s)
                trained[p].append(t)
    finally:
        for run in runs.values():
            run.stop()
    for p in PATHS:
        out[p] = {"envs_per_worker": configs[p].num_envs_per_worker,
                  "sampled_per_s": round(statistics.median(sampled[p])),
                  "trained_per_s": round(statistics.median(trained[p])),
                  "rounds_sampled": [round(x) for x in sampled[p]]}
        log(f"[bench.vector_envs] end to end, {p} ({out[p]['envs_per_worker']} envs per "
            f"worker): {out[p]['sampled_per_s']:,} sampled, {out[p]['trained_per_s']:,} "
            "trained env steps/s")
    out["sampled_ratio"] = round(out["vector"]["sampled_per_s"] / out["per-env"]["sampled_per_s"],
                                 2)
    return out


def solve(seeds: list[int], vector_envs: int, max_seconds: float, log: Any) -> dict[str, Any]:
    """Seconds and env steps to 475 per seed, both settings, alternating which goes first."""
    extra = {"per-env": (), "vector": ("--vector-env", "true", "--num-envs-per-worker",
                                       str(vector_envs))}
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    for k, seed in enumerate(seeds):
        for p in (PATHS if k % 2 == 0 else PATHS[::-1]):
            r = solves.time_to_solve(seed, max_seconds, extra_args=extra[p])
            runs[p].append(r)
            log(f"[bench.vector_envs] solve, seed {seed}, {p}: "
                + (f"475 at {r['seconds_to_target']:.1f} s, {r['env_steps_to_target']:,} env "
                   "steps" if r["reached"] else f"not reached in {max_seconds:g} s"))
    out: dict[str, Any] = {"seeds": seeds, "max_seconds": max_seconds, "runs": runs}
    for p in PATHS:
        secs = [r["seconds_to_target"] if r["reached"] else float("inf") for r in runs[p]]
        steps = [r["env_steps_to_target"] if r["reached"] else float("inf") for r in runs[p]]
        low, high = median_interval(secs)
        out[p] = {"n": len(secs), "solved": sum(r["reached"] for r in runs[p]),
                  "median_s": statistics.median(secs), "ci95_s": [low, high],
                  "worst_s": max(secs), "median_env_steps": statistics.median(steps)}
    a, b = out["per-env"]["ci95_s"], out["vector"]["ci95_s"]
    out["verdict"] = ("vector faster" if b[1] < a[0] else "per-env faster" if a[1] < b[0]
                      else "inconclusive")
    return out


def _s(x: float) -> str:
    return "not solved" if x == float("inf") else f"{x:.1f} s"


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Vectorised envs on CartPole-v1 ({results['cpus']} cores; "
             f"`{results['command']}`)", "",
             "**Sampling ceiling** (2 process workers, no learner; env steps/s, medians of "
             f"{results['rounds']} alternating windows of {results['seconds']:g} s)", "",
             "| envs per worker | per-env path | vector path | vector / per-env |",
             "| ---: | ---: | ---: | ---: |"]
    for r in results["ceiling"]:
        lines.append(f"| {r['envs_per_worker']} | {r['per-env_steps_per_s']:,} | "
                     f"{r['vector_steps_per_s']:,} | {r['ratio']:.2f}x |")
    e = results["end_to_end"]
    lines += ["", "**End to end** (the tuned run, learner training; env steps/s, medians of "
              "alternating windows)", "", "| setting | envs per worker | sampled | trained |",
              "| --- | ---: | ---: | ---: |"]
    for p in PATHS:
        lines.append(f"| {p} | {e[p]['envs_per_worker']} | {e[p]['sampled_per_s']:,} | "
                     f"{e[p]['trained_per_s']:,} |")
    s = results["solve"]
    lines += ["", f"**Time to 475** (seeds drawn at random for this run: "
              f"{', '.join(map(str, s['seeds']))}; seconds from process start)", "",
              "| setting | n | solved | median [95% interval] | worst | median env steps |",
              "| --- | ---: | ---: | --- | ---: | ---: |"]
    for p in PATHS:
        v = s[p]
        lines.append(f"| {p} | {v['n']} | {v['solved']} | {_s(v['median_s'])} "
                     f"[{_s(v['ci95_s'][0])}, {_s(v['ci95_s'][1])}] | {_s(v['worst_s'])} | "
                     f"{v['median_env_steps']:,.0f} |")
    lines += ["", f"Verdict on the seconds: {s['verdict']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vector_envs",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows, 2 seeds (CI)")
    parser.add_argument("--envs-per-worker", default="8,32,64",
                        help="widths of the ceiling measurement (comma-separated)")
    parser.add_argument("--e2e-envs", type=int, default=32,
                        help="envs per worker of the vector run end to end and in the solves")
    parser.add_argument("--rounds", type=int, default=None, help="windows per path (4; 2 quick)")
    parser.add_argument("--seconds", type=float, default=None, help="window (3 s; 1 s quick)")
    parser.add_argument("--seeds", type=int, default=None, help="solve seeds (8; 2 quick)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    n_seeds = args.seeds or (2 if args.quick else 8)
    widths = [int(w) for w in args.envs_per_worker.split(",") if w.strip()]
    if rounds < 1 or seconds <= 0 or n_seeds < 1 or args.e2e_envs < 1 or not widths or min(
            widths) < 1:
        parser.error("--rounds, --seconds, --seeds, --e2e-envs and every --envs-per-worker "
                     "must be positive")
    def log(msg: str) -> None:
        print(msg, flush=True)

    seeds = solves.draw_seeds(n_seeds)
    log(f"[bench.vector_envs] solve seeds drawn at random for this run: "
        f"{', '.join(map(str, seeds))}")
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "command": "python -m bench.vector_envs " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "cpus": len(os.sched_getaffinity(0)), "rounds": rounds, "seconds": seconds,
        "loadavg_at_start": list(os.getloadavg())}
    results["ceiling"] = ceiling(widths, rounds, seconds, log)
    results["end_to_end"] = end_to_end(args.e2e_envs, rounds, seconds,
                                       2.0 if args.quick else 5.0, log)
    results["solve"] = solve(seeds, args.e2e_envs, 30.0 if args.quick else 60.0, log)
    results["total_s"] = round(time.perf_counter() - t0, 1)
    results["loadavg_at_end"] = list(os.getloadavg())
    text = markdown(results)
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vector_envs.json").write_text(json.dumps(results, indent=1, default=float))
    (args.out / "vector_envs.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
