"""Matplotlib figures of a run (`VIEWS`, the same in the dashboard, notebooks and the CLI's
``report.png``), from a live run's history or a run directory's ``metrics.csv`` (as float
columns by flat key); a dotted line marks each knob change. Figures sit on an Agg canvas,
never pyplot (no global state: safe in the poller thread); in a notebook one shows as the
cell's value::

    from impala_lab.dashboard import plots
    plots.report_figure(plots.read_metrics_csv("runs/cartpole/metrics.csv"))
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from impala_lab.dashboard.format import fmt_knob, nice_ceil
from impala_lab.dashboard.labels import ACTIONS, EVAL_KEYS, LABELS, TIMER_COLORS, TIMERS
from impala_lab.knobs import LIVE_KNOBS, cast
from impala_lab.stats import csv_number

TITLE_SIZE, LABEL_SIZE, TICK_SIZE, LEGEND_SIZE = 13, 11, 10, 10  # readable on a projector


# ---------------------------------------------------------------------- data (numpy only)
X_KEY = "time_total_s"
MAX_POINTS = 600  # points drawn per line: longer runs are decimated evenly


def read_metrics_csv(path: str | Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` as dicts of floats (cells that are not numbers become NaN)."""
    with open(path, newline="") as fh:
        return [{key: csv_number(text) for key, text in raw.items()}
                for raw in csv.DictReader(fh)]


def column(rows: Sequence[Mapping], key: str) -> np.ndarray:
    """One key over the rows: ``[len(rows)]`` float64, NaN where a row lacks it."""
    return _as_float([r.get(key) for r in rows])


class HasColumns(Protocol):
    """A source of whole columns by flat key, like `impala_lab.stats.StatsHistory`."""

    def column(self, key: str) -> np.ndarray: ...


def columns(source: Sequence[Mapping] | HasColumns, keys: Sequence[str],
            max_points: int = MAX_POINTS) -> dict[str, np.ndarray]:
    """``{key: [n] float64}`` (NaN where a row lacks the key) of `keys` and ``time_total_s``,
    from flat rows or a `StatsHistory`; longer columns are decimated evenly to `max_points`,
    the last row kept."""
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


def _as_float(values: Sequence[object]) -> np.ndarray:
    """Numbers as float64, anything else (None, text, a bool) as NaN."""
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if isinstance(v, int | float | np.number) and not isinstance(v, bool):
            out[i] = float(v)
    return out


#: The live knobs' columns in ``metrics.csv`` (and the history's flat rows).
KNOB_KEYS = tuple(f"knobs.{name}" for name in LIVE_KNOBS)


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
            name = key.split(".", 1)[1]
            changes.setdefault(int(i), []).append(f"{name}={fmt_knob(cast(name, col[i]))}")
    return [(float(t[i]), ", ".join(labels)) for i, labels in sorted(changes.items())
            if np.isfinite(t[i])]


class RunFigure(Figure):
    """A `Figure` on an Agg canvas that shows itself in a notebook (``_repr_png_``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        FigureCanvasAgg(self)

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png")
        return buf.getvalue()


# ---------------------------------------------------------------------- limits
def _x_limits(t: np.ndarray, cur: tuple[float, float] | None,
              live: bool) -> tuple[float, float] | None:
    """New x limits once the data leaves the current ones (None: keep them): a live figure's
    double, rounded (each change costs a full redraw); a static one's fit the data."""
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
    """New y limits, or None to keep `cur`. A static figure fits the data; a live one fits
    the 2nd-98th percentile (one spike is clipped instead of squashing the rest) with
    headroom, and changes only when that range leaves them or fills under 30 % of them."""
    finite = [v[np.isfinite(v)] for v in values if np.isfinite(v).any()]
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
    if cur is not None and cur[0] <= lo and hi <= cur[1] and span >= 0.3 * (cur[1] - cur[0]):
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
    """One line over time: a flat stats key and its colour (its legend text is `LABELS`')."""

    key: str
    color: str


class LinePanel:
    """One axes of lines over time, with knob-change marks. ``setup(ax, animated)`` draws the
    static parts; ``update(cols)`` sets the lines' data and returns True when the static parts
    changed (limits, knob marks): a blitting renderer must then redraw the whole figure."""

    def __init__(self, title: str, series: Sequence[Series], ylabel: str = "", *,
                 y_floor: float | None = None, legend: bool = True) -> None:
        self.title, self.series, self.ylabel = title, tuple(series), ylabel
        self.y_floor, self.legend = y_floor, legend
        self.ax: Axes | None = None
        self.lines: list[Any] = []
        self.live = True
        self._has_limits = False
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
        self.lines = [ax.plot([], [], color=s.color, lw=2, label=LABELS[s.key].legend_name,
                              animated=animated)[0] for s in self.series]
        if self.legend and len(self.series) > 1:
            # above the axes, never over the lines: a live figure keeps it in the background
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


class TimingPanel:
    """Horizontal bars: the timing breakdown (ms) of the last row that has one."""

    def __init__(self) -> None:
        self.ax: Axes | None = None
        self.bars: list[Any] = []
        self.texts: list[Any] = []

    @property
    def keys(self) -> list[str]:
        return [f"timing_breakdown.{k}" for k in TIMERS]

    @property
    def artists(self) -> list[Any]:
        return [*self.bars, *self.texts]

    def setup(self, ax: Axes, animated: bool) -> None:
        self.ax = ax
        _style(ax, "timing breakdown (mean ms)", "ms", "")
        ax.grid(True, axis="x", alpha=0.3)
        ax.grid(False, axis="y")
        y = np.arange(len(TIMERS))
        self.bars = list(ax.barh(y, np.zeros(len(y)), color=TIMER_COLORS[:len(y)], height=0.6,
                                 animated=animated))
        ax.set_yticks(y, [label.name for label in TIMERS.values()], fontsize=LABEL_SIZE)
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
        xmax = nice_ceil(max(max(values, default=0.0) * 1.3, 1.0))
        self.ax.set_xlim(0, xmax)
        for bar, text, v in zip(self.bars, self.texts, values):
            bar.set_width(v)
            text.set_position((v + xmax * 0.01, text.get_position()[1]))
            text.set_text(f"{v:.3g}")
        return True  # drawn statically (report.png): no blitting to spare


LEARNER_PARTS = ("losses", "entropy", "grad_norm", "rho")


def view_panels(view: str) -> list[LinePanel | TimingPanel]:
    """The panels (one per axes) of a view, not yet placed on axes."""
    if view.startswith("learner."):  # one of the learner row's axes, as its own figure
        part = view.split(".", 1)[1]
        if part in LEARNER_PARTS:
            return [view_panels("learner")[LEARNER_PARTS.index(part)]]
    if view == "throughput":
        return [LinePanel("throughput", [Series("sample_throughput", "#1f77b4"),
                                         Series("train_throughput", "#218a3b")],
                          "env steps / s", y_floor=0.0)]
    if view == "return":
        return [LinePanel("episode return", [Series("episode_return_mean", "#d35400"), Series(
            EVAL_KEYS[0], "#8e44ad"), Series(EVAL_KEYS[1], "#16a085")], "return")]
    if view == "queues":
        return [LinePanel("",  # the legend says it all; a title would collide with it
                          [Series("learner_queue.mean", "#c0392b"),
                           Series("policy_lag.mean", "#7b5a3a")],
                          "batches / updates", y_floor=0.0)]
    if view == "timing":
        return [TimingPanel()]
    if view == "actions":  # a Box-action run's Gaussian policy
        return [LinePanel("actions", [Series(ACTION_KEYS[0], "#1f77b4"),
                                      Series(ACTION_KEYS[1], "#d35400")], "action units")]
    if view == "learner":
        return [
            LinePanel("", [Series("learner.total_loss", "#222222"),
                           Series("learner.policy_loss", "#1f77b4"),
                           Series("learner.vf_loss", "#d35400")]),
            LinePanel(LABELS["learner.entropy"].name, [Series("learner.entropy", "#8e44ad")]),
            LinePanel(LABELS["learner.grad_gnorm"].name,
                      [Series("learner.grad_gnorm", "#c0392b")], y_floor=0.0),
            LinePanel("",  # the legend names both; a title would collide with it
                      [Series("learner.mean_rho", "#218a3b"),
                       Series("learner.vf_explained_var", "#7f8c8d")]),
        ]
    raise ValueError(f"view={view!r} is unknown; use one of {', '.join(VIEWS + LIVE_VIEWS[4:])}")


#: The learner's stats of a Box-action run only, as flat keys (``metrics.csv`` columns).
ACTION_KEYS = tuple(f"learner.{key}" for key in ACTIONS)
VIEWS = ("throughput", "return", "queues", "timing", "learner", "actions")
# The dashboard's: the learner row as four figures (a limit change redraws a quarter of it);
# its timing breakdown is an SVG (diagram.timing_svg); a Box-action run adds BOX_LIVE_VIEWS.
LIVE_VIEWS = ("throughput", "return", "queues", *(f"learner.{part}" for part in LEARNER_PARTS))
BOX_LIVE_VIEWS = ("actions",)
# Figure sizes in inches at DPI: the dashboard is 960 px wide (beside JupyterLab's file
# browser), half-width views 470x230 px, the learner row four figures of 232x240 px.
DPI = 80
SIZES = {"throughput": (5.875, 2.875), "return": (5.875, 2.875), "queues": (5.875, 2.875),
         "timing": (5.875, 2.875), "actions": (5.875, 2.875), "learner": (11.6, 3.0),
         **{f"learner.{part}": (2.9, 3.0) for part in LEARNER_PARTS}}


# Live figures' margins in pixels (left, right, top, bottom, gap between axes): fixed, so a
# full redraw needs no layout engine (constrained layout would double its cost).
MARGINS_PX = {"timing": (96, 16, 30, 44, 0), "learner": (50, 12, 30, 44, 50),
              **{f"learner.{part}": (48, 10, 30, 44, 0) for part in LEARNER_PARTS}}
DEFAULT_MARGINS_PX = (62, 14, 30, 44, 0)


def new_figure(view: str, panels: list, animated: bool) -> RunFigure:
    """A figure of a view with its panels set up, one axes each; `animated` for a live one
    (fixed pixel margins, animated artists)."""
    size, dpi = SIZES[view], DPI
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


def view_figure(view: str, source: Sequence[Mapping] | HasColumns) -> RunFigure:
    """One view (`VIEWS`, or one learner axes: ``learner.<part>``) of rows or a history."""
    panels = view_panels(view)
    fig = new_figure(view, panels, False)
    cols = columns(source, [k for p in panels for k in p.keys])
    for panel in panels:
        panel.update(cols)
    return fig


def has_actions(rows: Sequence[Mapping] | HasColumns) -> bool:
    """Whether rows carry a Box-action run's action mean (a number in some row)."""
    return bool(np.isfinite(columns(rows, ACTION_KEYS[:1])[ACTION_KEYS[0]]).any())


def report_figure(rows: Sequence[Mapping] | HasColumns, title: str = "") -> RunFigure:
    """Every view in one figure (the CLI's ``report.png``): a 2x2 grid, then the learner
    stats in a row of four (five with a Box-action run's ``actions``)."""
    fig = RunFigure(figsize=(14.5, 10.5), dpi=DPI, facecolor="white", layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[2, 1])
    grid = top.subplots(2, 2)
    learner_axes = list(bottom.subplots(1, 5 if has_actions(rows) else 4))
    placed = [("return", [grid[0, 0]]), ("throughput", [grid[0, 1]]),
              ("queues", [grid[1, 0]]), ("timing", [grid[1, 1]]),
              ("learner", learner_axes[:4]), ("actions", learner_axes[4:])]
    panels = []
    for view, axes in placed:
        for panel, ax in zip(view_panels(view), axes):
            panel.setup(ax, False)
            panels.append(panel)
    cols = columns(rows, [k for p in panels for k in p.keys])
    for panel in panels:
        panel.update(cols)
    if title:
        fig.suptitle(title, fontsize=15)
    return fig


def save_report(rows: Sequence[Mapping] | HasColumns, path: str | Path,
                title: str = "") -> Path:
    """Write `report_figure` as a PNG and return its path."""
    report_figure(rows, title).savefig(path, dpi=DPI)
    return Path(path)

