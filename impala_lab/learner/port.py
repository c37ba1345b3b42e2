"""`LearnerPort`: everything the driver may ask of a learner, and the flag it takes.

The driver (`impala_lab.driver.driver_loop.DriverLoop`) and the learner run in different
threads and share, only through these calls: train batches (``put_batch`` on a bounded queue,
False while it stays full: back-pressure), what was trained (``drain_trained``), and that the
weights changed (an `UpdateFlag` the learner sets and the driver takes, read and cleared in
one locked step, so an update that lands during a broadcast is never lost); plus the weights
(``get_weights``, ``weights_version``) and the thread's health (``raise_if_failed``,
``is_alive``). `LearnerThread` and `MultiGPULearner` implement it; a test can drive the loop
with any object that has these members.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class LearnerPort(Protocol):
    """The learner as the driver sees it (see the module docstring)."""

    def put_batch(self, batch: Any, timeout: float) -> bool:
        """Queue a train batch; False if the queue was still full after ``timeout`` s."""
        ...

    def drain_trained(self) -> int:
        """Env steps trained since the previous call (0 if none)."""
        ...

    def take_weights_updated(self) -> bool:
        """True once per batch of updates: whether the weights changed since the last take."""
        ...

    @property
    def weights_version(self) -> int:
        """The learner's weights version now (its number of applied updates)."""
        ...

    def get_weights(self) -> tuple[list, int]:
        """The current weights (numpy arrays) and their version, read together."""
        ...

    def raise_if_failed(self) -> None:
        """Raise the learner's error, if it failed."""
        ...

    def is_alive(self) -> bool:
        """Whether a thread consumes the queue (False before ``start()`` and after a stop)."""
        ...


class UpdateFlag:
    """A flag that one side sets and the other takes, read and cleared under one lock (a
    plain attribute would lose an update landing between the driver's read and clear)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False

    def set(self) -> None:
        """The owner's side: the weights changed."""
        with self._lock:
            self._set = True

    def take(self) -> bool:
        """Whether the flag was set since the last take; clears it."""
        with self._lock:
            was_set, self._set = self._set, False
            return was_set

    def peek(self) -> bool:
        """Whether the flag is set, without taking it (for display only)."""
        return self._set
