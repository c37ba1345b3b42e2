"""The dashboard's HTML (inline CSS only): pure functions of a stats snapshot."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from impala_lab.dashboard.format import fmt_count, fmt_float, fmt_knob, fraction
from impala_lab.dashboard.labels import LABELS, queue_figures
from impala_lab.health_flags import LABELS as HEALTH_LABELS
from impala_lab.health_flags import describe_seen

GREEN, ORANGE, RED, GREY = "#2e9e44", "#e67e22", "#c0392b", "#7f8c8d"
BLUE = "#1f77b4"


def box_actions(action_space: Any) -> bool:
    """Whether a run's action space is a gymnasium ``Box`` (a Gaussian policy)."""
    from gymnasium import spaces

    return isinstance(action_space, spaces.Box)


def eval_figure(evaluation: Mapping[str, Any] | None) -> str:
    """The eval card's figure: ``"off"``, or the returns played (greedy / sampled)."""
    if evaluation is None:
        return "off"
    return " / ".join(fmt_float(evaluation[f"episode_return_mean_{mode}"])
                      for mode in ("greedy", "sampled")
                      if f"episode_return_mean_{mode}" in evaluation)


# card name (a CSS class) -> (the flat key of its figure and its LABELS key, its format)
CARDS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "sample_throughput": ("sample_throughput", lambda v: f"{fmt_count(v)}/s"),
    "train_throughput": ("train_throughput", lambda v: f"{fmt_count(v)}/s"),
    "episode_return_mean": ("episode_return_mean", fmt_float),
    "evaluation": ("evaluation", eval_figure),
    "num_steps_sampled": ("num_steps_sampled", fmt_count),
    "weights_version": ("weights_version", lambda v: f"v{v or 0}"),
    "policy_lag": ("policy_lag.mean", lambda v: fmt_float(v, 2)),
    "policy_lag_at_training": ("policy_lag_at_training.mean", lambda v: fmt_float(v, 2)),
    "time_total_s": ("time_total_s", lambda v: f"{v or 0.0:,.0f} s"),
    "action_mean": ("learner.action_mean", fmt_float),  # BOX_CARDS: a Gaussian policy's
    "action_std": ("learner.action_std", fmt_float),
}
#: The cards a dashboard shows only for a run whose action space is a Box.
BOX_CARDS = ("action_mean", "action_std")


# run state -> (the header's status text, its colour)
STATES = {
    "training": ("● training", GREEN),
    "train": ("● training: train() holds this cell", GREEN),
    "paused": ("❚❚ paused", ORANGE),
    "stopped": ("■ stopped", GREY),
    "failed": ("✖ training failed", RED),
    "gone": ("■ the run was garbage-collected", GREY),
}


def _escape(text: str) -> str:
    return escape(text, quote=False)


def header_html(title: str, stats: Mapping[str, Any] | None, state: str) -> str:
    """The title, the backend and workers (once known) and the run's state (`STATES`)."""
    label, color = STATES[state]
    p = (stats or {}).get("pipeline") or {}
    detail = (f" · {p.get('backend', '?')} backend · {p.get('num_workers', '?')} workers"
              if p else "")
    return (f'<div style="font-size:20px"><b>{title}</b>{detail} '
            f'<span class="impala-status impala-status-{state}" '
            f'style="color:{color};font-weight:bold;margin-left:12px">{label}</span></div>')


def health_html(health: Mapping[str, Any] | None) -> str:
    """A badge per active health flag with its sentence, else "ok" (and earlier flags)."""
    if not health:
        return ""
    flags = health.get("flags") or []
    if not flags:
        seen = describe_seen(health)
        earlier = (f' <span style="color:#555">(earlier: {_escape(seen)})</span>'
                   if seen else "")
        return (f'<div class="impala-health-ok" style="font-size:14px;color:{GREEN}">'
                f"✓ learning health: ok{earlier}</div>")
    rows = []
    for flag in flags:
        code = str(flag.get("code"))
        label = HEALTH_LABELS.get(code, code)
        rows.append(
            f'<div class="impala-health-flag impala-health-{code.replace("_", "-")}" '
            f'style="font-size:14px;margin:2px 0"><span class="impala-health-badge" '
            f'style="background:{ORANGE};color:white;font-weight:bold;border-radius:4px;'
            f'padding:1px 8px;margin-right:8px">⚠ {_escape(label)}</span>'
            f'{_escape(str(flag.get("message", "")))}</div>')
    return f'<div class="impala-health-warning">{"".join(rows)}</div>'


def card_html(name: str, stats: Mapping[str, Any]) -> str:
    """One headline card of `CARDS`: its label over its figure."""
    key, figure = CARDS[name]
    value: Any = stats
    for part in key.split("."):  # the flat key's value in the nested snapshot
        value = value.get(part) if isinstance(value, Mapping) else None
    return (f'<div style="line-height:1.15"><div style="font-size:13px;color:#555">'
            f'{LABELS[key].name}</div><div style="font-size:24px;font-weight:bold">'
            f"{figure(value)}</div></div>")


def gauge_text(name: str, level: float, capacity: float) -> str:
    """The figure beside a gauge: ``"5 / 16"``, or ``"off"`` for a replay without slots."""
    text = "off" if name == "replay" and capacity <= 0 else f"{level:.0f} / {capacity:.0f}"
    return f'<span style="font-size:15px">{text}</span>'


def gauge_color(name: str, frac: float) -> str:
    """The learner queue's gauge: green, orange (nearly full), red (full); the others blue."""
    if name != "learner_queue":
        return BLUE
    return GREEN if frac < 0.75 else (ORANGE if frac < 1 else RED)


def gauges(stats: Mapping[str, Any]) -> dict[str, tuple[float, str, str]]:
    """Every queue gauge of a snapshot: name -> (fill in [0, 1], colour, `gauge_text`)."""
    out = {}
    for name, (level, capacity) in queue_figures(stats).items():
        frac = fraction(level, capacity)
        out[name] = (frac, gauge_color(name, frac), gauge_text(name, level, capacity))
    return out


def bottleneck_html(stats: Mapping[str, Any]) -> str:
    """Which side waits, read off the learner queue's mean fill over its last steps."""
    q = stats.get("learner_queue") or {}
    size = queue_figures(stats)["learner_queue"][1]
    mean = q.get("mean", math.nan)
    if not q.get("count") or size <= 0 or not math.isfinite(mean):
        hint = "learner queue: no learner step yet"
    elif mean / size >= 0.75:
        hint = ("learner queue mostly full: the <b>learner</b> is the bottleneck "
                "(actors wait for it)")
    elif mean / size <= 0.1:
        hint = ("learner queue mostly empty: the learner waits for data "
                "(the <b>actors</b> are the bottleneck)")
    else:
        hint = "learner queue partly full: actors and learner are balanced"
    return f'<span style="font-size:14px">{hint}</span>'


def message_html(*, error: BaseException | None = None, blocking_train: bool = False,
                 replay_off: bool = False, note: str = "", note_error: bool = False) -> str:
    """The line under the controls: a training error, ``train()`` holding the cell, replay
    off, or the last button's or knob's note (the first that applies)."""
    if error is not None:
        text = (f"background training failed: {type(error).__name__}: {error}. "
                "impala.wait() raises it with its traceback.")
        return f'<span style="color:{RED};font-size:14px">{_escape(text)}</span>'
    if blocking_train:
        return ('<span style="font-size:14px">train() holds this cell: the buttons and '
                "knobs wake up when it returns. Interrupt the kernel to end it early; "
                "impala.start() trains in the background with live controls.</span>")
    if replay_off and not note:
        return ('<span style="font-size:14px;color:#555">replay_proportion is off: the '
                "run has no replay slots (replay_buffer_num_slots=0)</span>")
    color = RED if note_error else "#333"
    return f'<span style="font-size:14px;color:{color}">{_escape(note)}</span>'


def knob_log_html(changes: Sequence[Mapping[str, Any]]) -> str:
    """The last five knob changes (``Impala.knob_changes``), newest first; "" if none."""
    changes = list(changes)[-5:]
    if not changes:
        return ""
    items = "".join(
        f"<li>{c.get('time_s', 0.0):.1f} s, step {fmt_count(c.get('num_steps_sampled'))}: "
        f"{_escape(str(c.get('knob')))} = {_escape(fmt_knob(c.get('value')))}</li>"
        for c in reversed(changes))
    return (f'<div style="font-size:14px"><b>knob changes</b> (newest first)'
            f'<ul style="margin:2px 0">{items}</ul></div>')


def section_title(text: str) -> str:
    """A group's title: ``queues``, ``controls``."""
    return f'<b style="font-size:16px">{text}</b>'


def gauge_label(text: str) -> str:
    """The name left of a gauge."""
    return f'<span style="font-size:15px">{text}</span>'
