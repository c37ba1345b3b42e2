"""The data behind the plots: a run's rows as columns over time, and where knobs changed.

Rows come from a live run's history (`impala_lab.stats.StatsHistory`, or its ``rows()``) or
from a run directory's ``metrics.csv`` (`read_metrics_csv`); `columns` turns either into float
arrays by flat key, decimated for long runs, and `knob_marks` finds the knob changes that the
plots mark. `impala_lab.dashboard.plots` draws them (and re-exports these names).

numpy only: no matplotlib.
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
    """Rows of a ``metrics.csv`` as dicts of floats (empty cells become NaN)."""
    rows = []
    with open(path, newline="") as fh:
        for raw in csv.DictReader(fh):
            row = {}
            for key, text in raw.items():
                try:
                    row[key] = float(text) if text not in ("", None) else math.nan
                except ValueError:
                    row[key] = math.nan
            rows.append(row)
    return rows


def column(rows: Sequence[Mapping], key: str) -> np.ndarray:
    """One key over the rows: ``[len(rows)]`` float64, NaN where a row lacks it."""
    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        v = r.get(key)
        if isinstance(v, int | float | np.number) and not isinstance(v, bool):
            out[i] = float(v)
    return out


class HasColumns(Protocol):
    """A source of whole columns by flat key, like `impala_lab.stats.StatsHistory`."""

    def column(self, key: str) -> np.ndarray: ...


def columns(source: Sequence[Mapping] | HasColumns, keys: Sequence[str],
            max_points: int = MAX_POINTS) -> dict[str, np.ndarray]:
    """The columns `keys` (plus ``time_total_s``) of rows or of a `StatsHistory`.

    Args:
      source: flat rows (``history.rows()``, ``read_metrics_csv``) or a `StatsHistory`.
      keys: flat keys such as ``"learner.total_loss"``.
      max_points: longer columns are decimated evenly to this many points, the last row
        always kept (a plot of a day-long run stays cheap).

    Returns:
      key -> ``[n]`` float64 array (NaN where a row lacks the key); all of one length.
    """
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


def _as_float(values: np.ndarray) -> np.ndarray:
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
