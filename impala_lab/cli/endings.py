"""How ``impala-lab train`` ends: the signals that end a run (`EndingSignals`), and output
streams that fail (a closed pipe, a full disk, a hung-up terminal), which end the output
(`say`, `Output`), never the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

# What a failing stream raises: OSError (EPIPE, ENOSPC, EIO, EBADF) or ValueError (a file
# object closed under us).
STREAM_ERRORS = (OSError, ValueError)


class EndingSignals:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (as Ctrl-C does) until `defer`, and the exit
    code says which signal ended the run; a signal ignored at the start (``nohup``) stays so."""

    SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s)

    def __init__(self) -> None:
        self.signum = signal.SIGINT
        self.late: int | None = None  # a signal that came while the outputs were written
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS
                          if signal.getsignal(s) is not signal.SIG_IGN}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def _note(self, signum: int, frame: Any) -> None:
        if self.late is None:
            say("impala-lab: writing the run's outputs first (a few seconds); the run ends "
                "then", err=True)
        self.late = self.late or signum

    def defer(self) -> None:
        """From now on (the final saves) a signal is noted, not raised."""
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous.setdefault(signal.SIGINT, signal.getsignal(signal.SIGINT))
        for s in self._previous:
            signal.signal(s, self._note)

    def exit_code(self, interrupted: bool) -> int | None:
        """128 + the signal that ended the run, or that came during its saves; None if no
        signal came."""
        if interrupted:
            return 128 + int(self.signum)
        return None if self.late is None else 128 + int(self.late)

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def say(text: str, err: bool = False) -> bool:
    """Prints a line, and whether it was written (a stream that fails is silenced)."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
        return True
    except STREAM_ERRORS:
        silence(stream)
        return False


def silence(stream: Any) -> None:
    """Points a failing stream at /dev/null, so that later writes (and Python's flush at
    exit) do not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


class Output:
    """The progress output: on until its stream fails once."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, show: Callable[..., Any], *args: Any) -> None:
        if not self.on:
            return
        try:
            show(*args)
        except STREAM_ERRORS:
            self.on = False
            silence(sys.stdout)


def open_std_streams() -> None:
    """A standard stream closed before the start (``impala-lab train >&-``) becomes /dev/null:
    else the next file the run opens would get its descriptor (and the progress lines)."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115
