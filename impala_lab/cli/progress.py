"""The ``impala-lab train`` progress view: a bar towards the stop condition over the live panel.

In a terminal, each report redraws, in place, one bar line and the text dashboard under it::

    progress [##############················]  47%  env steps 28,200 / 60,000   12.4 s
    CartPole-v1 (process, 2 workers)   12.4 s   env steps 28,200   trained 27,600
    ...

The bar follows the run's nearest limit: the mean return towards ``--stop-return``, the env
steps towards ``--max-env-steps`` or the seconds towards ``--max-seconds``, whichever is
furthest along (the run ends when the first one is reached). The return's bar starts at the
lowest mean return seen, so it works for negative returns too. Elsewhere (a log, a pipe, CI)
the output is the dashboard's one progress line per report, exactly as without this module.

Pure Python, like the dashboard's text view: the CLI imports it before TensorFlow.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from impala_lab.dashboard.format import is_number
from impala_lab.dashboard.terminal import TerminalView
from impala_lab.health_flags import describe_seen

BAR_WIDTH = 30


@dataclass(frozen=True)
class StopGoal:
    """The limits of one ``train`` call (None: not set), as the CLI's options give them."""

    stop_return: float | None = None
    max_env_steps: int | None = None
    max_seconds: float | None = None


@dataclass(frozen=True)
class Progress:
    """How far a run is towards its nearest limit.

    Attributes:
      fraction: in [0, 1].
      label: what is counted, e.g. ``"env steps 28,200 / 60,000"``.
    """

    fraction: float
    label: str


def _clip(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def return_progress(mean: Any, target: float, low: float | None) -> Progress:
    """The mean return's way from ``low`` (the lowest mean seen; None: none yet) to ``target``."""
    if not is_number(mean):
        return Progress(0.0, f"mean return – / {target:g}")
    start = mean if low is None else min(low, mean)
    frac = 1.0 if mean >= target else (
        _clip((mean - start) / (target - start)) if target > start else 0.0)
    return Progress(frac, f"mean return {mean:.1f} / {target:g}")


def goal_progress(stats: Mapping[str, Any], goal: StopGoal, seconds: float,
                  low_return: float | None = None) -> Progress | None:
    """The progress towards the limit of ``goal`` that is furthest along; None when ``goal``
    sets no limit.

    Args:
      stats: an ``Impala.stats()`` snapshot (``num_steps_sampled``, ``episode_return_mean``).
      goal: the run's limits.
      seconds: time since ``train`` started (what ``max_seconds`` counts).
      low_return: the lowest mean return seen so far, where the return's bar starts.
    """
    candidates = []
    if goal.stop_return is not None:
        candidates.append(return_progress(stats.get("episode_return_mean"), goal.stop_return,
                                          low_return))
    if goal.max_env_steps is not None:
        steps = stats.get("num_steps_sampled") or 0
        candidates.append(Progress(_clip(steps / goal.max_env_steps),
                                   f"env steps {steps:,} / {goal.max_env_steps:,}"))
    if goal.max_seconds is not None:
        candidates.append(Progress(_clip(seconds / goal.max_seconds),
                                   f"time {seconds:.0f} / {goal.max_seconds:g} s"))
    # max() keeps the first of equal fractions: the return, then steps, then time.
    return max(candidates, key=lambda p: p.fraction, default=None)


def bar_line(progress: Progress | None, seconds: float, width: int = BAR_WIDTH) -> str:
    """``progress [#####·····]  47%  env steps 28,200 / 60,000   12.4 s``; without a limit,
    says that only Ctrl-C ends the run."""
    if progress is None:
        return f"progress: no stop condition, Ctrl-C ends the run   {seconds:.1f} s"
    filled = round(progress.fraction * width)
    gauge = "#" * filled + "·" * (width - filled)
    return (f"progress [{gauge}] {progress.fraction:4.0%}  {progress.label}"
            f"   {seconds:.1f} s")


class ProgressView(TerminalView):
    """The CLI's live view: the bar over the text dashboard, redrawn in place in a terminal;
    the dashboard's one progress line per report elsewhere (`TerminalView`'s, unchanged).

    Args:
      goal: the run's limits.
      stream: where to write (stdout by default).
      title: the dashboard's first label, e.g. ``"CartPole-v1 (process, 2 workers)"``.
      live: draw the bar and redraw in place; None decides by ``stream.isatty()``.
      clock: seconds on a monotonic clock (tests pass a fake one).
    """

    def __init__(self, goal: StopGoal, stream: TextIO | None = None, title: str = "",
                 live: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stream, title, live)
        self.goal = goal
        self._clock = clock
        self._started = clock()
        self._low_return: float | None = None

    def begin(self) -> None:
        """Start the clock that ``max_seconds`` is measured on (call as ``train`` starts)."""
        self._started = self._clock()

    def progress(self, stats: Mapping[str, Any]) -> Progress | None:
        """The progress of a snapshot (and remember its return as a low, if it is one)."""
        mean = stats.get("episode_return_mean")
        if is_number(mean):
            self._low_return = mean if self._low_return is None else min(self._low_return, mean)
        return goal_progress(stats, self.goal, self._clock() - self._started, self._low_return)

    def panel(self, stats: Mapping[str, Any], no_samples: bool) -> str:
        """The bar line over the dashboard's panel."""
        bar = bar_line(self.progress(stats), self._clock() - self._started)
        return bar + "\n" + super().panel(stats, no_samples)


def final_line(result: dict[str, Any], args: argparse.Namespace, out: Path,
               interrupted: bool = False) -> str:
    """The one line ``train`` ends with: was the target reached, and if not, what the health
    monitor saw; where the results are.

    E.g. ``impala-lab: reached mean return 475 in 14.2 s (812,000 env steps); results in
    runs/demo/`` or ``impala-lab: did NOT reach mean return 475 within 300 s (best trailing
    mean 382.1, last 9.3); health monitor saw: value-loss spike at 40 s (3 times), entropy
    collapsed at 41 s; results in runs/demo/``.
    """
    final = result["final"]
    seen = describe_seen(result.get("health"))
    last = final.get("episode_return_mean", math.nan)
    best = result.get("best_return_mean")
    returns = (f"best trailing mean {best:.1f}, last {last:.1f}" if best is not None
               else f"{final.get('episode_return_count', 0)} episodes, too few for a mean")
    elapsed = final.get("time_total_s", 0.0)
    steps = final.get("num_steps_sampled", 0)
    prefix = "impala-lab: interrupted: " if interrupted else "impala-lab: "
    if result["solved"]:
        which = "evaluation return" if result.get("stop_on") == "eval" else "mean return"
        text = (f"reached {which} {args.stop_return:g} in {result['seconds_to_target']:.1f} s "
                f"({result['env_steps_to_target']:,} env steps)")
        if args.train_after_target > 0:
            low = result["return_min_after_target"]
            text += (f", then trained {result['seconds_after_target']:.1f} s more (lowest mean "
                     f"return {low if low is not None else math.nan:.1f})")
        if seen:
            text += f"; health monitor saw: {seen}"
    elif args.stop_return is not None:
        if interrupted:
            limit = f"before the interrupt at {elapsed:.1f} s"
        elif result["stop_reason"] == "max_env_steps":
            limit = f"within {args.max_env_steps:,} env steps"
        elif result["stop_reason"] == "max_seconds":
            limit = f"within {args.max_seconds:g} s"
        else:
            limit = f"in {elapsed:.1f} s"
        text = (f"did NOT reach mean return {args.stop_return:g} {limit} ({returns}); health "
                f"monitor saw: {seen or 'nothing wrong'}")
    else:
        text = (f"trained {elapsed:.1f} s, {steps:,} env steps (stop: "
                f"{result['stop_reason']}); {returns}")
        if seen:
            text += f"; health monitor saw: {seen}"
    if final.get("evaluation"):
        from impala_lab.dashboard.markup import eval_figure

        ev = final["evaluation"]
        modes = " / ".join(m for m in ("greedy", "sampled") if f"episode_return_mean_{m}" in ev)
        text += f"; the final weights evaluated ({modes}): {eval_figure(ev)}"
    return f"{prefix}{text}; results in {out}/"
