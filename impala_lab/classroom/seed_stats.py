"""Statistics over seeds, as Agarwal et al. (2021) recommend: the interquartile mean (IQM:
robust to an outlier, yet using more runs than the median), its percentile bootstrap interval,
and the interval of a difference of two IQMs. Each bootstrap's generator is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Bootstrap resamples for an interval: enough that its ends move by well under their width.
NUM_RESAMPLES = 5000


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """The mean after cutting floor(n / 4) values from each end (``trim_mean(x, 0.25)``)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    return float(_iqm_rows(x[None])[0]) if x.size else math.nan


def _iqm_rows(samples: np.ndarray) -> np.ndarray:
    """The IQM of each row of a [resamples, n] array."""
    x = np.sort(samples, axis=1)
    cut = x.shape[1] // 4
    return x[:, cut:x.shape[1] - cut].mean(axis=1)


def bootstrap_interval(values: Sequence[float], rng: np.random.Generator,
                       num_resamples: int = NUM_RESAMPLES) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the IQM of ``values`` (NaN, NaN for none)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    picks = rng.integers(0, x.size, size=(num_resamples, x.size))
    return _interval95(_iqm_rows(x[picks]))


def _interval95(stats: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(low), float(high)


def difference_interval(a: Sequence[float], b: Sequence[float], rng: np.random.Generator,
                        num_resamples: int = NUM_RESAMPLES,
                        paired: bool = False) -> tuple[float, float, float]:
    """IQM(a) - IQM(b), and the 95% bootstrap interval of that difference.

    Unpaired: each side is resampled on its own (two groups of runs). Paired: ``a[i]`` and
    ``b[i]`` belong to the same run, and the runs are resampled together.
    """
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if paired and x.size != y.size:
        raise ValueError(f"paired figures need one value per run on both sides, got {x.size} "
                         f"and {y.size}")
    if x.size == 0 or y.size == 0:
        return math.nan, math.nan, math.nan
    px = rng.integers(0, x.size, size=(num_resamples, x.size))
    py = px if paired else rng.integers(0, y.size, size=(num_resamples, y.size))
    low, high = _interval95(_iqm_rows(x[px]) - _iqm_rows(y[py]))
    return iqm(x) - iqm(y), low, high


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
