"""`Poller`: a daemon thread that calls a dashboard's ``tick()`` a few times a second, holding
it weakly; a tick that raises is counted and polling goes on, a tick that returns False ends it.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any


class Poller:
    """Calls ``target.tick()`` every ``1 / hz`` seconds in a thread of its own; counts
    ``ticks``, their ``cpu_s``, ``errors`` and keeps the ``last_error``."""

    def __init__(self, hz: float, name: str) -> None:
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.name = name
        self.ticks = 0
        self.cpu_s = 0.0
        self.errors = 0
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, target: Any) -> None:
        """Start polling `target` (held weakly); no-op while running."""
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(weakref.ref(target), self._stop),
                                        name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to end and wait for it (unless called from it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self, ref: weakref.ref, stop: threading.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            target = ref()
            if target is None:
                return
            cpu = time.thread_time()
            try:
                alive = target.tick()
            except Exception as exc:  # e.g. a torn read while someone steps by hand
                self.errors += 1
                self.last_error = exc
                alive = True
            self.ticks += 1
            self.cpu_s += time.thread_time() - cpu
            del target
            if not alive:
                return
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow render): do not try to catch up
                next_at, delay = time.monotonic(), self.interval / 2
            stop.wait(delay)
