"""The pipeline diagram: an SVG of the data's way through IMPALA (actors, task pool, replay
mixer, batch buffer, learner queue, minibatch ring, learner, the weight broadcast back), each
stage with its figures from one ``Impala.stats()`` snapshot. An arrow that data crossed since
the previous drawing is dark and its dashes march; an idle one is grey. A stalled worker is
red. Tests and custom CSS find parts by their ``impala-...`` classes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from html import escape
from typing import Any

from impala_lab.dashboard.format import fmt_count, fmt_float, fmt_knob, fraction, nice_ceil
from impala_lab.dashboard.labels import TIMER_COLORS, TIMERS, queue_figures
from impala_lab.dashboard.markup import gauge_color

WIDTH, HEIGHT = 1180, 290
BOX_Y, BOX_H = 30, 182
FONT = "'DejaVu Sans', 'Helvetica Neue', Arial, sans-serif"
# (key, title, x, width, colour), left to right.
STAGES = (
    ("actors", "actors", 8, 160, "#1f77b4"),
    ("pool", "task pool", 196, 128, "#138d9c"),
    ("replay", "replay mixer", 352, 140, "#8e44ad"),
    ("buffer", "batch buffer", 520, 136, "#d35400"),
    ("queue", "learner queue", 684, 160, "#c0392b"),
    ("ring", "minibatch ring", 872, 140, "#7b5a3a"),
    ("learner", "learner", 1040, 132, "#218a3b"),
)
WHERE = {key: (x, w, color) for key, _, x, w, color in STAGES}
# Which counter moves each arrow: (from stage, to stage, flow name).
EDGES = (
    ("actors", "pool", "sample"),
    ("pool", "replay", "sample"),
    ("replay", "buffer", "mix"),
    ("buffer", "queue", "batch"),
    ("queue", "ring", "train"),
    ("ring", "learner", "train"),
)
FLOWS = ("sample", "mix", "batch", "train", "broadcast")
STALLED_COLOR = "#c0392b"
DASH_PERIOD = 16  # stroke-dasharray "10 6"


def flow_counters(stats: Mapping[str, Any]) -> dict[str, float]:
    """The cumulative counter behind each flow (an arrow moves when its counter grew)."""
    p = stats.get("pipeline") or {}
    return {
        "sample": float(stats.get("num_steps_sampled", 0)),
        "mix": float(stats.get("num_steps_sampled", 0) + stats.get("num_steps_replayed", 0)),
        "batch": float(p.get("num_train_batches", 0)),
        "train": float(stats.get("num_steps_trained", 0)),
        "broadcast": float(stats.get("num_broadcasts", 0)),
    }


class PipelineDiagram:
    """Draws successive snapshots as SVG, remembering the last to animate the arrows."""

    def __init__(self) -> None:
        self._previous: dict[str, float] | None = None
        self.phase = dict.fromkeys(FLOWS, 0)

    def render(self, stats: Mapping[str, Any]) -> str:
        """The SVG of `stats`; arrows whose counter grew since the last call march."""
        counters = flow_counters(stats)
        flowing = {name: self._previous is not None and counters[name] > self._previous[name]
                   for name in FLOWS}
        for name, moved in flowing.items():
            self.phase[name] += moved
        self._previous = counters
        return pipeline_svg(stats, flowing=flowing, phase=self.phase)


# ---------------------------------------------------------------------- SVG pieces
def _text(x: float, y: float, s: str, *, size: int = 13, weight: str = "normal",
          color: str = "#222", anchor: str = "middle", cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" '
            f'fill="{color}" text-anchor="{anchor}"{c}>{escape(s)}</text>')


def _bar(x: float, y: float, w: float, frac: float, color: str, cls: str) -> str:
    fill = max(0.0, min(frac, 1.0)) * w
    return (f'<g class="{cls}"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="12" '
            f'rx="3" fill="#e6e6e6"/><rect x="{x:.1f}" y="{y:.1f}" width="{fill:.1f}" '
            f'height="12" rx="3" fill="{color}"/></g>')


def _box(key: str, title: str, x: float, w: float, color: str) -> str:
    y, h = BOX_Y, BOX_H
    header = (f"M{x},{y + 30} V{y + 8} Q{x},{y} {x + 8},{y} H{x + w - 8} "
              f"Q{x + w},{y} {x + w},{y + 8} V{y + 30} Z")
    return (f'<g class="impala-stage impala-stage-{key}">'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="#ffffff" '
            f'stroke="{color}" stroke-width="2.5"/><path d="{header}" fill="{color}"/>'
            + _text(x + w / 2, y + 21, title, size=15, weight="bold", color="#ffffff")
            + "</g>")


def _edge(x1: float, x2: float, y: float, flowing: bool, phase: int, cls: str) -> str:
    color = "#333333" if flowing else "#b5b5b5"
    offset = -(phase * 4) % DASH_PERIOD
    state = " impala-edge-flowing" if flowing else ""
    return (f'<line class="impala-edge impala-edge-{cls}{state}" x1="{x1}" y1="{y}" '
            f'x2="{x2}" y2="{y}" stroke="{color}" stroke-width="3" stroke-dasharray="10 6" '
            f'stroke-dashoffset="{offset}" marker-end="url(#impala-arrow-'
            f'{"on" if flowing else "off"})"/>')


def _actors(x: float, w: float, color: str, s: Mapping[str, Any]) -> list[str]:
    p = s.get("pipeline") or {}
    in_flight = p.get("in_flight") or {}
    most = int(p.get("max_in_flight", 0))
    stalled = {str(w.get("index")): w for w in s.get("workers") or () if w.get("stalled")}
    out = []
    # Stalled workers first, so the four rows of a large run still show them.
    workers = sorted(in_flight.items(), key=lambda item: str(item[0]) not in stalled)
    shown = workers if len(workers) <= 5 else workers[:4]
    for row, (idx, n) in enumerate(shown):
        y = BOX_Y + 54 + 21 * row
        stall = stalled.get(str(idx))
        out.append(_text(x + 12, y + 5, f"w{idx}", size=13, anchor="start",
                         weight="bold" if stall else "normal",
                         color=STALLED_COLOR if stall else "#222"))
        if stall is not None:
            seconds = fmt_count(stall.get("seconds_since_sample"))
            out.append(_text(x + 50, y + 5, f"stalled {seconds} s", size=13, weight="bold",
                             anchor="start", color=STALLED_COLOR, cls="impala-worker-stalled"))
        elif most <= 6:
            for j in range(most):
                filled = color if j < n else "#ffffff"
                out.append(f'<circle cx="{x + 52 + 17 * j}" cy="{y}" r="6.5" fill="{filled}" '
                           f'stroke="{color}" stroke-width="2"/>')
        else:
            out.append(_text(x + 50, y + 5, f"{n} / {most} in flight", anchor="start"))
    if len(workers) > len(shown):
        out.append(_text(x + 12, BOX_Y + 54 + 21 * 4 + 5, f"+{len(workers) - 4} more workers",
                         anchor="start"))
    if not workers:
        out.append(_text(x + w / 2, BOX_Y + 70, "no workers", color="#777"))
    out.append(_text(x + w / 2, BOX_Y + BOX_H - 32, f"{fmt_count(s.get('sample_throughput'))}/s",
                     size=16, weight="bold", cls="impala-sample-rate"))
    out.append(_text(x + w / 2, BOX_Y + BOX_H - 11,
                     f"env steps {fmt_count(s.get('num_steps_sampled'))}", size=13,
                     cls="impala-count-sampled"))
    return out


def _figure_box(x: float, w: float, color: str, big: str, lines: list[str],
                frac: float | None, cls: str) -> list[str]:
    """A stage that is one big figure, caption lines and an optional fill bar."""
    out = [_text(x + w / 2, BOX_Y + 64, big, size=22, weight="bold", cls=cls)]
    for i, line in enumerate(lines):
        out.append(_text(x + w / 2, BOX_Y + 88 + 19 * i, line, color="#444"))
    if frac is not None:
        out.append(_bar(x + 12, BOX_Y + BOX_H - 24, w - 24, frac, color, cls + "-bar"))
    return out


def _cells(x: float, w: float, top: float, n: int, cell: int, gap: int,
           per_row: int) -> list[tuple[float, float]]:
    """The corners of ``n`` square cells in rows of ``per_row``, centred in ``[x, x + w]``."""
    x0 = x + (w - (min(n, per_row) * (cell + gap) - gap)) / 2
    return [(x0 + (i % per_row) * (cell + gap), top + (i // per_row) * (cell + gap))
            for i in range(n)]


def _queue(x: float, w: float, s: Mapping[str, Any]) -> list[str]:
    level, size = queue_figures(s)["learner_queue"]
    frac = fraction(level, size)
    mean = (s.get("learner_queue") or {}).get("mean", math.nan)
    out = [_text(x + w / 2, BOX_Y + 62, f"{level:.0f} / {size:.0f}", size=22, weight="bold",
                 cls="impala-learner-queue"),
           _text(x + w / 2, BOX_Y + 82, "train batches waiting", color="#444")]
    if 0 < size <= 24:  # one cell per queue slot, filled up to the queue's length
        for i, (cx, cy) in enumerate(_cells(x, w, BOX_Y + 94, int(size), 15, 3, 8)):
            fill = gauge_color("learner_queue", frac) if i < level else "#eeeeee"
            out.append(f'<rect x="{cx:.1f}" y="{cy}" width="15" height="15" rx="2" '
                       f'fill="{fill}" stroke="#999" stroke-width="0.8"/>')
    else:
        out.append(_bar(x + 12, BOX_Y + 100, w - 24, frac, gauge_color("learner_queue", frac),
                        "impala-learner-queue-bar"))
    out.append(_text(x + w / 2, BOX_Y + BOX_H - 10, f"mean {fmt_float(mean, 2)} (last 50)",
                     color="#444"))
    return out


def _ring(x: float, w: float, color: str, s: Mapping[str, Any]) -> list[str]:
    p = s.get("pipeline") or {}
    slots = p.get("minibatch_slots") or []
    out = []
    if 0 < len(slots) <= 8:
        corners = _cells(x, w, BOX_Y + 44, len(slots), 28, 6, 4)
        for (occupied, ttl), (cx, cy) in zip(slots, corners):
            fill = "#e8d9c8" if occupied else "#ffffff"
            out.append(f'<rect class="impala-slot" x="{cx:.1f}" y="{cy}" width="28" '
                       f'height="28" rx="4" fill="{fill}" stroke="{color}" stroke-width="2"/>')
            out.append(_text(cx + 14, cy + 19, str(ttl) if occupied else "·", size=14,
                             weight="bold", color=color))
    else:
        used = sum(1 for occupied, _ in slots if occupied)
        out.append(_text(x + w / 2, BOX_Y + 64, f"{used} / {len(slots)}", size=22,
                         weight="bold"))
    out.append(_text(x + w / 2, BOX_Y + 128, "ttl: passes left", color="#444"))
    out.append(_text(x + w / 2, BOX_Y + 148, f"num_sgd_iter = {p.get('num_sgd_iter', '–')}",
                     color="#444"))
    return out


def _learner(x: float, w: float, s: Mapping[str, Any]) -> list[str]:
    grad = (s.get("timing_breakdown") or {}).get("learner_grad_time_ms", math.nan)
    return [
        _text(x + w / 2, BOX_Y + 64, f"v{s.get('weights_version', 0)}", size=24,
              weight="bold", cls="impala-weights-version"),
        _text(x + w / 2, BOX_Y + 86, "weights version", color="#444"),
        _text(x + w / 2, BOX_Y + 124, f"{fmt_count(s.get('train_throughput'))}/s", size=16,
              weight="bold", cls="impala-train-rate"),
        _text(x + w / 2, BOX_Y + 144, "env steps trained", color="#444"),
        _text(x + w / 2, BOX_Y + BOX_H - 12, f"grad {fmt_float(grad, 3)} ms", color="#444"),
    ]


def _replay(x: float, w: float, color: str, stats: Mapping[str, Any]) -> list[str]:
    level, cap = queue_figures(stats)["replay"]
    if cap <= 0:
        return _figure_box(x, w, color, "off",
                           ["no replay slots", "(new batches", "pass through)"], None,
                           "impala-replay")
    knobs = stats.get("knobs") or {}
    return _figure_box(x, w, color, f"{level:.0f} / {cap:.0f}",
                       ["batches stored", f"p = {fmt_knob(knobs.get('replay_proportion', '–'))}",
                        f"{fmt_count(stats.get('num_steps_replayed'))} replayed"],
                       fraction(level, cap), "impala-replay")


def _stages(stats: Mapping[str, Any]) -> list[str]:
    p = stats.get("pipeline") or {}
    q = queue_figures(stats)
    parts = [_box(key, title, x, w, color) for key, title, x, w, color in STAGES]
    parts += _actors(*WHERE["actors"], stats)
    level, cap = q["in_flight"]
    parts += _figure_box(*WHERE["pool"], f"{level:.0f} / {cap:.0f}", ["requests", "in flight"],
                         fraction(level, cap), "impala-in-flight")
    parts += _replay(*WHERE["replay"], stats)
    level, cap = q["batch_buffer"]
    parts += _figure_box(*WHERE["buffer"], f"{level:.0f} / {cap:.0f}",
                         ["env steps", f"{fmt_count(p.get('num_train_batches'))} batches out"],
                         fraction(level, cap), "impala-batch-buffer")
    parts += _queue(*WHERE["queue"][:2], stats)
    parts += _ring(*WHERE["ring"], stats)
    parts += _learner(*WHERE["learner"][:2], stats)
    return parts


def _edges(flowing: Mapping[str, bool], phase: Mapping[str, int]) -> list[str]:
    """The arrows between neighbouring stages, at mid height."""
    mid = BOX_Y + BOX_H / 2
    return [_edge(WHERE[src][0] + WHERE[src][1] + 3, WHERE[dst][0] - 5, mid,
                  flowing.get(flow, False), phase.get(flow, 0), flow)
            for src, dst, flow in EDGES]


def _broadcast(stats: Mapping[str, Any], on: bool, phase: int) -> list[str]:
    """The weight broadcast back to the actors, with its counters and the policy lag."""
    color = "#218a3b" if on else "#9fc9a9"
    lx = WHERE["learner"][0] + WHERE["learner"][1] / 2
    ax = WHERE["actors"][0] + WHERE["actors"][1] / 2
    by = BOX_Y + BOX_H + 34
    offset = -(phase * 4) % DASH_PERIOD
    parts = [f'<path class="impala-edge impala-edge-broadcast'
             f'{" impala-edge-flowing" if on else ""}" d="M{lx},{BOX_Y + BOX_H + 2} '
             f'V{by} H{ax} V{BOX_Y + BOX_H + 8}" fill="none" stroke="{color}" '
             f'stroke-width="3" stroke-dasharray="10 6" stroke-dashoffset="{offset}"/>',
             f'<path d="M{ax - 7},{BOX_Y + BOX_H + 12} L{ax},{BOX_Y + BOX_H + 2} '
             f'L{ax + 7},{BOX_Y + BOX_H + 12} Z" fill="{color}"/>']
    p = stats.get("pipeline") or {}
    lag = stats.get("policy_lag") or {}
    knobs = stats.get("knobs") or {}
    interval = knobs.get("broadcast_interval", p.get("broadcast_interval", "–"))
    label = (f"weight broadcast: v{stats.get('weights_version', 0)} · "
             f"{fmt_count(stats.get('num_broadcasts'))} broadcasts · "
             f"every {interval} returned samples · "
             f"{fmt_count(stats.get('num_weight_syncs'))} syncs")
    mid_x = (ax + lx) / 2
    half = 4.6 * len(label) + 12  # about half the label's width at 15 px bold
    parts.append(f'<rect x="{mid_x - half:.0f}" y="{by - 13}" width="{2 * half:.0f}" '
                 f'height="26" fill="#fbfbfb"/>')
    parts.append(_text(mid_x, by + 6, label, size=15, weight="bold", color="#1d6b30",
                       cls="impala-broadcast"))
    trained = stats.get("policy_lag_at_training") or {}
    parts.append(_text(mid_x, by + 32,
                       f"policy lag {fmt_float(lag.get('mean'), 2)} updates "
                       f"(max {lag.get('max', '–')}) at the driver, "
                       f"{fmt_float(trained.get('mean'), 2)} (max {trained.get('max', '–')}) "
                       f"when trained on",
                       size=14, color="#333", cls="impala-policy-lag"))
    return parts


def pipeline_svg(stats: Mapping[str, Any], *, flowing: Mapping[str, bool] | None = None,
                 phase: Mapping[str, int] | None = None) -> str:
    """The diagram of one ``Impala.stats()`` snapshot as an ``<svg>`` that scales to the
    cell's width (missing parts draw empty). ``flowing``: flow name (`FLOWS`) -> whether its
    arrow moves; ``phase``: flow name -> its dash offset step."""
    flowing = flowing or {}
    phase = phase or {}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="impala-pipeline" width="100%" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" '
        f'style="max-width:{WIDTH}px; background:#fbfbfb">',
        "<defs>",
        *(f'<marker id="impala-arrow-{state}" markerWidth="8" markerHeight="8" refX="6" '
          f'refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 Z" fill="{c}"/></marker>'
          for state, c in (("on", "#333333"), ("off", "#b5b5b5"))),
        "</defs>",
        *_stages(stats),
        *_edges(flowing, phase),
        *_broadcast(stats, flowing.get("broadcast", False), phase.get("broadcast", 0)),
        "</svg>",
    ]
    return "".join(parts)


def timing_svg(stats: Mapping[str, Any], width: int = 560) -> str:
    """The timing breakdown (mean ms) as horizontal bars on a round scale."""
    timing = stats.get("timing_breakdown") or {}
    rows = [(key, label.name, float(timing.get(key) or 0.0)) for key, label in TIMERS.items()
            if key in timing] or [(key, label.name, 0.0) for key, label in TIMERS.items()]
    scale = nice_ceil(max(1.0, max(v for _, _, v in rows) * 1.15))
    left, right, row_h, top = 110, 64, 26, 34
    bar_w = width - left - right
    height = top + row_h * len(rows) + 8
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="impala-timing" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" font-family="{FONT}">',
             _text(4, 20, "timing breakdown (mean ms per call)", size=15, weight="bold",
                   anchor="start"),
             _text(width - 4, 20, f"scale 0-{scale:g} ms", size=12, color="#666",
                   anchor="end")]
    for i, (key, label, value) in enumerate(rows):
        y = top + i * row_h
        w = bar_w * min(value / scale, 1.0)
        parts.append(_text(left - 8, y + 16, label, size=14, anchor="end"))
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{bar_w}" height="18" '
                     f'fill="#f0f0f0"/><rect x="{left}" y="{y + 3}" width="{w:.1f}" '
                     f'height="18" fill="{TIMER_COLORS[i % len(TIMER_COLORS)]}"/>')
        parts.append(_text(left + w + 6, y + 17, fmt_float(value, 3), size=13,
                           anchor="start", cls=f"impala-timer-{key.replace('_', '-')}"))
    parts.append("</svg>")
    return "".join(parts)
