"""The dashboard's text view for a terminal or a log: `render` (the panel, <= 100 columns),
`progress_line` (one line) and `TerminalView` (the CLI's: the panel redrawn in place in a TTY,
else a line per report). Pure Python, so the CLI starts quickly.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from impala_lab.dashboard.format import bar, fmt_count, fmt_float, fmt_knob, fraction, is_number
from impala_lab.dashboard.labels import ACTIONS, LEARNER, QUEUES, TIMERS, Label, queue_figures
from impala_lab.dashboard.markup import eval_figure
from impala_lab.health_flags import flag_labels


# ---------------------------------------------------------------------- the views
def no_samples_note(s: Mapping[str, Any]) -> str:
    """What a report window without a sample says, e.g. ``NO SAMPLES yet (3.0 s)``."""
    since = s.get("seconds_since_sample")
    if not s.get("num_steps_sampled"):
        return "NO SAMPLES yet" + (f" ({since:.1f} s)" if is_number(since) else "")
    return "NO SAMPLES since the last report" + (
        f" ({since:.1f} s since the last sample)" if is_number(since) else "")


def progress_line(s: Mapping[str, Any], no_samples: bool = False) -> str:
    """One line: time, env steps, return, throughputs, learner queue, policy lag, the latest
    evaluation, the health flags, and `no_samples_note` if ``no_samples``."""
    q = queue_figures(s)["learner_queue"]
    lag = (s.get("policy_lag") or {}).get("mean", math.nan)
    ret = s.get("episode_return_mean", math.nan)
    flags = flag_labels(s.get("health"))
    return (f"{s.get('time_total_s', 0.0):7.1f}s  steps {fmt_count(s.get('num_steps_sampled')):>9}"
            f"  return {ret if is_number(ret) else math.nan:7.1f}"
            f"  sample {fmt_count(s.get('sample_throughput')):>8}/s"
            f"  train {fmt_count(s.get('train_throughput')):>8}/s"
            f"  queue {q[0]:>2.0f}/{q[1]:.0f}  lag {lag if is_number(lag) else math.nan:.1f}"
            + (f"  eval {eval_figure(s['evaluation'])}" if "evaluation" in s else "")
            + (f"  {no_samples_note(s)}" if no_samples else "")
            + (f"  health: {flags}" if flags else ""))


def _pipeline_line(s: Mapping[str, Any]) -> str:
    """The queues in the data's order: ``in flight [2 1 0] > replay 14/20 > ... > ring [2 ·]``."""
    p = s.get("pipeline") or {}
    q = queue_figures(s)
    in_flight = p.get("in_flight") or {}
    actors = " ".join(str(n) for n in list(in_flight.values())[:6])
    if len(in_flight) > 6:
        actors += " …"
    slots = p.get("minibatch_slots") or []
    ring = " ".join(f"{ttl}" if occ else "·" for occ, ttl in slots[:6])

    def fill(name: str) -> str:
        return f"{q[name][0]:.0f}/{q[name][1]:.0f}"

    stages = [f"{QUEUES['in_flight'].short} [{actors or '–'}]",
              f"{QUEUES['replay'].short} {fill('replay')}",
              f"{QUEUES['batch_buffer'].short} {fill('batch_buffer')}",
              f"{QUEUES['learner_queue'].short} {bar(fraction(*q['learner_queue']), 8)} "
              f"{fill('learner_queue')}",
              f"{QUEUES['minibatch'].short} [{ring}]"]
    return "pipeline    " + " > ".join(stages)


def _figures(labels: Mapping[str, Label], values: Mapping[str, Any], digits: int) -> str:
    """``short value`` of each figure of `labels` that `values` holds."""
    return "  ".join(f"{label.short} {fmt_float(values[key], digits)}"
                     for key, label in labels.items() if key in values)


def render(s: Mapping[str, Any], title: str = "", no_samples: bool = False) -> str:
    """The text dashboard (7 lines, <= 100 columns) of one ``Impala.stats()`` snapshot, with
    ``health``, ``actions`` (Box actions) and `no_samples_note` lines where they apply."""
    p = s.get("pipeline") or {}
    lag = s.get("policy_lag") or {}  # at the driver; ``trained``: when the learner trains
    trained = s.get("policy_lag_at_training") or {}
    head = title or f"IMPALA ({p.get('backend', '?')}, {p.get('num_workers', '?')} workers)"
    lines = [
        f"{head}   {s.get('time_total_s', 0.0):.1f} s   env steps "
        f"{fmt_count(s.get('num_steps_sampled'))}   "
        f"trained {fmt_count(s.get('num_steps_trained'))}",
        *([f"            {no_samples_note(s)}"] if no_samples else []),
        f"throughput  sample {fmt_count(s.get('sample_throughput'))}/s   "
        f"train {fmt_count(s.get('train_throughput'))}/s   "
        f"replayed {fmt_count(s.get('num_steps_replayed'))} steps",
        f"return      {fmt_float(s.get('episode_return_mean'))} (mean of last "
        f"{s.get('episode_return_count', 0)}, {fmt_count(s.get('episodes_total'))} episodes)"
        f"   weights v{s.get('weights_version', 0)}   lag "
        f"{fmt_float(lag.get('mean'), 2)} (max {lag.get('max', '–')}), trained at "
        f"{fmt_float(trained.get('mean'), 2)}",
        _pipeline_line(s),
        "timing ms   " + _figures(TIMERS, s.get("timing_breakdown") or {}, 2),
    ]
    learner = s.get("learner") or {}
    lines.append("learner     " + (_figures(LEARNER, learner, 3) if learner
                                   else "no learner step yet"))
    if any(key in learner for key in ACTIONS):  # a Box-action run's Gaussian policy
        lines.append("actions     " + _figures(ACTIONS, learner, 3))
    knobs = s.get("knobs") or {}
    lines.append("knobs       " + " ".join(f"{k}={fmt_knob(v)}" for k, v in knobs.items()))
    health = s.get("health")
    if health is not None:  # always present in a live run: the panel keeps its height
        flags = flag_labels(health)
        lines.append("health      " + (f"WARNING: {flags}" if flags else "ok"))
    return "\n".join(line[:100] for line in lines)


class TerminalView:
    """The CLI's live view on `stream` (stdout): `render` redrawn in place if `live` (None:
    ``stream.isatty()``), else one line per report."""

    def __init__(self, stream: TextIO | None = None, title: str = "",
                 live: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.title = title
        self.live = self.stream.isatty() if live is None else live
        self._drawn_lines = 0
        self._last_sampled: Any = None

    def update(self, stats: Mapping[str, Any]) -> None:
        """Show one snapshot; say so if no sample arrived since the previous one."""
        sampled = stats.get("num_steps_sampled")
        idle = sampled == (0 if self._last_sampled is None else self._last_sampled)
        self._last_sampled = sampled
        if not self.live:
            self.stream.write(progress_line(stats, idle) + "\n")
            self.stream.flush()
            return
        text = self.panel(stats, idle)
        # Move up over the previous panel and clear each line, so nothing scrolls.
        up = f"\x1b[{self._drawn_lines}F" if self._drawn_lines else ""
        self.stream.write(up + "".join(f"\x1b[2K{line}\n" for line in text.split("\n")))
        self.stream.flush()
        self._drawn_lines = text.count("\n") + 1

    def panel(self, stats: Mapping[str, Any], no_samples: bool) -> str:
        """The text redrawn in a TTY (a subclass may add lines: the CLI's progress bar)."""
        return render(stats, self.title, no_samples)

    def close(self) -> None:
        """Leave the last panel on screen; later output starts below it."""
        self._drawn_lines = 0
