"""``python -m bench.evaluation_cost``: what evaluating the learner's weights costs the run.

One tuned CartPole run (process backend, 2 workers) trains in alternating windows with the
`Evaluator` on (an evaluation at every report, i.e. about as often as the thread can play:
the worst case) and off; the order flips from pair to pair. Per window: env steps sampled per
second and the driver's mean step time. Windows next to each other share the machine's load,
so each pair's ratio (on / off) is the figure; the report gives n pairs, their median and a
bootstrap 95% interval of the ratios' IQM (`impala_lab.classroom.seed_stats`), and says
"inconclusive" when it holds 1.

    python -m bench.evaluation_cost                 # 6 pairs of 5 s windows
    python -m bench.evaluation_cost --pairs 10 --window 8
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

import numpy as np

from impala_lab.classroom import seed_stats


def window(run: Any, seconds: float, evaluate: bool) -> dict[str, float]:
    """Train ``seconds`` with evaluation on or off; env steps/s, driver step ms, evaluations."""
    run.evaluator.enabled = evaluate
    before = run.num_steps_sampled
    evals_before = run.evaluator.latest()["num_evaluations"]
    timer = run.run_stats.optimizer_step_timer
    steps_before, total_before = timer.count, timer.total
    started = time.monotonic()
    run.train(max_seconds=seconds, report_interval=0.5)
    elapsed = time.monotonic() - started
    run.evaluator.wait()
    steps = timer.count - steps_before
    step_ms = 1000 * (timer.total - total_before) / steps if steps else np.nan
    return {"env_steps_per_s": (run.num_steps_sampled - before) / elapsed,
            "driver_step_ms": step_ms,
            "evaluations": run.evaluator.latest()["num_evaluations"] - evals_before}


def measure(pairs: int, seconds: float, seed: int) -> dict[str, Any]:
    """Alternating on/off windows of one run; the per-pair ratios and their summary."""
    from impala_lab.config import ImpalaConfig
    from impala_lab.driver.impala import Impala

    config = ImpalaConfig.tuned("CartPole-v1", seed=seed, evaluation_interval=1,
                                evaluation_num_episodes=10, evaluation_actions="both")
    rows = []
    with Impala(config) as run:
        run.train(max_seconds=seconds)  # warm up: TensorFlow's first steps, the workers
        for i in range(pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            pair = {("on" if on else "off"): window(run, seconds, on) for on in order}
            rows.append(pair)
            print(f"pair {i + 1}/{pairs}: on {pair['on']['env_steps_per_s']:,.0f} env steps/s "
                  f"({pair['on']['evaluations']} evaluations), off "
                  f"{pair['off']['env_steps_per_s']:,.0f}; driver step "
                  f"{pair['on']['driver_step_ms']:.2f} / {pair['off']['driver_step_ms']:.2f} ms",
                  flush=True)
    return {"seed": seed, "pairs": rows, "window_s": seconds}


def summary(result: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Ratios on / off per pair: n, median, IQM and its interval, and the verdict."""
    out = {}
    for key in ("env_steps_per_s", "driver_step_ms"):
        ratios = [p["on"][key] / p["off"][key] for p in result["pairs"]]
        low, high = seed_stats.bootstrap_interval(ratios, rng)
        verdict = ("inconclusive" if low <= 1.0 <= high else
                   "evaluation on is higher" if low > 1.0 else "evaluation on is lower")
        out[key] = {"n": len(ratios), "median_ratio": statistics.median(ratios),
                    "iqm_ratio": seed_stats.iqm(ratios), "ci95": [low, high],
                    "verdict": verdict}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.evaluation_cost",
                                description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=6, help="on/off window pairs")
    p.add_argument("--window", type=float, default=5.0, help="seconds per window")
    p.add_argument("--seed", type=int, default=None, help="the run's seed (default: random)")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"bench.evaluation_cost: seed {seed}; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    result = measure(args.pairs, args.window, seed)
    result["summary"] = summary(result, np.random.default_rng())
    result["load_average_end"] = os.getloadavg()[0]
    for key, s in result["summary"].items():
        print(f"{key}: on / off over n={s['n']} pairs: median {s['median_ratio']:.3f}, IQM "
              f"{s['iqm_ratio']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]: {s['verdict']}")
    print(f"load average at the end {result['load_average_end']:.1f}")
    return result


if __name__ == "__main__":
    main()
