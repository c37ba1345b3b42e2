"""Workers in the caller's process, for stepping through and tests: a sample request runs at
once, inside ``sample()``, so after ``impala.step()`` a notebook can look at the worker, its
envs and the batch it returned.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any

from impala_lab.actor import make_rollout_worker
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.backends.base import Backend, WorkerHandle
from impala_lab.config import ImpalaConfig
from impala_lab.errors import WorkerError


class DoneFuture:
    """A future whose value (or error) is already known."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error
        self.completion_time = time.monotonic()

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class InlineWorkerHandle(WorkerHandle):
    """A `RolloutWorker` in the driver's process; ``sample()`` runs at once."""

    def __init__(self, index: int, worker: RolloutWorker) -> None:
        self.index = index
        self.worker = worker
        self._alive = True

    def sample(self) -> DoneFuture:
        try:
            return DoneFuture(self.worker.sample())
        except Exception as exc:  # the env raised: the driver decides (restart or raise)
            self._alive = False
            return DoneFuture(error=WorkerError(
                self.index, self.worker.env_id, f"{type(exc).__name__}: {exc}",
                "".join(traceback.format_exception(exc, chain=False))))

    def set_weights(self, weights_ref: Any) -> None:
        weights, version = weights_ref
        self.worker.set_weights(weights, version)

    def is_alive(self) -> bool:
        return self._alive

    def close(self) -> None:
        """Ends the worker: closes its envs."""
        self._alive = False
        self.worker.close()

    def describe(self) -> str:
        return f"worker {self.index} (inline, env {self.worker.env_id})"


class InlineBackend(Backend):
    """Rollout workers in the driver's process (see the module docstring)."""

    name = "inline"

    def __init__(self, config: ImpalaConfig) -> None:
        super().__init__(config)
        self.handles: list[InlineWorkerHandle] = []

    def make_worker(self, index: int) -> InlineWorkerHandle:
        kwargs = self.worker_kwargs(index)
        try:
            worker = make_rollout_worker(**kwargs)
        except Exception as exc:
            raise WorkerError(index, str(kwargs["env"]), f"{type(exc).__name__}: {exc}",
                              traceback.format_exc()) from exc
        handle = InlineWorkerHandle(index, worker)
        self.handles.append(handle)
        return handle

    def put_weights(self, weights: list, version: int) -> Any:
        return (weights, version)  # the workers share the driver's memory

    def wait(self, futures: Sequence[Any], timeout: float | None) -> list:
        return [f for f in futures if f.done()]

    def stop_worker(self, handle: WorkerHandle) -> None:
        assert isinstance(handle, InlineWorkerHandle)
        handle.close()
        if handle in self.handles:
            self.handles.remove(handle)

    def shutdown(self) -> None:
        for handle in list(self.handles):
            self.stop_worker(handle)
