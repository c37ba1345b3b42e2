"""Matplotlib figures of a run, from a live run's history or a run directory's ``metrics.csv``.

The views (the same in the dashboard, in notebooks and in the CLI's ``report.png``):

- ``throughput``: sample and train throughput (env steps/s) over time;
- ``return``: mean episode return (last 100 episodes) over time;
- ``queues``: learner queue length (mean of the last 50 learner steps) and policy lag;
- ``timing``: the timing breakdown (ms) of the latest row, one bar per timer;
- ``learner``: total, policy and value loss; entropy; grad norm; mean rho and
  vf_explained_var, over time.

Knob changes (the ``knobs.*`` columns changing between rows) are marked with a dotted
vertical line on the plots over time, so the effect of a knob can be read off them.

Every figure is a plain `matplotlib.figure.Figure` on an Agg canvas (never pyplot: no global
state, safe in the dashboard's poller thread, nothing to close, no window). In a notebook a
figure shows as the cell's value::

    from impala_lab.dashboard import plots
    rows = plots.read_metrics_csv("runs/cartpole/metrics.csv")   # or impala.history.rows()
    plots.report_figure(rows)

`LiveFigure` serves the dashboard: it keeps its axes and only redraws the axes, ticks and
labels when the limits must change (they grow in steps, with headroom); otherwise it blits
the lines onto the saved background. A render then costs about 10 ms instead of 50-120 ms
on this 2-core machine (``python -m bench.dashboard_overhead`` measures the whole dashboard).
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from impala_lab.dashboard.terminal import TIMER_LABELS, fmt_knob, nice_ceil

TIMERS = ("optimizer_step_time_ms", "learner_grad_time_ms", "learner_load_time_ms",
          "learner_load_wait_time_ms", "learner_dequeue_time_ms")
X_KEY = "time_total_s"
MAX_POINTS = 600  # points drawn per line: longer runs are decimated evenly
TITLE_SIZE, LABEL_SIZE, TICK_SIZE, LEGEND_SIZE = 13, 11, 10, 10  # readable on a projector


class RunFigure(Figure):
    """A `Figure` on an Agg canvas that shows itself in a notebook (``_repr_png_``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        FigureCanvasAgg(self)

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png")
        return buf.getvalue()


# ---------------------------------------------------------------------- data
def read_metrics_csv(path: str | Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` as dicts of floats (empty cells become NaN)."""
    rows = []
    with open(path, newline="") as fh:
        for raw in csv.DictReader(fh):
            row = {}
            for key, text in raw.items():
                try:
                    row[key] = float(text) if text not in ("", None) else math.nan
                except ValueError:
                    row[key] = math.nan
            rows.append(row)
    return rows


def column(rows: Sequence[Mapping], key: str) -> np.ndarray:
    """One key over the rows: ``[len(rows)]`` float64, NaN where a row lacks it."""
    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        v = r.get(key)
        if isinstance(v, int | float | np.number) and not isinstance(v, bool):
            out[i] = float(v)
    return out


class _HasColumns(Protocol):
    def column(self, key: str) -> np.ndarray: ...


def columns(source: Sequence[Mapping] | _HasColumns, keys: Sequence[str],
            max_points: int = MAX_POINTS) -> dict[str, np.ndarray]:
    """The columns `keys` (plus ``time_total_s``) of rows or of a `StatsHistory`.

    Args:
      source: flat rows (``history.rows()``, ``read_metrics_csv``) or a `StatsHistory`.
      keys: flat keys such as ``"learner.total_loss"``.
      max_points: longer columns are decimated evenly to this many points, the last row
        always kept (a plot of a day-long run stays cheap).

    Returns:
      key -> ``[n]`` float64 array (NaN where a row lacks the key); all of one length.
    """
    keys = list(dict.fromkeys([X_KEY, *keys]))
    if hasattr(source, "column") and not isinstance(source, Sequence):
        cols = {}
        for k in keys:
            values = source.column(k)
            cols[k] = values if values.dtype == np.float64 else _as_float(values)
    else:
        cols = {k: column(source, k) for k in keys}
    n = len(cols[X_KEY])
    if n > max_points:
        idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
        cols = {k: v[idx] for k, v in cols.items()}
    return cols


def _as_float(values: np.ndarray) -> np.ndarray:
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if isinstance(v, int | float | np.number) and not isinstance(v, bool):
            out[i] = float(v)
    return out


KNOB_KEYS = ("knobs.broadcast_interval", "knobs.replay_proportion", "knobs.num_sgd_iter",
             "knobs.lr", "knobs.entropy_coeff")


def knob_marks(cols: Mapping[str, np.ndarray]) -> list[tuple[float, str]]:
    """``(time, "lr=0.001")`` wherever a ``knobs.*`` column changed from the previous row."""
    t = cols[X_KEY]
    changes: dict[int, list[str]] = {}
    for key in KNOB_KEYS:
        col = cols.get(key)
        if col is None or len(col) < 2:
            continue
        prev, cur = col[:-1], col[1:]
        for i in np.flatnonzero(np.isfinite(prev) & np.isfinite(cur) & (prev != cur)) + 1:
            value = float(col[i])
            shown = int(value) if value.is_integer() and key != "knobs.lr" else value
            changes.setdefault(int(i), []).append(f"{key.split('.', 1)[1]}={fmt_knob(shown)}")
    return [(float(t[i]), ", ".join(labels)) for i, labels in sorted(changes.items())
            if np.isfinite(t[i])]


# ---------------------------------------------------------------------- limits
def _x_limits(t: np.ndarray, cur: tuple[float, float] | None,
              live: bool) -> tuple[float, float] | None:
    """New x limits once the data leaves the current ones: live ones double, rounded (each
    change costs a full redraw); a static figure fits the data."""
    t = t[np.isfinite(t)]
    if not len(t):
        return None if cur else (0.0, 60.0 if live else 10.0)
    lo, hi = float(t.min()), float(t.max())
    if not live:
        return (lo, hi) if hi > lo else (lo, lo + 1.0)
    if cur is not None and cur[0] <= lo and hi <= cur[1]:
        return None
    lo = min(lo, 0.0) if lo < 60 else lo  # a run's clock starts at 0: keep the axis there
    return (lo, lo + nice_ceil(max((hi - lo) * 2.0, 60.0)))


def _y_limits(values: list[np.ndarray], cur: tuple[float, float] | None,
              floor: float | None, live: bool = True) -> tuple[float, float] | None:
    """New y limits, or None to keep `cur`.

    A static figure fits all the data. A live one fits the 2nd-98th percentile (a single
    spike, such as the first losses, is clipped instead of squashing the rest), with
    generous headroom, and changes only when that range leaves the limits or fills less than
    30 % of them: every change costs a full redraw.
    """
    finite = [v[np.isfinite(v)] for v in values]
    finite = [v for v in finite if len(v)]
    if not finite:
        return None if cur else (0.0, 1.0)
    both = np.concatenate(finite)
    if live and len(both) >= 20:
        lo, hi = (float(x) for x in np.percentile(both, [2, 98]))
    else:
        lo, hi = float(both.min()), float(both.max())
    if floor is not None:
        lo = min(lo, floor)
    span = hi - lo
    if span <= 0:  # a constant: give it a span, or it would be refitted on every render
        span = abs(hi) * 0.2 or 1.0
    if cur is not None:
        inside = cur[0] <= lo and hi <= cur[1]
        if inside and span >= 0.3 * (cur[1] - cur[0]):
            return None
    below, above = (0.15, 0.6) if live else (0.1, 0.08)
    new_lo = floor if floor is not None and lo >= floor else lo - below * span
    return (new_lo, hi + above * span)


def short_number(x: float, _pos: Any = None) -> str:
    """Tick labels of at most about 5 characters: 15000 -> "15k", 2.5e6 -> "2.5M"."""
    a = abs(x)
    if a == 0:
        return "0"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{x / div:.3g}{suffix}"
    if a >= 0.01:
        return f"{x:.3g}"
    return f"{x:.0e}"


def _style(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.set_title(title, fontsize=TITLE_SIZE, loc="left")
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    # Short labels keep the axes' width steady, so live figures can use fixed margins.
    ax.yaxis.set_major_formatter(FuncFormatter(short_number))
    ax.xaxis.set_major_formatter(FuncFormatter(short_number))


# ---------------------------------------------------------------------- panels
@dataclass(frozen=True)
class Series:
    key: str
    label: str
    color: str


class LinePanel:
    """One axes of lines over time, with knob-change marks.

    ``setup(ax, animated)`` draws the static parts; ``update(cols)`` sets the lines' data
    and returns True when the static parts changed (limits, knob marks), i.e. when a blitting
    renderer must redraw the whole figure.
    """

    def __init__(self, title: str, series: Sequence[Series], ylabel: str = "", *,
                 y_floor: float | None = None, legend: bool = True) -> None:
        self.title, self.series, self.ylabel = title, tuple(series), ylabel
        self.y_floor, self.legend = y_floor, legend
        self.ax: Axes | None = None
        self.lines: list[Any] = []
        self._marks: list[tuple[float, str]] = []
        self._mark_artists: list[Any] = []

    @property
    def keys(self) -> list[str]:
        return [s.key for s in self.series] + list(KNOB_KEYS)

    @property
    def artists(self) -> list[Any]:
        return self.lines

    def setup(self, ax: Axes, animated: bool) -> None:
        self.ax = ax
        self.live = animated
        _style(ax, self.title, "seconds", self.ylabel)
        self.lines = [ax.plot([], [], color=s.color, lw=2, label=s.label, animated=animated)[0]
                      for s in self.series]
        if self.legend and len(self.series) > 1:
            # Above the axes, right of the title: never over the lines, so a live figure keeps
            # it in the background instead of drawing its text at every render.
            ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(self.series),
                      fontsize=LEGEND_SIZE, frameon=False, borderaxespad=0.1,
                      handlelength=1.2, columnspacing=0.8, handletextpad=0.4)
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 1)

    def update(self, cols: Mapping[str, np.ndarray]) -> bool:
        ax = self.ax
        t = cols[X_KEY]
        ys = [cols.get(s.key, np.full(len(t), np.nan)) for s in self.series]
        for line, y in zip(self.lines, ys):
            line.set_data(t, y)
            # A line through one point draws nothing: mark a lone point.
            line.set_marker("o" if np.isfinite(y).sum() == 1 else "None")
        changed = False
        xl = _x_limits(t, tuple(ax.get_xlim()) if self._has_limits else None, self.live)
        if xl is not None:
            ax.set_xlim(*xl)
            changed = True
        yl = _y_limits(ys, tuple(ax.get_ylim()) if self._has_limits else None, self.y_floor,
                       self.live)
        if yl is not None:
            ax.set_ylim(*yl)
            changed = True
        # Without data the limits are placeholders: the first data must fit them afresh.
        self._has_limits = bool(np.isfinite(t).any())
        marks = knob_marks(cols)
        if marks != self._marks:
            for a in self._mark_artists:
                a.remove()
            self._mark_artists = []
            for x, label in marks:
                self._mark_artists.append(ax.axvline(x, color="#555", ls=":", lw=1.5))
                self._mark_artists.append(ax.annotate(
                    label, (x, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", va="top", fontsize=9, color="#333",
                    rotation=90))
            self._marks = marks
            changed = True
        return changed

    _has_limits = False
    live = True


class TimingPanel:
    """Horizontal bars: the timing breakdown (ms) of the last row that has one."""

    def __init__(self, title: str = "timing breakdown (mean ms)") -> None:
        self.title = title
        self.timers = list(TIMER_LABELS)
        self.ax: Axes | None = None
        self.bars: list[Any] = []
        self.texts: list[Any] = []
        self._xmax: float | None = None

    @property
    def keys(self) -> list[str]:
        return [f"timing_breakdown.{k}" for k in self.timers]

    @property
    def artists(self) -> list[Any]:
        return [*self.bars, *self.texts]

    def setup(self, ax: Axes, animated: bool) -> None:
        self.ax = ax
        _style(ax, self.title, "ms", "")
        ax.grid(True, axis="x", alpha=0.3)
        ax.grid(False, axis="y")
        y = np.arange(len(self.timers))
        colors = ["#555555", "#d35400", "#218a3b", "#c0392b", "#8e44ad", "#7f8c8d", "#1f77b4"]
        self.bars = list(ax.barh(y, np.zeros(len(y)), color=colors[:len(y)], height=0.6,
                                 animated=animated))
        ax.set_yticks(y, [TIMER_LABELS[k] for k in self.timers], fontsize=LABEL_SIZE)
        ax.invert_yaxis()
        self.texts = [ax.text(0, yi, "", va="center", fontsize=TICK_SIZE, animated=animated)
                      for yi in y]
        ax.set_xlim(0, 1)

    def update(self, cols: Mapping[str, np.ndarray]) -> bool:
        values = []
        for key in self.keys:
            col = cols.get(key)
            finite = col[np.isfinite(col)] if col is not None else np.array([])
            values.append(float(finite[-1]) if len(finite) else 0.0)
        top = max(values) if values else 0.0
        changed = False
        if self._xmax is None or top > self._xmax or top < 0.25 * self._xmax:
            self._xmax = nice_ceil(max(top * 1.3, 1.0))
            self.ax.set_xlim(0, self._xmax)
            changed = True
        for bar, text, v in zip(self.bars, self.texts, values):
            bar.set_width(v)
            text.set_position((v + self._xmax * 0.01, text.get_position()[1]))
            text.set_text(f"{v:.3g}")
        return changed


LEARNER_PARTS = ("losses", "entropy", "grad_norm", "rho")


def _panels(view: str) -> list[LinePanel | TimingPanel]:
    if view.startswith("learner."):  # one of the learner row's axes, as its own figure
        part = view.split(".", 1)[1]
        if part in LEARNER_PARTS:
            return [_panels("learner")[LEARNER_PARTS.index(part)]]
    if view == "throughput":
        return [LinePanel("throughput", [Series("sample_throughput", "sampled", "#1f77b4"),
                                         Series("train_throughput", "trained", "#218a3b")],
                          "env steps / s", y_floor=0.0)]
    if view == "return":
        return [LinePanel("episode return (mean of last 100)",
                          [Series("episode_return_mean", "return", "#d35400")], "return")]
    if view == "queues":
        return [LinePanel("",  # the legend says it all; a title would collide with it
                          [Series("learner_queue.mean", "learner queue (batches)", "#c0392b"),
                           Series("policy_lag.mean", "policy lag (updates)", "#7b5a3a")],
                          "batches / updates", y_floor=0.0)]
    if view == "timing":
        return [TimingPanel()]
    if view == "learner":
        return [
            LinePanel("", [Series("learner.total_loss", "total loss", "#222222"),
                           Series("learner.policy_loss", "policy", "#1f77b4"),
                           Series("learner.vf_loss", "value", "#d35400")]),
            LinePanel("entropy", [Series("learner.entropy", "entropy", "#8e44ad")]),
            LinePanel("grad norm", [Series("learner.grad_gnorm", "grad norm", "#c0392b")],
                      y_floor=0.0),
            LinePanel("",  # the legend names both; a title would collide with it
                      [Series("learner.mean_rho", "mean rho", "#218a3b"),
                       Series("learner.vf_explained_var", "vf explained var", "#7f8c8d")]),
        ]
    raise ValueError(f"view={view!r} is unknown; use one of {', '.join(VIEWS + LIVE_VIEWS[4:])}")


VIEWS = ("throughput", "return", "queues", "timing", "learner")
# The dashboard draws the learner row as four figures: a limit change in one of them then
# redraws a quarter of the row.
# The timing breakdown is an SVG there (diagram.timing_svg), redrawn at the poll rate.
LIVE_VIEWS = ("throughput", "return", "queues", *(f"learner.{part}" for part in LEARNER_PARTS))
# Figure sizes in inches at DPI. The dashboard is 960 px wide (a notebook beside JupyterLab's
# file browser): half-width views 470x230 px, the learner row four figures of 232x240 px.
DPI = 80
SIZES = {"throughput": (5.875, 2.875), "return": (5.875, 2.875), "queues": (5.875, 2.875),
         "timing": (5.875, 2.875), "learner": (11.6, 3.0),
         **{f"learner.{part}": (2.9, 3.0) for part in LEARNER_PARTS}}


# Live figures' margins in pixels (left, right, top, bottom, gap between axes): fixed, so a
# full redraw needs no layout engine (constrained layout doubled its cost here).
MARGINS_PX = {"timing": (96, 16, 30, 44, 0), "learner": (50, 12, 30, 44, 50),
              **{f"learner.{part}": (48, 10, 30, 44, 0) for part in LEARNER_PARTS}}
DEFAULT_MARGINS_PX = (62, 14, 30, 44, 0)


def _figure(view: str, panels: list, animated: bool, figsize: tuple[float, float] | None,
            dpi: int) -> RunFigure:
    size = figsize or SIZES[view]
    fig = RunFigure(figsize=size, dpi=dpi, facecolor="white",
                    layout=None if animated else "constrained")
    axes = fig.subplots(1, len(panels), squeeze=False).ravel()
    if animated:
        w, h = size[0] * dpi, size[1] * dpi
        left, right, top, bottom, gap = MARGINS_PX.get(view, DEFAULT_MARGINS_PX)
        n = len(panels)
        axes_w = (w - left - right - gap * (n - 1)) / n
        fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h,
                            bottom=bottom / h, wspace=gap / axes_w if n > 1 else 0.2)
    for panel, ax in zip(panels, axes):
        panel.setup(ax, animated)
    return fig


def view_figure(view: str, source: Sequence[Mapping] | _HasColumns, *,
                figsize: tuple[float, float] | None = None, dpi: int = DPI) -> RunFigure:
    """One view of rows or a history: ``throughput, return, queues, timing, learner``, or
    one of the learner's axes (``learner.losses``, ``.entropy``, ``.grad_norm``, ``.rho``)."""
    panels = _panels(view)
    fig = _figure(view, panels, False, figsize, dpi)
    cols = columns(source, [k for p in panels for k in p.keys])
    for panel in panels:
        panel.update(cols)
    return fig


def throughput_figure(source: Sequence[Mapping] | _HasColumns) -> RunFigure:
    """Sample and train throughput over time."""
    return view_figure("throughput", source)


def return_figure(source: Sequence[Mapping] | _HasColumns) -> RunFigure:
    """Mean episode return over time."""
    return view_figure("return", source)


def timing_figure(source: Sequence[Mapping] | _HasColumns) -> RunFigure:
    """The latest timing breakdown as bars."""
    return view_figure("timing", source)


def learner_figure(source: Sequence[Mapping] | _HasColumns) -> RunFigure:
    """Losses, entropy, grad norm, mean rho and vf_explained_var over time."""
    return view_figure("learner", source)


def report_figure(rows: Sequence[Mapping] | _HasColumns, title: str = "") -> RunFigure:
    """Every view in one figure (the CLI's ``report.png``): return, throughput, queues and
    policy lag, timing breakdown, then the learner stats in a row of four."""
    fig = RunFigure(figsize=(14.5, 10.5), dpi=DPI, facecolor="white", layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[2, 1])
    grid = top.subplots(2, 2)
    learner_axes = bottom.subplots(1, 4)
    placed = [("return", [grid[0, 0]]), ("throughput", [grid[0, 1]]),
              ("queues", [grid[1, 0]]), ("timing", [grid[1, 1]]),
              ("learner", list(learner_axes))]
    panels = []
    for view, axes in placed:
        for panel, ax in zip(_panels(view), axes):
            panel.setup(ax, False)
            panels.append(panel)
    cols = columns(rows, [k for p in panels for k in p.keys])
    for panel in panels:
        panel.update(cols)
    if title:
        fig.suptitle(title, fontsize=15)
    return fig


def save_report(rows: Sequence[Mapping] | _HasColumns, path: str | Path,
                title: str = "") -> Path:
    """Write `report_figure` as a PNG and return its path."""
    fig = report_figure(rows, title)
    fig.savefig(path, dpi=DPI)
    return Path(path)


def figures_from_run_dir(run_dir: str | Path) -> RunFigure:
    """`report_figure` of a run directory written by ``impala-lab train``."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics.csv here; pass the --out directory of "
                                "an impala-lab train run")
    return report_figure(read_metrics_csv(path), title=Path(run_dir).name)


# ---------------------------------------------------------------------- live rendering
def encode_png(canvas: FigureCanvasAgg) -> bytes:
    """The canvas as PNG bytes: RGB, fast zlib level (about 6 ms for 580x240 here)."""
    from PIL import Image

    rgba = np.asarray(canvas.buffer_rgba())
    buf = io.BytesIO()
    Image.fromarray(rgba[..., :3]).save(buf, format="png", compress_level=1)
    return buf.getvalue()


class LiveFigure:
    """A view drawn again and again from growing data, cheaply (for the dashboard).

        live = LiveFigure("throughput")
        png = live.render(impala.history)      # bytes for an ipywidgets Image

    Lines, bars and bar labels are animated artists: a render sets their data and, unless the
    axes limits or knob marks changed, restores the saved background and draws only them.
    ``full_draws`` and ``renders`` count both kinds (tests read them).
    """

    def __init__(self, view: str, *, figsize: tuple[float, float] | None = None,
                 dpi: int = DPI) -> None:
        self.view = view
        self.panels = _panels(view)
        self.fig = _figure(view, self.panels, True, figsize, dpi)
        self.canvas: FigureCanvasAgg = self.fig.canvas
        self.keys = [k for p in self.panels for k in p.keys]
        self._background: Any = None
        self.full_draws = 0
        self.renders = 0

    def render(self, source: Sequence[Mapping] | _HasColumns) -> bytes:
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
        return encode_png(self.canvas)


# ---------------------------------------------------------------------- the plot process
def _serve(conn: Any, views: tuple[str, ...]) -> None:
    """The plot process: renders ``(view, columns)`` requests into ``(view, png, cpu_s)``.

    Ends when the dashboard sends None or its end of the pipe closes (the kernel ended).
    """
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
    """Live figures drawn in a child process, one request at a time.

    Matplotlib holds the GIL while it draws (tens of ms for a full redraw): in the notebook's
    kernel that time is taken from the run's driver and learner threads. Here the kernel only
    computes the columns and moves about 40 kB each way through a pipe.

        plotter = PlotProcess(LIVE_VIEWS)
        plotter.submit("throughput", columns(history, keys))
        ...
        done = plotter.poll()         # None, or (view, png bytes, child CPU seconds)

    The child is spawned (never forked: TensorFlow may be loaded here), ignores SIGINT and
    exits when the pipe closes, so it cannot outlive the kernel; ``close()`` ends it at once.
    """

    def __init__(self, views: Sequence[str]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, tuple(views)), daemon=True,
                                   name="impala-dashboard-plots")
        self.process.start()
        child.close()
        self.pending: str | None = None

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

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
