"""`WorkerSupervisor`: the run's workers, when each last answered, and what a failure costs.

A worker that raises, dies, or owes a sample longer than ``sample_timeout_s`` is ended and
replaced by one with the next index (``restart_failed_workers=True``), or its error ends the
run. Restarts stop after ``max(3, 2 x num_workers)`` failures in a row without a sample, or
`MAX_REPEATED_WORKER_FAILURES` (at least 2 x num_workers) of the same failure (same env and
message, numbers blanked) within `REPEATED_FAILURE_WINDOW_S`, samples or not in between.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from typing import Any

from impala_lab.backends.base import WorkerHandle
from impala_lab.driver.health import stalled_after_s
from impala_lab.errors import ImpalaError, WorkerError

MAX_REPEATED_WORKER_FAILURES = 20
REPEATED_FAILURE_WINDOW_S = 600.0
#: How often (at most) the driver looks for workers past ``sample_timeout_s``.
LIVENESS_CHECK_PERIOD_S = 0.5
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")

logger = logging.getLogger("impala_lab")


class WorkerSupervisor:
    """Starts, watches and replaces the run's workers (on ``backend``; their requests in
    flight are in ``tasks``, the `SampleTaskPool`).

    Attributes:
      workers: the live worker handles, in start order.
      num_worker_failures: failures so far (each one replaced, or the last one raised).
      sampling_since: liveness counts from here (``train()`` restarts it: a run built long
        ago has not been idle).
    """

    def __init__(self, config: Any, backend: Any, tasks: Any) -> None:
        self.config = config
        self.backend = backend
        self.tasks = tasks
        self.workers: list[WorkerHandle] = []
        self.num_worker_failures = 0
        self.sampling_since = time.monotonic()
        self._failures_in_a_row = 0
        # (env, message with numbers blanked) -> times it happened in the window
        self._repeated_failures: dict[tuple[str, str], deque[float]] = {}
        # worker index -> [started, last sample reached the driver (None: none yet), samples]
        self._clocks: dict[int, list] = {}
        self._last_sample_at: float | None = None
        self._next_liveness_check = 0.0
        self._next_worker_index = config.num_workers

    def start_workers(self) -> list[WorkerHandle]:
        """Start ``num_workers`` workers (indices 0, 1, ...); their requests are the caller's."""
        self.workers = [self.backend.make_worker(i) for i in range(self.config.num_workers)]
        for worker in self.workers:
            self._clocks[worker.index] = [time.monotonic(), None, 0]
        return self.workers

    def sample_returned(self, worker: WorkerHandle) -> None:
        """A sample of ``worker`` reached the driver: its liveness clock, and no failure run."""
        now = time.monotonic()
        self._last_sample_at = now
        self._failures_in_a_row = 0
        clock = self._clocks.get(worker.index)
        if clock is not None:
            clock[1] = now
            clock[2] += 1

    def replace(self, err: WorkerError) -> WorkerHandle:
        """End the worker ``err`` names and start its replacement (requests: the caller's).
        Raises ``err`` with ``restart_failed_workers=False``, and an `ImpalaError` once the
        failures come back too often to be worth another restart."""
        self.num_worker_failures += 1
        self._failures_in_a_row += 1
        for worker in [w for w in self.workers if w.index == err.worker_index]:
            self.workers.remove(worker)
            self.backend.stop_worker(worker)
            self._clocks.pop(worker.index, None)
        self.tasks.reset_workers(self.workers)
        if not self.config.restart_failed_workers:
            raise err
        self._raise_if_hopeless(err)
        logger.warning("%s failed: %s; replaced by worker %d (%d worker failures so far)",
                       err.stage, err.message, self._next_worker_index,
                       self.num_worker_failures)
        replacement = self.backend.make_worker(self._next_worker_index)
        self._next_worker_index += 1
        self.workers.append(replacement)
        self._clocks[replacement.index] = [time.monotonic(), None, 0]
        return replacement

    def _raise_if_hopeless(self, err: WorkerError) -> None:
        limit = max(3, 2 * self.config.num_workers)
        if self._failures_in_a_row >= limit:
            raise ImpalaError(
                f"workers failed {self._failures_in_a_row} times in a row without returning a "
                f"sample; the env keeps failing, so restarting is stopped. Last error:\n{err}"
            ) from err
        repeats = self.count_repeats(err)
        limit = max(MAX_REPEATED_WORKER_FAILURES, 2 * self.config.num_workers)
        if repeats >= limit:
            raise ImpalaError(
                f"the same worker failure came back {repeats} times within "
                f"{REPEATED_FAILURE_WINDOW_S:g} s (env {err.env_id}), samples or not in "
                f"between: restarting does not fix it, so restarting is stopped. Last "
                f"error:\n{err}"
            ) from err

    def count_repeats(self, err: WorkerError) -> int:
        """How often this failure (env, message with its numbers blanked) happened within
        `REPEATED_FAILURE_WINDOW_S`, this one included."""
        key = (err.env_id, _NUMBERS.sub("#", err.message))
        times = self._repeated_failures.setdefault(key, deque())
        now = time.monotonic()
        times.append(now)
        while now - times[0] > REPEATED_FAILURE_WINDOW_S:
            times.popleft()
        return len(times)

    def hung_workers(self) -> list[WorkerError]:
        """An error for each worker that owes a sample longer than ``sample_timeout_s`` (its
        env hangs), to be handled as a failure (an inline worker never owes one)."""
        timeout = self.config.sample_timeout_s
        now = time.monotonic()
        if timeout is None or now < self._next_liveness_check:
            return []
        self._next_liveness_check = now + min(LIVENESS_CHECK_PERIOD_S, timeout / 4)
        owed = self.tasks.owed_since()
        now = time.monotonic()
        errors = []
        for worker in list(self.workers):
            since = owed.get(worker)
            if since is None or now - since <= timeout:
                continue
            env_id = getattr(worker, "env_id", None) or self.config.env_id
            pid = getattr(worker, "pid", None)
            errors.append(WorkerError(
                worker.index, env_id,
                f"it owed a sample for {now - since:.1f} s, longer than "
                f"sample_timeout_s={timeout:g}: its env may hang in step() or reset() (if it is "
                f"only that slow, raise sample_timeout_s); the worker"
                f"{f' (process {pid})' if pid is not None else ''} was ended"))
        return errors

    def liveness(self, judging: bool) -> tuple[float, list[dict[str, Any]]]:
        """Seconds since the last sample reached the driver, and per worker (by index): seconds
        since its last sample (or start), samples returned, requests in flight, and
        ``stalled`` (past `stalled_after_s`, only while ``judging``), all from `sampling_since`."""
        now = time.monotonic()
        since = self.sampling_since
        last = self._last_sample_at
        overall = now - (since if last is None else max(last, since))
        in_flight = {getattr(w, "index", w): n for w, n in self.tasks.in_flight_counts().items()}
        limit = stalled_after_s(self.config.sample_timeout_s)
        workers = []
        for index, (started, last_sample, samples) in sorted(self._clocks.items()):
            seconds = now - max(started if last_sample is None else last_sample, since)
            workers.append({"index": index, "seconds_since_sample": round(seconds, 2),
                            "samples": samples, "in_flight": in_flight.get(index, 0),
                            "stalled": judging and seconds >= limit})
        return round(overall, 2), workers
