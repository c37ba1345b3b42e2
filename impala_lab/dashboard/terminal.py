"""The dashboard's text view: the same figures as the widgets, for a terminal or a log.

`render(stats)` returns a few lines (at most 100 columns) that follow the data's way through
the pipeline; `progress_line(stats)` is one line for logs; `TerminalView` redraws the panel in
place in a TTY (the CLI's live view) and prints one line per report elsewhere. The dashboard's
``show()`` prints `render` when there is no notebook frontend.

Both show the learning-health monitor's active flags (``stats()["health"]``) when there are
any: the line ends with ``health: entropy collapsed, ...``, the panel has a ``health`` line.
A report window in which no sample reached the driver (``num_steps_sampled`` did not move
since the previous report; none yet at the first) says so: ``NO SAMPLES since the last report
(12.0 s since the last sample)``, or ``NO SAMPLES yet (3.0 s)`` (`TerminalView` compares the
snapshots).

Pure Python on purpose: no numpy, no matplotlib, no ipywidgets, so the CLI stays quick to
start and this module is safe to import anywhere.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from impala_lab.health import flag_labels

# Short labels of stats()["timing_breakdown"] keys (milliseconds), in pipeline order.
TIMER_LABELS = {
    "optimizer_step_time_ms": "driver step",
    "batch_concat_time_ms": "concat",
    "broadcast_time_ms": "broadcast",
    "learner_dequeue_time_ms": "dequeue",
    "learner_load_time_ms": "load",
    "learner_load_wait_time_ms": "load wait",
    "learner_grad_time_ms": "grad",
}
LEARNER_LABELS = {
    "total_loss": "total loss",
    "policy_loss": "policy loss",
    "vf_loss": "value loss",
    "entropy": "entropy",
    "grad_gnorm": "grad norm",
    "mean_rho": "mean rho",
    "vf_explained_var": "vf explained var",
}
_TIMER_SHORT = {"optimizer_step_time_ms": "step", "batch_concat_time_ms": "concat",
                "broadcast_time_ms": "bcast", "learner_dequeue_time_ms": "dequeue",
                "learner_load_time_ms": "load", "learner_load_wait_time_ms": "wait",
                "learner_grad_time_ms": "grad"}
_LEARNER_SHORT = {"total_loss": "loss", "policy_loss": "pi", "vf_loss": "vf",
                  "entropy": "ent", "grad_gnorm": "gnorm", "mean_rho": "rho",
                  "vf_explained_var": "expl.var"}


# ---------------------------------------------------------------------- number formats
def is_number(value: Any) -> bool:
    """True for a finite int or float (bool excluded)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def fmt_count(value: Any) -> str:
    """``22400`` -> ``"22,400"``; anything that is not a finite number -> ``"–"``."""
    return f"{round(value):,}" if is_number(value) else "–"


def fmt_float(value: Any, digits: int = 3) -> str:
    """About `digits` significant digits: ``33.93`` -> ``"33.9"``, ``6266.5`` -> ``"6,266"``,
    ``0.00012`` -> ``"1.20e-04"``; anything that is not a finite number -> ``"–"``."""
    if not is_number(value):
        return "–"
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:,.{decimals}f}"


def fmt_knob(value: Any) -> str:
    """Knob values as a person types them: ``0.0005`` -> ``"0.0005"``, ``2`` -> ``"2"``."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def fraction(part: Any, whole: Any) -> float:
    """``part / whole`` clipped to [0, 1]; 0.0 when either is missing or ``whole <= 0``."""
    if not (is_number(part) and is_number(whole)) or whole <= 0:
        return 0.0
    return min(max(part / whole, 0.0), 1.0)


def nice_ceil(v: float) -> float:
    """The smallest 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten that is >= v."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    exp = math.floor(math.log10(v))
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * 10**exp >= v * (1 - 1e-12):
            return m * 10**exp
    return 10 ** (exp + 1)


def bar(frac: float, width: int = 10) -> str:
    """A text gauge: ``bar(0.4, 10)`` -> ``"[####······]"``."""
    filled = round(min(max(frac, 0.0), 1.0) * width)
    return "[" + "#" * filled + "·" * (width - filled) + "]"


# ---------------------------------------------------------------------- derived figures
def queue_figures(stats: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """``(level, capacity)`` of every buffer the gauges show, from ``stats()["pipeline"]``.

    Keys: ``in_flight`` (sample requests in flight over all workers), ``replay`` (batches
    stored for replay), ``batch_buffer`` (env steps waiting to be concatenated),
    ``learner_queue`` (train batches waiting for the learner), ``minibatch`` (occupied slots
    of the learner's minibatch ring). A stage the run does not report gives ``(0, 0)``.
    """
    p = stats.get("pipeline") or {}
    in_flight = p.get("in_flight") or {}
    slots = p.get("minibatch_slots") or []
    return {
        "in_flight": (float(sum(in_flight.values())),
                      float(p.get("num_workers", 0) * p.get("max_in_flight", 0))),
        "replay": (float(p.get("replay_stored", 0)), float(p.get("replay_capacity", 0))),
        "batch_buffer": (float(p.get("batch_buffer_steps", 0)),
                         float(p.get("train_batch_size", 0))),
        "learner_queue": (float(p.get("learner_queue_len", 0)),
                          float(p.get("learner_queue_size", 0))),
        "minibatch": (float(sum(1 for occupied, _ in slots if occupied)), float(len(slots))),
    }


# ---------------------------------------------------------------------- the views
def no_samples_note(s: Mapping[str, Any]) -> str:
    """What a report window without a sample says, with the seconds since the last one:
    ``NO SAMPLES yet (3.0 s)`` before the first, else ``NO SAMPLES since the last report
    (12.0 s since the last sample)``."""
    since = s.get("seconds_since_sample")
    if not s.get("num_steps_sampled"):
        return "NO SAMPLES yet" + (f" ({since:.1f} s)" if is_number(since) else "")
    return "NO SAMPLES since the last report" + (
        f" ({since:.1f} s since the last sample)" if is_number(since) else "")


def progress_line(s: Mapping[str, Any], no_samples: bool = False) -> str:
    """One line: time, env steps, return, throughputs, learner queue, policy lag, the health
    flags when there are any, and `no_samples_note` when ``no_samples``."""
    q = queue_figures(s)["learner_queue"]
    lag = (s.get("policy_lag") or {}).get("mean", math.nan)
    ret = s.get("episode_return_mean", math.nan)
    flags = flag_labels(s.get("health"))
    return (f"{s.get('time_total_s', 0.0):7.1f}s  steps {fmt_count(s.get('num_steps_sampled')):>9}"
            f"  return {ret if is_number(ret) else math.nan:7.1f}"
            f"  sample {fmt_count(s.get('sample_throughput')):>8}/s"
            f"  train {fmt_count(s.get('train_throughput')):>8}/s"
            f"  queue {q[0]:>2.0f}/{q[1]:.0f}  lag {lag if is_number(lag) else math.nan:.1f}"
            + (f"  {no_samples_note(s)}" if no_samples else "")
            + (f"  health: {flags}" if flags else ""))


def render(s: Mapping[str, Any], title: str = "", no_samples: bool = False) -> str:
    """The text dashboard (7 lines, <= 100 columns) of one ``Impala.stats()`` snapshot; 8 with
    a ``health`` line when the snapshot has a health key (every live run's has); 9 with
    `no_samples_note` under the first when ``no_samples``."""
    p = s.get("pipeline") or {}
    q = queue_figures(s)
    lag = s.get("policy_lag") or {}
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
        f"   weights v{s.get('weights_version', 0)}   policy lag "
        f"{fmt_float(lag.get('mean'), 2)} (max {lag.get('max', '–')})",
    ]
    in_flight = p.get("in_flight") or {}
    actors = " ".join(str(n) for n in list(in_flight.values())[:6])
    if len(in_flight) > 6:
        actors += " …"
    slots = p.get("minibatch_slots") or []
    ring = " ".join(f"{ttl}" if occ else "·" for occ, ttl in slots[:6])
    lines.append(
        f"pipeline    in flight [{actors or '–'}] > replay {q['replay'][0]:.0f}/"
        f"{q['replay'][1]:.0f} > buffer {q['batch_buffer'][0]:.0f}/{q['batch_buffer'][1]:.0f}"
        f" > queue {bar(fraction(*q['learner_queue']), 8)} {q['learner_queue'][0]:.0f}/"
        f"{q['learner_queue'][1]:.0f} > ring [{ring}]")
    timing = s.get("timing_breakdown") or {}
    lines.append("timing ms   " + "  ".join(
        f"{label} {fmt_float(timing.get(key), 2)}" for key, label in _TIMER_SHORT.items()
        if key in timing))
    learner = s.get("learner") or {}
    lines.append("learner     " + ("  ".join(
        f"{label} {fmt_float(learner.get(key), 3)}" for key, label in _LEARNER_SHORT.items()
        if key in learner) if learner else "no learner step yet"))
    knobs = s.get("knobs") or {}
    lines.append("knobs       " + " ".join(f"{k}={fmt_knob(v)}" for k, v in knobs.items()))
    health = s.get("health")
    if health is not None:  # always present in a live run: the panel keeps its height
        flags = flag_labels(health)
        lines.append("health      " + (f"WARNING: {flags}" if flags else "ok"))
    return "\n".join(line[:100] for line in lines)


class TerminalView:
    """The CLI's live view: redraws `render` in place in a TTY, else one line per report.

    Args:
      stream: where to write (stdout by default).
      title: the first line's label, e.g. ``"CartPole-v1 (process, 2 workers)"``.
      live: redraw in place; None decides by ``stream.isatty()``.
    """

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
        text = render(stats, self.title, idle)
        # Move up over the previous panel and clear each line, so nothing scrolls.
        up = f"\x1b[{self._drawn_lines}F" if self._drawn_lines else ""
        self.stream.write(up + "".join(f"\x1b[2K{line}\n" for line in text.split("\n")))
        self.stream.flush()
        self._drawn_lines = text.count("\n") + 1

    def close(self) -> None:
        """Leave the last panel on screen; later output starts below it."""
        self._drawn_lines = 0
