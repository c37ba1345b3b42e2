"""``python -m bench --only continuous`` (or ``python -m bench.continuous``): Box actions.

Not part of the default ``make bench``: each seed may take minutes.

    python -m bench --only continuous                   # Pendulum-v1, 5 random seeds
    python -m bench.continuous --envs mujoco            # HalfCheetah-v5 and Hopper-v5, 3 each
    python -m bench.continuous --envs all --seeds 2     # every env, 2 seeds each

Per env and seed, drawn at random for the run and printed: ``impala-lab train --env ENV
--stop-return TARGET --train-after-target AFTER --max-seconds MAX --seed S`` (the env's tuned
preset, as a newcomer runs it) in a fresh process. Times are from the process's start.

Targets (`ENVS`): every seed's trailing-100 mean return reaches the env's target within its
limit (Pendulum-v1 -250 in 300 s; HalfCheetah-v5 1500 and Hopper-v5 1000 in 20 minutes).
Reported: the solve rate with its Wilson 95% interval, the median and worst seconds and env
steps to the target, and how many solved seeds stayed above the env's floor for the AFTER
seconds they trained on (the lowest trailing mean over that window).

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

from bench import solves
from bench.seed_summary import wilson_interval
from impala_lab.stats import jsonable

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
# env: (target return, seconds from process start to reach it, "stayed" floor afterwards,
# seeds by default)
ENVS: dict[str, tuple[float, float, float, int]] = {
    # a swing-up held most of each 200-step episode
    "Pendulum-v1": (-250.0, 300.0, -400.0, 5),
    # MuJoCo: the targets PPO-class methods reach in about 1M env steps
    "HalfCheetah-v5": (1500.0, 1200.0, 1000.0, 3),
    "Hopper-v5": (1000.0, 1200.0, 500.0, 3),
}
GROUPS = {"pendulum": ["Pendulum-v1"], "mujoco": ["HalfCheetah-v5", "Hopper-v5"],
          "all": list(ENVS)}


def run(seeds: list[int], max_s: float, after_s: float, env: str, log: Any = print
        ) -> dict[str, Any]:
    """Each seed's run of ``env`` to its target, then ``after_s`` more seconds; the summary."""
    target, _, floor, _ = ENVS[env]
    runs = []
    for i, seed in enumerate(seeds):
        r = solves.time_to_solve(seed, max_s, target, ("--env", env),
                                 train_after_target=after_s, solve_limit_s=max_s)
        runs.append(r)
        what = (f"reached {target:g} in {r['seconds_to_target']:.1f} s, "
                f"{r['env_steps_to_target']:,} env steps; lowest trailing mean in the "
                f"{after_s:g} s after: {r['return_min_after_target']}"
                if r["reached"] else f"did not reach {target:g} (best trailing mean "
                f"{r['best_return_mean']})")
        log(f"  {env} seed {seed} ({i + 1}/{len(seeds)}): {what}; wall {r['wall_s']:.1f} s",
            flush=True)
    summary = solves.summarize_solves(runs, max_s, solve_limit_s=max_s, after_s=after_s,
                                      stay_floor=floor)
    low, high = wilson_interval(summary["num_solved"], summary["num_runs"])
    summary["solve_rate_ci95"] = [round(low, 3), round(high, 3)]
    summary.update(env=env, target=target)
    return summary


def markdown(summaries: list[dict[str, Any]]) -> str:
    """The README's table: a row per env's summary (`run`'s)."""

    def sec(x: Any) -> str:
        return "never" if x is None else f"{x:.1f} s"

    def steps(x: Any) -> str:
        return "never" if x is None else f"{x / 1e6:.2f}M"

    rows = ["| env | seeds (drawn at random) | reached the target within the limit "
            "[Wilson 95%] | median s | worst s | median env steps | worst env steps | "
            "stayed above the floor after |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        lo, hi = s["solve_rate_ci95"]
        rows.append(
            f"| {s['env']} | {', '.join(map(str, s['seeds']))} | {s['target']:g} within "
            f"{s['solve_limit_s']:g} s: {s['num_solved']}/{s['num_runs']} [{lo:.2f}, {hi:.2f}] "
            f"| {sec(s['median_s'])} | {sec(s['max_s'])} | {steps(s['median_env_steps'])} | "
            f"{steps(s['max_env_steps'])} | {s['stay_floor']:g} for {s['after_s']:g} s: "
            f"{s['num_stayed']}/{s['num_solved']} (lowest {s['lowest_after_target']}) |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.continuous",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="pendulum",
                        help=f"an env id, or one of {', '.join(GROUPS)} (comma-separated)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds drawn at random per env (default: the env's, `ENVS`)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="each run's cap and the target's limit (default: the env's)")
    parser.add_argument("--after", type=float, default=60.0,
                        help="seconds each run trains on after reaching the target")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    envs = [e for part in args.envs.split(",") for e in GROUPS.get(part, [part])]
    unknown = [e for e in envs if e not in ENVS]
    if unknown:
        parser.error(f"--envs: {', '.join(unknown)} has no target here; choose from "
                     f"{', '.join([*GROUPS, *ENVS])}")
    t0 = time.perf_counter()
    summaries = []
    for env in envs:
        _, limit, _, num_seeds = ENVS[env]
        seeds = solves.draw_seeds(args.seeds or num_seeds)
        max_s = args.max_seconds or limit
        print(f"[bench.continuous] {env}: {len(seeds)} seeds drawn at random for this run: "
              f"{', '.join(map(str, seeds))}", flush=True)
        summaries.append(run(seeds, max_s, args.after, env))
    passed = all(s["num_solved"] == s["num_runs"] for s in summaries)
    table = markdown(summaries)
    print(f"\n{table}\n\ntarget: every seed reaches its env's target within the limit: "
          f"{'PASS' if passed else 'FAIL'} ({time.perf_counter() - t0:.0f} s in all)")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "continuous_results" if envs == GROUPS["pendulum"] else \
        f"continuous_results_{'_'.join(e.split('-')[0].lower() for e in envs)}"
    result = {"envs": envs, "passed": passed, "summaries": summaries,
              "loadavg_at_end": list(os.getloadavg())}
    (args.out / f"{name}.json").write_text(json.dumps(jsonable(result), indent=1))
    (args.out / f"{name}.md").write_text(table + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
