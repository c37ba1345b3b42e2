"""``python -m bench --only continuous`` (or ``python -m bench.continuous``): Box actions.

Not part of the default ``make bench``: each seed may take minutes.

    python -m bench --only continuous                 # 5 random seeds, Pendulum-v1
    python -m bench.continuous --seeds 3 --max-seconds 120

Per seed, drawn at random for the run and printed: ``impala-lab train --env Pendulum-v1
--stop-return -250 --train-after-target AFTER --max-seconds MAX --seed S`` (the tuned preset,
as a newcomer runs it) in a fresh process. Times are from the process's start.

Targets: the trailing-100 mean return reaches -250 within 300 s on every seed. Reported: the
solve rate with its Wilson 95% interval, the median and worst seconds and env steps to the
target, and how many solved seeds stayed above -400 for the AFTER seconds they trained on
(the lowest trailing mean over that window).

Results go to ``docs/results/continuous_results.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench import pipeline
from impala_lab.seed_stats import wilson_interval
from impala_lab.stats import jsonable

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
ENV = "Pendulum-v1"
TARGET = -250.0  # the target: a swing-up held most of each 200-step episode
STAY_FLOOR = -400.0  # "stayed": no trailing mean this far below the target after it
MAX_S = 300.0


def run(seeds: list[int], max_s: float, after_s: float, log: Any = print) -> dict[str, Any]:
    """Each seed's run to the target, then ``after_s`` more seconds; the summary."""
    runs = []
    for i, seed in enumerate(seeds):
        r = pipeline.time_to_solve(seed, max_s, TARGET, ("--env", ENV),
                                   train_after_target=after_s, solve_limit_s=max_s)
        runs.append(r)
        what = (f"reached {TARGET:g} in {r['seconds_to_target']:.1f} s, "
                f"{r['env_steps_to_target']:,} env steps; lowest trailing mean in the "
                f"{after_s:g} s after: {r['return_min_after_target']}"
                if r["reached"] else f"did not reach {TARGET:g} (best trailing mean "
                f"{r['best_return_mean']})")
        log(f"  seed {seed} ({i + 1}/{len(seeds)}): {what}; wall {r['wall_s']:.1f} s",
            flush=True)
    summary = pipeline.summarize_solves(runs, max_s, solve_limit_s=max_s, after_s=after_s,
                                        stay_floor=STAY_FLOOR)
    low, high = wilson_interval(summary["num_solved"], summary["num_runs"])
    summary["solve_rate_ci95"] = [round(low, 3), round(high, 3)]
    return summary


def markdown(s: dict[str, Any], env: str = ENV) -> str:
    """The README's table of one env's summary."""
    def sec(x: Any) -> str:
        return "never" if x is None else f"{x:.1f} s"

    def steps(x: Any) -> str:
        return "never" if x is None else f"{x / 1e6:.2f}M"

    lo, hi = s["solve_rate_ci95"]
    return "\n".join([
        f"| env | seeds (drawn at random) | reached {TARGET:g} within {s['solve_limit_s']:g} s "
        "[Wilson 95%] | median s | worst s | median env steps | worst env steps | "
        f"stayed above {s['stay_floor']:g} for {s['after_s']:g} s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {env} | {', '.join(map(str, s['seeds']))} | {s['num_solved']}/{s['num_runs']} "
        f"[{lo:.2f}, {hi:.2f}] | {sec(s['median_s'])} | {sec(s['max_s'])} | "
        f"{steps(s['median_env_steps'])} | {steps(s['max_env_steps'])} | "
        f"{s['num_stayed']}/{s['num_solved']} (lowest {s['lowest_after_target']}) |"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.continuous",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds drawn at random")
    parser.add_argument("--max-seconds", type=float, default=MAX_S,
                        help="each run's cap, and the limit of the target")
    parser.add_argument("--after", type=float, default=60.0,
                        help="seconds each run trains on after reaching the target")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    seeds = pipeline.draw_seeds(args.seeds)
    print(f"[bench.continuous] {ENV}: {len(seeds)} seeds drawn at random for this run: "
          f"{', '.join(map(str, seeds))}", flush=True)
    t0 = time.perf_counter()
    summary = run(seeds, args.max_seconds, args.after)
    passed = summary["num_solved"] == summary["num_runs"]
    table = markdown(summary)
    print(f"\n{table}\n\ntarget: every seed reaches {TARGET:g} within "
          f"{args.max_seconds:g} s: {'PASS' if passed else 'FAIL'} "
          f"({time.perf_counter() - t0:.0f} s in all)")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"env": ENV, "target": TARGET, "passed": passed, "summary": summary,
              "loadavg_at_end": list(os.getloadavg())}
    (args.out / "continuous_results.json").write_text(json.dumps(jsonable(result), indent=1))
    (args.out / "continuous_results.md").write_text(table + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
