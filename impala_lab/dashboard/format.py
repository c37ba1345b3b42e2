"""How every view of the dashboard writes numbers; anything that is not a finite number
(None, NaN) shows as ``"–"``. Pure Python (the CLI imports it).
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"


def is_number(value: Any) -> bool:
    """True for a finite int or float (bool excluded)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def fmt_count(value: Any) -> str:
    """``22400`` -> ``"22,400"``; anything that is not a finite number -> ``"–"``."""
    return f"{round(value):,}" if is_number(value) else MISSING


def fmt_float(value: Any, digits: int = 3) -> str:
    """About `digits` significant digits: ``33.93`` -> ``"33.9"``, ``6266.5`` -> ``"6,266"``,
    ``0.00012`` -> ``"1.20e-04"``; anything that is not a finite number -> ``"–"``."""
    if not is_number(value):
        return MISSING
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:,.{decimals}f}"


def fmt_knob(value: Any) -> str:
    """Knob values as a person types them: ``0.0005`` -> ``"0.0005"``, ``2`` -> ``"2"``."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def fraction(part: Any, whole: Any) -> float:
    """``part / whole`` clipped to [0, 1]; 0.0 when either is missing or ``whole <= 0``."""
    if not (is_number(part) and is_number(whole)) or whole <= 0:
        return 0.0
    return min(max(part / whole, 0.0), 1.0)


def nice_ceil(v: float) -> float:
    """The smallest 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten >= v."""
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
