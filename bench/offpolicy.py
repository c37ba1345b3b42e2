"""``python -m bench.offpolicy``: the IMPALA paper's table 2 and figure E.1 at laptop scale.

Four off-policy corrections (no correction, epsilon, 1-step importance sampling, V-trace) x
{no replay, replay_proportion 1.0} on one env, the actors held ``--lag`` learner updates behind,
``--seeds`` seeds per cell (drawn at random per bench run and printed; every cell uses the same
ones), then a sweep of the lag (no replay). The study is `impala_lab.classroom.offpolicy_study`;
each run
is cached in ``bench/out/offpolicy/<settings hash>/`` (git-ignored), so an interrupted bench
continues. Writes ``docs/results/offpolicy_results.json`` (every run's curve and figures),
``docs/results/offpolicy_results.md`` (the tables, for the README) and
``docs/results/offpolicy_results.png``
(learning curves and the sweep).

    python -m bench.offpolicy                              # CartPole-v1, about 25 minutes here
    python -m bench.offpolicy --seeds 5 --steps 300000 --lags 0,32
    python -m bench.offpolicy --env MinAtar/Breakout-v1    # another registered env

Figures are sample efficiency (env steps), so a loaded machine slows the bench but does not
change what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MPLBACKEND", "Agg")

from impala_lab.classroom.offpolicy_study import (
    StudySettings,
    claims_markdown,
    plot_study,
    run_study,
    sweep_markdown,
    table2_markdown,
)

HERE = Path(__file__).resolve().parent
# What the bench measured lives beside the docs that quote it, not among the bench's code.
RESULTS = HERE.parent / "docs" / "results"


def main(argv: list[str] | None = None) -> int:
    defaults = StudySettings()
    parser = argparse.ArgumentParser(prog="python -m bench.offpolicy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--env", default=defaults.env, help="gymnasium env id")
    parser.add_argument("--steps", type=int, default=defaults.env_steps,
                        help="env steps per run")
    parser.add_argument("--lag", type=int, default=defaults.extra_policy_lag,
                        help="extra_policy_lag of the table")
    parser.add_argument("--seeds", type=int, default=defaults.num_seeds,
                        help="seeds per cell of the table")
    parser.add_argument("--lags", default=",".join(map(str, defaults.lags)),
                        help="the sweep's extra_policy_lag values")
    parser.add_argument("--sweep-seeds", type=int, default=defaults.sweep_seeds,
                        help="seeds per point of the sweep (the first of the table's)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="runs at a time, each in a process of its own (default: the "
                        "cores; an inline run keeps about one core busy)")
    parser.add_argument("--out", type=Path, default=RESULTS / "offpolicy_results",
                        help="path prefix of the .json, .md and .png")
    args = parser.parse_args(argv)
    settings = StudySettings(env=args.env, env_steps=args.steps, extra_policy_lag=args.lag,
                             num_seeds=args.seeds,
                             lags=tuple(int(v) for v in args.lags.split(",")),
                             sweep_seeds=args.sweep_seeds)
    start = time.monotonic()
    results = run_study(settings, HERE / "out" / "offpolicy" / settings.key(), jobs=args.jobs)
    results["seconds"] = round(time.monotonic() - start, 1)
    # what the study costs from scratch (runs already in the study directory were read)
    results["run_seconds_total"] = round(sum(r["seconds"] for r in results["runs"]), 1)
    results["command"] = "python -m bench.offpolicy " + " ".join(argv or sys.argv[1:])
    results["load_average"] = os.getloadavg()
    out = args.out
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = (f"Off-policy corrections under policy lag ({settings.env}, "
            f"{settings.env_steps:,} env steps per run, {settings.num_seeds} seeds per cell "
            f"drawn at random for this study: {results['seeds']}; "
            f"`{results['command'].strip()}`, {results['run_seconds_total']:.0f} s of "
            f"training runs)\n\n"
            f"Each cell, over its {settings.num_seeds} seeds: the final return (the mean of the "
            f"last 100 episodes at the end of the budget) and the run mean (the learning "
            f"curve's mean over the budget), each as the interquartile mean [bootstrap 95% "
            f"interval]; and the runs whose mean ever reached the solve threshold:\n\n"
            f"{table2_markdown(results)}\n\nLag sweep (no replay; {settings.sweep_seeds} seeds "
            f"a point, the same figures):\n\n{sweep_markdown(results)}\n\n"
            f"The paper's findings, each checked on the interval of a difference of IQMs "
            f"(agrees: the interval lies on the finding's side of 0; differs: on the other "
            f"side; inconclusive: it holds 0):\n\n{claims_markdown(results)}\n")
    out.with_suffix(".md").write_text(text)
    plot_study(results, out.with_suffix(".png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
