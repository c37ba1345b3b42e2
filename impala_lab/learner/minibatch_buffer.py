"""`MinibatchBuffer`: the learner's ring of recent train batches, each used several times.

With ``num_sgd_iter > 1`` the learner makes several passes over each train batch. Back to
back they would overfit one batch; RLlib keeps a ring of ``minibatch_buffer_size`` slots and
cycles through it, so passes over different batches interleave. Each slot holds an item and
its ttl (passes left); the ttl ramps up (the first item gets 1 pass, the next 2, ... up to
``num_sgd_iter``), so training starts at once.

Example, size 2, num_sgd_iter 3, items 0, 1, 2, ... from the queue; each `get` returns
``(item, released)``::

    (0, True) (1, False) (2, False) (1, True) (2, False) (3, False) (2, True) ...

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class LearnerQueueTimeout(TimeoutError):
    """The learner's input queue stayed empty for ``learner_queue_timeout`` seconds."""


def _check_int(name: str, value: Any, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: {fix}")


class MinibatchBuffer:
    """Ring buffer of recent items (train batches) for minibatch SGD, as in RLlib.

    Two timeouts: ``get(block_timeout=...)`` per call, so the learner thread waits in short
    slices and checks its stop flag (``queue.Empty``, the ring unchanged: call again); and
    `timeout` (``learner_queue_timeout``), the seconds blocked in `get` since the last item
    arrived, summed over calls: reaching it raises `LearnerQueueTimeout` (the actors stopped
    delivering). Time outside `get` does not count. With neither, `get` blocks as RLlib's.

    Attributes:
      inqueue: the queue items come from (``get(block, timeout)``); size: slots;
      num_sgd_iter: the most times an item is served (RLlib's ``max_ttl``); cur_max_ttl:
      the ttl the next fetched item gets; timeout: seconds, or None for no limit.
    """

    def __init__(self, inqueue: Any, size: int, num_sgd_iter: int,
                 timeout: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """An empty ring; ``clock`` (seconds) measures the waits in `get`."""
        _check_int("size", size, "the ring needs at least 1 slot; set minibatch_buffer_size >= 1")
        _check_int("num_sgd_iter", num_sgd_iter,
                   "each item must be served at least once; set num_sgd_iter >= 1")
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout={timeout!r} is invalid: learner_queue_timeout must be a "
                             f"positive number of seconds, or None to wait forever")
        self.inqueue = inqueue
        self.size = int(size)
        self.num_sgd_iter = int(num_sgd_iter)
        # The first batches are used few times each: the first updates do not all fit them.
        self.cur_max_ttl = 1
        self.timeout = timeout
        self.buffers: list[Any] = [None] * self.size
        self.ttl = [0] * self.size
        self.idx = 0
        self._waited = 0.0
        self._clock = clock
        self._lock = threading.Lock()  # makes slots() a consistent snapshot

    def get(self, block_timeout: float | None = None) -> tuple[Any, bool]:
        """Serves the item in the current slot, fetching a new one if the slot is empty.

        Args:
          block_timeout: seconds to block for a new item in this call (0: do not block),
            or None to block until an item arrives or `timeout` is reached.

        Returns:
          ``(item, released)``: `released` is True when this was the item's last pass and
          it has left the ring (the multi-device learner then recycles its buffer).

        Raises:
          queue.Empty: nothing arrived within `block_timeout`; the ring is unchanged.
          LearnerQueueTimeout: the queue stayed empty for `timeout` seconds of waiting.
        """
        if block_timeout is not None and not block_timeout >= 0:
            raise ValueError(f"block_timeout={block_timeout!r} is invalid: use seconds >= 0, "
                             f"or None to block")
        idx = self.idx
        fetched = self._fetch(block_timeout) if self.ttl[idx] <= 0 else None
        with self._lock:
            if self.ttl[idx] <= 0:
                self.buffers[idx] = fetched
                self.ttl[idx] = self.cur_max_ttl
                if self.cur_max_ttl < self.num_sgd_iter:
                    self.cur_max_ttl += 1
            item = self.buffers[idx]
            self.ttl[idx] -= 1
            released = self.ttl[idx] <= 0
            if released:
                self.buffers[idx] = None
            self.idx = (idx + 1) % self.size
        return item, released

    def _get_within(self, seconds: float | None) -> Any:
        if seconds is None:
            return self.inqueue.get()
        if seconds <= 0:
            return self.inqueue.get(block=False)
        return self.inqueue.get(timeout=seconds)

    def _fetch(self, block_timeout: float | None) -> Any:
        if self.timeout is None:
            return self._get_within(block_timeout)
        left = self.timeout - self._waited
        final = block_timeout is None or block_timeout >= left  # this wait may exhaust it
        start = self._clock()
        try:
            item = self._get_within(max(left, 0.0) if final else block_timeout)
        except queue.Empty:
            self._waited += self._clock() - start
            if final or self._waited >= self.timeout:
                self._waited = 0.0
                raise LearnerQueueTimeout(
                    f"learner queue stayed empty for {self.timeout} s (learner_queue_timeout): "
                    f"the actors are not producing samples fast enough, or died; raise "
                    f"learner_queue_timeout or check the workers") from None
            raise
        self._waited = 0.0
        return item

    def slots(self) -> list[tuple[bool, int]]:
        """``(occupied, ttl)`` per slot, slot 0 first: a snapshot for the dashboard."""
        with self._lock:
            return [(t > 0, t) for t in self.ttl]

    @property
    def next_index(self) -> int:
        """The slot the next `get` serves."""
        return self.idx
