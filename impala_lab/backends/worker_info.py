"""What the process and Ray backends share: sending the env to another process (with
cloudpickle: a notebook's factory by value, a module's by reference), and a worker's report
about itself."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["describe_env", "pickled_env", "rss_bytes", "worker_info"]


#: Where cgroup v2 is mounted (tests point it elsewhere).
CGROUP_ROOT = "/sys/fs/cgroup"


def describe_env(env: Any) -> str:
    """The env's name for messages: its id, or its factory's ``__qualname__``."""
    from impala_lab.actor.rollout_worker import env_description

    try:
        return env_description(env)
    except Exception:
        return type(env).__name__


def pickled_env(env: Any, backend: str, destination: str, importable: str,
                dumps: Callable[[Any], bytes] | None = None) -> bytes:
    """``env`` pickled (by ``dumps``, default cloudpickle's), or a ValueError that says why it
    cannot travel; ``backend``, ``destination`` (``"a worker process"``) and ``importable``
    (where an importable factory must live) word the message."""
    if dumps is None:
        import cloudpickle

        def dumps(obj: Any) -> bytes:
            return cloudpickle.dumps(obj, protocol=5)

    try:
        return dumps(env)
    except Exception as exc:
        raise ValueError(
            f"backend={backend!r} cannot send the env factory {describe_env(env)!r} to "
            f"{destination}: cloudpickle could not pickle it ({type(exc).__name__}: {exc}). "
            "It probably holds or closes over an open handle (lock, file, socket, database "
            "connection, generator, C-extension object). Create such objects inside the "
            f"factory, or define the factory in an importable module ({importable}) and pass "
            "that function; backend='inline' needs no pickling."
        ) from exc


def rss_bytes() -> int | None:
    """This process's resident memory in bytes (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def worker_info(worker: Any) -> dict[str, Any]:
    """What a `RolloutWorker` in this process reports about itself (tests check that actors
    import neither TensorFlow nor Keras, and ignore SIGINT)."""
    return {
        "pid": os.getpid(), "ppid": os.getppid(), "index": worker.worker_index,
        "env_id": worker.env_id, "weights_version": worker.weights_version,
        "num_env_steps": worker.num_env_steps, "rss_bytes": rss_bytes(),
        "tensorflow_imported": "tensorflow" in sys.modules,
        "keras_imported": "keras" in sys.modules,
        "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
    }


def oom_kill_count() -> int | None:
    """How many processes the out-of-memory killer has ended in this process's memory cgroup
    (v2 or v1), or None where neither can be read. Read before and after a worker dies of
    SIGKILL, it tells an OOM kill from another process's ``kill -9``."""
    for path in _oom_count_files():
        try:
            with open(path) as fh:
                return next(int(line.split()[1]) for line in fh if line.startswith("oom_kill "))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return None


def _oom_count_files() -> list[str]:
    """Where this process's cgroup keeps its OOM-kill count, most specific first."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = [line.rstrip("\n").split(":", 2) for line in fh]
    except OSError:
        return []
    files = []
    for _, controllers, path in (x for x in lines if len(x) == 3):
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2
            files.append(os.path.join(CGROUP_ROOT, relative, "memory.events"))
        elif "memory" in controllers.split(","):  # cgroup v1 (a container may mount its own
            for folder in (relative, ""):          # cgroup as the hierarchy's root)
                files.append(os.path.join(CGROUP_ROOT, "memory", folder, "memory.oom_control"))
    return files
