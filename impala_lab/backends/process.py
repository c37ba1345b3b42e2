"""Rollout workers in spawned processes (the default backend).

Each `RolloutWorker` lives in its own process, started with ``multiprocess``'s ``spawn``
(TensorFlow is not fork-safe), and never imports TensorFlow. `worker_process` holds the
worker's command loop, `shared_weights` the broadcasts, `process_handle` the driver's side of
one worker; this module starts, waits on and stops the workers. `ProcessBackend.wait` (the task
pool's ``wait_fn``) blocks on the pipes and process sentinels, so an idle driver uses no CPU. A
worker that raises or dies fails its pending futures with `WorkerError`. The env travels
cloudpickled (`worker_info`): dill, though ``multiprocess`` is built on it, loses
notebook-defined env classes. docs/training.md, "Where the workers live", tells the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import multiprocess
import multiprocess.connection
import multiprocess.util  # registers multiprocess's exit hook before ours (see below)

from impala_lab.backends.base import Backend, WorkerHandle
from impala_lab.backends.process_handle import ProcessFuture, ProcessWorkerHandle
from impala_lab.backends.shared_weights import SharedWeights, WeightBlocks
from impala_lab.backends.worker_info import describe_env, pickled_env
from impala_lab.backends.worker_process import end_process_group, worker_main
from impala_lab.config import ImpalaConfig

__all__ = ["ProcessBackend", "ProcessFuture", "ProcessWorkerHandle"]

_STOP_JOIN_S = 2.0  # a worker gets this long to exit after "stop" before it is terminated
_KILL_JOIN_S = 1.0

_live_backends: weakref.WeakSet[ProcessBackend] = weakref.WeakSet()


def _shutdown_live_backends() -> None:
    for backend in list(_live_backends):
        with contextlib.suppress(Exception):
            backend.shutdown()


# atexit runs hooks last-in first-out: this one, registered after multiprocess's, stops the
# workers in order before multiprocess terminates the daemonic ones.
atexit.register(_shutdown_live_backends)


# A worker's numpy steps one small batch at a time: a second BLAS thread buys nothing there,
# and OpenBLAS's idle threads spin, taking CPU from the other workers and the learner.
ACTOR_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1"}
_environ_lock = threading.Lock()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Processes started meanwhile get `ACTOR_THREAD_ENV`'s variables (the user's own win);
    this process's environment is restored after. Surrounds ``Process.start()``."""
    with _environ_lock:
        added = [name for name in ACTOR_THREAD_ENV if name not in os.environ]
        for name in added:
            os.environ[name] = ACTOR_THREAD_ENV[name]
        try:
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


class ProcessBackend(Backend):
    """Rollout workers in spawned processes (see the module docstring).

    Attributes:
      handles: the workers started and not yet stopped.
      blocks: the shared-memory blocks of the weights broadcasts.
      lock: guards ``handles`` and each handle's request queue and state.
    """

    name = "process"

    def __init__(self, config: ImpalaConfig) -> None:
        super().__init__(config)
        self._ctx = multiprocess.get_context("spawn")
        self.handles: list[ProcessWorkerHandle] = []
        self.lock = threading.RLock()
        self.blocks = WeightBlocks(self.lock)
        self._env_blob: bytes | None = None
        self._closed = False
        _live_backends.add(self)

    def _pickled_env(self) -> bytes:
        if self._env_blob is None:
            self._env_blob = pickled_env(self.env, "process", "a worker process",
                                         "a .py file on sys.path")
        return self._env_blob

    def prepare(self) -> None:
        self._pickled_env()  # an env factory that cannot travel fails here, before TF loads

    def make_worker(self, index: int) -> ProcessWorkerHandle:
        """Starts worker ``index`` in a new process; returns at once (a failure to build its
        envs is the answer to the first request)."""
        if self._closed:
            raise RuntimeError("this ProcessBackend was shut down; create a new one")
        blob = self._pickled_env()
        kwargs = self.worker_kwargs(index)
        del kwargs["env"]
        ours, theirs = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main, args=(theirs, os.getpid(), index, blob, kwargs),
            name=f"impala_lab-worker-{index}", daemon=True)
        try:
            with single_threaded_blas():
                process.start()
        finally:
            theirs.close()  # else the driver holds the worker's end and never sees EOF
        handle = ProcessWorkerHandle(index, process, ours, describe_env(self.env),
                                     lock=self.lock, blocks=self.blocks,
                                     wait_until_done=self.wait_until_done)
        with self.lock:
            self.handles.append(handle)
        return handle

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes that are still running."""
        with self.lock:
            return [h.pid for h in self.handles if h.process.is_alive()]

    def put_weights(self, weights: list, version: int) -> SharedWeights:
        """Writes the weights once into a shared-memory block; returns its reference."""
        if self._closed:
            raise RuntimeError("this ProcessBackend was shut down; create a new one")
        return self.blocks.put(weights, version)

    def wait(self, futures: Sequence[Any], timeout: float | None) -> list:
        """The task pool's ``wait_fn``: blocks on the workers' pipes (no polling).

        Returns every future of ``futures`` that is done, as soon as at least one is, or an
        empty list after ``timeout`` seconds (0: check once; None: no limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            waiting = {f.handle for f in futures if not f.done()}
            self._receive(waiting, 0.0)  # take in whatever has arrived
            done = [f for f in futures if f.done()]
            if done or not waiting:
                return done
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            self._receive(waiting, left)  # sleeps in poll() until a pipe or sentinel is ready

    def wait_until_done(self, fut: ProcessFuture) -> None:
        """Blocks until ``fut`` is done (its worker answered or ended)."""
        while not fut.done():
            self._receive({fut.handle}, None)

    def _receive(self, handles: set[ProcessWorkerHandle], timeout: float | None) -> None:
        """Waits up to ``timeout`` for any of ``handles`` to answer or die; handles it all."""
        owners: dict[int, tuple[ProcessWorkerHandle, bool]] = {}  # fd: (worker, is pipe)
        with self.lock:  # a worker stopped meanwhile has no descriptors left to wait on
            for h in handles:
                for fd, is_pipe in zip(h.waitables(), (True, False)):
                    owners[fd] = (h, is_pipe)
        if not owners:
            return
        ended = set()
        for fd in multiprocess.connection.wait(list(owners), timeout):
            h, is_pipe = owners[fd]
            if not is_pipe or not h.drain():
                ended.add(h)
        for h in ended:
            h.on_exit()

    def stop_worker(self, handle: WorkerHandle) -> None:
        """Ends one worker (dead or alive): stop, join 2 s, terminate, join, kill."""
        assert isinstance(handle, ProcessWorkerHandle)
        self._stop([handle])

    def _stop(self, handles: list[ProcessWorkerHandle]) -> None:
        with self.lock:  # from now on no thread reads their pipes or sends to them
            handles = [h for h in handles if h.begin_stop()]
        for h in handles:  # all at once: the workers exit in parallel
            h.send_stop()
        deadline = time.monotonic() + _STOP_JOIN_S
        for h in handles:
            h.process.join(max(0.0, deadline - time.monotonic()))
        stubborn = [h for h in handles if h.process.is_alive()]
        for h in stubborn:
            h.process.terminate()
        for h in stubborn:
            h.process.join(_KILL_JOIN_S)
        for h in stubborn:
            if h.process.is_alive():
                h.process.kill()
                h.process.join(_KILL_JOIN_S)
        for h in handles:
            end_process_group(h.pid)  # what its env started, if anything is left
            h.finish_stop()
        with self.lock:
            self.handles = [h for h in self.handles if h not in handles]

    def shutdown(self) -> None:
        """Stops every worker (in parallel) and unlinks every weights block; idempotent."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self.handles)
        try:
            self._stop(handles)
        finally:
            self.blocks.close()
            _live_backends.discard(self)
