"""Live figures for the dashboard, redrawn cheaply from growing data (`LiveFigure`), a child
process that draws them (`PlotProcess`), so matplotlib's hold on the GIL spares the run, and
`PlotScheduler`, which decides which plot to draw next, where, and within what CPU.

Only a plot whose history has new rows is drawn, the most overdue first (headline plots every
``interval``, the queues every two, the learner's axes every three), and a token bucket holds
drawing to ``budget`` of one core. The poller's plots go to a `PlotProcess`; if it cannot start
or dies, they are drawn in the calling thread within ``min(budget, IN_THREAD_BUDGET)``.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from impala_lab.dashboard.plots import HasColumns, columns, new_figure, view_panels


def png_bytes(rgb: np.ndarray) -> bytes:
    """uint8 [H, W, 3] as PNG bytes, at a fast zlib level (a live PNG lives seconds)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format="png", compress_level=1)
    return buf.getvalue()


class LiveFigure:
    """A view drawn again and again from growing data, cheaply: unless the axes limits or
    knob marks changed, a render restores the saved background and draws only the animated
    artists (blitting). ``full_draws`` and ``renders`` count both kinds.

        png = LiveFigure("throughput").render(impala.history)   # bytes for an Image widget
    """

    def __init__(self, view: str) -> None:
        self.view = view
        self.panels = view_panels(view)
        self.fig = new_figure(view, self.panels, True)
        self.canvas: FigureCanvasAgg = self.fig.canvas
        self.keys = [k for p in self.panels for k in p.keys]
        self._background: Any = None
        self.full_draws = 0
        self.renders = 0

    def render(self, source: Sequence[Mapping] | HasColumns) -> bytes:
        """PNG bytes of the view of `source` (rows or a `StatsHistory`)."""
        return self.render_columns(columns(source, self.keys))

    def render_columns(self, cols: Mapping[str, np.ndarray]) -> bytes:
        """PNG bytes of the view of `columns` (as `columns` returns them)."""
        changed = self._background is None
        for panel in self.panels:
            changed |= panel.update(cols)
        if changed:
            self.canvas.draw()  # animated artists are left out of the background
            self._background = self.canvas.copy_from_bbox(self.fig.bbox)
            self.full_draws += 1
        else:
            self.canvas.restore_region(self._background)
        for panel in self.panels:
            for artist in panel.artists:
                panel.ax.draw_artist(artist)
        self.renders += 1
        return png_bytes(np.asarray(self.canvas.buffer_rgba())[..., :3])


# ---------------------------------------------------------------------- the plot process
def _serve(conn: Any, views: tuple[str, ...]) -> None:
    """The plot process: ``(view, columns)`` in, ``(view, png, cpu_s)`` out, until None."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupted cell is the kernel's affair
    figures = {view: LiveFigure(view) for view in views}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        view, cols = request
        start = time.process_time()
        png = figures[view].render_columns(cols)
        conn.send((view, png, time.process_time() - start))


class PlotProcess:
    """Live figures drawn in a child process, one request at a time (`submit`, then `poll`:
    None, or (view, png bytes, child CPU seconds)). The child is spawned (TensorFlow may be
    loaded here: no fork), ignores SIGINT and exits when the pipe closes."""

    def __init__(self, views: Sequence[str]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, tuple(views)), daemon=True,
                                   name="impala-dashboard-plots")
        self.process.start()
        child.close()
        self.pending: str | None = None

    def submit(self, view: str, cols: Mapping[str, np.ndarray]) -> None:
        """Ask for one view; one request may be pending at a time."""
        if self.pending is not None:
            raise RuntimeError(f"plot {self.pending!r} is still being drawn")
        self._conn.send((view, dict(cols)))
        self.pending = view

    def poll(self, timeout: float = 0.0) -> tuple[str, bytes, float] | None:
        """The finished request, or None; raises EOFError if the child died."""
        if self.pending is None:
            return None
        if not self._conn.poll(timeout):
            if not self.process.is_alive():
                raise EOFError("the plot process ended")
            return None
        result = self._conn.recv()
        self.pending = None
        return result

    def close(self, timeout: float = 2.0) -> None:
        """End the child: ask, wait, then terminate."""
        with contextlib.suppress(OSError, ValueError):  # already gone
            self._conn.send(None)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        self._conn.close()


# ---------------------------------------------------------------------- the schedule
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
