"""`LearnerThread`: trains the policy on batches from a bounded queue, in a background thread.

RLlib's structure: the driver puts train batches on ``inqueue`` (bounded by
learner_queue_size, so a slow learner slows the driver instead of eating memory); a
`MinibatchBuffer` serves each batch up to num_sgd_iter times; each learner step puts the
number of trained env steps on ``outqueue`` and sets the weights-updated flag so the driver
knows to broadcast. The driver reaches all three only through the `LearnerPort` calls
(``put_batch``, ``drain_trained``, ``take_weights_updated``; `impala_lab.learner.port`).

Two policy lags: the driver's when a batch arrives (``stats()["policy_lag"]``), and the
learner's each time it trains on the batch (``stats()["policy_lag_at_training"]``), larger by
the waits in the queue and the ring and by every pass.

A thread, so the driver keeps talking to the actors while TensorFlow (GIL released) runs the
update. ``step()`` can be called by hand (``Impala(config, start_learner=False)``). An
exception in the thread is raised in the driver's next step as a `LearnerError` naming the
stage, with its traceback.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from impala_lab.batch import policy_lag
from impala_lab.errors import LearnerError, NonFiniteLossError
from impala_lab.learner.minibatch_buffer import MinibatchBuffer
from impala_lab.learner.port import UpdateFlag
from impala_lab.stats import TimerStat, WindowStat


class LearnerThread(threading.Thread):
    """Background thread that updates the policy from sample batches (a `LearnerPort`).

    Args:
      policy: a `VTracePolicy` (anything with ``learn_on_batch(batch) -> dict``).
      minibatch_buffer_size, num_sgd_iter: the minibatch ring's slots and max ttl.
      learner_queue_size, learner_queue_timeout: the bound of ``inqueue``, and the seconds
        it may stay empty before an error.

    Attributes:
      last_train_metrics: the loss metrics of the latest update (``stats()["learner"]``).
      learner_queue_stat: ``inqueue``'s length after each of the last 50 steps.
      train_lag_stat: the mean policy lag of each of the last 100 batches trained on;
        max_train_lag: the largest column lag so far; recent_train_lags: the oldest column's
        lag in each of the last 1000 batches.
    """

    stage = "learner thread"

    def __init__(self, policy: Any, minibatch_buffer_size: int = 1, num_sgd_iter: int = 1,
                 learner_queue_size: int = 16, learner_queue_timeout: float = 300.0) -> None:
        super().__init__(name="impala-learner", daemon=True)
        self.policy = policy
        self.learner_queue_stat = WindowStat("size", 50)
        self.train_lag_stat = WindowStat("policy_lag_at_training", 100)
        self.max_train_lag = 0
        self.recent_train_lags: deque[int] = deque(maxlen=1000)
        self.inqueue: queue.Queue = queue.Queue(maxsize=learner_queue_size)
        self.outqueue: queue.Queue = queue.Queue()
        self.minibatch_buffer = MinibatchBuffer(self.inqueue, minibatch_buffer_size,
                                                num_sgd_iter, timeout=learner_queue_timeout)
        self.queue_timer = TimerStat()
        self.grad_timer = TimerStat()
        self.load_timer = TimerStat()
        self.load_wait_timer = TimerStat()
        self._weights_updated = UpdateFlag()  # set here after each update; the driver takes it
        self.last_train_metrics: dict[str, float] = {}
        # Called with every train step's stats, in this thread (the run's health monitor).
        self.on_train_step: Callable[[dict[str, float]], None] | None = None
        self.stopped = False
        self.num_steps = 0
        self.error: BaseException | None = None
        # How long one blocking wait lasts before the thread rechecks ``stopped``.
        self.poll_interval = 0.1

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        try:
            while not self.stopped:
                self.step(block_timeout=self.poll_interval)
        except BaseException as exc:  # kept for the driver: see raise_if_failed()
            self.error = self._wrap(exc)

    def _wrap(self, exc: BaseException) -> BaseException:
        if isinstance(exc, NonFiniteLossError):
            return exc
        return LearnerError(self.stage, f"{type(exc).__name__}: {exc}", traceback.format_exc())

    def step(self, block_timeout: float | None = None) -> bool:
        """One learner step: take a batch from the ring, train on it, report. True if a
        batch was trained on, False if none came within ``block_timeout`` seconds (None
        waits, up to learner_queue_timeout in all)."""
        try:
            with self.queue_timer:
                batch, _ = self.minibatch_buffer.get(block_timeout=block_timeout)
        except queue.Empty:
            return False
        self._record_train_lag(batch)
        with self.grad_timer:
            self.last_train_metrics = self.policy.learn_on_batch(batch)
        self._report_step(batch.count)
        return True

    def _record_train_lag(self, batch: Any) -> None:
        """The batch's policy lag now, before the update (only reads)."""
        versions = getattr(batch, "policy_versions", None)
        version = getattr(self.policy, "version", None)
        if versions is None or version is None or len(versions) == 0:
            return  # a stand-in policy or batch (tests, notebooks) without versions
        lag = policy_lag(version, versions)
        self.train_lag_stat.push(float(lag.mean()))
        self.max_train_lag = max(self.max_train_lag, int(lag.max()))
        self.recent_train_lags.append(int(lag.max()))

    def _report_step(self, count: int) -> None:
        """After an update: tell the driver (env steps trained) and the health monitor."""
        self._weights_updated.set()
        self.num_steps += 1
        self.outqueue.put(count)
        self.learner_queue_stat.push(self.inqueue.qsize())
        if self.on_train_step is not None:
            self.on_train_step(self.last_train_metrics)

    # ------------------------------------------------------------------ the driver's port
    def put_batch(self, batch: Any, timeout: float) -> bool:
        """Put a train batch on ``inqueue``; False if it stayed full for ``timeout`` s."""
        try:
            self.inqueue.put(batch, timeout=timeout)
        except queue.Full:
            return False
        return True

    def drain_trained(self) -> int:
        """The env steps of every update since the previous call (``outqueue``, emptied)."""
        trained = 0
        while True:
            try:
                trained += self.outqueue.get_nowait()
            except queue.Empty:
                return trained

    def take_weights_updated(self) -> bool:
        """Whether an update landed since the last take; clears the flag in the same step."""
        return self._weights_updated.take()

    @property
    def weights_updated(self) -> bool:
        """Whether an update landed since the driver last took the flag (read-only)."""
        return self._weights_updated.peek()

    @property
    def weights_version(self) -> int:
        """The policy's weights version (its applied updates)."""
        return int(self.policy.version)

    def get_weights(self) -> tuple[list, int]:
        """The policy's weights and their version (read together)."""
        return self.policy.get_weights()

    def raise_if_failed(self) -> None:
        """Raise the thread's exception (with its original traceback) in the caller."""
        if self.error is not None:
            raise self.error

    def set_num_sgd_iter(self, n: int) -> None:
        """Change the passes per batch between steps (the dashboard's knob)."""
        if int(n) < 1:
            raise ValueError(f"num_sgd_iter={n!r} is invalid: it must be >= 1")
        self.minibatch_buffer.num_sgd_iter = int(n)
        self.minibatch_buffer.cur_max_ttl = min(self.minibatch_buffer.cur_max_ttl, int(n))

    def data_wait_timer(self) -> TimerStat:
        """The timer of this learner's own wait for data (here: its dequeue)."""
        return self.queue_timer

    def timers(self) -> dict[str, TimerStat]:
        return {"learner_grad_time_ms": self.grad_timer,
                "learner_load_time_ms": self.load_timer,
                "learner_load_wait_time_ms": self.load_wait_timer,
                "learner_dequeue_time_ms": self.queue_timer}

    def stop(self, timeout: float = 10.0) -> None:
        self.stopped = True
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
