"""The dashboard's widgets (core ipywidgets) and where each sits; the ``impala-...`` CSS
classes are what the browser tests and the page's style find them by."""

from __future__ import annotations

from typing import Any, TypeVar

import ipywidgets as W

from impala_lab.dashboard import markup
from impala_lab.dashboard.controls import KnobSliders, button
from impala_lab.dashboard.labels import QUEUES

WidgetT = TypeVar("WidgetT", bound=W.Widget)


def _css(name: str) -> str:
    return name.replace(".", "-").replace("_", "-")


def _classed(widget: WidgetT, *classes: str) -> WidgetT:
    for name in classes:
        widget.add_class(name)
    return widget


def _html(css_class: str, **layout: str) -> W.HTML:
    return _classed(W.HTML(layout=W.Layout(**layout)), css_class)


def _row(children: list[W.Widget]) -> W.HBox:
    """Widgets side by side, wrapping on a narrow page."""
    return W.HBox(children, layout=W.Layout(flex_flow="row wrap"))


class DashboardWidgets:
    """The widgets of a dashboard, built by `_build`; the `Dashboard` subclass provides the
    click handlers (``_on_*``), ``_scheduler``, ``_frame_view`` and ``box_actions``."""

    _scheduler: Any
    _frame_view: Any
    box_actions: bool

    def _build(self) -> None:
        status = self._build_status()
        gauges = self._build_gauges()
        controls = self._build_controls()
        plots = self._build_plots()
        self.widget = _classed(W.VBox([
            *status,
            W.HBox([gauges, controls], layout=W.Layout(flex_flow="row wrap",
                                                       margin="8px 0")),
            plots,
        ], layout=W.Layout(max_width="980px", padding="6px")), "impala-dashboard")

    def _build_status(self) -> list[W.Widget]:
        self.header = _html("impala-header")
        self.health = _html("impala-health", width="100%")
        self.cards: dict[str, W.HTML] = {
            name: _classed(W.HTML(layout=W.Layout(min_width="124px", margin="0 6px 0 0")),
                           "impala-stat", f"impala-stat-{_css(name)}")
            for name in markup.CARDS if self.box_actions or name not in markup.BOX_CARDS}
        self.diagram = _html("impala-diagram", width="100%")
        cards = _row(list(self.cards.values()))
        return [self.header, self.health, cards, self.diagram]

    def _build_gauges(self) -> W.VBox:
        self.gauges: dict[str, W.FloatProgress] = {}
        self.gauge_labels: dict[str, W.HTML] = {}
        rows = []
        for name, label in QUEUES.items():
            bar = _classed(W.FloatProgress(value=0.0, min=0.0, max=1.0,
                                           layout=W.Layout(width="190px", height="22px")),
                           "impala-gauge", f"impala-gauge-{_css(name)}")
            text = _html(f"impala-gauge-{_css(name)}-value", width="90px")
            self.gauges[name], self.gauge_labels[name] = bar, text
            rows.append(W.HBox([W.HTML(markup.gauge_label(label.name),
                                       layout=W.Layout(width="150px")), bar, text]))
        self.hint = _html("impala-bottleneck", width="440px")
        return _classed(W.VBox([W.HTML(markup.section_title("queues")), *rows, self.hint],
                               layout=W.Layout(width="450px", margin="0 16px 0 0")),
                        "impala-gauges")

    def _build_controls(self) -> W.VBox:
        self.start_button, self.pause_button, self.stop_button = (
            button("start"), button("pause"), button("stop"))
        self.start_button.on_click(lambda _: self._on_start())
        self.pause_button.on_click(lambda _: self._on_pause())
        self.stop_button.on_click(lambda _: self._on_stop())
        self._knob_sliders = KnobSliders(self._on_knob)
        self.knobs: dict[str, W.ValueWidget] = self._knob_sliders.sliders
        self.message = _html("impala-message", width="460px")
        self.knob_log = _html("impala-knob-log", width="460px")
        return _classed(W.VBox([W.HTML(markup.section_title("controls")),
                                W.HBox([self.start_button, self.pause_button,
                                        self.stop_button]),
                                *self.knobs.values(), self.message, self.knob_log],
                               layout=W.Layout(width="470px")), "impala-controls")

    def _build_plots(self) -> W.VBox:
        """The plot images (blank until the history has rows) and the timing bars."""
        views = self._scheduler.views
        self.plots: dict[str, W.Image] = {
            view: _classed(W.Image(value=self._scheduler.blank(view), format="png",
                                   layout=W.Layout(max_width="100%", height="auto",
                                                   margin="4px 4px 4px 0")),
                           "impala-plot", f"impala-plot-{_css(view)}")
            for view in views}
        self.timing = _html("impala-timing", width="470px", margin="4px 4px 4px 0")
        self.lag_histogram = _html("impala-lag-histogram", width="470px", margin="4px 4px 4px 0")
        learner = _classed(_row([self.plots[v] for v in views if v.startswith("learner.")]),
                           "impala-plot-learner")
        return W.VBox([_row([self.plots["throughput"], self.plots["return"]]),
                       self._build_frame_strip(),
                       _row([self.timing, self.plots["queues"]]),
                       _row([self.lag_histogram,
                             *([self.plots["actions"]] if "actions" in self.plots else [])]),
                       learner])

    def _build_frame_strip(self) -> W.VBox:
        """The frame strip's caption and image (hidden until frames arrive)."""
        self.frame_caption = _html("impala-frame-strip-caption")
        self.frame_strip = _classed(W.Image(value=b"", format="png",
                                            layout=W.Layout(max_width="100%", height="auto",
                                                            display="none")),
                                    "impala-frame-strip-image")
        return _classed(W.VBox([self.frame_caption, self.frame_strip],
                               layout=W.Layout(margin="4px 0", display=None
                                               if self._frame_view.visible else "none")),
                        "impala-frame-strip")
