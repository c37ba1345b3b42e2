"""`Actors`: the calls the driver loop needs across the backend (where workers live), the
`SampleTaskPool` (the requests each owes) and the `WorkerSupervisor` (starting and replacing
them), so the loop never reaches into any of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from impala_lab.backends.base import Backend, WorkerHandle
from impala_lab.batch import SampleBatch
from impala_lab.driver.supervisor import WorkerSupervisor
from impala_lab.driver.task_pool import SampleTaskPool
from impala_lab.errors import WorkerError


class Actors:
    """The run's workers as the driver loop uses them."""

    def __init__(self, backend: Backend, tasks: SampleTaskPool,
                 supervisor: WorkerSupervisor) -> None:
        self.backend = backend
        self.tasks = tasks
        self.supervisor = supervisor

    def start(self) -> list[WorkerHandle]:
        """Start the configured workers; their first requests are the caller's."""
        return self.supervisor.start_workers()

    def completed(self, blocking_wait: bool, timeout: float
                  ) -> Iterator[tuple[WorkerHandle, SampleBatch]]:
        """The finished samples, ``(worker, batch)``, in completion order (raises the
        `WorkerError` of a worker that failed)."""
        return self.tasks.completed_prefetch(blocking_wait=blocking_wait, timeout=timeout)

    def request_samples(self, worker: WorkerHandle, n: int) -> None:
        """Ask ``worker`` for ``n`` more samples."""
        for _ in range(n):
            self.tasks.add(worker, worker.sample())

    def sample_returned(self, worker: WorkerHandle) -> None:
        """A sample of ``worker`` reached the driver (its liveness clock)."""
        self.supervisor.sample_returned(worker)

    def replace(self, err: WorkerError) -> WorkerHandle:
        """End the worker that failed with ``err`` and start its replacement (or raise)."""
        return self.supervisor.replace(err)

    def put_weights(self, weights: list, version: int) -> Any:
        """Publish weights once; every worker can read the returned reference."""
        return self.backend.put_weights(weights, version)

    def lowest_live_index(self, default: int) -> int:
        """The lowest index of a live worker (``default`` when none is live)."""
        return min((w.index for w in self.supervisor.workers), default=default)

    def in_flight_counts(self) -> dict[Any, int]:
        """Sample requests in flight, per worker."""
        return self.tasks.in_flight_counts()
