"""The policy-lag histogram (``stats()["policy_lag_distribution"]``) as SVG: each batch's lag
when it reached the driver (dropped ones too) and when the learner trained on it, on one axis,
with ``extra_policy_lag`` dashed and ``max_policy_lag`` (the drop limit) red.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from impala_lab.dashboard.diagram import FONT, _text
from impala_lab.dashboard.format import fmt_count

SERIES = (("at_arrival", "at arrival", "#1f77b4"), ("at_training", "at training", "#d35400"))


def _fractions(counts: Mapping[str, int]) -> dict[int, float]:
    total = sum(counts.values())
    return {int(k): v / total for k, v in counts.items()} if total else {}


def lag_histogram_svg(stats: Mapping[str, Any], width: int = 470) -> str:
    """The histogram as an SVG string: bars are fractions of each series' batches; lags
    beyond the axis (60 columns at most) go in its last column."""
    dist = stats.get("policy_lag_distribution") or {}
    knobs = stats.get("knobs") or {}
    extra, limit = knobs.get("extra_policy_lag"), knobs.get("max_policy_lag")
    series = {key: _fractions(dist.get(key) or {}) for key, _, _ in SERIES}
    largest = max([0, *(lag for f in series.values() for lag in f)])
    marks = [v for v in (extra, limit) if isinstance(v, int) and v <= 60]
    top_lag = min(60, max([largest, *marks]) + 1)
    left, right, top, plot_h = 40, 10, 40, 110
    plot_w = width - left - right
    height = top + plot_h + 34
    col = plot_w / (top_lag + 1)
    dropped = int(stats.get("num_samples_dropped_for_lag") or 0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="impala-lag-histogram" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'font-family="{FONT}">',
             _text(4, 18, "policy lag (learner updates behind)", size=15, weight="bold",
                   anchor="start"),
             _text(width - 4, 18, f"dropped {fmt_count(dropped)} env steps", size=12,
                   color="#c0392b" if dropped else "#666", anchor="end",
                   cls="impala-lag-dropped")]
    for i, (_, label, color) in enumerate(SERIES):
        parts.append(f'<rect x="{left + i * 110}" y="26" width="10" height="10" '
                     f'fill="{color}"/>')
        parts.append(_text(left + 14 + i * 110, 35, label, size=12, anchor="start"))
    peak = max([0.0, *(v for f in series.values() for v in f.values())]) or 1.0
    base = top + plot_h
    for i, (key, _, color) in enumerate(SERIES):
        folded: dict[int, float] = {}
        for lag, frac in series[key].items():
            folded[min(lag, top_lag)] = folded.get(min(lag, top_lag), 0.0) + frac
        for lag, frac in sorted(folded.items()):
            h = plot_h * frac / peak
            x = left + lag * col + i * col / 2
            parts.append(f'<rect class="impala-lag-{key.replace("_", "-")}-{lag}" '
                         f'x="{x:.1f}" y="{base - h:.1f}" width="{col / 2:.1f}" '
                         f'height="{h:.1f}" fill="{color}"/>')
    parts.append(f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" '
                 f'stroke="#888"/>')
    for tick in sorted({0, top_lag // 2, top_lag}):
        parts.append(_text(left + (tick + 0.5) * col, base + 14, str(tick), size=11,
                           color="#666"))
    for value, color, dash, name in ((extra, "#218a3b", "4,3", "extra_policy_lag"),
                                     (limit, "#c0392b", "", "max_policy_lag")):
        if not isinstance(value, int) or value > 60 or (name == "extra_policy_lag" and not value):
            continue
        x = left + (value + 1) * col if name == "max_policy_lag" else left + value * col
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="{color}" '
                     f'stroke-dasharray="{dash}"/>')
        parts.append(_text(x, base + 28, f"{name} {value}", size=11, color=color))
    parts.append("</svg>")
    return "".join(parts)
