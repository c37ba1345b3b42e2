"""Statistics over seeds, as Agarwal et al. (2021) recommend: the interquartile mean (IQM:
robust to an outlier, yet using more runs than the median), its percentile bootstrap interval,
and the interval of a difference of two IQMs. Each bootstrap's generator is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
