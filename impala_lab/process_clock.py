"""When this process started, on the `time.monotonic` clock: start-up figures (the CLI's
seconds to a target, ``stats()["startup"]``) count the interpreter's and TensorFlow's start.

Standard library only: imported before anything heavy loads.
"""

from __future__ import annotations

import os
import time

__all__ = ["process_start", "seconds_since_process_start"]

# Where the OS cannot say when the process started: this module is imported early.
_IMPORTED_AT = time.monotonic()


def process_start() -> float:
    """When this process started (`time.monotonic` seconds). Linux says it in /proc/self/stat
    (clock ticks since boot); elsewhere it is when this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            # after "pid (comm)": the command name may hold spaces
            fields = fh.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):  # no /proc, no CLOCK_BOOTTIME
        return _IMPORTED_AT
    return min(time.monotonic() - age, _IMPORTED_AT)


def seconds_since_process_start(at: float | None) -> float | None:
    """``at`` (a `time.monotonic` reading) as seconds since this process started; None
    stays None."""
    return None if at is None else round(at - process_start(), 3)
