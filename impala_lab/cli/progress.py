"""The ``impala-lab train`` progress view: a bar towards the stop condition over the live panel
(in a terminal; elsewhere each report is the dashboard's one progress line). `TargetWatch`
follows ``--stop-return`` over the reports, and `final_line` is the one line a run ends with.
Pure Python: the CLI imports it before TensorFlow.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from impala_lab.dashboard.format import fraction, is_number
from impala_lab.dashboard.terminal import TerminalView
from impala_lab.driver.health import RETURN_MIN_EPISODES
from impala_lab.health_flags import describe_seen
from impala_lab.stats import csv_number, process_start

BAR_WIDTH = 30


@dataclass(frozen=True)
class StopGoal:
    """The limits of one ``train`` call (None: not set), as the CLI's options give them."""

    stop_return: float | None = None
    max_env_steps: int | None = None
    max_seconds: float | None = None


@dataclass(frozen=True)
class Progress:
    """How far a run is towards its nearest limit: ``fraction`` in [0, 1], and ``label`` what
    is counted (``"env steps 28,200 / 60,000"``)."""

    fraction: float
    label: str


def return_progress(mean: Any, target: float, low: float | None) -> Progress:
    """The mean return's way from ``low`` (the lowest mean seen; None: none yet) to ``target``."""
    if not is_number(mean):
        return Progress(0.0, f"mean return – / {target:g}")
    start = mean if low is None else min(low, mean)
    frac = 1.0 if mean >= target else fraction(mean - start, target - start)
    return Progress(frac, f"mean return {mean:.1f} / {target:g}")


def goal_progress(stats: Mapping[str, Any], goal: StopGoal, seconds: float,
                  low_return: float | None = None) -> Progress | None:
    """The progress of an ``Impala.stats()`` snapshot, ``seconds`` after ``train`` started,
    towards the limit of ``goal`` that is furthest along (the first reached ends the run; None:
    no limit); the return's bar starts at ``low_return``, the lowest mean seen so far (so
    negative returns work too)."""
    candidates = []
    if goal.stop_return is not None:
        candidates.append(return_progress(stats.get("episode_return_mean"), goal.stop_return,
                                          low_return))
    if goal.max_env_steps is not None:
        steps = stats.get("num_steps_sampled") or 0
        candidates.append(Progress(fraction(steps, goal.max_env_steps),
                                   f"env steps {steps:,} / {goal.max_env_steps:,}"))
    if goal.max_seconds is not None:
        candidates.append(Progress(fraction(seconds, goal.max_seconds),
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
    """`TerminalView` (``live`` None: ``stream.isatty()``) with the bar towards ``goal`` over
    its panel; ``clock``: monotonic seconds (tests pass a fake one)."""

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


def evaluation_return(s: Mapping[str, Any]) -> float:
    """The return an evaluation reported: the greedy policy's where it was played, else
    the sampled one's; NaN before the first evaluation (or with evaluation off)."""
    ev = s.get("evaluation") or {}
    if not ev.get("num_evaluations"):
        return math.nan
    greedy = ev.get("episode_return_mean_greedy", math.nan)
    return greedy if math.isfinite(greedy) else ev.get("episode_return_mean_sampled", math.nan)


class TargetWatch:
    """Watches the reports for ``--stop-return``: when it was first reached (seconds from
    process start, env steps, monotonic ``at``), the returns reported from then on, and the
    best trailing mean of the whole run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.stop_return: float | None = args.stop_return
        self.stop_on: str = args.stop_on
        self.train_after_target: float = args.train_after_target
        self.seconds: float | None = None
        self.env_steps: int | None = None
        self.at: float | None = None
        self.returns_after: list[float] = []
        self.best_return_mean: float | None = None
        self._seconds_before = 0.0  # a resumed run's training before this process

    @property
    def reached(self) -> bool:
        return self.at is not None

    def watched_return(self, s: Mapping[str, Any]) -> float:
        """The return ``--stop-return`` watches: the actors' trailing mean (``--stop-on
        train``, once 100 episodes finished) or the latest evaluation's (``eval``)."""
        if self.stop_on == "eval":
            return evaluation_return(s)
        return s["episode_return_mean"] if s["episode_return_count"] >= 100 else math.nan

    def solved(self, s: Mapping[str, Any]) -> bool:
        ret = self.watched_return(s)
        return self.stop_return is not None and math.isfinite(ret) and ret >= self.stop_return

    def note_best(self, s: Mapping[str, Any]) -> None:
        ret = s["episode_return_mean"]
        if s["episode_return_count"] >= RETURN_MIN_EPISODES and math.isfinite(ret):
            self.best_return_mean = max(ret, self.best_return_mean or -math.inf)

    def note_target(self, s: Mapping[str, Any]) -> None:
        """The first time ``s`` meets the target: when, and after how many env steps."""
        if self.at is None and self.solved(s):
            self.at = time.monotonic()
            self.seconds = round(self.at - process_start() + self._seconds_before, 2)
            self.env_steps = s["num_steps_sampled"]

    def on_report(self, s: Mapping[str, Any]) -> None:
        """Each report (a row of metrics.csv): the best mean, the target, and from the
        target on, the return it watched (``return_min_after_target`` is their lowest)."""
        self.note_best(s)
        self.note_target(s)
        if self.at is not None:
            self.returns_after.append(self.watched_return(s))

    def stop(self, s: Mapping[str, Any]) -> bool:
        """Reached, and trained ``--train-after-target`` seconds since. `Impala.train` calls
        it between reports too, so the target is noted when it is met, not at the next
        report."""
        self.note_target(s)
        return self.at is not None and time.monotonic() - self.at >= self.train_after_target

    def resume(self, rows: list[dict[str, str]], seconds_before: float) -> None:
        """A resumed run's watch, from the metrics.csv rows it kept (``time_total_s`` up to
        ``seconds_before``, the checkpoint's): its best mean, and the target if it was
        reached (its seconds are then the run's ``time_total_s``)."""
        self._seconds_before = seconds_before
        for row in rows:
            s = _row_stats(row)
            self.note_best(s)
            if self.at is None and self.solved(s):
                self.seconds, self.env_steps = s["time_total_s"], int(s["num_steps_sampled"])
                self.at = time.monotonic() - max(0.0, seconds_before - s["time_total_s"])
            elif self.at is not None:
                self.returns_after.append(self.watched_return(s))


def _row_stats(row: Mapping[str, str]) -> dict[str, Any]:
    """The figures `TargetWatch` reads, from a metrics.csv row (text; NaN where empty)."""
    s: dict[str, Any] = {k: csv_number(row.get(k)) for k in (
        "episode_return_mean", "episode_return_count", "time_total_s", "num_steps_sampled")}
    s["evaluation"] = {k.split(".", 1)[1]: csv_number(v) for k, v in row.items()
                       if k.startswith("evaluation.")}
    return s


def final_line(result: dict[str, Any], args: argparse.Namespace, out: Path,
               interrupted: bool = False, unwritten: Mapping[str, str] | None = None) -> str:
    """The one line ``train`` ends with: was the target reached, and if not, what the health
    monitor saw; where the results are, or which could not be written (``unwritten``: file
    -> reason)."""
    final = result["final"]
    seen = describe_seen(result.get("health"))
    last = final.get("episode_return_mean", math.nan)
    best = result.get("best_return_mean")
    returns = (f"best trailing mean {best:.1f}, last {last:.1f}" if best is not None
               else f"{final.get('episode_return_count', 0)} episodes, too few for a mean")
    elapsed = final.get("time_total_s", 0.0)
    prefix = "impala-lab: interrupted: " if interrupted else "impala-lab: "
    if result["solved"]:
        which = "evaluation return" if result.get("stop_on") == "eval" else "mean return"
        text = (f"reached {which} {args.stop_return:g} in {result['seconds_to_target']:.1f} s "
                f"({result['env_steps_to_target']:,} env steps)")
        if args.train_after_target > 0:
            low = result["return_min_after_target"]
            text += (f", then trained {result['seconds_after_target']:.1f} s more (lowest mean "
                     f"return {low if low is not None else math.nan:.1f})")
    elif args.stop_return is not None:
        if interrupted:
            limit = f"before the interrupt at {elapsed:.1f} s"
        elif result["stop_reason"] == "max_env_steps":
            limit = f"within {args.max_env_steps:,} env steps"
        elif result["stop_reason"] == "max_seconds":
            limit = f"within {args.max_seconds:g} s"
        else:
            limit = f"in {elapsed:.1f} s"
        text = f"did NOT reach mean return {args.stop_return:g} {limit} ({returns})"
        seen = seen or "nothing wrong"
    else:
        text = (f"trained {elapsed:.1f} s, {final.get('num_steps_sampled', 0):,} env steps "
                f"(stop: {result['stop_reason']}); {returns}")
    if seen:
        text += f"; health monitor saw: {seen}"
    ev = final.get("evaluation")
    if ev and ev.get("num_evaluations"):
        from impala_lab.dashboard.markup import eval_figure

        modes = " / ".join(m for m in ("greedy", "sampled") if f"episode_return_mean_{m}" in ev)
        which = ("the final weights evaluated" if result.get("final_evaluation") == "done" else
                 f"the latest evaluation (weights version {ev.get('weights_version')})")
        text += f"; {which} ({modes}): {eval_figure(ev)}"
    return f"{prefix}{text}; {where(out, unwritten)}"


def where(out: Path, unwritten: Mapping[str, str] | None) -> str:
    """Where the results are; or which could not be written, and why."""
    if not unwritten:
        return f"results in {out}/"
    reasons = ", ".join(dict.fromkeys(unwritten.values()))
    return (f"could NOT write {', '.join(unwritten)} ({reasons}): {out}/ holds what was "
            "written before")
