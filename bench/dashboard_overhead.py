"""What does watching cost? Throughput of one run with the dashboard polling at its default
rate against without it, side by side in one process.

    python -m bench.dashboard_overhead [--seconds 20] [--backend process] [--phase-s 2.5]

One `Impala` run trains in the background (``impala.start()``, a history row per second, as
in a notebook). After a warm-up, the measurement alternates short phases without (A) and
with (B) a `Dashboard` whose poller runs exactly as after ``show()``: stats at ``poll_hz``,
the diagram, gauges and knobs set inside ``hold_sync()``, plots rendered from the history
within their budget. Phases go A B B A A B B A ...: short phases in this order cancel a
drift of the run's speed (CartPole episodes get longer as the policy learns) and spread the
load of other processes on the machine over both conditions. A condition's throughput is its
env steps over its seconds, from the run's counters. The reported ratio is the geometric mean
of the ratios of adjacent phase pairs (one of each condition), with a 95 % interval: on a
shared 2-core machine single phases vary by +-15 %. Env steps per CPU second of the run's
processes (this one, its workers, the plot process; needs psutil) are reported too: that
ratio hardly moves with the load of other processes, but misses GIL contention.

There is no browser here: widget messages go to ipywidgets' no-op comm, so the cost of
serializing them onto the kernel's socket is not counted (small against the rendering: a
tick sends a few kB, a plot 20-60 kB).

The target: with / without >= 0.95 for env steps/s. ``run(seconds)`` returns the
numbers as a dict (the bench runner imports it); the command prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")

TARGET = 0.95
# Student's t, two-sided 95 %, by degrees of freedom (pairs - 1).
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12}
CONFIG = dict(env="CartPole-v1", num_workers=2, num_envs_per_worker=8, sample_batch_size=50,
              train_batch_size=500, seed=0)


def _tree_cpu_s() -> float:
    """CPU seconds of this process and its children (workers, the plot process) so far;
    NaN without psutil."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a child that just ended
            pass
    return total


def _phase(impala: Any, seconds: float) -> tuple[float, float, float]:
    """Env steps/s and trained steps/s over `seconds` of wall time, and env steps per CPU
    second of the run's processes."""
    s0, cpu0 = impala.stats(), _tree_cpu_s()
    t0 = time.monotonic()
    time.sleep(seconds)
    s1, cpu1 = impala.stats(), _tree_cpu_s()
    dt = time.monotonic() - t0
    sampled = s1["num_steps_sampled"] - s0["num_steps_sampled"]
    return (sampled / dt, (s1["num_steps_trained"] - s0["num_steps_trained"]) / dt,
            sampled / (cpu1 - cpu0) if cpu1 > cpu0 else float("nan"))


def run(seconds: float = 20, *, backend: str = "process", phase_s: float = 2.5,
        poll_hz: float = 4.0, warmup_s: float = 6.0, verbose: bool = False) -> dict[str, Any]:
    """Measure the dashboard's overhead.

    Args:
      seconds: measured time per condition (without, with), split into phases.
      backend: ``process`` (the default backend) or ``inline``.
      phase_s: seconds of one phase (rounded so that each condition gets an even number).
      poll_hz: the dashboard's poll rate (its default is 4 Hz).
      warmup_s: background training, with the dashboard polling, before the first phase
        (the first learner trace, the plot process's start and first full draws).

    Returns:
      ``{"ratio", "ratio_ci95", "target", "passed", "without", "with", "phases", ...}``:
      the paired with/without ratio of env steps/s and its interval, the means per
      condition, every phase, and the dashboard's own counters (CPU shares, renders).
    """
    from impala_lab import Impala
    from impala_lab.dashboard import Dashboard

    per_condition = max(1, round(seconds / phase_s))
    phase_s = seconds / per_condition
    impala = Impala(backend=backend, **CONFIG)
    board = Dashboard(impala, poll_hz=poll_hz)
    phases: list[dict[str, Any]] = []
    try:
        impala.start()
        board.start_polling()  # warm up with it: the plot process starts, first draws happen
        time.sleep(warmup_s)
        board.stop_polling()
        # A B B A A B ...: every pair of phases holds one of each condition.
        order = ([False, True, True, False] * per_condition)[: 2 * per_condition]
        for with_dashboard in order:
            if with_dashboard:
                board.start_polling()
            sampled, trained, per_cpu = _phase(impala, phase_s)
            if with_dashboard:
                board.stop_polling()
            phases.append({"dashboard": with_dashboard, "env_steps_per_s": round(sampled, 1),
                           "train_steps_per_s": round(trained, 1),
                           "env_steps_per_cpu_s": round(per_cpu, 1)})
            if verbose:
                print(f"  phase {len(phases)}: dashboard={'on ' if with_dashboard else 'off'} "
                      f"{sampled:10,.0f} env steps/s {trained:10,.0f} trained/s", flush=True)
        impala.pause()
    finally:
        board.close()
        impala.stop()

    def mean(flag: bool, key: str) -> float:
        return statistics.fmean(p[key] for p in phases if p["dashboard"] is flag)

    without, with_ = mean(False, "env_steps_per_s"), mean(True, "env_steps_per_s")
    # Adjacent phases form pairs with one of each condition: their ratios cancel the drift
    # and the load of other processes that the two phases share. Geometric mean and 95 %
    # interval of the pair ratios (a t interval on their logs).
    logs = []
    for a, b in zip(phases[0::2], phases[1::2]):
        on, off = (a, b) if a["dashboard"] else (b, a)
        if on["env_steps_per_s"] > 0 and off["env_steps_per_s"] > 0:
            logs.append(math.log(on["env_steps_per_s"] / off["env_steps_per_s"]))
    ratio = math.exp(statistics.fmean(logs)) if logs else float("nan")
    half = (T95.get(len(logs) - 1, 2.0) * statistics.stdev(logs) / math.sqrt(len(logs))
            if len(logs) > 1 else float("nan"))
    ci = (math.exp(math.log(ratio) - half), math.exp(math.log(ratio) + half)) \
        if logs else (float("nan"), float("nan"))
    polled_s = phase_s * sum(p["dashboard"] for p in phases) + warmup_s
    # CPU efficiency: unlike wall throughput it hardly moves with other processes' load.
    cpu_ratio = mean(True, "env_steps_per_cpu_s") / mean(False, "env_steps_per_cpu_s")
    return {
        "backend": backend, "poll_hz": poll_hz, "seconds_per_phase": phase_s,
        "cpu_count": os.cpu_count(), "config": CONFIG,
        "without": round(without, 1), "with": round(with_, 1), "ratio": round(ratio, 4),
        "ratio_ci95": [round(ci[0], 4), round(ci[1], 4)], "pairs": len(logs),
        "cpu_efficiency_ratio": round(cpu_ratio, 4), "loadavg": os.getloadavg(),
        "train_without": round(mean(False, "train_steps_per_s"), 1),
        "train_with": round(mean(True, "train_steps_per_s"), 1),
        "target": TARGET, "passed": bool(ratio >= TARGET),
        "poll_ticks": board.poll_ticks, "poll_hz_measured": round(board.poll_ticks / polled_s, 2),
        "poll_cpu_share": round(board.poll_cpu_s / polled_s, 4),
        "plot_renders": board.plot_renders,
        "plot_cpu_share": round(board.plot_seconds / polled_s, 4),
        "poll_errors": board.poll_errors,
        "phases": phases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="measured seconds per condition")
    parser.add_argument("--backend", default="process", choices=["process", "inline"])
    parser.add_argument("--phase-s", type=float, default=2.5, help="seconds of one phase")
    parser.add_argument("--poll-hz", type=float, default=4.0)
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    print(f"dashboard overhead: {args.backend} backend, {CONFIG['num_workers']} workers x "
          f"{CONFIG['num_envs_per_worker']} envs, {args.seconds:.0f} s per condition, "
          f"poll {args.poll_hz} Hz", flush=True)
    result = run(args.seconds, backend=args.backend, phase_s=args.phase_s,
                 poll_hz=args.poll_hz, verbose=True)
    print(f"\n{'':24}{'env steps/s':>14}{'trained/s':>14}")
    print(f"{'without dashboard':24}{result['without']:>14,.0f}{result['train_without']:>14,.0f}")
    print(f"{'with dashboard':24}{result['with']:>14,.0f}{result['train_with']:>14,.0f}")
    print(f"{'ratio of the means':24}{result['with'] / result['without']:>14.3f}"
          f"{result['train_with'] / max(result['train_without'], 1e-9):>14.3f}")
    lo, hi = result["ratio_ci95"]
    print(f"paired ratio (target >= 0.95): {result['ratio']:.3f}, 95 % interval "
          f"{lo:.3f}-{hi:.3f} over {result['pairs']} pairs of phases")
    print(f"env steps per CPU second of the run's processes, with / without: "
          f"{result['cpu_efficiency_ratio']:.3f}; load average {result['loadavg'][0]:.1f}")
    print(f"\npoller: {result['poll_ticks']} ticks ({result['poll_hz_measured']} Hz), "
          f"{100 * result['poll_cpu_share']:.1f} % of a core; plots: "
          f"{result['plot_renders']} renders, {100 * result['plot_cpu_share']:.1f} % of a core; "
          f"{'PASS' if result['passed'] else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
