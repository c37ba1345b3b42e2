"""The data behind the plots (numpy only): rows of a history or a ``metrics.csv`` as float
columns by flat key, and where the knobs changed.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from impala_lab.dashboard.format import fmt_knob
from impala_lab.knobs import LIVE_KNOBS, cast

X_KEY = "time_total_s"
MAX_POINTS = 600  # points drawn per line: longer runs are decimated evenly


def read_metrics_csv(path: str | Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` as dicts of floats (cells that are not numbers become NaN)."""
    with open(path, newline="") as fh:
        return [{key: _to_float(text) for key, text in raw.items()}
                for raw in csv.DictReader(fh)]


def _to_float(text: str | None) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def column(rows: Sequence[Mapping], key: str) -> np.ndarray:
    """One key over the rows: ``[len(rows)]`` float64, NaN where a row lacks it."""
    return _as_float([r.get(key) for r in rows])


class HasColumns(Protocol):
    """A source of whole columns by flat key, like `impala_lab.stats.StatsHistory`."""

    def column(self, key: str) -> np.ndarray: ...


def columns(source: Sequence[Mapping] | HasColumns, keys: Sequence[str],
            max_points: int = MAX_POINTS) -> dict[str, np.ndarray]:
    """``{key: [n] float64}`` (NaN where a row lacks the key) of `keys` and ``time_total_s``,
    from flat rows or a `StatsHistory`; longer columns are decimated evenly to `max_points`,
    the last row kept."""
    keys = list(dict.fromkeys([X_KEY, *keys]))
    if hasattr(source, "column") and not isinstance(source, Sequence):
        cols = {}
        for k in keys:
            values = source.column(k)
            cols[k] = values if values.dtype == np.float64 else _as_float(values)
    else:
        cols = {k: column(source, k) for k in keys}
    n = len(cols[X_KEY])
    if n > max_points:
        idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
        cols = {k: v[idx] for k, v in cols.items()}
    return cols


def _as_float(values: Sequence[object]) -> np.ndarray:
    """Numbers as float64, anything else (None, text, a bool) as NaN."""
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if isinstance(v, int | float | np.number) and not isinstance(v, bool):
            out[i] = float(v)
    return out


#: The live knobs' columns in ``metrics.csv`` (and the history's flat rows).
KNOB_KEYS = tuple(f"knobs.{name}" for name in LIVE_KNOBS)


def knob_marks(cols: Mapping[str, np.ndarray]) -> list[tuple[float, str]]:
    """``(time, "lr=0.001")`` wherever a ``knobs.*`` column changed from the previous row."""
    t = cols[X_KEY]
    changes: dict[int, list[str]] = {}
    for key in KNOB_KEYS:
        col = cols.get(key)
        if col is None or len(col) < 2:
            continue
        prev, cur = col[:-1], col[1:]
        for i in np.flatnonzero(np.isfinite(prev) & np.isfinite(cur) & (prev != cur)) + 1:
            name = key.split(".", 1)[1]
            changes.setdefault(int(i), []).append(f"{name}={fmt_knob(cast(name, col[i]))}")
    return [(float(t[i]), ", ".join(labels)) for i, labels in sorted(changes.items())
            if np.isfinite(t[i])]
