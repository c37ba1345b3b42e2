"""Tests of impala_lab.stats: timers, window stats, throughput meters, history."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from impala_lab.stats import StatsHistory, ThroughputMeter, TimerStat, WindowStat, flatten


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


# --- TimerStat ---------------------------------------------------------------------------


def test_timer_empty_is_zero_not_nan():
    timer = TimerStat()
    assert (timer.mean, timer.last, timer.median, timer.max) == (0.0, 0.0, 0.0, 0.0)
    assert timer.count == 0 and timer.total == 0.0
    assert timer.mean_throughput == 0.0 and timer.mean_units_processed == 0.0


def test_timer_context_manager_with_fake_clock():
    clock = FakeClock()
    timer = TimerStat(window_size=3, clock=clock)
    for dt in (0.5, 1.0, 2.0, 4.0):
        with timer:
            clock.advance(dt)
    # The window keeps the last 3 durations; count and total cover all 4.
    assert timer.samples() == [1.0, 2.0, 4.0]
    assert timer.mean == pytest.approx(7.0 / 3.0)
    assert timer.last == 4.0
    assert timer.median == 2.0
    assert timer.max == 4.0
    assert timer.count == 4
    assert timer.total == pytest.approx(7.5)


def test_timer_push_and_throughput():
    timer = TimerStat(window_size=2)
    timer.push(0.25)
    timer.push_units_processed(100)
    timer.push(0.75)
    timer.push_units_processed(300)
    assert timer.mean == 0.5
    assert timer.mean_units_processed == 200.0
    assert timer.mean_throughput == pytest.approx(400 / 1.0)
    timer.push(1.0)
    timer.push_units_processed(100)
    # window now [0.75, 1.0] and units [300, 100]
    assert timer.mean_throughput == pytest.approx(400 / 1.75)
    timer.reset()
    assert timer.count == 0 and timer.mean == 0.0 and timer.samples() == []


def test_timer_exception_still_records_and_nesting_refused():
    clock = FakeClock()
    timer = TimerStat(clock=clock)
    with pytest.raises(KeyError), timer:
        clock.advance(0.1)
        raise KeyError("x")
    assert timer.count == 1 and timer.last == pytest.approx(0.1)
    with timer, pytest.raises(RuntimeError, match="nested"):
        timer.__enter__()


def test_timer_two_threads_time_at_once():
    timer = TimerStat(window_size=100)
    barrier = threading.Barrier(2)

    def work():
        with timer:
            barrier.wait(timeout=5)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert timer.count == 2


def test_timer_default_clock_measures_wall_seconds():
    import time

    timer = TimerStat()
    before = time.perf_counter()
    with timer:
        inner_start = time.perf_counter()
        time.sleep(0.001)  # wall time without CPU time; its length does not matter
        inner_end = time.perf_counter()
    after = time.perf_counter()
    # The timer read the same clock just outside the inner readings and inside the outer ones.
    assert inner_end - inner_start <= timer.last <= after - before


def test_timer_validates_window():
    with pytest.raises(ValueError, match="window_size=0"):
        TimerStat(window_size=0)


# --- WindowStat --------------------------------------------------------------------------


def test_window_stat_exact_numbers():
    w = WindowStat("size", 4)
    assert w.stats() == {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "count": 0}
    for x in (2, 4, 4, 4):
        w.push(x)
    s = w.stats()
    assert s == {"mean": 3.5, "std": math.sqrt(0.75), "min": 2.0, "max": 4.0, "count": 4}
    for x in (5, 5, 7, 9):  # replaces the whole window
        w.push(x)
    s = w.stats()
    assert s["mean"] == 6.5 and s["min"] == 5.0 and s["max"] == 9.0 and s["count"] == 4
    assert s["std"] == pytest.approx(np.std([5, 5, 7, 9]), abs=1e-15)
    assert w.total_count == 8 and w.name == "size"


def test_window_stat_partial_window_and_types():
    w = WindowStat("x", 50)
    w.push(1)
    w.push(3)
    s = w.stats()
    assert s == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0, "count": 2}
    assert all(type(s[k]) is float for k in ("mean", "std", "min", "max"))
    assert type(s["count"]) is int


def test_window_stat_concurrent_push_and_read():
    w = WindowStat("x", 10)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            w.push(i % 7)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(2000):
            s = w.stats()
            assert 0 <= s["min"] <= s["mean"] <= s["max"] <= 6
    finally:
        stop.set()
        t.join()


def test_window_stat_validates_n():
    with pytest.raises(ValueError, match="n=0"):
        WindowStat("x", 0)


# --- ThroughputMeter ---------------------------------------------------------------------


def test_throughput_sliding_window_with_fake_clock():
    clock = FakeClock(0.0)
    m = ThroughputMeter(window_s=10.0, clock=clock)
    assert m.rate() == 0.0  # age 0
    m.add(100)
    clock.advance(2.0)
    # Younger than the window: the rate is over the meter's age.
    assert m.rate() == pytest.approx(50.0)
    m.add(300)
    clock.advance(8.0)  # t = 10: the add at t = 0 falls out (window is (0, 10])
    assert m.rate() == pytest.approx(300 / 10.0)
    clock.advance(1.0)  # t = 11
    assert m.rate() == pytest.approx(300 / 10.0)
    clock.advance(1.0)  # t = 12: the add at t = 2 falls out
    assert m.rate() == 0.0
    assert m.total == 400
    assert m.elapsed == 12.0
    assert m.mean_rate == pytest.approx(400 / 12.0)


def test_throughput_interval_rate_resets():
    clock = FakeClock(0.0)
    m = ThroughputMeter(clock=clock)
    m.add(50)
    clock.advance(5.0)
    assert m.pop_interval_rate() == pytest.approx(10.0)
    assert m.pop_interval_rate() == 0.0  # zero time since the last call
    m.add(30)
    clock.advance(3.0)
    m.add(30)
    clock.advance(3.0)
    assert m.pop_interval_rate() == pytest.approx(10.0)
    assert m.total == 110


def test_throughput_reset_and_validation():
    clock = FakeClock(0.0)
    m = ThroughputMeter(window_s=1.0, clock=clock)
    m.add(5)
    clock.advance(1.0)
    m.reset()
    assert m.total == 0 and m.rate() == 0.0 and m.elapsed == 0.0
    with pytest.raises(ValueError, match="window_s=0"):
        ThroughputMeter(window_s=0)


# --- flatten / StatsHistory --------------------------------------------------------------


def test_flatten():
    nested = {"a": 1, "timing_breakdown": {"learner_grad_time_ms": 5.0, "deep": {"x": [1, 2]}}}
    assert flatten(nested) == {
        "a": 1,
        "timing_breakdown.learner_grad_time_ms": 5.0,
        "timing_breakdown.deep.x": [1, 2],
    }
    assert flatten({"a": {"b": 2}}, sep="/") == {"a/b": 2}
    assert flatten({}) == {}


def test_history_bounds_and_columns():
    clock = FakeClock(0.0)
    h = StatsHistory(maxlen=3, clock=clock)
    for i in range(5):
        clock.advance(1.0)
        h.append({"step": i, "timing_breakdown": {"grad_ms": 10.0 * i}})
    assert len(h) == 3
    assert [r["step"] for r in h.rows()] == [2, 3, 4]
    np.testing.assert_array_equal(h.column("time"), [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(h.column("timing_breakdown.grad_ms"), [20.0, 30.0, 40.0])
    assert h.column("step").dtype == np.float64
    assert h.keys() == ["step", "timing_breakdown.grad_ms", "time"]


def test_history_missing_keys_and_own_timestamp():
    h = StatsHistory(maxlen=10)
    h.append({"time": 1.5, "a": 1})
    h.append({"time": 2.5, "b": 2})
    np.testing.assert_array_equal(h.column("time"), [1.5, 2.5])
    a = h.column("a")
    assert a[0] == 1.0 and math.isnan(a[1])
    assert np.isnan(h.column("nope")).all() and h.column("nope").shape == (2,)
    h.append({"time": 3.0, "a": "text"})
    col = h.column("a")
    assert col.dtype == object and list(col) == [1, None, "text"]


def test_history_rows_are_copies_and_clear():
    h = StatsHistory(maxlen=2, clock=lambda: 0.0)
    h.append({"a": 1})
    h.rows()[0]["a"] = 99
    assert h.rows()[0]["a"] == 1
    h.clear()
    assert len(h) == 0 and h.rows() == [] and h.column("a").shape == (0,)
    with pytest.raises(ValueError, match="maxlen=0"):
        StatsHistory(maxlen=0)
