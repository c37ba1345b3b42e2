"""The process table and the thread list, for tests that check a run leaves nothing behind.

    with no_leaks():            # fails if a child process or a thread started inside
        ...                     # the block is still alive shortly after it ends

Child processes are read from /proc (Linux). The ``multiprocess``/``multiprocessing``
resource trackers are excluded: each is one helper per interpreter that lives until the
interpreter exits, started by the first shared-memory block, not a leak of a run.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

# One /proc reader for the soak and the tests.
from bench.soak import child_pids as children_of
from bench.soak import resource_tracker_pids

__all__ = ["Leaks", "alive", "children_of", "no_leaks", "resource_tracker_pids", "wait_gone"]


def alive(pid: int) -> bool:
    """True while ``pid`` is a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until no pid of ``pids`` is alive; returns those still alive at ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


class Leaks:
    """What `no_leaks` found: child pids and thread names still alive after the block."""

    def __init__(self) -> None:
        self.processes: list[int] = []
        self.threads: list[str] = []


@contextlib.contextmanager
def no_leaks(timeout: float = 10.0) -> Iterator[Leaks]:
    """Assert that every child process and thread started inside the block has ended within
    ``timeout`` seconds after it (daemon threads too: the learner, loader and driver threads
    are daemons, and a leaked one would keep a run's memory alive)."""
    me = os.getpid()
    processes_before = set(children_of(me))
    threads_before = set(threading.enumerate())
    leaks = Leaks()
    yield leaks
    new = [p for p in children_of(me) if p not in processes_before
           and p not in resource_tracker_pids()]
    leaks.processes = wait_gone(new, timeout)
    deadline = time.monotonic() + timeout
    while True:
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if not threads or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    leaks.threads = [t.name for t in threads]
    assert leaks.processes == [], f"child processes left behind: {leaks.processes}"
    assert leaks.threads == [], f"threads left behind: {leaks.threads}"
