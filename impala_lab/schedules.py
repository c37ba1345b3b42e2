"""Piecewise-linear schedules over env steps (``lr_schedule``: the IMPALA paper's linearly
annealed learning rate): ``(env_steps, value)`` points, strictly increasing env steps,
interpolated between them and flat outside (RLlib's ``PiecewiseSchedule``, the last value its
``outside_value``): ``((0, 0.003), (2_000_000, 0.0))`` anneals to 0 over 2M env steps.
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
from collections.abc import Sequence
from typing import Any

from impala_lab.errors import ConfigError

__all__ = ["check_schedule", "scheduled_value"]

Schedule = Sequence[tuple[int, float]]


def check_schedule(name: str, points: Any) -> None:
    """Raise `ConfigError` (naming the field, the value and the fix) unless ``points`` is a
    non-empty list of ``(env_steps, value)`` pairs: env steps integers >= 0, strictly
    increasing; values finite and >= 0."""
    fix = (f"give [(env_steps, value), ...] with env steps >= 0 and increasing and values "
           f">= 0, e.g. [(0, 0.003), (2000000, 0.0)] (on the command line "
           f"--{name.replace('_', '-')} 0:0.003,2000000:0), or None")
    ok = isinstance(points, Sequence) and not isinstance(points, str) and len(points) > 0
    for p in points if ok else ():
        ok = ok and (isinstance(p, Sequence) and len(p) == 2
                     and isinstance(p[0], numbers.Integral) and not isinstance(p[0], bool)
                     and isinstance(p[1], numbers.Real) and not isinstance(p[1], bool)
                     and p[0] >= 0 and math.isfinite(p[1]) and p[1] >= 0)
    if ok and any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        raise ConfigError(f"{name}={points!r} is invalid: its env steps must increase "
                          f"strictly from point to point; {fix}")
    if not ok:
        raise ConfigError(f"{name}={points!r} is invalid: {fix}")


def scheduled_value(points: Schedule, t: float) -> float:
    """The schedule's value at ``t`` env steps (see the module docstring)."""
    steps = [p[0] for p in points]
    k = bisect.bisect_right(steps, t)
    if k == 0:
        return float(points[0][1])
    if k == len(points):
        return float(points[-1][1])
    (t0, v0), (t1, v1) = points[k - 1], points[k]
    return float(v0 + (v1 - v0) * (t - t0) / (t1 - t0))


def parse_schedule(text: str) -> tuple[tuple[int, float], ...]:
    """``"0:0.003,2e6:0"`` as ``((0, 0.003), (2000000, 0.0))``; ValueError if it is not."""
    points = []
    for part in text.replace(" ", "").split(","):
        steps, value = part.split(":")
        t = float(steps)
        if not t.is_integer():
            raise ValueError(part)
        points.append((int(t), float(value)))
    return tuple(points)
