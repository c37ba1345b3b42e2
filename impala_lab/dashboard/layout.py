"""The dashboard's widgets and their layout: which widget shows what, and where it sits.

`DashboardWidgets` builds every widget of a `impala_lab.dashboard.widgets.Dashboard` once, in
the main thread, and names them (``header``, ``health``, ``cards``, ``diagram``, ``gauges``,
``knobs``, ``plots``, ``timing``, ``lag_histogram``, the frame strip); the `Dashboard` keeps
their values in step with the run and handles the clicks. A run whose action space is a Box
gets two more cards (the policy's action mean and std) and the ``actions`` plot beside the lag
histogram; any other run's page is without them. Core ipywidgets only; the CSS
classes (``impala-...``) are what the browser tests and the page's style find them by.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W

from impala_lab.dashboard import markup
from impala_lab.dashboard.controls import KnobSliders, button
from impala_lab.dashboard.labels import QUEUES


def _css(name: str) -> str:
    return name.replace(".", "-").replace("_", "-")


class DashboardWidgets:
    """The widgets of a dashboard, built by `_build` (the `Dashboard` subclasses it).

    The subclass provides the click handlers (``_on_start``, ``_on_pause``, ``_on_stop``,
    ``_on_knob``), its plot scheduler (``_scheduler``: blank plot images, its ``views``),
    its frame strip view (``_frame_view``: whether the run has frames to show) and
    ``box_actions`` (whether the run's action space is a Box).
    """

    _scheduler: Any
    _frame_view: Any
    box_actions: bool

    def _build(self) -> None:
        """Build every widget and lay out the page (once, in the main thread)."""
        status = self._build_status()
        gauges = self._build_gauges()
        controls = self._build_controls()
        plots = self._build_plots()
        self.widget = W.VBox([
            *status,
            W.HBox([gauges, controls], layout=W.Layout(flex_flow="row wrap",
                                                       margin="8px 0")),
            plots,
        ], layout=W.Layout(max_width="980px", padding="6px"))
        self.widget.add_class("impala-dashboard")

    def _build_status(self) -> list[W.Widget]:
        """The header, the health badge, the headline cards and the diagram."""
        self.header = W.HTML()
        self.header.add_class("impala-header")
        self.health = W.HTML(layout=W.Layout(width="100%"))
        self.health.add_class("impala-health")
        self.cards: dict[str, W.HTML] = {}
        for name in markup.CARDS:
            if name in markup.BOX_CARDS and not self.box_actions:
                continue
            card = W.HTML(layout=W.Layout(min_width="124px", margin="0 6px 0 0"))
            card.add_class("impala-stat")
            card.add_class(f"impala-stat-{_css(name)}")
            self.cards[name] = card
        self.diagram = W.HTML(layout=W.Layout(width="100%"))
        self.diagram.add_class("impala-diagram")
        cards = W.HBox(list(self.cards.values()), layout=W.Layout(flex_flow="row wrap"))
        return [self.header, self.health, cards, self.diagram]

    def _build_gauges(self) -> W.VBox:
        """A gauge and its figure per queue, and the bottleneck hint."""
        self.gauges: dict[str, W.FloatProgress] = {}
        self.gauge_labels: dict[str, W.HTML] = {}
        rows = []
        for name, label in QUEUES.items():
            bar = W.FloatProgress(value=0.0, min=0.0, max=1.0,
                                  layout=W.Layout(width="190px", height="22px"))
            bar.add_class("impala-gauge")
            bar.add_class(f"impala-gauge-{_css(name)}")
            text = W.HTML(layout=W.Layout(width="90px"))
            text.add_class(f"impala-gauge-{_css(name)}-value")
            self.gauges[name], self.gauge_labels[name] = bar, text
            rows.append(W.HBox([W.HTML(markup.gauge_label(label.name),
                                       layout=W.Layout(width="150px")), bar, text]))
        self.hint = W.HTML(layout=W.Layout(width="440px"))
        self.hint.add_class("impala-bottleneck")
        gauges = W.VBox([W.HTML(markup.section_title("queues")), *rows, self.hint],
                        layout=W.Layout(width="450px", margin="0 16px 0 0"))
        gauges.add_class("impala-gauges")
        return gauges

    def _build_controls(self) -> W.VBox:
        """The buttons, a slider per live knob, the message line and the knob log."""
        self.start_button, self.pause_button, self.stop_button = (
            button("start"), button("pause"), button("stop"))
        self.start_button.on_click(lambda _: self._on_start())
        self.pause_button.on_click(lambda _: self._on_pause())
        self.stop_button.on_click(lambda _: self._on_stop())
        self._knob_sliders = KnobSliders(self._on_knob)
        self.knobs: dict[str, W.ValueWidget] = self._knob_sliders.sliders
        self.message = W.HTML(layout=W.Layout(width="460px"))
        self.message.add_class("impala-message")
        self.knob_log = W.HTML(layout=W.Layout(width="460px"))
        self.knob_log.add_class("impala-knob-log")
        controls = W.VBox([W.HTML(markup.section_title("controls")),
                           W.HBox([self.start_button, self.pause_button, self.stop_button]),
                           *self.knobs.values(), self.message, self.knob_log],
                          layout=W.Layout(width="470px"))
        controls.add_class("impala-controls")
        return controls

    def _build_plots(self) -> W.VBox:
        """The plot images (blank until the history has rows) and the timing bars."""
        self.plots: dict[str, W.Image] = {}
        views = self._scheduler.views
        for view in views:
            img = W.Image(value=self._scheduler.blank(view), format="png",
                          layout=W.Layout(max_width="100%", height="auto",
                                          margin="4px 4px 4px 0"))
            img.add_class("impala-plot")
            img.add_class(f"impala-plot-{_css(view)}")
            self.plots[view] = img
        self.timing = W.HTML(layout=W.Layout(width="470px", margin="4px 4px 4px 0"))
        self.timing.add_class("impala-timing")
        self.lag_histogram = W.HTML(layout=W.Layout(width="470px", margin="4px 4px 4px 0"))
        self.lag_histogram.add_class("impala-lag-histogram")
        learner = W.HBox([self.plots[v] for v in views if v.startswith("learner.")],
                         layout=W.Layout(flex_flow="row wrap"))
        learner.add_class("impala-plot-learner")
        return W.VBox([W.HBox([self.plots["throughput"], self.plots["return"]],
                              layout=W.Layout(flex_flow="row wrap")),
                       self._build_frame_strip(),
                       W.HBox([self.timing, self.plots["queues"]],
                              layout=W.Layout(flex_flow="row wrap")),
                       W.HBox([self.lag_histogram,
                               *([self.plots["actions"]] if "actions" in self.plots else [])],
                              layout=W.Layout(flex_flow="row wrap")),
                       learner])

    def _build_frame_strip(self) -> W.VBox:
        """The frame strip's caption and image (the image hidden until frames arrive; the
        whole panel for a run without an observation space)."""
        self.frame_caption = W.HTML()
        self.frame_caption.add_class("impala-frame-strip-caption")
        self.frame_strip = W.Image(value=b"", format="png",
                                   layout=W.Layout(max_width="100%", height="auto",
                                                   display="none"))
        self.frame_strip.add_class("impala-frame-strip-image")
        panel = W.VBox([self.frame_caption, self.frame_strip],
                       layout=W.Layout(margin="4px 0",
                                       display=None if self._frame_view.visible else "none"))
        panel.add_class("impala-frame-strip")
        return panel
