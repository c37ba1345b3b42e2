"""`Dashboard`: the live notebook view of one `Impala` run, with core ipywidgets only (the
package's docstring shows its use).

The widgets are laid out in `layout`, their HTML is `markup`'s; this class keeps them in step
with the run. A daemon poller reads ``impala.stats()`` at ``poll_hz`` and sets the widgets
inside ``hold_sync()``, never printing (ipykernel routes a thread's output badly);
``refresh()`` updates once in the calling thread (step-through cells, tests). The run is held
weakly: keep your own reference. Under a blocking ``train(..., dashboard=True)`` the kernel
takes no clicks, so the controls stay disabled; ``start()`` gives live controls.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from impala_lab.dashboard import markup
from impala_lab.dashboard.diagram import PipelineDiagram, timing_svg
from impala_lab.dashboard.format import fmt_knob
from impala_lab.dashboard.frame_strip import FrameStripView
from impala_lab.dashboard.lag_histogram import lag_histogram_svg
from impala_lab.dashboard.layout import DashboardWidgets
from impala_lab.dashboard.live_plots import PlotScheduler
from impala_lab.dashboard.plots import BOX_LIVE_VIEWS, LIVE_VIEWS
from impala_lab.dashboard.terminal import TerminalView, render


def frontend_available() -> bool:
    """True inside a Jupyter kernel that can show widgets."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def _check_arguments(impala: Any, poll_hz: float, plot_interval: float,
                     plot_budget: float) -> None:
    if not 0 <= poll_hz <= 10:  # NaN too
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


class Poller:
    """A daemon thread that calls ``target.tick()`` every ``1 / hz`` seconds, holding it
    weakly; a tick that raises is counted (``errors``, ``last_error``) and polling goes on, a
    tick that returns False ends it. Also counts ``ticks`` and their ``cpu_s``."""

    def __init__(self, hz: float, name: str) -> None:
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.name = name
        self.ticks = 0
        self.cpu_s = 0.0
        self.errors = 0
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, target: Any) -> None:
        """Start polling `target` (held weakly); no-op while running."""
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(weakref.ref(target), self._stop),
                                        name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to end and wait for it (unless called from it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self, ref: weakref.ref, stop: threading.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            target = ref()
            if target is None:
                return
            cpu = time.thread_time()
            try:
                alive = target.tick()
            except Exception as exc:  # e.g. a torn read while someone steps by hand
                self.errors += 1
                self.last_error = exc
                alive = True
            self.ticks += 1
            self.cpu_s += time.thread_time() - cpu
            del target
            if not alive:
                return
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow render): do not try to catch up
                next_at, delay = time.monotonic(), self.interval / 2
            stop.wait(delay)


def _read_through(path: str, doc: str) -> property:
    return property(operator.attrgetter(path), doc=doc)


class Dashboard(DashboardWidgets):
    """The live dashboard of one `Impala` run.

    Args:
      poll_hz: widget updates per second while shown, in (0, 10]; 0: call ``refresh()``.
      plot_interval: seconds between two renders of one plot, at least.
      plot_budget: share of one CPU core the plots may use on average, in (0, 1].
      plot_process: draw the poller's plots in a child process (the kernel's GIL stays with
        the run); else, or if it cannot start, in the poller thread.
      start_kwargs: ``impala.start()``'s arguments for the start button.
    """

    def __init__(self, impala: Any, *, poll_hz: float = 4.0, plot_interval: float = 1.0,
                 plot_budget: float = 0.06, plot_process: bool = True,
                 start_kwargs: Mapping[str, Any] | None = None) -> None:
        _check_arguments(impala, poll_hz, plot_interval, plot_budget)
        self._ref = weakref.ref(impala)
        self.poll_hz = float(poll_hz)
        self.start_kwargs = dict(start_kwargs or {})
        config = getattr(impala, "config", None)
        env_id = getattr(config, "env_id", None) or "env"
        self.title = f"IMPALA · {env_id}"
        self.blocking_train = False
        self._lock = threading.RLock()
        self._replay_off = False
        self._lr_scheduled = False
        self._diagram = PipelineDiagram()
        self._frame_view = FrameStripView(getattr(impala, "observation_space", None))
        self.box_actions = markup.box_actions(getattr(impala, "action_space", None))
        views = LIVE_VIEWS + (BOX_LIVE_VIEWS if self.box_actions else ())
        self._scheduler = PlotScheduler(views, interval=float(plot_interval),
                                        budget=float(plot_budget),
                                        use_process=bool(plot_process), show=self._show_plot)
        self._note = ""  # the last message from a button or knob
        self._note_error = False
        self._poller = Poller(self.poll_hz, "impala-dashboard-poller")
        self._closed = False
        self._terminal: TerminalView | None = None
        self._build()

    @property
    def impala(self) -> Any:
        """The run, or None once it was garbage-collected."""
        return self._ref()

    # The poller's and the plots' counters, read through (bench and notebooks use them).
    plot_renders = _read_through("_scheduler.renders", "Plots drawn so far.")
    plot_seconds = _read_through("_scheduler.seconds", "CPU seconds spent drawing plots.")
    plot_process = _read_through("_scheduler.use_process", "Whether the poller's plots are "
                                 "drawn in a child process (False once it failed).")
    poll_ticks = _read_through("_poller.ticks", "Poller updates so far.")
    poll_cpu_s = _read_through("_poller.cpu_s", "CPU seconds of the poller's updates.")
    poll_errors = _read_through("_poller.errors", "Poller updates that raised (it goes on).")
    last_poll_error = _read_through("_poller.last_error", "The last error of a poller update, "
                                    "or of the plot process that failed.")

    def _show_plot(self, view: str, png: bytes) -> None:
        self.plots[view].value = png

    # ------------------------------------------------------------------ showing
    def show(self, *, blocking_train: bool = False) -> None:
        """Display the widgets and start the poller (without a frontend: print the text view).
        ``blocking_train`` disables the controls until ``train_ended()``."""
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
        """``on_report`` for ``train()``: `on_report`, and the text view without a frontend."""
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
        self._poller.start(self)

    def stop_polling(self, timeout: float = 2.0) -> None:
        """Stop the poller thread and wait for it (the plot process stays until ``close()``)."""
        self._poller.stop(timeout)

    @property
    def polling(self) -> bool:
        """Whether the poller thread runs."""
        return self._poller.running

    def close(self) -> None:
        """Stop polling and remove the widgets from the page (the run goes on)."""
        self.stop_polling()
        self._scheduler.close()
        self._closed = True
        todo = [self.widget]
        while todo:  # this dashboard's widgets only (Widget.close_all would close every one)
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            w.close()

    def tick(self) -> bool:
        """One poller update; False ends the poller (the run is gone or stopped)."""
        run = self.impala
        if run is None:
            with self._lock:
                self.header.value = markup.header_html(self.title, None, "gone")
                self._set_buttons(None)
            self._scheduler.close()
            return False
        stats = run.stats()
        with self._lock:
            self._apply(stats, run)
            if run.stopped:
                self._scheduler.close()
                self._scheduler.draw_here(run.history, force=True)
                return False
            error = self._scheduler.step(run.history)
            if error is not None:  # the plots are drawn in this thread from now on
                self._poller.last_error = error
        return True

    # ------------------------------------------------------------------ updating
    def refresh(self, stats: Mapping[str, Any] | None = None, *, plots: bool = True
                ) -> dict[str, Any]:
        """Update every widget now from ``stats`` (None: the run's); returns the snapshot.
        ``plots``: redraw every plot with new rows (in the plot process while it runs)."""
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
                if self._scheduler.child is not None and self.polling:
                    # drawn here, they would have other axes limits than the child's: jumps
                    self._scheduler.redraw_soon()
                else:
                    self._scheduler.draw_here(run.history, force=True)
        return stats

    def _apply(self, s: Mapping[str, Any], run: Any) -> None:
        """Set every widget from one snapshot, each widget's changes in one message."""
        state = self._state(run)
        widgets = [self.header, self.health, self.diagram, self.timing, self.hint, self.message,
                   self.knob_log, self.lag_histogram, self.frame_caption, self.frame_strip,
                   *self.cards.values(), *self.gauges.values(), *self.gauge_labels.values(),
                   *self.knobs.values(), self.start_button, self.pause_button,
                   self.stop_button]
        with contextlib.ExitStack() as stack:
            for w in widgets:
                stack.enter_context(w.hold_sync())
            self.header.value = markup.header_html(self.title, s, state)
            self.health.value = markup.health_html(s.get("health"))
            for name, card in self.cards.items():
                card.value = markup.card_html(name, s)
            self.diagram.value = self._diagram.render(s)
            self.timing.value = timing_svg(s, width=470)
            self.lag_histogram.value = lag_histogram_svg(s, width=470)
            self._apply_frames(run)
            self._apply_gauges(s)
            self._apply_knobs(s)
            self._set_buttons(run, state)
            # run may be None (collected): getattr then gives the default
            self.message.value = markup.message_html(
                error=getattr(run, "background_error", None), blocking_train=self.blocking_train,
                replay_off=self._replay_off, note=self._note, note_error=self._note_error)
            self.knob_log.value = markup.knob_log_html(getattr(run, "knob_changes", None) or [])

    def _apply_frames(self, run: Any) -> None:
        """The frame strip: a new PNG only when new frames arrived."""
        latest = getattr(run, "latest_frames", None)
        png, caption = self._frame_view.update(latest() if latest is not None else None)
        self.frame_caption.value = caption
        if png is not None:
            self.frame_strip.value = png
            self.frame_strip.layout.display = None

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

    def _apply_gauges(self, s: Mapping[str, Any]) -> None:
        for name, (frac, color, text) in markup.gauges(s).items():
            self.gauges[name].value = frac
            self.gauge_labels[name].value = text
            self.gauges[name].style.bar_color = color
        self.hint.value = markup.bottleneck_html(s)

    def _apply_knobs(self, s: Mapping[str, Any]) -> None:
        self._knob_sliders.follow(s.get("knobs") or {})
        replay_capacity = (s.get("pipeline") or {}).get("replay_capacity")
        if "replay_proportion" in self.knobs and replay_capacity is not None:
            self._replay_off = replay_capacity <= 0
        self._lr_scheduled = s.get("lr_schedule") is not None  # the run refuses the lr knob

    def _set_buttons(self, run: Any, state: str | None = None) -> None:
        state = state or self._state(run)
        locked = state in ("stopped", "gone", "train")
        self.start_button.disabled = locked or state == "training"
        self.pause_button.disabled = locked or state not in ("training", "failed")
        self.stop_button.disabled = locked
        for name, w in self.knobs.items():
            w.disabled = locked or (name == "replay_proportion" and self._replay_off) or (
                name == "lr" and self._lr_scheduled)

    # ------------------------------------------------------------------ controls
    def _on_knob(self, name: str, value: Any) -> None:
        """A slider moved: ask the run to take the value, and say how that went."""
        run = self.impala
        if run is None:
            return
        try:
            run.set_knobs(**{name: value})
        except (ValueError, TypeError) as exc:  # ConfigError is a ValueError
            self._note, self._note_error = f"{name}: {exc}", True
            self._knob_sliders.forget(name)
        else:
            when = ("before the driver's next step" if getattr(run, "is_training", False)
                    else "now (or before the next step)")
            self._note, self._note_error = f"{name} = {fmt_knob(value)}: applied {when}", False
        self._refresh_quietly(plots=False)

    def _act(self, action: Callable[[Any], None], done: str, failed: str) -> bool:
        """Call `action` on the run and note how it went; False when the run is gone."""
        run = self.impala
        if run is None:
            return False
        try:
            action(run)
            self._note, self._note_error = done, False
        except Exception as exc:
            self._note, self._note_error = f"{failed}: {type(exc).__name__}: {exc}", True
        return True

    def _refresh_quietly(self, plots: bool = True) -> None:
        with contextlib.suppress(Exception):
            self.refresh(plots=plots)

    def _on_start(self) -> None:
        if self._act(lambda run: run.start(**self.start_kwargs),
                     "training in the background", "start"):
            self.start_polling()
            self._refresh_quietly(plots=False)

    def _on_pause(self) -> None:
        # pause() raises the background error, if training failed
        if self._act(lambda run: run.pause(), "paused; start resumes training",
                     "training failed"):
            self._refresh_quietly()

    def _on_stop(self) -> None:
        if self._act(lambda run: run.stop(), "stopped: the workers and the learner ended",
                     "stop"):
            self._refresh_quietly()

