"""Rollout workers in spawned processes (the default backend).

Each `RolloutWorker` lives in its own process, started with the ``spawn`` method of the
`multiprocess` package (TensorFlow is not fork-safe). Worker processes import numpy,
gymnasium and `impala_lab.rollout` only, never TensorFlow (about 45 MB each instead of
about 600 MB).

Transport. One duplex pipe per worker carries small commands, in order::

    driver -> worker   ("set_weights", SharedWeights)   no reply; applied before the next sample
                       ("sample",)                      reply ("ok", SampleBatch)
                       ("info",)                        reply ("ok", dict)  (tests, diagnostics)
                       ("stop",)                        the worker exits at once
    worker -> driver   ("ok", value) or ("error", record) for each request, in request order

Messages are pickled with protocol 5 (numpy arrays travel as one contiguous copy). The
driver keeps ``max_sample_requests_in_flight_per_worker`` sample requests queued on each
worker; `ProcessBackend.wait` (the task pool's ``wait_fn``) blocks on the pipes and the
process sentinels with ``multiprocess.connection.wait``, so an idle driver uses no CPU, and
completes each worker's futures in the order of its requests.

Weights: shared memory, written once per broadcast. `ProcessBackend.put_weights` writes
every array, the version and a broadcast serial into a shared-memory block no worker is
using; ``set_weights`` sends only the block's name and layout (about 300 bytes), and a
worker copies the arrays out when it starts its next sample with a broadcast it has not
read yet. ``bench/transport.py`` measured both ways on this 2-core machine (2 workers;
medians, ranges over 3 runs, some with other jobs running). "broadcast" lasts until every
worker holds the arrays, "driver" is the driver's writing and sending only; "busy" workers
read their pipe only between 10 ms samples, as real ones do::

    workers  weights            way         broadcast   driver wall   driver CPU  (ms)
    idle     64x64 MLP, 19 KB   pipe        0.23-0.27   0.07-0.10     0.07-0.12
    idle     64x64 MLP, 19 KB   shared mem  0.34-0.47   0.08-0.11     0.09-0.12
    idle     1024x1024, 4.2 MB  pipe        5.1-28      4.0-20        1.9-4.4
    idle     1024x1024, 4.2 MB  shared mem  2.1-6.3     0.54-0.90     0.58-0.75
    busy     64x64 MLP, 19 KB   pipe        10.4-10.6   0.17-0.20     0.17-0.19
    busy     64x64 MLP, 19 KB   shared mem  10.7-11.3   0.23-0.25     0.23-0.26
    busy     1024x1024, 4.2 MB  pipe        21-29       15.6-20.1     2.5-2.7
    busy     1024x1024, 4.2 MB  shared mem  12.6-13.1   0.82-0.96     0.71-0.84

For the small model the two cost the same (a tenth of a millisecond); for 4 MB of weights
the pipe blocks the driver loop until each busy worker has finished its sample and drained
the pipe (15-20 ms per broadcast with 2 workers, growing with the number of workers),
while shared memory costs the driver under 1 ms whatever the number of workers. Tiny
commands also mean the driver can never block on a worker's pipe while that worker is
itself blocked writing a large batch to the driver (with 4 MB commands that deadlock needs
a sender thread to avoid). So: shared memory.

Block lifetime and reuse: a block is released once it is not the latest broadcast and
every worker that was told to use it has answered a later request (so it has read the
block, or skipped it for a newer one) or has ended. Up to two released blocks are kept
and overwritten by later broadcasts (a new 4 MB block costs 8-15 ms of page faults here,
overwriting one 0.3-0.6 ms); the rest are unlinked, and `ProcessBackend.shutdown` unlinks
all. Blocks are named ``il<driver pid>_<random>_<n>`` (in ``/dev/shm`` on Linux); if the
driver is killed, the ``multiprocess`` resource tracker unlinks what is left once the
workers have exited. A kill of the whole process group takes the tracker too, and the blocks
would stay until reboot: so each new `ProcessBackend` first unlinks this user's
``il<pid>_*`` blocks whose driver is gone (`remove_stale_blocks`).

Lifetimes. A worker ignores SIGINT (interrupting a notebook cell interrupts the driver,
which stops its workers in order; only a Ctrl-C in a terminal during the fraction of a
second before a worker's own code runs can still end it, seen as a failed worker). It
exits when its parent dies (a watchdog thread compares ``os.getppid()`` with the parent's
pid every 0.5 s; ``PR_SET_PDEATHSIG`` is not used because it fires when the *thread* that
started the worker ends, which would kill the workers of a driver running in a background
thread), and when its pipe closes.
`ProcessBackend.stop_worker` and `ProcessBackend.shutdown` send ``stop``, close the pipe,
join for 2 s, then terminate, join, kill. Worker processes are daemonic, so an env cannot
start ``multiprocess`` children of its own, and ``multiprocess`` ends them at interpreter
exit if nothing else did; an ``atexit`` hook here shuts every live backend down first.

Faults. A worker whose env raises answers that request with an error record (exception
type and message, formatted traceback, env id) and exits (a broken env is not reused);
``result()`` raises `WorkerError` with the worker's traceback. A worker process that dies
(SIGKILL, a crash in C code) is seen as pipe EOF or its sentinel: every pending future of
that worker completes and raises `WorkerError` naming the exit code or signal, so the
driver restarts the worker or raises instead of hanging.

What travels to a worker, and what cannot. The env (an id, or a zero-argument factory) is
pickled once, before the first process starts, with cloudpickle (a gymnasium dependency),
as Ray does. Functions, lambdas and classes defined in a notebook or a script are carried
by value, with the variables and notebook-defined classes they use; functions and classes
of importable modules by reference. Not dill, although ``multiprocess`` is built on it:
dill 0.4 either leaves a notebook-defined env class behind (``NameError`` in the worker)
or, with ``recurse=True``, rebuilds a subclass of ``gymnasium.Env`` or ``gymnasium.Wrapper``
on the wrong bases (it takes the ``__orig_bases__`` inherited from ``Env``'s
``Generic[...]``), so the worker's env is no ``gymnasium.Env`` at all. Neither can carry
objects holding operating-system or C-extension state: locks and queues, open files and
sockets, threads, database connections (``sqlite3.Connection``), generators, ``mmap``
objects, ctypes pointers, SSL contexts, hash objects, weak references; a factory that holds
or closes over one is refused by `ProcessBackend.make_worker` with a ValueError before any
process starts. Create such resources inside the factory, or define the factory in an
importable module (a ``.py`` file on ``sys.path``; the workers get the driver's
``sys.path``). The spawn method also runs the main script's top level again (as
``__mp_main__``) in each worker: keep ``import tensorflow`` in a script under ``if __name__
== "__main__":`` or inside functions, or every worker imports TensorFlow too (notebooks
and ``python -c`` have no main script to run again).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import re
import secrets
import signal
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import multiprocess
import multiprocess.connection
import multiprocess.util  # registers multiprocess's exit hook before ours (see below)
import numpy as np
from multiprocess import shared_memory

from impala_lab.backends.base import Backend, WorkerHandle, pid_exists
from impala_lab.config import ImpalaConfig
from impala_lab.errors import WorkerError

__all__ = [
    "ProcessBackend",
    "ProcessWorkerHandle",
    "ProcessFuture",
    "SharedWeights",
    "weights_layout",
    "write_shared_weights",
    "read_shared_weights",
    "SharedWeightsReader",
    "remove_stale_blocks",
]

_STOP_JOIN_S = 2.0  # a worker gets this long to exit after "stop" before it is terminated
_KILL_JOIN_S = 1.0
_EXIT_JOIN_S = 0.5  # after pipe EOF the process is ending: wait this long for its exit code
_WATCHDOG_PERIOD_S = 0.5
_ALIGN = 64  # byte alignment of each array in a weights block
_HEADER = 64  # block header: int64 serial, version, number of arrays
_MAX_FREE_BLOCKS = 2  # released blocks kept for reuse (a new block costs page faults)
# What a pipe operation raises once the worker's end is gone (EOF, EPIPE), or when another
# thread closed our end meanwhile (OSError "handle is closed", or TypeError: the handle is
# already None while the close runs); only a shutdown at exit, under a driver thread, does.
_PIPE_GONE = (EOFError, OSError, TypeError, ValueError)

_live_backends: weakref.WeakSet[ProcessBackend] = weakref.WeakSet()


def _shutdown_live_backends() -> None:
    for backend in list(_live_backends):
        with contextlib.suppress(Exception):
            backend.shutdown()


# atexit runs hooks last-in first-out: this one, registered after multiprocess's, stops the
# workers in order before multiprocess terminates the daemonic ones.
atexit.register(_shutdown_live_backends)


# ---------------------------------------------------------------------- shared weights
@dataclass(frozen=True)
class SharedWeights:
    """A reference to one broadcast's weights in a shared-memory block.

    What `ProcessBackend.put_weights` returns and ``set_weights`` sends to a worker; small
    (the arrays stay in the block). A block is reused for a later broadcast once no worker
    can still read it, so ``serial`` (unique per broadcast), not ``name``, tells broadcasts
    apart.

    Attributes:
      name: the block's name (``SharedMemory(name=...)``).
      serial: the broadcast's number, also stored in the block's header.
      version: the weights version, also stored in the block's header.
      layout: per array, ``(byte offset, shape, dtype.str)``, in ``get_weights()`` order.
      size: bytes of the block in use (header and arrays).
    """

    name: str
    serial: int
    version: int
    layout: tuple[tuple[int, tuple[int, ...], str], ...]
    size: int


def weights_layout(weights: Sequence[np.ndarray]
                   ) -> tuple[tuple[tuple[int, tuple[int, ...], str], ...], int]:
    """Where each array goes in a block: ``(layout, bytes needed)`` (see `SharedWeights`)."""
    layout = []
    offset = _HEADER
    for w in weights:
        a = np.asarray(w)
        layout.append((offset, tuple(int(d) for d in a.shape), a.dtype.str))
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    return tuple(layout), offset


def write_shared_weights(
    weights: Sequence[np.ndarray], version: int, serial: int = 0, name: str | None = None,
    block: shared_memory.SharedMemory | None = None,
) -> tuple[shared_memory.SharedMemory, SharedWeights]:
    """Writes ``weights``, ``version`` and ``serial`` into a shared-memory block.

    Args:
      weights: the arrays, e.g. ``keras_model.get_weights()``; any shapes and dtypes.
      version: the weights version (header and reference).
      serial: the broadcast's number (header and reference).
      name: the name of a new block (None lets ``SharedMemory`` choose); unused with `block`.
      block: an open block to overwrite (no reader may be using it), at least as large as
        the weights need; None creates a new one. Reusing a block is much cheaper: a new
        4 MB block costs 8-15 ms of page faults here, overwriting one 0.3-0.6 ms.

    Returns:
      ``(block, ref)``: the open block (the caller closes and unlinks it) and the reference
      that `read_shared_weights` takes.
    """
    arrays = [np.asarray(w) for w in weights]
    layout, size = weights_layout(arrays)
    new = block is None
    if block is None:
        block = shared_memory.SharedMemory(name=name, create=True, size=size)
    elif block.size < size:
        raise ValueError(f"write_shared_weights: block {block.name!r} has {block.size} bytes, "
                         f"the weights need {size}; pass block=None to create a larger one")
    try:
        header = np.ndarray((3,), np.int64, buffer=block.buf)
        header[:] = (serial, version, len(arrays))
        del header
        for (off, shape, dtype), a in zip(layout, arrays):
            view = np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=off)
            view[...] = a
            del view  # no view may outlive the block's mapping (close() refuses)
    except BaseException:
        if new:
            block.close()
            block.unlink()
        raise
    return block, SharedWeights(block.name, int(serial), int(version), layout, size)


def read_shared_weights(ref: SharedWeights,
                        block: shared_memory.SharedMemory | None = None) -> list[np.ndarray]:
    """Copies the arrays of ``ref`` out of its block.

    Args:
      ref: the reference `write_shared_weights` returned.
      block: the block ``ref`` names, already open (`SharedWeightsReader` keeps them open);
        None opens it for this read and closes it again.

    Returns:
      The weights, each with the shape and dtype it was written with.

    Raises:
      ValueError: if the block's header does not match ``ref`` (the block was reused for a
        later broadcast: a bug in the block bookkeeping).
    """
    opened = block is None
    if block is None:
        block = shared_memory.SharedMemory(name=ref.name)
    try:
        header = np.ndarray((3,), np.int64, buffer=block.buf)
        found = tuple(int(x) for x in header)
        del header
        expected = (ref.serial, ref.version, len(ref.layout))
        if found != expected:
            raise ValueError(
                f"shared weights block {ref.name!r} holds (serial, version, arrays) {found}, "
                f"expected {expected}: it was overwritten while a worker still needed it")
        out = []
        for off, shape, dtype in ref.layout:
            view = np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=off)
            out.append(view.copy())
            del view
        return out
    finally:
        if opened:
            block.close()


class SharedWeightsReader:
    """A worker's reader of broadcast weights that keeps the last few blocks open.

    Opening a block costs a resource-tracker round trip and a mapping; the driver reuses a
    handful of blocks, so a worker that keeps them open reads a broadcast with one copy.
    (py-spy put open + register at 8 % of a CartPole worker's time before this.)
    """

    def __init__(self, max_open: int = 8) -> None:
        self._max_open = max_open
        self._open: dict[str, shared_memory.SharedMemory] = {}

    def read(self, ref: SharedWeights) -> list[np.ndarray]:
        block = self._open.pop(ref.name, None)
        if block is None:
            block = shared_memory.SharedMemory(name=ref.name)
            if block.size < ref.size:  # a block of that name, but not the one written
                block.close()
                raise ValueError(f"shared weights block {ref.name!r} has {block.size} bytes, "
                                 f"the reference needs {ref.size}")
        self._open[ref.name] = block  # most recently used last
        while len(self._open) > self._max_open:
            oldest = next(iter(self._open))
            self._open.pop(oldest).close()
        return read_shared_weights(ref, block)

    def close(self) -> None:
        for block in self._open.values():
            with contextlib.suppress(BufferError, OSError):
                block.close()
        self._open.clear()


@dataclass
class _Block:
    memory: shared_memory.SharedMemory
    serial: int
    users: int = 0  # set_weights commands naming this block not yet known to be consumed


# ---------------------------------------------------------------------- the worker process
def _describe_env(env: Any) -> str:
    from impala_lab.rollout import env_description

    try:
        return env_description(env)
    except Exception:
        return type(env).__name__


def _watch_parent(parent_pid: int) -> None:
    """Ends this process once its parent is gone (re-parented: getppid() changes)."""

    def watch() -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="impala_lab-parent-watchdog", daemon=True).start()


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _worker_main(conn: Any, parent_pid: int, index: int, env_blob: bytes,
                 kwargs: dict[str, Any]) -> None:
    """The worker process: builds a `RolloutWorker` and serves the driver's commands."""
    # First: a Ctrl-C in a terminal reaches the whole process group; the driver stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(parent_pid)
    import traceback

    from impala_lab.rollout import RolloutWorker

    def send(obj: Any) -> None:
        conn.send_bytes(pickle.dumps(obj, protocol=5))

    def send_error(exc: BaseException, what: str, env_id: str) -> None:
        send(("error", {"type": type(exc).__name__, "message": f"{what}{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(), "env_id": env_id}))

    env_id = f"<env of worker {index}>"
    try:
        env = pickle.loads(env_blob)  # cloudpickle's output loads with plain pickle
        env_id = _describe_env(env)
        worker = RolloutWorker(env=env, **kwargs)
    except Exception as exc:
        with contextlib.suppress(OSError):
            send_error(exc, "could not start: ", env_id)
        sys.exit(1)

    commands: deque[tuple] = deque()
    reader = SharedWeightsReader()
    wanted: SharedWeights | None = None  # the latest set_weights
    current: int | None = None  # serial of the broadcast whose weights are in use
    try:
        while True:
            if not commands:
                commands.append(pickle.loads(conn.recv_bytes()))
            while conn.poll(0):  # read ahead: a queued "stop" ends us before queued samples
                commands.append(pickle.loads(conn.recv_bytes()))
            if any(c[0] == "stop" for c in commands):
                return
            cmd = commands.popleft()
            if cmd[0] == "set_weights":
                wanted = cmd[1]
            elif cmd[0] == "sample":
                try:
                    if wanted is not None and wanted.serial != current:
                        worker.set_weights(reader.read(wanted), wanted.version)
                        current = wanted.serial
                    batch = worker.sample()
                except Exception as exc:
                    send_error(exc, "", worker.env_id)
                    sys.exit(1)  # a broken env is not reused: the driver restarts the worker
                send(("ok", batch))
            elif cmd[0] == "info":
                send(("ok", {
                    "pid": os.getpid(), "ppid": os.getppid(), "index": index,
                    "env_id": worker.env_id, "weights_version": worker.weights_version,
                    "num_env_steps": worker.num_env_steps, "rss_bytes": _rss_bytes(),
                    "tensorflow_imported": "tensorflow" in sys.modules,
                    "keras_imported": "keras" in sys.modules,
                    "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                }))
            else:
                raise ValueError(f"unknown command {cmd[0]!r}")
    except (EOFError, OSError):
        return  # the driver closed the pipe (or died): nothing left to serve
    finally:
        reader.close()
        worker.close()


# ---------------------------------------------------------------------- the driver side
class ProcessFuture:
    """One request to a worker process (the `SampleFuture` protocol).

    Completed by `ProcessBackend.wait` (or by ``result()``, which blocks) when the worker
    answers or dies; ``completion_time`` is the ``time.monotonic()`` at which the driver
    received the answer.
    """

    __slots__ = ("_done", "_error", "_value", "completion_time", "handle", "weight_blocks")

    def __init__(self, handle: ProcessWorkerHandle, weight_blocks: list[str]) -> None:
        self.handle = handle
        self.weight_blocks = weight_blocks  # blocks named by set_weights before this request
        self._done = False
        self._value: Any = None
        self._error: WorkerError | None = None
        self.completion_time: float | None = None

    def done(self) -> bool:
        return self._done

    def result(self) -> Any:
        """The `SampleBatch` (or info dict); raises `WorkerError` if the worker failed."""
        if not self._done:
            self.handle._backend._wait_until_done(self)
        if self._error is not None:
            raise self._error
        return self._value

    def _finish(self, value: Any = None, error: WorkerError | None = None) -> None:
        self._value, self._error = value, error
        self.completion_time = time.monotonic()
        self._done = True

    def __repr__(self) -> str:
        state = "error" if self._error else ("done" if self._done else "pending")
        return f"<ProcessFuture worker {self.handle.index} {state}>"


class ProcessWorkerHandle(WorkerHandle):
    """The driver's side of one worker process.

    Attributes:
      index: the worker's index in the run.
      pid: the worker's process id.
      exitcode: the process's exit code once `ProcessBackend.stop_worker` or ``shutdown``
        ended it (-N: killed by signal N); None before.
      env_id: the env's name (the id, or the factory's ``__qualname__``).
      process: the ``multiprocess`` Process.
    """

    def __init__(self, backend: ProcessBackend, index: int, process: Any, conn: Any,
                 env_id: str) -> None:
        self._backend = backend
        self.index = index
        self.process = process
        self.pid: int = process.pid
        self.exitcode: int | None = None  # the process's, once stopped (negative: signal)
        self.conn = conn
        self.env_id = env_id
        self.started_at = time.monotonic()
        self._pending: deque[ProcessFuture] = deque()
        self._unconsumed: list[str] = []  # blocks named since the last request was sent
        self._sent_serial: int | None = None
        self._alive = True  # False once it died or was stopped
        self._stopped = False  # stop_worker/shutdown ended it
        self._failure: WorkerError | None = None
        self._num_messages = 0  # answers received: 0 means it died while starting

    # -- commands
    def _send(self, cmd: tuple) -> None:
        self.conn.send_bytes(pickle.dumps(cmd, protocol=5))

    def _request(self, cmd: tuple) -> ProcessFuture:
        fut = ProcessFuture(self, self._unconsumed)
        self._unconsumed = []
        with self._backend._lock:
            alive = self._alive
            if alive:
                self._pending.append(fut)
        if not alive:
            self._backend._release(fut.weight_blocks)
            fut._finish(error=self._failure or WorkerError(
                self.index, self.env_id, "the worker was stopped; start a new one"))
            return fut
        try:
            self._send(cmd)
        except _PIPE_GONE:  # the process is gone: fail every pending request, this one too
            self._backend._on_worker_exit(self)
            if not fut.done():  # another thread is stopping this worker
                self._backend._fail_pending(self, self._failure or WorkerError(
                    self.index, self.env_id, "the worker was stopped by the driver"))
        return fut

    def sample(self) -> ProcessFuture:
        """Queues one sample request; the future's result is a `SampleBatch`."""
        return self._request(("sample",))

    def info(self) -> ProcessFuture:
        """Queues a request for the worker's state: a dict with ``pid``, ``env_id``,
        ``weights_version``, ``num_env_steps``, ``rss_bytes``, ``tensorflow_imported``,
        ``keras_imported`` and ``sigint_ignored`` (answered after the queued samples)."""
        return self._request(("info",))

    def set_weights(self, weights_ref: Any) -> None:
        """Queues the weights of ``weights_ref`` (from `ProcessBackend.put_weights`) for the
        worker's next sample; a reference already sent is not sent again."""
        if not isinstance(weights_ref, SharedWeights):
            raise TypeError(f"set_weights(weights_ref={type(weights_ref).__name__}): pass what "
                            "ProcessBackend.put_weights returned (a SharedWeights)")
        if not self._alive or weights_ref.serial == self._sent_serial:
            return
        self._backend._acquire(weights_ref)
        self._unconsumed.append(weights_ref.name)
        self._sent_serial = weights_ref.serial
        try:
            self._send(("set_weights", weights_ref))
        except _PIPE_GONE:
            self._backend._on_worker_exit(self)

    def is_alive(self) -> bool:
        return self._alive and self.process.is_alive()

    def describe(self) -> str:
        return f"worker {self.index} (process {self.pid}, env {self.env_id})"

    def __repr__(self) -> str:
        state = "alive" if self._alive else "ended"
        return f"<ProcessWorkerHandle {self.index} pid={self.pid} {state}>"


class ProcessBackend(Backend):
    """Rollout workers in spawned processes (see the module docstring).

    Args:
      config: the run's config (workers, envs per worker, unroll length, seed, model).
      env_creator: a zero-argument env factory; overrides ``config.env``.
    """

    name = "process"

    def __init__(self, config: ImpalaConfig, env_creator: Callable[[], Any] | None = None
                 ) -> None:
        super().__init__(config, env_creator)
        self._ctx = multiprocess.get_context("spawn")
        self.handles: list[ProcessWorkerHandle] = []
        self._blocks: dict[str, _Block] = {}  # blocks in use: the latest, or still named
        self._free: list[shared_memory.SharedMemory] = []  # unused blocks, kept for reuse
        self._latest: str | None = None
        remove_stale_blocks()  # left by drivers killed with their resource tracker
        self._block_prefix = f"il{os.getpid()}_{secrets.token_hex(3)}_"
        self._num_blocks = 0
        self._serial = 0
        self._env_blob: bytes | None = None
        self._lock = threading.RLock()
        self._closed = False
        _live_backends.add(self)

    # -- workers
    def _pickled_env(self) -> bytes:
        if self._env_blob is None:
            import cloudpickle

            try:
                self._env_blob = cloudpickle.dumps(self.env, protocol=5)
            except Exception as exc:
                name = _describe_env(self.env)
                raise ValueError(
                    f"backend='process' cannot send the env factory {name!r} to a worker "
                    f"process: cloudpickle could not pickle it ({type(exc).__name__}: {exc}). "
                    "It probably holds or closes over an open handle (lock, file, socket, "
                    "database connection, generator, C-extension object). Create such objects "
                    "inside the factory, or define the factory in an importable module (a .py "
                    "file on sys.path) and pass that function; backend='inline' needs no "
                    "pickling."
                ) from exc
        return self._env_blob

    def prepare(self) -> None:
        self._pickled_env()  # an env factory that cannot travel fails here, before TF loads

    def make_worker(self, index: int) -> ProcessWorkerHandle:
        """Starts worker ``index`` in a new process; returns at once (the process builds its
        envs while the driver goes on; a failure to build them is the answer to the first
        request)."""
        if self._closed:
            raise RuntimeError("this ProcessBackend was shut down; create a new one")
        blob = self._pickled_env()
        kwargs = self.worker_kwargs(index)
        del kwargs["env"]
        ours, theirs = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main, args=(theirs, os.getpid(), index, blob, kwargs),
            name=f"impala_lab-worker-{index}", daemon=True)
        try:
            process.start()
        finally:
            theirs.close()  # else the driver holds the worker's end and never sees EOF
        handle = ProcessWorkerHandle(self, index, process, ours, _describe_env(self.env))
        with self._lock:
            self.handles.append(handle)
        return handle

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes that are still running."""
        with self._lock:
            return [h.pid for h in self.handles if h.process.is_alive()]

    # -- weights
    def put_weights(self, weights: list, version: int) -> SharedWeights:
        """Writes the weights once into a shared-memory block no worker is using (a reused
        one if possible); returns its reference."""
        if self._closed:
            raise RuntimeError("this ProcessBackend was shut down; create a new one")
        with self._lock:
            self._serial += 1
            _, size = weights_layout(weights)
            reuse = next((m for m in self._free if m.size >= size), None)
            if reuse is not None:
                self._free.remove(reuse)
            name = f"{self._block_prefix}{self._num_blocks}"
            memory, ref = write_shared_weights(weights, version, serial=self._serial,
                                               name=name, block=reuse)
            if reuse is None:
                self._num_blocks += 1
            self._blocks[ref.name] = _Block(memory, ref.serial)
            self._latest = ref.name
            self._collect()
        return ref

    def _acquire(self, ref: SharedWeights) -> None:
        with self._lock:
            block = self._blocks.get(ref.name)
            if block is None or block.serial != ref.serial:
                raise ValueError(f"set_weights: the weights block {ref.name!r} (version "
                                 f"{ref.version}) was already released; pass the reference the "
                                 "latest put_weights() returned")
            block.users += 1

    def _release(self, names: list[str]) -> None:
        if not names:
            return
        with self._lock:
            for name in names:
                block = self._blocks.get(name)
                if block is not None:
                    block.users -= 1
            self._collect()

    def _collect(self) -> None:
        """Frees every block no worker can still read (never the latest one): keeps a few
        for reuse, unlinks the rest."""
        for name, block in list(self._blocks.items()):
            if block.users <= 0 and name != self._latest:
                del self._blocks[name]
                if len(self._free) < _MAX_FREE_BLOCKS:
                    self._free.append(block.memory)
                else:
                    _unlink(block.memory)

    def shared_blocks(self) -> tuple[list[str], list[str]]:
        """Names of this backend's shared-memory blocks: ``(in use, kept for reuse)``; the
        blocks in use are the latest broadcast's and those workers may still read."""
        with self._lock:
            return list(self._blocks), [m.name for m in self._free]

    # -- completion
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

    def _wait_until_done(self, fut: ProcessFuture) -> None:
        while not fut.done():
            self._receive({fut.handle}, None)

    def _receive(self, handles: set[ProcessWorkerHandle], timeout: float | None) -> None:
        """Waits up to ``timeout`` for any of ``handles`` to answer or die; handles it all."""
        handles = {h for h in handles if h._alive}
        if not handles:
            return
        objects: dict[Any, ProcessWorkerHandle] = {}
        try:
            for h in handles:
                objects[h.conn] = h
                objects[h.process.sentinel] = h
            ready = multiprocess.connection.wait(list(objects), timeout)
        except _PIPE_GONE:
            # Another thread (shutdown at exit) closed a pipe or process meanwhile: its
            # futures were failed there; the caller looks at the futures again.
            return
        exited = set()
        for obj in ready:
            h = objects[obj]
            if obj is h.conn:
                if not self._drain(h):
                    exited.add(h)
            else:
                exited.add(h)
        for h in exited:
            self._on_worker_exit(h)

    def _drain(self, h: ProcessWorkerHandle) -> bool:
        """Handles every message waiting on the worker's pipe; False at EOF."""
        while h._alive:
            try:
                if not h.conn.poll(0):
                    break
                data = h.conn.recv_bytes()
            except _PIPE_GONE:
                return False
            self._on_message(h, data)
        return True

    def _on_message(self, h: ProcessWorkerHandle, data: bytes) -> None:
        kind, payload = pickle.loads(data)
        h._num_messages += 1
        with self._lock:
            fut = h._pending.popleft() if h._pending else None
        if kind == "ok":
            if fut is not None:
                fut._finish(value=payload)
        else:
            err = WorkerError(h.index, payload["env_id"], payload["message"],
                              payload["traceback"])
            h.env_id = payload["env_id"]
            h._failure = err
            if fut is not None:
                fut._finish(error=err)
        if fut is not None:
            self._release(fut.weight_blocks)

    def _on_worker_exit(self, h: ProcessWorkerHandle) -> None:
        """The worker's pipe closed or its process ended: fail what it still owed."""
        if not h._alive:
            return
        while True:  # what it sent before it ended (its error record)
            try:
                if not h.conn.poll(0):
                    break
                data = h.conn.recv_bytes()
            except _PIPE_GONE:
                break
            self._on_message(h, data)
        with self._lock:
            if not h._alive:  # stopped meanwhile by another thread
                return
            h._alive = False
        with contextlib.suppress(ValueError):  # ValueError: closed by a concurrent stop
            h.process.join(_EXIT_JOIN_S)
            h.exitcode = h.process.exitcode
        if h._failure is not None:
            err = WorkerError(h.index, h.env_id,
                              "the worker process ended after an earlier error "
                              f"({str(h._failure).split(' failed: ', 1)[-1].splitlines()[0]})",
                              h._failure.remote_traceback)
        else:
            hint = _unguarded_main_hint() if h._num_messages == 0 and h.exitcode == 1 else ""
            err = WorkerError(h.index, h.env_id, f"the worker process (pid {h.pid}) "
                              f"{_exit_description(h.exitcode)}; its pending sample "
                              f"requests are lost{hint}")
            h._failure = err
        self._fail_pending(h, err)
        with contextlib.suppress(*_PIPE_GONE):
            h.conn.close()

    def _fail_pending(self, h: ProcessWorkerHandle, err: WorkerError) -> None:
        with self._lock:  # the driver thread and a shutdown at exit may both get here
            pending, h._pending = h._pending, deque()
            unconsumed, h._unconsumed = h._unconsumed, []
            for fut in pending:
                fut._finish(error=err)
                self._release(fut.weight_blocks)
            self._release(unconsumed)

    # -- ending
    def stop_worker(self, handle: WorkerHandle) -> None:
        """Ends one worker (dead or alive): stop, join 2 s, terminate, join, kill."""
        assert isinstance(handle, ProcessWorkerHandle)
        self._stop([handle])

    def _stop(self, handles: list[ProcessWorkerHandle]) -> None:
        with self._lock:
            handles = [h for h in handles if not h._stopped]
            for h in handles:
                h._stopped = True
                if h._alive:  # from now on no thread reads its pipe or sends to it
                    h._alive = False
                    h._failure = h._failure or WorkerError(
                        h.index, h.env_id, "the worker was stopped by the driver")
        for h in handles:  # all at once: the workers exit in parallel
            with contextlib.suppress(*_PIPE_GONE):
                h._send(("stop",))
            with contextlib.suppress(*_PIPE_GONE):
                h.conn.close()  # a worker blocked writing a batch gets EPIPE and exits
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
            # Only now that it has ended: a running worker might still open a weights block.
            self._fail_pending(h, h._failure or WorkerError(
                h.index, h.env_id, "the worker was stopped by the driver"))
        with self._lock:
            for h in handles:
                if h in self.handles:
                    self.handles.remove(h)
                h.exitcode = h.process.exitcode
                with contextlib.suppress(ValueError):
                    h.process.close()  # frees its sentinel; ValueError: still running

    def shutdown(self) -> None:
        """Stops every worker (in parallel) and unlinks every weights block; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self.handles)
        try:
            self._stop(handles)
        finally:
            with self._lock:
                blocks, self._blocks = self._blocks, {}
                free, self._free = self._free, []
                self._latest = None
                for memory in [b.memory for b in blocks.values()] + free:
                    _unlink(memory)
            _live_backends.discard(self)


# ``ProcessBackend._block_prefix`` + a block number.
_BLOCK_NAME = re.compile(r"il(\d+)_[0-9a-f]{6}_\d+")
_SHM_DIR = "/dev/shm"
# A driver pid counts as reused (its blocks stale) only if the process holding it now
# started this long after the block was last written (clock readings from /proc differ by
# about a second).
_PID_REUSE_MARGIN_S = 60.0


def remove_stale_blocks(shm_dir: str = _SHM_DIR) -> list[str]:
    """Unlink the weights blocks of drivers that are gone; returns the names removed.

    A block ``il<pid>_<random>_<n>`` of this user is stale when process ``pid`` does not
    exist (or is a zombie), or started more than a minute after the block was last written
    (the pid was reused). Blocks of live drivers, of other users and other names are left
    alone. Where there is no ``/dev/shm`` (not Linux) there is nothing to do.
    """
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _BLOCK_NAME.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(shm_dir, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid != os.getuid() or _block_owner_alive(int(match.group(1)), st.st_mtime):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(name)
    return removed


def _block_owner_alive(pid: int, block_mtime: float) -> bool:
    if pid == os.getpid():
        return True
    if not pid_exists(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):  # ended, not yet reaped
            return False
        with open("/proc/stat") as fh:
            boot = next(float(line.split()[1]) for line in fh if line.startswith("btime "))
        started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return True  # cannot tell: keep the block
    return started <= block_mtime + _PID_REUSE_MARGIN_S


def _unlink(memory: shared_memory.SharedMemory) -> None:
    with contextlib.suppress(Exception):
        memory.close()
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()


def _unguarded_main_hint() -> str:
    """Why a worker may die while starting: spawn runs the driver's script again in the
    worker, and a script that builds the run at top level tries to start workers from there
    (multiprocess refuses). Said only if the script has no ``__main__`` guard."""
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


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering (its pipe closed; the process has not exited yet)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"
