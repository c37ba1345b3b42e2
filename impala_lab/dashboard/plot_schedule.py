"""`PlotScheduler`: which live plot the dashboard draws next, where, and within what CPU.

Only a plot whose history has new rows is drawn, the most overdue first (headline plots every
``interval``, the queues every two, the learner's axes every three), and a token bucket holds
drawing to ``budget`` of one core. The poller's plots go to a `PlotProcess`; if it cannot start
or dies, they are drawn in the calling thread within ``min(budget, IN_THREAD_BUDGET)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from impala_lab.dashboard.live_plots import LiveFigure, PlotProcess
from impala_lab.dashboard.plots import columns

# Drawing in the poller thread holds the kernel's GIL: keep it to 3 % of a core.
IN_THREAD_BUDGET = 0.03
PLOT_BURST_S = 1.0  # CPU seconds the plots may spend at once (see allowed)


#: A view's interval in units of the scheduler's ``interval`` (the learner's axes: 3).
INTERVAL_UNITS = {"throughput": 1.0, "return": 1.0, "queues": 2.0}


class PlotScheduler:
    """Draws the live views of one history, most overdue first, within a CPU budget.

    Args:
      interval: seconds between two renders of a headline view, at least.
      budget: share of one core the plots may use on average, in (0, 1].
      use_process: draw the poller's plots in a child process.
      show: called with ``(view, png bytes)`` for every render.

    Attributes:
      renders, seconds: plots drawn, and the CPU seconds spent drawing them.
      child: the `PlotProcess` while one runs, else None.
    """

    def __init__(self, views: Sequence[str], *, interval: float, budget: float,
                 use_process: bool, show: Callable[[str, bytes], None]) -> None:
        self.views = tuple(views)
        self.interval = interval
        self.budget = budget
        self.use_process = use_process
        self.show = show
        self.live = {view: LiveFigure(view) for view in self.views}
        self.child: PlotProcess | None = None
        self.renders = 0
        self.seconds = 0.0
        self._rows_seen: dict[str, int] = dict.fromkeys(self.views, -1)
        self._last: dict[str, float] = dict.fromkeys(self.views, -math.inf)
        # `budget` core-seconds accrue per second, up to a burst for the first full draws
        self._tokens = PLOT_BURST_S
        self._refilled = time.monotonic()

    def blank(self, view: str) -> bytes:
        """The view without data (the image before the first rows)."""
        return self.live[view].render([])

    def due(self, history: Any) -> tuple[list[str], int]:
        """Views whose history has rows they have not drawn, and the history's length."""
        n = len(history)
        if n == 0:
            return [], 0
        full = n >= getattr(history, "maxlen", math.inf)  # rows roll over: always new
        return [v for v in self.views if full or self._rows_seen[v] != n], n

    def most_overdue(self, due: list[str], now: float) -> str | None:
        """The due view longest past its interval; None if none is past it yet."""
        overdue = {v: (now - self._last[v]) / (self.interval * INTERVAL_UNITS.get(v, 3.0))
                   for v in due}
        view = max(overdue, key=overdue.get) if overdue else None
        return view if view is not None and overdue[view] >= 1 else None

    def allowed(self, budget: float) -> bool:
        """Whether the bucket holds CPU time for another render (it refills at `budget`)."""
        now = time.monotonic()
        burst = PLOT_BURST_S * min(1.0, budget / self.budget)
        self._tokens = min(burst, self._tokens + budget * (now - self._refilled))
        self._refilled = now
        return self._tokens > 0

    def redraw_soon(self) -> None:
        """Make every view overdue: the next turns draw each one with new rows."""
        self._last = dict.fromkeys(self.views, -math.inf)

    def _drawn(self, view: str, png: bytes, cpu_s: float) -> None:
        self.show(view, png)
        self.renders += 1
        self.seconds += cpu_s
        self._tokens -= cpu_s

    def _mark(self, view: str, rows: int, now: float) -> None:
        self._rows_seen[view] = rows
        self._last[view] = now

    def step(self, history: Any) -> BaseException | None:
        """The poller's turn: at most one view; returns the error that lost the child, if any."""
        if not self.use_process:
            self.draw_here(history, force=False)
            return None
        try:
            if self.child is None:
                self.child = PlotProcess(self.views)
            done = self.child.poll()
        except (OSError, EOFError, RuntimeError) as exc:  # no child: draw in this thread
            self.use_process = False
            self.close()
            return exc
        if done is not None:
            self._drawn(*done)
        if self.child.pending is not None:
            return None
        due, n = self.due(history)
        if not due or not self.allowed(self.budget):
            return None
        now = time.monotonic()
        view = self.most_overdue(due, now)
        if view is not None:
            self.child.submit(view, columns(history, self.live[view].keys))
            self._mark(view, n, now)
        return None

    def draw_here(self, history: Any, force: bool) -> None:
        """Draw in this thread: every due view when forced; else the most overdue one, once
        its interval passed and the (smaller) in-thread budget allows."""
        due, n = self.due(history)
        if not due:
            return
        if not force:
            allowed = self.allowed(min(self.budget, IN_THREAD_BUDGET))
            view = self.most_overdue(due, time.monotonic()) if allowed else None
            if view is None:
                return
            due = [view]
        for view in due:
            # CPU time of this thread, not wall time: waiting for the GIL is not our cost.
            start = time.thread_time()
            png = self.live[view].render(history)
            self._drawn(view, png, time.thread_time() - start)
            self._mark(view, n, time.monotonic())

    def close(self) -> None:
        """End the child process, if any (a later `step` starts a new one)."""
        child, self.child = self.child, None
        if child is not None:
            child.close()
