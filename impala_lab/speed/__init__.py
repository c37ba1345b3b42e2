"""Speed behind one door: what exists only to make a run start or go faster.

The reading path (docs/map.md) holds IMPALA alone; the measures here change how fast the same
computation runs, never what it computes, each kept for a measured gain (docs/performance.md).
``IMPALA_LAB_PLAIN=1`` turns them off (`enabled`).

- `compiled_policy.CompiledPolicy`: the step as a traced graph (saves 0.25 s to 475) that reads
  the weights it leaves, broadcast without the learner's lock (0.72 s, 7ab927f's snapshot).
- `lean_imports.lean_imports`: the ``impala-lab`` command's TensorFlow import without Keras's
  optional modules (saves 0.84 s of the first train step, 1.16 s to 475).
- `freeze_before_exit`: the command's exit without the collector's passes over what
  TensorFlow left (saves 0.7 s of the exit).
"""

from __future__ import annotations

import gc
import os

__all__ = ["enabled", "freeze_before_exit"]


def enabled() -> bool:
    """Whether the speed measures are on (they are unless ``IMPALA_LAB_PLAIN`` is set to a
    true value)."""
    return os.environ.get("IMPALA_LAB_PLAIN", "").strip().lower() in ("", "0", "false", "no")


def freeze_before_exit() -> None:
    """`gc.freeze` as the ``impala-lab`` command returns: the interpreter's teardown collects
    cycles several times, and every pass would walk TensorFlow's millions of objects. Cycles
    still alive at exit are then not collected (the command has closed what it wrote)."""
    if enabled():
        gc.freeze()
