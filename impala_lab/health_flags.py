"""What the health flags are called, and a run's health said in words.

`impala_lab.driver.health.HealthMonitor` raises the flags; their labels and the words for
``stats()["health"]`` live here, so that the views read them without importing the driver.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Every flag code, with the short label the CLI and the dashboard show.
LABELS = {
    "entropy_collapsed": "entropy collapsed",
    "value_loss_spike": "value-loss spike",
    "grad_norm_spike": "gradient-norm spike",
    "updates_skipped": "non-finite updates skipped",
    "learner_starved": "learner starved",
    "learner_overfed": "learner overfed",
    "no_samples": "no samples",
    "worker_stalled": "worker stalled",
}


def flag_labels(health: Mapping[str, Any] | None) -> str:
    """The active flags as short labels, e.g. ``"entropy collapsed, value-loss spike"``;
    ``""`` when all is well (or there is no health dict)."""
    flags = (health or {}).get("flags") or []
    return ", ".join(LABELS.get(f.get("code"), str(f.get("code"))) for f in flags)


def flag_codes(health: Mapping[str, Any] | None) -> str:
    """The active flags' codes joined with ``;`` (the ``health.flags`` column of metrics.csv)."""
    return ";".join(str(f.get("code")) for f in (health or {}).get("flags") or [])


def describe_seen(health: Mapping[str, Any] | None) -> str:
    """What the monitor saw over the whole run, in first-seen order, e.g.
    ``"value-loss spike at 40 s (3 times), entropy collapsed at 41 s"``; ``""`` if nothing."""
    seen = (health or {}).get("seen") or {}
    parts = []
    for code, entry in sorted(seen.items(), key=lambda kv: kv[1].get("first_s", math.inf)):
        first = entry.get("first_s")
        when = f" at {first:.0f} s" if isinstance(first, int | float) and math.isfinite(first) \
            else ""
        times = entry.get("times", 1)
        parts.append(f"{LABELS.get(code, code)}{when}" + (f" ({times} times)" if times > 1 else ""))
    return ", ".join(parts)
