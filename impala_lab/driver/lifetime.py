"""How a run ends: the registry of live runs, each run's finalizer, the exit hook.

Apart from `impala_lab.driver.impala` so that ``impala_lab.shutdown_all()`` never needs
TensorFlow.
"""

from __future__ import annotations

import atexit
import math
import weakref
from collections.abc import Callable
from typing import Any

# Every run not yet stopped (weakly: a dropped run is ended by its finalizer, not kept here).
live_runs: weakref.WeakSet[Any] = weakref.WeakSet()

# How long a cleanup first waits for the learner thread to end before it ends the workers.
LEARNER_STOP_WAIT_S = 2.0
# How long the last cleanup waits for a learner inside a train step (a first one traces).
LEARNER_EXIT_WAIT_S = 120.0


def shutdown_all() -> None:
    """Stop every `Impala` run of this process (workers, learner thread, Ray)."""
    for run in list(live_runs):
        run.stop()


atexit.register(shutdown_all)


def cleanup(backend: Any, learner: Any) -> None:
    """End a run's learner thread and its workers (the run's finalizer: it must not hold the
    `Impala` object, or the run could never be collected)."""
    try:
        learner.stop(timeout=LEARNER_STOP_WAIT_S)
    finally:
        try:
            backend.shutdown()
        finally:
            # At interpreter exit a thread still inside TensorFlow crashes the process.
            learner.stop(timeout=LEARNER_EXIT_WAIT_S)


def run_clock(ref: weakref.ref) -> Callable[[], float]:
    """The run's elapsed seconds, without holding the run (the learner outlives it in the
    finalizer, and the health monitor it feeds must not keep the run alive)."""
    def clock() -> float:
        run = ref()
        return run.elapsed_s if run is not None else math.nan

    return clock
