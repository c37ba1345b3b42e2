"""bench.speed_door's summary: medians of each side, the paired difference and its interval,
on known data (no training)."""

from __future__ import annotations

import numpy as np

from bench.speed_door import markdown, summarize


def _run(first: float, target: float | None, exit_s: float) -> dict:
    return {"first_train_s": first, "seconds_to_target": target, "exit_s": exit_s}


def test_the_summary_gives_each_sides_median_and_what_the_door_saves():
    pairs = [(_run(2.0, 5.0, 8.0), _run(2.5, 5.5, 8.6)),
             (_run(2.1, 6.0, 9.0), _run(2.6, 6.4, 9.4)),
             (_run(1.9, None, 60.0), _run(2.4, 7.0, 10.0))]  # the door missed: left out there
    s = summarize(pairs, np.random.default_rng(0))
    assert s["pairs"] == 3
    assert s["first_train_s"]["n"] == 3 and s["seconds_to_target"]["n"] == 2
    assert s["first_train_s"]["door"] == 2.0 and s["first_train_s"]["plain"] == 2.5
    assert np.isclose(s["first_train_s"]["saves"], 0.5)
    assert np.isclose(s["seconds_to_target"]["saves"], 0.45)  # median of 0.5 and 0.4
    lo, hi = s["seconds_to_target"]["interval"]
    assert np.isclose(lo, 0.4) and np.isclose(hi, 0.5)
    assert "| seconds_to_target | 2 | 5.50 | 5.95 | +0.45 [+0.40, +0.50] |" in markdown(s)
