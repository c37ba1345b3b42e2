"""`Dashboard`: the live notebook view of one `Impala` run, with core ipywidgets only.

    impala = Impala(env="CartPole-v1", backend="inline")
    board = Dashboard(impala)
    board.show()                      # widgets in this cell; a poller keeps them moving
    impala.start(max_seconds=120)     # trains in the background: the cell returns

What it shows (top to bottom): the run's status; a learning-health badge (``stats()["health"]``:
a warning badge per active flag with its one-sentence explanation, else "ok" and what was seen
earlier); the headline figures; the pipeline diagram
(`impala_lab.dashboard.diagram`); gauges for the queues with a bottleneck hint; start, pause
and stop buttons and the live knobs; plots of throughput, return, learner queue and policy
lag, the timing breakdown and the learner stats (`impala_lab.dashboard.plots`).

How it runs (DESIGN.md, "Dashboard pattern"): the widgets are built and displayed by the
main thread; one daemon poller thread reads ``impala.stats()`` at ``poll_hz`` (default 4 Hz)
and sets the widgets' values inside ``hold_sync()``; it never prints, displays or enters an
``Output`` context. The diagram, gauges, figures and the timing bars (SVG) follow every
poll. The plots over time are matplotlib Agg PNGs in ``Image`` widgets, redrawn only when
``impala.history`` has new rows: the most overdue view first (throughput and return every
``plot_interval``, the others less often), within ``plot_budget`` of one core. The poller
has them drawn by a small spawned plot process, because matplotlib holds the GIL while it
draws and the kernel's GIL belongs to the run's driver and learner threads; if that process
cannot start, the poller draws them itself within 3 % of a core. ``refresh()`` does one
complete update in the calling thread: step-through cells and tests use it.
``python -m bench.dashboard_overhead`` measures what all of it costs the run.

The dashboard only reads ``stats()``, ``history`` and ``knob_changes`` and calls
``start()``, ``pause()``, ``stop()`` and ``set_knobs()``; it never reaches into the pipeline.
It holds the run weakly: re-running a cell that makes a new run lets the old one be collected
(and its workers end); keep your own reference (``impala = Impala(...)``).

Buttons and knobs work while the kernel is idle, i.e. with ``impala.start()`` (background
training). ``impala.train(..., dashboard=True)`` holds the cell until its stop condition: the
widgets keep moving (the poller's updates reach the page), but the kernel cannot receive
clicks until the cell ends, so the controls are disabled meanwhile; interrupt the kernel to
end such a run early (``train()`` then stops the run), or use ``start()`` instead.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as W

from impala_lab.dashboard.diagram import PipelineDiagram, timing_svg
from impala_lab.dashboard.plots import LIVE_VIEWS as VIEWS
from impala_lab.dashboard.plots import LiveFigure, PlotProcess, columns
from impala_lab.dashboard.terminal import (
    TerminalView,
    fmt_count,
    fmt_float,
    fmt_knob,
    fraction,
    queue_figures,
    render,
)
from impala_lab.health import LABELS as HEALTH_LABELS
from impala_lab.health import describe_seen

# name -> (label, formatter of the stats snapshot)
CARDS: dict[str, tuple[str, Callable[[Mapping[str, Any]], str]]] = {
    "sample_throughput": ("sampled", lambda s: f"{fmt_count(s.get('sample_throughput'))}/s"),
    "train_throughput": ("trained", lambda s: f"{fmt_count(s.get('train_throughput'))}/s"),
    "episode_return_mean": ("return (last 100)",
                            lambda s: fmt_float(s.get("episode_return_mean"))),
    "num_steps_sampled": ("env steps", lambda s: fmt_count(s.get("num_steps_sampled"))),
    "weights_version": ("weights", lambda s: f"v{s.get('weights_version', 0)}"),
    "policy_lag": ("policy lag", lambda s: fmt_float((s.get("policy_lag") or {}).get("mean"),
                                                     2)),
    "time_total_s": ("time", lambda s: f"{s.get('time_total_s', 0.0):,.0f} s"),
}
# Drawing in the poller thread holds the kernel's GIL: keep it to 3 % of a core.
IN_THREAD_BUDGET = 0.03
PLOT_BURST_S = 1.0  # CPU seconds the plots may spend at once (see _plot_allowed)
# Plot intervals in units of plot_interval: the headline plots first.
PLOT_EVERY = {view: 1.0 if view in ("throughput", "return") else 2.0 if view == "queues"
              else 3.0 for view in VIEWS}
GAUGES = {  # name -> label (queue_figures' keys)
    "in_flight": "requests in flight",
    "replay": "replay store",
    "batch_buffer": "batch buffer",
    "learner_queue": "learner queue",
    "minibatch": "minibatch ring",
}
GAUGE_CLASSES = {"in_flight": "in-flight", "replay": "replay", "batch_buffer": "batch-buffer",
                 "learner_queue": "learner-queue", "minibatch": "minibatch"}
INT_KNOBS = ("broadcast_interval", "num_sgd_iter")
KNOB_HELP = {
    "broadcast_interval": "samples a worker returns between weight broadcasts",
    "replay_proportion": "replayed batches per new batch (needs replay slots)",
    "num_sgd_iter": "passes over each train batch",
    "lr": "learning rate",
    "entropy_coeff": "weight of the entropy bonus",
}
GREEN, ORANGE, RED, GREY = "#2e9e44", "#e67e22", "#c0392b", "#7f8c8d"


def frontend_available() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Voila) that can show
    widgets; False in a plain Python process or a terminal IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _knob_widget(name: str) -> W.ValueWidget:
    common = dict(continuous_update=False, style={"description_width": "140px"},
                  layout=W.Layout(width="460px"), description=name,
                  description_allow_html=False)
    if name == "broadcast_interval":
        w = W.IntSlider(value=1, min=1, max=32, **common)
    elif name == "num_sgd_iter":
        w = W.IntSlider(value=1, min=1, max=10, **common)
    elif name == "replay_proportion":
        w = W.FloatSlider(value=0.0, min=0.0, max=4.0, step=0.25, readout_format=".2f",
                          **common)
    elif name == "lr":
        w = W.FloatLogSlider(value=5e-4, base=10, min=-5, max=-1, step=0.05,
                             readout_format=".1e", **common)
    elif name == "entropy_coeff":
        w = W.FloatSlider(value=0.01, min=0.0, max=0.05, step=0.001, readout_format=".3f",
                          **common)
    else:  # pragma: no cover - LIVE_KNOBS and this table change together
        raise ValueError(f"no control for knob {name!r}")
    w.tooltip = KNOB_HELP.get(name, name)
    w.add_class(f"impala-knob-{name.replace('_', '-')}")
    return w


class Dashboard:
    """The live dashboard of one `Impala` run.

    Args:
      impala: the run (held weakly; keep your own reference).
      poll_hz: widget updates per second while shown, in (0, 10]; 0 disables the poller
        (then call ``refresh()`` yourself).
      plot_interval: seconds between two renders of one plot, at least.
      plot_budget: share of one CPU core the plots may use on average, in (0, 1].
      plot_process: draw the poller's plots in a child process (the kernel's GIL stays with
        the run); False, or a child that cannot start, draws them in the poller thread
        within ``min(plot_budget, 0.03)``.
      start_kwargs: arguments of ``impala.start()`` for the start button, e.g.
        ``{"max_seconds": 300}`` or ``{"stop": {"episode_return_mean": 475}}``.
    """

    def __init__(self, impala: Any, *, poll_hz: float = 4.0, plot_interval: float = 1.0,
                 plot_budget: float = 0.06, plot_process: bool = True,
                 start_kwargs: Mapping[str, Any] | None = None) -> None:
        if not (0 <= poll_hz <= 10) or math.isnan(poll_hz):
            raise ValueError(f"poll_hz={poll_hz!r} is invalid: use 2-5 updates per second "
                             "(0 disables the poller; then call refresh())")
        if not plot_interval > 0:
            raise ValueError(f"plot_interval={plot_interval!r} is invalid: use a positive "
                             "number of seconds, e.g. 1.0")
        if not 0 < plot_budget <= 1:
            raise ValueError(f"plot_budget={plot_budget!r} is invalid: it is a share of one "
                             "core in (0, 1], e.g. 0.06")
        for name in ("stats", "history", "start", "pause", "stop", "set_knobs"):
            if not hasattr(impala, name):
                raise TypeError(f"Dashboard(impala) needs an Impala run; "
                                f"{type(impala).__name__} has no {name!r}")
        self._ref = weakref.ref(impala)
        self.poll_hz = float(poll_hz)
        self.plot_interval = float(plot_interval)
        self.plot_budget = float(plot_budget)
        self.plot_process = bool(plot_process)
        self._plotter: PlotProcess | None = None
        self.start_kwargs = dict(start_kwargs or {})
        config = getattr(impala, "config", None)
        env_id = getattr(config, "env_id", None) or "env"
        self.title = f"IMPALA · {env_id}"
        self.blocking_train = False
        self.last_stats: dict[str, Any] | None = None
        self.poll_errors = 0
        self.plot_renders = 0  # plots drawn, and the CPU seconds spent drawing them
        self.plot_seconds = 0.0
        self.poll_ticks = 0  # poller updates, and the poller thread's CPU seconds
        self.poll_cpu_s = 0.0
        self.last_poll_error: BaseException | None = None
        self._lock = threading.RLock()
        self._local = threading.local()  # .syncing: knob values set by the dashboard
        self._seen_knobs: dict[str, Any] = {}
        self._diagram = PipelineDiagram()
        self._live = {view: LiveFigure(view) for view in VIEWS}
        self._plot_rows_seen: dict[str, int] = dict.fromkeys(VIEWS, -1)
        self._plot_last: dict[str, float] = dict.fromkeys(VIEWS, -math.inf)
        # Plot CPU as a token bucket: `budget` core-seconds accrue per second, up to a burst
        # that lets the first full draws (limits still settling) happen without delay.
        self._plot_tokens = PLOT_BURST_S
        self._plot_refilled = time.monotonic()
        self._note = ""  # the last message from a button or knob
        self._note_error = False
        self._stop_event = threading.Event()
        self._poller: threading.Thread | None = None
        self._closed = False
        self._terminal: TerminalView | None = None
        self._build()

    # ------------------------------------------------------------------ building
    @property
    def impala(self) -> Any:
        """The run, or None once it was garbage-collected."""
        return self._ref()

    def _build(self) -> None:
        self.header = W.HTML()
        self.header.add_class("impala-header")
        self.health = W.HTML(layout=W.Layout(width="100%"))
        self.health.add_class("impala-health")
        self.cards: dict[str, W.HTML] = {}
        for name in CARDS:
            card = W.HTML(layout=W.Layout(min_width="124px", margin="0 6px 0 0"))
            card.add_class("impala-stat")
            card.add_class(f"impala-stat-{name.replace('_', '-')}")
            self.cards[name] = card
        self.diagram = W.HTML(layout=W.Layout(width="100%"))
        self.diagram.add_class("impala-diagram")

        self.gauges: dict[str, W.FloatProgress] = {}
        self.gauge_labels: dict[str, W.HTML] = {}
        rows = []
        for name, label in GAUGES.items():
            bar = W.FloatProgress(value=0.0, min=0.0, max=1.0,
                                  layout=W.Layout(width="190px", height="22px"))
            bar.add_class("impala-gauge")
            bar.add_class(f"impala-gauge-{GAUGE_CLASSES[name]}")
            text = W.HTML(layout=W.Layout(width="90px"))
            text.add_class(f"impala-gauge-{GAUGE_CLASSES[name]}-value")
            self.gauges[name], self.gauge_labels[name] = bar, text
            rows.append(W.HBox([W.HTML(f'<span style="font-size:15px">{label}</span>',
                                       layout=W.Layout(width="150px")), bar, text]))
        self.hint = W.HTML(layout=W.Layout(width="440px"))
        self.hint.add_class("impala-bottleneck")
        gauges = W.VBox([W.HTML('<b style="font-size:16px">queues</b>'), *rows, self.hint],
                        layout=W.Layout(width="450px", margin="0 16px 0 0"))
        gauges.add_class("impala-gauges")

        self.start_button = W.Button(description="start", icon="play", button_style="success",
                                     tooltip="train in the background (impala.start())")
        self.pause_button = W.Button(description="pause", icon="pause", button_style="warning",
                                     tooltip="end background training after this step")
        self.stop_button = W.Button(description="stop", icon="stop", button_style="danger",
                                    tooltip="end the run: workers and learner stop")
        for b, name in ((self.start_button, "start"), (self.pause_button, "pause"),
                        (self.stop_button, "stop")):
            b.add_class(f"impala-button-{name}")
            b.layout = W.Layout(width="110px", height="36px")
        self.start_button.on_click(lambda _: self._on_start())
        self.pause_button.on_click(lambda _: self._on_pause())
        self.stop_button.on_click(lambda _: self._on_stop())
        from impala_lab.config import LIVE_KNOBS

        self.knobs: dict[str, W.ValueWidget] = {}
        for name in LIVE_KNOBS:
            w = _knob_widget(name)
            w.observe(self._knob_observer(name), names="value")
            self.knobs[name] = w
        self.message = W.HTML(layout=W.Layout(width="460px"))
        self.message.add_class("impala-message")
        self.knob_log = W.HTML(layout=W.Layout(width="460px"))
        self.knob_log.add_class("impala-knob-log")
        controls = W.VBox([W.HTML('<b style="font-size:16px">controls</b>'),
                           W.HBox([self.start_button, self.pause_button, self.stop_button]),
                           *self.knobs.values(), self.message, self.knob_log],
                          layout=W.Layout(width="470px"))
        controls.add_class("impala-controls")

        self.plots: dict[str, W.Image] = {}
        for view in VIEWS:
            img = W.Image(value=self._live[view].render([]), format="png",
                          layout=W.Layout(max_width="100%", height="auto",
                                          margin="4px 4px 4px 0"))
            img.add_class("impala-plot")
            img.add_class(f"impala-plot-{view.replace('.', '-').replace('_', '-')}")
            self.plots[view] = img
        self.timing = W.HTML(layout=W.Layout(width="470px", margin="4px 4px 4px 0"))
        self.timing.add_class("impala-timing")
        learner = W.HBox([self.plots[v] for v in VIEWS if v.startswith("learner.")],
                         layout=W.Layout(flex_flow="row wrap"))
        learner.add_class("impala-plot-learner")
        plots = W.VBox([W.HBox([self.plots["throughput"], self.plots["return"]],
                               layout=W.Layout(flex_flow="row wrap")),
                        W.HBox([self.timing, self.plots["queues"]],
                               layout=W.Layout(flex_flow="row wrap")),
                        learner])
        self.widget = W.VBox([
            self.header,
            self.health,
            W.HBox(list(self.cards.values()), layout=W.Layout(flex_flow="row wrap")),
            self.diagram,
            W.HBox([gauges, controls], layout=W.Layout(flex_flow="row wrap",
                                                       margin="8px 0")),
            plots,
        ], layout=W.Layout(max_width="980px", padding="6px"))
        self.widget.add_class("impala-dashboard")

    # ------------------------------------------------------------------ showing
    def show(self, *, blocking_train: bool = False) -> None:
        """Display the widgets and start the poller; without a frontend, print the text view.

        Args:
          blocking_train: ``Impala.train(dashboard=True)`` passes True: the controls stay
            disabled until ``train_ended()`` (the kernel cannot take clicks meanwhile).
        """
        self.blocking_train = blocking_train
        if not frontend_available():
            print(self.text())
            return
        from IPython.display import display

        self.refresh()
        display(self.widget)
        self.start_polling()

    def _ipython_display_(self) -> None:
        self.show()

    def text(self, stats: Mapping[str, Any] | None = None) -> str:
        """The terminal view of the run (the fallback without a frontend)."""
        run = self.impala
        if stats is None:
            if run is None:
                return f"{self.title}: the run was garbage-collected"
            stats = run.stats()
        return render(stats, self.title)

    def report_hook(self, on_report: Callable[[dict], None] | None = None
                    ) -> Callable[[dict], None]:
        """``on_report`` for ``train()``: calls `on_report`, and without a frontend also
        prints the terminal view (redrawn in place in a TTY)."""
        if not frontend_available() and self._terminal is None:
            self._terminal = TerminalView(title=self.title)

        def hook(snapshot: dict) -> None:
            if on_report is not None:
                on_report(snapshot)
            if self._terminal is not None:
                self._terminal.update(snapshot)

        return hook

    def train_ended(self) -> None:
        """A blocking ``train(dashboard=True)`` returned: wake the controls, draw the end."""
        self.blocking_train = False
        if self._terminal is not None:
            self._terminal.close()
        with contextlib.suppress(Exception):  # the run may have been stopped by an error
            self.refresh()

    # ------------------------------------------------------------------ polling
    def start_polling(self) -> None:
        """Start the poller thread (``show()`` does); no-op if running or ``poll_hz == 0``."""
        if self.poll_hz <= 0 or self._closed:
            return
        if self._poller is not None and self._poller.is_alive():
            return
        self._stop_event = threading.Event()
        self._poller = threading.Thread(
            target=_poll_loop, args=(weakref.ref(self), self._stop_event, 1.0 / self.poll_hz),
            name="impala-dashboard-poller", daemon=True)
        self._poller.start()

    def stop_polling(self, timeout: float = 2.0) -> None:
        """Stop the poller thread and wait for it. The plot process stays for a restart;
        ``close()``, the end of the run or of this dashboard ends it."""
        self._stop_event.set()
        poller = self._poller
        if poller is not None and poller is not threading.current_thread():
            poller.join(timeout)

    def _close_plotter(self) -> None:
        plotter, self._plotter = self._plotter, None
        if plotter is not None:
            plotter.close()

    @property
    def polling(self) -> bool:
        return self._poller is not None and self._poller.is_alive()

    def close(self) -> None:
        """Stop polling and remove the widgets from the page (the run goes on)."""
        self.stop_polling()
        self._close_plotter()
        self._closed = True
        todo = [self.widget]
        while todo:  # this dashboard's widgets only (Widget.close_all would close every one)
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            w.close()

    def _tick(self) -> bool:
        """One poller update; False ends the poller (the run is gone or stopped)."""
        run = self.impala
        if run is None:
            with self._lock:
                self.header.value = self._header_html(None, "gone")
                self._set_buttons(None)
            self._close_plotter()
            return False
        stats = run.stats()
        with self._lock:
            self._apply(stats, run)
            if run.stopped:
                self._close_plotter()
                self._render_plots(run, force=True)
                return False
            if self.plot_process:
                self._plot_in_process(run)
            else:
                self._render_plots(run, force=False)
        return True

    # ------------------------------------------------------------------ updating
    def refresh(self, stats: Mapping[str, Any] | None = None, *, plots: bool = True
                ) -> dict[str, Any]:
        """Update every widget now, in the calling thread (step-through cells, tests).

        Args:
          stats: the snapshot to show; None reads ``impala.stats()``.
          plots: also redraw every plot whose rows changed, here and now (ignoring the plot
            budget); while the poller's plot process runs, it is asked to draw them instead.

        Returns:
          the snapshot shown.
        """
        run = self.impala
        if stats is None:
            if run is None:
                raise RuntimeError("the run this dashboard showed was garbage-collected; "
                                   "keep a reference to it (impala = Impala(...))")
            stats = run.stats()
        stats = dict(stats)
        with self._lock:
            self._apply(stats, run)
            if plots and run is not None:
                if self._plotter is not None and self.polling:
                    # The poller's plot process draws them: ask for all of them soon, rather
                    # than draw here with other axes limits (the plots would jump).
                    self._plot_last = dict.fromkeys(VIEWS, -math.inf)
                else:
                    self._render_plots(run, force=True)
        return stats

    def _apply(self, s: Mapping[str, Any], run: Any) -> None:
        """Set every widget from one snapshot, each widget's changes in one message."""
        self.last_stats = dict(s)
        state = self._state(run)
        widgets = [self.header, self.health, self.diagram, self.timing, self.hint, self.message,
                   self.knob_log,
                   *self.cards.values(), *self.gauges.values(), *self.gauge_labels.values(),
                   *self.knobs.values(), self.start_button, self.pause_button,
                   self.stop_button]
        with contextlib.ExitStack() as stack:
            for w in widgets:
                stack.enter_context(w.hold_sync())
            self.header.value = self._header_html(s, state)
            self.health.value = self._health_html(s.get("health"))
            for name, (label, fmt) in CARDS.items():
                self.cards[name].value = (
                    f'<div style="line-height:1.15"><div style="font-size:13px;color:#555">'
                    f'{label}</div><div style="font-size:24px;font-weight:bold">{fmt(s)}'
                    f"</div></div>")
            self.diagram.value = self._diagram.render(s)
            self.timing.value = timing_svg(s, width=470)
            self._apply_gauges(s)
            self._apply_knobs(s)
            self._set_buttons(run, state)
            self.message.value = self._message_html(run)
            self.knob_log.value = self._knob_log_html(run)

    def _state(self, run: Any) -> str:
        if run is None:
            return "gone"
        if run.stopped:
            return "stopped"
        if getattr(run, "background_error", None) is not None:
            return "failed"
        if self.blocking_train:
            return "train"
        return "training" if getattr(run, "is_training", False) else "paused"

    def _header_html(self, s: Mapping[str, Any] | None, state: str) -> str:
        label, color = {
            "training": ("● training", GREEN),
            "train": ("● training: train() holds this cell", GREEN),
            "paused": ("❚❚ paused", ORANGE),
            "stopped": ("■ stopped", GREY),
            "failed": ("✖ training failed", RED),
            "gone": ("■ the run was garbage-collected", GREY),
        }[state]
        p = (s or {}).get("pipeline") or {}
        detail = ""
        if p:
            detail = (f" · {p.get('backend', '?')} backend · {p.get('num_workers', '?')} "
                      f"workers")
        return (f'<div style="font-size:20px"><b>{self.title}</b>{detail} '
                f'<span class="impala-status impala-status-{state}" '
                f'style="color:{color};font-weight:bold;margin-left:12px">{label}</span></div>')

    @staticmethod
    def _health_html(health: Mapping[str, Any] | None) -> str:
        """The learning-health badge: one orange badge per active flag with its sentence;
        "ok" (and what the run saw earlier) otherwise; nothing without a health key."""
        if not health:
            return ""
        flags = health.get("flags") or []
        if not flags:
            seen = describe_seen(health)
            earlier = (f' <span style="color:#555">(earlier: {_escape(seen)})</span>'
                       if seen else "")
            return (f'<div class="impala-health-ok" style="font-size:14px;color:{GREEN}">'
                    f"✓ learning health: ok{earlier}</div>")
        rows = []
        for flag in flags:
            code = str(flag.get("code"))
            label = HEALTH_LABELS.get(code, code)
            rows.append(
                f'<div class="impala-health-flag impala-health-{code.replace("_", "-")}" '
                f'style="font-size:14px;margin:2px 0"><span class="impala-health-badge" '
                f'style="background:{ORANGE};color:white;font-weight:bold;border-radius:4px;'
                f'padding:1px 8px;margin-right:8px">⚠ {_escape(label)}</span>'
                f'{_escape(str(flag.get("message", "")))}</div>')
        return f'<div class="impala-health-warning">{"".join(rows)}</div>'

    def _apply_gauges(self, s: Mapping[str, Any]) -> None:
        figures = queue_figures(s)
        for name, (level, capacity) in figures.items():
            frac = fraction(level, capacity)
            self.gauges[name].value = frac
            if name == "replay" and capacity <= 0:
                text = "off"
            else:
                text = f"{level:.0f} / {capacity:.0f}"
            self.gauge_labels[name].value = f'<span style="font-size:15px">{text}</span>'
            if name == "learner_queue":
                color = GREEN if frac < 0.75 else (ORANGE if frac < 1 else RED)
            else:
                color = "#1f77b4"
            self.gauges[name].style.bar_color = color
        q = s.get("learner_queue") or {}
        size = figures["learner_queue"][1]
        mean = q.get("mean", math.nan)
        if not q.get("count") or size <= 0 or not math.isfinite(mean):
            hint = "learner queue: no learner step yet"
        elif mean / size >= 0.75:
            hint = ("learner queue mostly full: the <b>learner</b> is the bottleneck "
                    "(actors wait for it)")
        elif mean / size <= 0.1:
            hint = ("learner queue mostly empty: the learner waits for data "
                    "(the <b>actors</b> are the bottleneck)")
        else:
            hint = "learner queue partly full: actors and learner are balanced"
        self.hint.value = f'<span style="font-size:14px">{hint}</span>'

    def _apply_knobs(self, s: Mapping[str, Any]) -> None:
        knobs = s.get("knobs") or {}
        replay_capacity = (s.get("pipeline") or {}).get("replay_capacity")
        self._local.syncing = True
        try:
            for name, w in self.knobs.items():
                if name in knobs and knobs[name] != self._seen_knobs.get(name):
                    value = knobs[name]
                    if name == "lr":
                        exponent = math.log10(value)
                        w.min, w.max = min(w.min, math.floor(exponent)), max(
                            w.max, math.ceil(exponent))
                    else:
                        w.max = max(w.max, value)
                    w.value = value
                    self._seen_knobs[name] = value
            replay = self.knobs.get("replay_proportion")
            if replay is not None and replay_capacity is not None:
                self._replay_off = replay_capacity <= 0
        finally:
            self._local.syncing = False

    _replay_off = False

    def _set_buttons(self, run: Any, state: str | None = None) -> None:
        state = state or self._state(run)
        locked = state in ("stopped", "gone", "train")
        self.start_button.disabled = locked or state == "training"
        self.pause_button.disabled = locked or state not in ("training", "failed")
        self.stop_button.disabled = locked
        for name, w in self.knobs.items():
            w.disabled = locked or (name == "replay_proportion" and self._replay_off)

    def _message_html(self, run: Any) -> str:
        error = getattr(run, "background_error", None) if run is not None else None
        if error is not None:
            text = (f"background training failed: {type(error).__name__}: {error}. "
                    "impala.wait() raises it with its traceback.")
            return f'<span style="color:{RED};font-size:14px">{_escape(text)}</span>'
        if self.blocking_train:
            return ('<span style="font-size:14px">train() holds this cell: the buttons and '
                    "knobs wake up when it returns. Interrupt the kernel to end it early; "
                    "impala.start() trains in the background with live controls.</span>")
        if self._replay_off and not self._note:
            return ('<span style="font-size:14px;color:#555">replay_proportion is off: the '
                    "run has no replay slots (replay_buffer_num_slots=0)</span>")
        color = RED if self._note_error else "#333"
        return f'<span style="font-size:14px;color:{color}">{_escape(self._note)}</span>'

    def _knob_log_html(self, run: Any) -> str:
        changes = list(getattr(run, "knob_changes", []) or [])[-5:] if run is not None else []
        if not changes:
            return ""
        items = "".join(
            f"<li>{c.get('time_s', 0.0):.1f} s, step {fmt_count(c.get('num_steps_sampled'))}: "
            f"{_escape(str(c.get('knob')))} = {_escape(fmt_knob(c.get('value')))}</li>"
            for c in reversed(changes))
        return (f'<div style="font-size:14px"><b>knob changes</b> (newest first)'
                f'<ul style="margin:2px 0">{items}</ul></div>')

    # ------------------------------------------------------------------ plots
    def _due_plots(self, run: Any) -> tuple[list[str], int]:
        """Views whose history has rows they have not drawn, and the history's length."""
        history = run.history
        n = len(history)
        if n == 0:
            return [], 0
        full = n >= getattr(history, "maxlen", math.inf)  # rows roll over: always new
        return [v for v in VIEWS if full or self._plot_rows_seen[v] != n], n

    def _most_overdue(self, due: list[str], now: float) -> str | None:
        """Overdue = time since the last render over the view's interval: throughput and
        return every plot_interval, the others less often. None if nothing is due yet."""
        overdue = {v: (now - self._plot_last[v]) / (self.plot_interval * PLOT_EVERY[v])
                   for v in due}
        view = max(overdue, key=overdue.get) if overdue else None
        return view if view is not None and overdue[view] >= 1 else None

    def _plot_allowed(self, budget: float) -> bool:
        """Whether the bucket holds CPU time for another render (it refills at `budget`)."""
        now = time.monotonic()
        burst = PLOT_BURST_S * min(1.0, budget / self.plot_budget)
        self._plot_tokens = min(burst, self._plot_tokens + budget * (now - self._plot_refilled))
        self._plot_refilled = now
        return self._plot_tokens > 0

    def _account(self, view: str, png: bytes, cpu_s: float) -> None:
        self.plots[view].value = png
        self.plot_renders += 1
        self.plot_seconds += cpu_s
        self._plot_tokens -= cpu_s

    def _plot_in_process(self, run: Any) -> None:
        """The poller's plots: one request at a time to the plot process."""
        try:
            if self._plotter is None:
                self._plotter = PlotProcess(VIEWS)
            done = self._plotter.poll()
        except (OSError, EOFError, RuntimeError) as exc:  # no child: draw in this thread
            self.last_poll_error = exc
            self.plot_process = False
            self._close_plotter()
            return
        if done is not None:
            self._account(*done)
        if self._plotter.pending is not None:
            return
        due, n = self._due_plots(run)
        if not due or not self._plot_allowed(self.plot_budget):
            return
        now = time.monotonic()
        view = self._most_overdue(due, now)
        if view is None:
            return
        self._plotter.submit(view, columns(run.history, self._live[view].keys))
        self._plot_rows_seen[view] = n
        self._plot_last[view] = now

    def _render_plots(self, run: Any, force: bool) -> None:
        """Draw plots in this thread: every due one when forced (``refresh()``); else the most
        overdue one, once its interval passed and the (smaller) in-thread budget allows."""
        due, n = self._due_plots(run)
        if not due:
            return
        if not force:
            allowed = self._plot_allowed(min(self.plot_budget, IN_THREAD_BUDGET))
            view = self._most_overdue(due, time.monotonic()) if allowed else None
            if view is None:
                return
            due = [view]
        for view in due:
            # CPU time of this thread, not wall time: waiting for the GIL is not our cost.
            start = time.thread_time()
            png = self._live[view].render(run.history)
            self._account(view, png, time.thread_time() - start)
            self._plot_rows_seen[view] = n
            self._plot_last[view] = time.monotonic()

    # ------------------------------------------------------------------ controls
    def _knob_observer(self, name: str) -> Callable[[dict], None]:
        def observe(change: dict) -> None:
            if getattr(self._local, "syncing", False):
                return
            self._on_knob(name, change["new"])

        return observe

    def _on_knob(self, name: str, value: Any) -> None:
        run = self.impala
        if run is None:
            return
        if name in INT_KNOBS:
            value = int(value)
        else:
            value = float(f"{value:.6g}")  # a slider's float noise would land in the metrics
        if self._seen_knobs.get(name) == value:
            return
        try:
            run.set_knobs(**{name: value})
        except (ValueError, TypeError) as exc:  # ConfigError is a ValueError
            self._note, self._note_error = f"{name}: {exc}", True
            self._seen_knobs.pop(name, None)  # the next update puts the run's value back
        else:
            when = ("before the driver's next step" if getattr(run, "is_training", False)
                    else "now (or before the next step)")
            self._note, self._note_error = f"{name} = {fmt_knob(value)}: applied {when}", False
        with contextlib.suppress(Exception):
            self.refresh(plots=False)

    def _on_start(self) -> None:
        run = self.impala
        if run is None:
            return
        try:
            run.start(**self.start_kwargs)
            self._note, self._note_error = "training in the background", False
        except Exception as exc:
            self._note, self._note_error = f"start: {type(exc).__name__}: {exc}", True
        self.start_polling()
        with contextlib.suppress(Exception):
            self.refresh(plots=False)

    def _on_pause(self) -> None:
        run = self.impala
        if run is None:
            return
        try:
            run.pause()
            self._note, self._note_error = "paused; start resumes training", False
        except Exception as exc:  # the background error, raised by pause()
            self._note, self._note_error = f"training failed: {type(exc).__name__}: {exc}", True
        with contextlib.suppress(Exception):
            self.refresh()

    def _on_stop(self) -> None:
        run = self.impala
        if run is None:
            return
        try:
            run.stop()
            self._note, self._note_error = "stopped: the workers and the learner ended", False
        except Exception as exc:
            self._note, self._note_error = f"stop: {type(exc).__name__}: {exc}", True
        with contextlib.suppress(Exception):
            self.refresh()


def _escape(text: str) -> str:
    from html import escape

    return escape(text, quote=False)


def _poll_loop(ref: weakref.ref, stop: threading.Event, interval: float) -> None:
    """The poller: holds the dashboard weakly, never prints, survives a failed update."""
    next_at = time.monotonic()
    while not stop.is_set():
        board = ref()
        if board is None:
            return
        cpu = time.thread_time()
        try:
            alive = board._tick()
        except Exception as exc:  # e.g. a torn read while someone steps by hand
            board.poll_errors += 1
            board.last_poll_error = exc
            alive = True
        board.poll_ticks += 1
        board.poll_cpu_s += time.thread_time() - cpu
        del board
        if not alive:
            return
        next_at += interval
        delay = next_at - time.monotonic()
        if delay < 0:  # fell behind (a slow render): do not try to catch up
            next_at, delay = time.monotonic(), interval / 2
        stop.wait(delay)
