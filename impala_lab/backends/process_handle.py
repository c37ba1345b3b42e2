"""The driver's side of one worker process: its pipe, its queue of requests, its state.

A `ProcessWorkerHandle` keeps the futures the worker owes in request order, completes them as
answers arrive (`drain`) and fails them all when the worker ends (`on_exit`). A shutdown at exit
may stop workers from the main thread while the driver's thread uses the pipes: the state
changes under the backend's lock, every use of the pipe under the handle's pipe lock (a
``multiprocess`` connection closed while another thread reads it fails deep inside).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from impala_lab.backends.base import WorkerHandle
from impala_lab.backends.shared_weights import SharedWeights, WeightBlocks
from impala_lab.backends.worker_info import oom_kill_count
from impala_lab.backends.worker_process import end_process_group
from impala_lab.errors import WorkerError

__all__ = ["ProcessFuture", "ProcessWorkerHandle"]

_EXIT_JOIN_S = 0.5  # after pipe EOF the process is ending: wait this long for its exit code
# What a pipe operation raises once either end is gone (EOF, EPIPE, "handle is closed", EBADF).
PIPE_GONE = (EOFError, OSError)


class ProcessFuture:
    """One request to a worker process (a `SampleFuture`); ``completion_time``: when the
    driver received the answer; ``weight_blocks``: the weights blocks named by ``set_weights``
    before this request."""

    __slots__ = ("_done", "_error", "_value", "completion_time", "handle", "weight_blocks")

    def __init__(self, handle: ProcessWorkerHandle, weight_blocks: list[str]) -> None:
        self.handle = handle
        self.weight_blocks = weight_blocks
        self._done = False
        self._value: Any = None
        self._error: WorkerError | None = None
        self.completion_time: float | None = None

    def done(self) -> bool:
        return self._done

    def result(self) -> Any:
        """The `SampleBatch` (or info dict); raises `WorkerError` if the worker failed."""
        if not self._done:
            self.handle.wait_until_done(self)
        if self._error is not None:
            raise self._error
        return self._value

    def finish(self, value: Any = None, error: WorkerError | None = None) -> None:
        """Complete the future (the handle's, while the backend reads its pipe)."""
        self._value, self._error = value, error
        self.completion_time = time.monotonic()
        self._done = True

    def __repr__(self) -> str:
        state = "error" if self._error else ("done" if self._done else "pending")
        return f"<ProcessFuture worker {self.handle.index} {state}>"


class ProcessWorkerHandle(WorkerHandle):
    """The driver's side of one worker process (``process``, a ``multiprocess`` Process, and
    ``conn``, the driver's end of its pipe); ``exitcode`` once it ended (-N: signal N).

    ``lock`` (the backend's) guards this handle's request queue and state; ``blocks``: the
    backend's `WeightBlocks`; ``wait_until_done``: its blocking wait for one future.
    """

    def __init__(self, index: int, process: Any, conn: Any, env_id: str, *,
                 lock: threading.RLock, blocks: WeightBlocks,
                 wait_until_done: Callable[[ProcessFuture], None]) -> None:
        self.index = index
        self.process = process
        self.pid: int = process.pid
        self.exitcode: int | None = None
        self.conn = conn
        self.env_id = env_id
        self._lock = lock  # guards the state below
        self._blocks = blocks
        self.wait_until_done = wait_until_done
        self._pipe_lock = threading.Lock()  # guards every use of conn, its close included
        self._pending: deque[ProcessFuture] = deque()
        self._unconsumed: list[str] = []  # blocks named since the last request was sent
        self._sent_serial: int | None = None
        self._alive = True  # False once it died or was stopped
        self._stopped = False  # stop_worker/shutdown ended it
        self._failure: WorkerError | None = None
        self._num_messages = 0  # answers received: 0 means it died while starting
        self._oom_kills_at_start = oom_kill_count()  # to tell an OOM kill from a kill -9

    def sample(self) -> ProcessFuture:
        """Queues one sample request; the future's result is a `SampleBatch`."""
        return self._request(("sample",))

    def info(self) -> ProcessFuture:
        """Queues a request for the worker's `worker_info`, answered after the queued samples."""
        return self._request(("info",))

    def set_weights(self, weights_ref: Any) -> None:
        """Queues the weights of ``weights_ref`` (from `ProcessBackend.put_weights`) for the
        worker's next sample; a reference already sent is not sent again."""
        if not isinstance(weights_ref, SharedWeights):
            raise TypeError(f"set_weights(weights_ref={type(weights_ref).__name__}): pass what "
                            "ProcessBackend.put_weights returned (a SharedWeights)")
        if not self._alive or weights_ref.serial == self._sent_serial:
            return
        self._blocks.acquire(weights_ref)
        self._unconsumed.append(weights_ref.name)
        self._sent_serial = weights_ref.serial
        try:
            self._send(("set_weights", weights_ref))
        except PIPE_GONE:
            self.on_exit()

    def _request(self, cmd: tuple) -> ProcessFuture:
        fut = ProcessFuture(self, self._unconsumed)
        self._unconsumed = []
        with self._lock:
            alive = self._alive
            if alive:
                self._pending.append(fut)
        if not alive:
            self._blocks.release(fut.weight_blocks)
            fut.finish(error=self._failure or WorkerError(
                self.index, self.env_id, "the worker was stopped; start a new one"))
            return fut
        try:
            self._send(cmd)
        except PIPE_GONE:  # the process is gone: fail every pending request, this one too
            self.on_exit()
            if not fut.done():  # another thread is stopping this worker
                self.fail_pending(self._stopped_error())
        return fut

    def _send(self, cmd: tuple) -> None:
        data = pickle.dumps(cmd, protocol=5)
        with self._pipe_lock:
            self.conn.send_bytes(data)

    def drain(self) -> bool:
        """Handles every answer waiting on the pipe, in order; False once the pipe is gone."""
        while self._alive:
            with self._pipe_lock:
                try:
                    if not self.conn.poll(0):
                        return True
                    data = self.conn.recv_bytes()
                except PIPE_GONE:
                    return False
            self._on_answer(data)
        return True

    def _on_answer(self, data: bytes) -> None:
        kind, payload = pickle.loads(data)
        self._num_messages += 1
        with self._lock:
            fut = self._pending.popleft() if self._pending else None
        value, error = payload, None
        if kind != "ok":
            self.env_id = payload["env_id"]
            value, error = None, WorkerError(self.index, self.env_id, payload["message"],
                                             payload["traceback"])
            self._failure = error
        if fut is not None:
            fut.finish(value, error)
            self._blocks.release(fut.weight_blocks)

    def on_exit(self) -> None:
        """The pipe closed or the process ended: takes what it sent before it ended (its
        error record), then fails every request it still owes."""
        if not self._alive:
            return
        self.drain()
        with self._lock:
            if not self._alive:  # stopped meanwhile by another thread
                return
            self._alive = False
        # ValueError: a concurrent stop closed the process object (it has ended then).
        with contextlib.suppress(ValueError):
            self.process.join(_EXIT_JOIN_S)
            self.exitcode = self.process.exitcode
        end_process_group(self.pid)  # the env's helper processes too
        if self._failure is not None:
            err = WorkerError(self.index, self.env_id, "the worker process ended after an "
                              f"earlier error ({self._failure.message})",
                              self._failure.remote_traceback)
        else:
            hint = (_unguarded_main_hint()
                    if self._num_messages == 0 and self.exitcode == 1 else "")
            err = WorkerError(self.index, self.env_id, f"the worker process (pid {self.pid}) "
                              f"{self._exit_description()}; its pending sample "
                              f"requests are lost{hint}")
            self._failure = err
        self.fail_pending(err)
        self.close_pipe()

    def fail_pending(self, err: WorkerError) -> None:
        """Fails every request the worker still owes and releases their weights blocks."""
        with self._lock:  # the driver thread and a shutdown at exit may both get here
            pending, self._pending = self._pending, deque()
            unconsumed, self._unconsumed = self._unconsumed, []
            for fut in pending:
                fut.finish(error=err)
                self._blocks.release(fut.weight_blocks)
            self._blocks.release(unconsumed)

    # -- ending, in steps (the backend stops many workers at once)
    def begin_stop(self) -> bool:
        """Marks the worker as stopped (no thread reads or writes its pipe from now on);
        False if it was stopped already. Call under the backend's lock."""
        if self._stopped:
            return False
        self._stopped = True
        if self._alive:
            self._alive = False
            self._failure = self._failure or self._stopped_error()
        return True

    def send_stop(self) -> None:
        """Asks the worker to exit, then closes the pipe (a worker blocked writing a batch
        gets EPIPE and exits)."""
        with contextlib.suppress(*PIPE_GONE):
            self._send(("stop",))
        self.close_pipe()

    def close_pipe(self) -> None:
        with self._pipe_lock, contextlib.suppress(*PIPE_GONE):
            self.conn.close()

    def finish_stop(self) -> None:
        """After the process ended: fails what it still owed, records its exit code and
        frees its sentinel. (Not earlier: a running worker might still open a block.)"""
        self.fail_pending(self._failure or self._stopped_error())
        with self._lock:
            self.exitcode = self.process.exitcode
            with contextlib.suppress(ValueError):
                self.process.close()  # ValueError: still running

    def _stopped_error(self) -> WorkerError:
        return WorkerError(self.index, self.env_id, "the worker was stopped by the driver")

    def is_alive(self) -> bool:
        return self._alive and self.process.is_alive()

    def waitables(self) -> list[int]:
        """The pipe's and the process sentinel's file descriptors, for
        ``multiprocess.connection.wait``; empty once the worker ended (call under the lock)."""
        return [self.conn.fileno(), self.process.sentinel] if self._alive else []

    def describe(self) -> str:
        return f"worker {self.index} (process {self.pid}, env {self.env_id})"

    def __repr__(self) -> str:
        state = "alive" if self._alive else "ended"
        return f"<ProcessWorkerHandle {self.index} pid={self.pid} {state}>"

    def _exit_description(self) -> str:
        """How the worker ended, in words; a SIGKILL is named as the kernel's OOM killer's
        when the cgroup's ``oom_kill`` count rose while the worker lived."""
        code = self.exitcode
        if code is None:
            return "stopped answering (its pipe closed; the process has not exited yet)"
        if code >= 0:
            return f"exited with code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        text = f"was killed by {name} (exit code {code})"
        if code != -signal.SIGKILL:
            return text
        before, after = self._oom_kills_at_start, oom_kill_count()
        if before is not None and after is not None and after > before:
            return (f"{text}: the kernel's out-of-memory killer ended it (the cgroup's "
                    f"oom_kill count rose from {before} to {after}); the machine ran out of "
                    "memory: lower num_workers or num_envs_per_worker, or give the run more "
                    "memory")
        return (f"{text}: nothing in impala_lab kills a running worker that way; if no other "
                "process did, the kernel's out-of-memory killer did (see `dmesg`)")


def _unguarded_main_hint() -> str:
    """Why a worker may die while starting, if the driver's script has no ``__main__`` guard:
    spawn runs the script again in the worker, which then tries to start workers itself."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file or not os.path.isfile(main_file):
        return ""  # a notebook, the REPL or python -c: nothing is re-run
    try:
        with open(main_file, encoding="utf-8", errors="replace") as fh:
            source = fh.read()
    except OSError:
        return ""
    if re.search(r"__name__\s*==\s*['\"]__main__['\"]", source):
        return ""
    return (f" while starting. The script {main_file!r} has no 'if __name__ == \"__main__\":' "
            "guard: the process backend starts workers with spawn, which runs the script "
            "again in each worker; put the code that builds and trains the run under the "
            "guard (or use backend='inline')")
