"""Speed behind one door: what exists only to make a run start or go faster.

The reading path (docs/map.md) holds IMPALA alone; the measures here change how fast the same
computation runs, never what it computes. Each one earned its place by a side-by-side
measurement (docs/performance.md has the table, with intervals); a measure that saved under
0.1 s was removed instead. `enabled` is the switch: ``IMPALA_LAB_PLAIN=1`` in the environment
runs the plain reading-path code everywhere (the bench measures the door that way).

- `compiled_policy.CompiledPolicy`: the learner's policy with its train step called as a
  traced graph (no tf.function dispatch per step) and its weights read in one op.
- `lean_imports.lean_imports`: under the ``impala-lab`` command, the learner's TensorFlow
  import without the optional modules Keras imports where installed (matplotlib, pandas,
  scipy, h5py, ...).
"""

from __future__ import annotations

import os

__all__ = ["enabled"]


def enabled() -> bool:
    """Whether the speed measures are on (they are unless ``IMPALA_LAB_PLAIN`` is set to a
    true value)."""
    return os.environ.get("IMPALA_LAB_PLAIN", "").strip().lower() in ("", "0", "false", "no")
