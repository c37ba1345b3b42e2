"""The worker process of the process backend: one `RolloutWorker` serving the driver's
commands over a duplex pipe (messages pickled with protocol 5: an array is one copy)::

    driver -> worker   ("set_weights", SharedWeights)   no reply; applied before the next sample
                       ("sample",)                      reply ("ok", SampleBatch)
                       ("info",)                        reply ("ok", dict)  (tests, diagnostics)
                       ("stop",)                        the worker exits at once
    worker -> driver   ("ok", value) or ("error", record) for each request, in request order

A queued ``stop`` ends the worker before the samples queued in front. It ignores SIGINT, and
exits when its pipe closes or its parent dies (a watchdog thread compares ``os.getppid()``:
``PR_SET_PDEATHSIG`` would fire when the *thread* that started it ends). An env that raises,
cannot be built or calls ``sys.exit()`` is answered with an error record and the worker exits.
Each worker leads a session of its own, so the processes its env starts end with it
(`end_process_group`). Never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from impala_lab.backends.shared_weights import SharedWeights, SharedWeightsReader
from impala_lab.backends.worker_info import describe_env, worker_info

__all__ = ["worker_main"]

_WATCHDOG_PERIOD_S = 0.5


def worker_main(conn: Any, parent_pid: int, index: int, env_blob: bytes,
                kwargs: dict[str, Any]) -> None:
    """The worker process's target: builds a `RolloutWorker` (``env_blob``: the env id or
    factory, cloudpickled; ``kwargs``: its other arguments) and serves the driver on ``conn``
    until it stops or ``parent_pid`` is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # already a group leader (not under spawn)
        os.setsid()
    _watch_parent(parent_pid)
    worker = _build_worker(conn, index, env_blob, kwargs)
    reader = SharedWeightsReader()
    try:
        _serve(conn, worker, reader)
    except (EOFError, OSError):
        return  # the driver closed the pipe (or died): nothing left to serve
    finally:
        reader.close()
        worker.close()


def _watch_parent(parent_pid: int) -> None:
    """Ends this process once its parent is gone (re-parented: getppid() changes)."""

    def watch() -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            if os.getppid() != parent_pid:
                end_process_group(os.getpid())  # the env's helpers, and this process
                os._exit(0)

    threading.Thread(target=watch, name="impala_lab-parent-watchdog", daemon=True).start()


def end_process_group(pgid: int) -> None:
    """SIGKILLs every process left in the worker's group ``pgid`` (its pid); never the
    driver's own group."""
    if pgid <= 1 or (pgid == os.getpgrp() and pgid != os.getpid()):
        return  # never the driver's own group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _send(conn: Any, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=5))


def _send_error(conn: Any, exc: BaseException, what: str, env_id: str) -> None:
    """Answers the current request with the exception (called inside its ``except``)."""
    _send(conn, ("error", {"type": type(exc).__name__,
                           "message": f"{what}{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(), "env_id": env_id}))


def _build_worker(conn: Any, index: int, env_blob: bytes, kwargs: dict[str, Any]) -> Any:
    """The `RolloutWorker`; if it cannot be built, the error record answers the driver's
    first request and the process exits with code 1."""
    from impala_lab.actor import make_rollout_worker

    env_id = f"<env of worker {index}>"
    try:
        env = pickle.loads(env_blob)  # cloudpickle's output loads with plain pickle
        env_id = describe_env(env)
        return make_rollout_worker(env=env, **kwargs)
    except (Exception, SystemExit) as exc:
        with contextlib.suppress(OSError):  # the driver is gone already
            _send_error(conn, _named(exc), "could not start: ", env_id)
        sys.exit(1)


def _named(exc: BaseException) -> BaseException:
    """An env's ``sys.exit()`` as an error that says so; any other exception as it is."""
    if not isinstance(exc, SystemExit):
        return exc
    err = RuntimeError(f"the env called sys.exit({exc.code!r}), which would end the worker "
                       "process; an env must raise an exception (or end its episode) instead")
    err.__cause__ = exc
    return err


def _serve(conn: Any, worker: Any, reader: SharedWeightsReader) -> None:
    """Answers commands until ``stop``; raises EOFError or OSError once the pipe is gone."""
    commands: deque[tuple] = deque()
    wanted: SharedWeights | None = None  # the latest set_weights
    current: int | None = None  # serial of the broadcast whose weights are in use
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
            except (Exception, SystemExit) as exc:
                _send_error(conn, _named(exc), "", worker.env_id)
                sys.exit(1)  # a broken env is not reused: the driver restarts the worker
            _send(conn, ("ok", batch))
        elif cmd[0] == "info":
            _send(conn, ("ok", worker_info(worker)))
        else:
            raise ValueError(f"unknown command {cmd[0]!r}")
