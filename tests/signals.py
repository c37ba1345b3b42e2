"""Signals in the child processes that tests interrupt."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """In a child before exec: Ctrl-C's and the hang-up's defaults, which a shell that started
    this test run in the background (SIGINT ignored) or under nohup (SIGHUP ignored) would
    otherwise leave out: Python keeps a signal it was started with ignored, so the child would
    never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
