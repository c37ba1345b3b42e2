"""`BackgroundTraining` (an `Impala` mixin): ``train()`` in a daemon thread while the caller
(a notebook cell) goes on; an error there is kept and raised by ``pause()`` or ``wait()``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from impala_lab.driver.run_stats import StopCondition
from impala_lab.errors import ImpalaError

__all__ = ["BackgroundTraining"]


class BackgroundTraining:
    """``start``/``pause``/``wait`` of an `Impala` run (which sets ``_background``,
    ``_driver``, ``_pause_requested``, ``background_error`` and ``last_result``, and has
    ``train()`` and ``_check_running()``)."""

    @contextlib.contextmanager
    def driving_thread(self) -> Iterator[None]:
        """Within it, the calling thread steps this run: other threads' ``stats()`` read the
        pipeline view its last step left, and their ``step()`` raises (no-op under ``start()``)."""
        if self._driver is not None:
            yield
            return
        self._driver = threading.current_thread()
        try:
            yield
        finally:
            self._driver = None

    def start(self, stop: StopCondition = None, *, max_seconds: float | None = None,
              max_env_steps: int | None = None, report_interval: float = 1.0) -> None:
        """Train in a background thread: the notebook cell returns, the dashboard keeps moving.
        Arguments as in ``train()``; the result lands in ``last_result``."""
        self._check_running()
        if self.is_training:
            raise ImpalaError("this run is already training in the background")
        self._pause_requested.clear()
        self.background_error = None

        def loop() -> None:
            try:
                self.last_result = self.train(stop, max_seconds=max_seconds,
                                              max_env_steps=max_env_steps,
                                              report_interval=report_interval)
            except BaseException as exc:  # kept for pause()/wait(), shown by the dashboard
                self.background_error = exc

        thread = threading.Thread(target=loop, name="impala-driver", daemon=True)
        self._background = self._driver = thread
        thread.start()

    @property
    def is_training(self) -> bool:
        """True while a background ``start()`` is running."""
        return self._background is not None and self._background.is_alive()

    def pause(self, timeout: float = 30.0) -> None:
        """End background training after the current step; raise its error, if any."""
        self._pause_requested.set()
        self.wait(timeout)

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until background training ends; raise its error, if any."""
        thread = self._background
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise ImpalaError(f"background training did not end within {timeout} s")
            self._background = None
            if self._driver is thread:
                self._driver = None
        self._pause_requested.clear()
        if self.background_error is not None:
            error, self.background_error = self.background_error, None
            raise error
        return self.last_result
