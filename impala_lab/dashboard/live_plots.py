"""Live figures for the dashboard, redrawn cheaply from growing data (`LiveFigure`), and a
child process that draws them (`PlotProcess`), so matplotlib's hold on the GIL spares the run.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Mapping, Sequence
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
