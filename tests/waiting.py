"""Waiting in tests for a condition to hold: a thread's update, a process gone, a file
written. The deadline bounds a hang and is generous (a loaded 2-core machine runs these);
it is never a measurement, and a test that passes does not wait for it."""

from __future__ import annotations

import time
from collections.abc import Callable

DEADLINE_S = 60.0


def wait_for(predicate: Callable[[], object], what: str | Callable[[], str],
             timeout: float = DEADLINE_S, interval: float = 0.02) -> None:
    """Polls ``predicate`` every ``interval`` seconds until it is true; fails the test if it
    is still false after ``timeout`` seconds, naming ``what`` (a callable is called then, to
    say what went wrong as of that moment)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what() if callable(what) else what}: not within {timeout:g} s")
        time.sleep(interval)
