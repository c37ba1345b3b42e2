"""Summaries of one figure over a bench's runs: the verdict of a difference's interval, the area
under a learning curve, a figure's IQM with its interval, median, worst and best, the median of
paired differences with its interval, and the Wilson interval of a solve rate. The IQM and its
bootstrap are the course's (`impala_lab.classroom.seed_stats`); these serve only the benches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from impala_lab.classroom.seed_stats import bootstrap_interval, iqm


def verdict(low: float, high: float, names: tuple[str, str] = ("A", "B")) -> str:
    """"A better" when the interval lies above 0, "B better" below, else "inconclusive"."""
    if low > 0:
        return f"{names[0]} better"
    if high < 0:
        return f"{names[1]} better"
    return "inconclusive"


def area_under_curve(xs: Sequence[float], ys: Sequence[float], budget: float) -> float:
    """The step curve's mean height over [0, budget]: each value held until the next, the
    first also before it, the last until the budget (a run that stopped at its target is not
    penalised); NaN when no value is finite."""
    x = np.asarray(xs, np.float64)
    y = np.asarray(ys, np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x <= budget)
    x, y = x[keep], y[keep]
    if x.size == 0 or not budget > 0:
        return math.nan
    edges = np.concatenate([[0.0], x[1:], [budget]])
    return float(np.sum(y * np.diff(edges)) / budget)


def summarize(values: Sequence[float], rng: np.random.Generator,
              solve_return: float | None = None, solved: Sequence[bool] | None = None
              ) -> dict[str, Any]:
    """n, IQM and its interval, median, worst and best of one figure over runs."""
    x = np.asarray([v for v in values if math.isfinite(v)], np.float64)
    low, high = bootstrap_interval(x, rng)
    out: dict[str, Any] = {"n": len(values), "n_finite": int(x.size), "iqm": iqm(x),
                           "ci95": [low, high],
                           "median": float(np.median(x)) if x.size else math.nan,
                           "worst": float(x.min()) if x.size else math.nan,
                           "best": float(x.max()) if x.size else math.nan}
    if solved is not None:
        out["solved"] = int(sum(bool(s) for s in solved))
        out["solve_return"] = solve_return
    return out


def median_difference(diff: np.ndarray, rng: np.random.Generator, draws: int = 5000
                      ) -> tuple[float, list[float]]:
    """The median of paired differences [n] and its percentile-bootstrap 95% interval."""
    resampled = np.median(rng.choice(diff, (draws, len(diff))), axis=1)
    return float(np.median(diff)), [float(v) for v in np.percentile(resampled, [2.5, 97.5])]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% for the default z) of a rate ``successes / n``, (0, 1)
    for n = 0: unlike the normal approximation it stays in [0, 1] and is not of width zero at
    5 of 5."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)
