"""Live knobs: the config fields a run may change between two driver steps, in one table that
``Impala.set_knobs``, the dashboard's sliders, the plots and the docs all read: a new knob is
one `Knob` here. ``ImpalaConfig`` validates a knob's value like any other field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """One live knob: the config field ``name``, its ``kind`` ("int" or "float": a dashboard
    value is cast to it), the slider's range ``low``-``high`` (validation may allow more),
    ``step`` (of the exponent for a base-10 ``log`` slider) and number format ``readout`` ("":
    the widget's own), a ``help`` line, and ``apply(run, value)``: how a running pipeline takes
    the value (None: storing it in ``run.config`` is all it takes)."""

    name: str
    kind: str
    low: float
    high: float
    step: float
    help: str
    log: bool = False
    readout: str = ""
    apply: Callable[[Any, Any], None] | None = None


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("broadcast_interval", "int", 1, 32, 1,
         "samples a worker returns between weight broadcasts"),
    Knob("replay_proportion", "float", 0.0, 4.0, 0.25,
         "replayed batches per new batch (needs replay slots)", readout=".2f",
         apply=lambda run, v: setattr(run.replay, "replay_proportion", v)),
    Knob("num_sgd_iter", "int", 1, 10, 1, "passes over each train batch",
         apply=lambda run, v: run.learner.set_num_sgd_iter(v)),
    Knob("lr", "float", 1e-5, 1e-1, 0.05, "learning rate", log=True, readout=".1e",
         apply=lambda run, v: run.policy.set_lr(v)),
    Knob("entropy_coeff", "float", 0.0, 0.05, 0.001, "weight of the entropy bonus",
         readout=".3f", apply=lambda run, v: run.policy.set_entropy_coeff(v)),
    Knob("extra_policy_lag", "int", 0, 64, 1,
         "hold broadcasts back: actors act this many learner updates behind"),
    Knob("max_policy_lag", "int", 1, 1000, 1,
         "drop new batches more than this many learner updates behind"),
)}

#: The live knobs' names, in the dashboard's order.
LIVE_KNOBS: tuple[str, ...] = tuple(KNOBS)


def cast(name: str, value: Any) -> int | float:
    """A control's value as the knob's type (a float slider's noise rounded to 6 digits)."""
    if KNOBS[name].kind == "int":
        return int(value)
    return float(f"{float(value):.6g}")
