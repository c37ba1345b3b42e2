"""Speed behind one door: what exists only to make a run start or go faster.

The reading path (docs/map.md) holds IMPALA alone; the measures here change how fast the same
computation runs, never what it computes, each kept for a measured gain (docs/performance.md).
``IMPALA_LAB_PLAIN=1`` turns them off (`enabled`).

- `compiled_policy.CompiledPolicy`: the train step called as a traced graph, the weights read
  in one op.
- `lean_imports.lean_imports`: under the ``impala-lab`` command, the TensorFlow import without
  the optional modules Keras imports where installed.
"""

from __future__ import annotations

import os

__all__ = ["enabled"]


def enabled() -> bool:
    """Whether the speed measures are on (they are unless ``IMPALA_LAB_PLAIN`` is set to a
    true value)."""
    return os.environ.get("IMPALA_LAB_PLAIN", "").strip().lower() in ("", "0", "false", "no")
