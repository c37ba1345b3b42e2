"""The dashboard's controls: a slider per live knob (its range, step and help from
`knobs.KNOBS`) and the start, pause and stop buttons.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as W

from impala_lab.config import ImpalaConfig
from impala_lab.knobs import KNOBS, LIVE_KNOBS, Knob, cast

# name -> (icon, button style, tooltip)
BUTTONS = {
    "start": ("play", "success", "train in the background (impala.start())"),
    "pause": ("pause", "warning", "end background training after this step"),
    "stop": ("stop", "danger", "end the run: workers and learner stop"),
}


def knob_widget(name: str) -> W.ValueWidget:
    """The slider of the live knob `name`, starting at the config's default."""
    knob = KNOBS[name]
    common: dict[str, Any] = dict(
        value=getattr(ImpalaConfig, name), continuous_update=False,
        style={"description_width": "140px"}, layout=W.Layout(width="460px"), description=name,
        description_allow_html=False)
    if knob.readout:
        common["readout_format"] = knob.readout
    if knob.kind == "int":
        w = W.IntSlider(min=int(knob.low), max=int(knob.high), step=int(knob.step), **common)
    elif knob.log:
        w = W.FloatLogSlider(base=10, min=math.log10(knob.low), max=math.log10(knob.high),
                             step=knob.step, **common)
    else:
        w = W.FloatSlider(min=knob.low, max=knob.high, step=knob.step, **common)
    w.tooltip = knob.help
    w.add_class(f"impala-knob-{name.replace('_', '-')}")
    return w


def show_value(w: W.ValueWidget, knob: Knob, value: Any) -> None:
    """Set a slider to the run's value, widening its range to hold it."""
    if knob.log:
        exponent = math.log10(value)
        w.min, w.max = min(w.min, math.floor(exponent)), max(w.max, math.ceil(exponent))
    else:
        w.max = max(w.max, value)
    w.value = value


class KnobSliders:
    """A slider per live knob that follows the run's values and reports the user's moves to
    ``on_move(name, value)`` (cast to the knob's type; not when the run has that value)."""

    def __init__(self, on_move: Callable[[str, Any], None]) -> None:
        self.on_move = on_move
        self.sliders: dict[str, W.ValueWidget] = {}
        self._seen: dict[str, Any] = {}  # the run's values, as last shown
        self._local = threading.local()  # .following: the change is ours, not the user's
        for name in LIVE_KNOBS:
            w = knob_widget(name)
            w.observe(self._observer(name), names="value")
            self.sliders[name] = w

    def follow(self, knobs: Mapping[str, Any]) -> None:
        """Show the run's knob values that changed since the last call (not a pending move)."""
        self._local.following = True
        try:
            for name, w in self.sliders.items():
                if name in knobs and knobs[name] != self._seen.get(name):
                    show_value(w, KNOBS[name], knobs[name])
                    self._seen[name] = knobs[name]
        finally:
            self._local.following = False

    def forget(self, name: str) -> None:
        """The run refused a move: the next `follow` puts the run's value back."""
        self._seen.pop(name, None)

    def _observer(self, name: str) -> Callable[[dict], None]:
        def observe(change: dict) -> None:
            if getattr(self._local, "following", False):
                return
            value = cast(name, change["new"])  # a slider's float noise would reach the metrics
            if self._seen.get(name) != value:
                self.on_move(name, value)

        return observe


def button(name: str) -> W.Button:
    """One of `BUTTONS`."""
    icon, style, tooltip = BUTTONS[name]
    b = W.Button(description=name, icon=icon, button_style=style, tooltip=tooltip)
    b.add_class(f"impala-button-{name}")
    b.layout = W.Layout(width="110px", height="36px")
    return b
