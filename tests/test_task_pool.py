"""Tests of impala_lab.driver.task_pool.SampleTaskPool and poll_wait."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from impala_lab.driver.task_pool import SampleFuture, SampleTaskPool, poll_wait


class FakeFuture:
    """A future finished by the test; optional completion_time like the real backends."""

    def __init__(self, value=None, *, error: Exception | None = None, with_time: bool = True):
        self.value = value
        self.error = error
        self._done = False
        self.with_time = with_time
        self.completion_time = None
        self.result_calls = 0

    def finish(self, t: float | None = None) -> FakeFuture:
        self._done = True
        if self.with_time:
            self.completion_time = t
        return self

    def done(self) -> bool:
        return self._done

    def result(self):
        self.result_calls += 1
        if not self._done:
            raise AssertionError("result() of an unfinished future")
        if self.error is not None:
            raise self.error
        return self.value


def test_fake_future_satisfies_protocol():
    assert isinstance(FakeFuture(), SampleFuture)
    assert isinstance(concurrent.futures.Future(), SampleFuture)
    assert not isinstance(object(), SampleFuture)


def test_completed_in_completion_time_order():
    pool = SampleTaskPool()
    futs = {name: FakeFuture(name) for name in "abcd"}
    for name, fut in futs.items():
        pool.add(f"w{name}", fut)
    futs["c"].finish(1.0)
    futs["a"].finish(3.0)
    futs["d"].finish(2.0)
    assert list(pool.completed()) == [("wc", "c"), ("wd", "d"), ("wa", "a")]
    assert len(pool) == 1 and pool.count("wb") == 1
    assert list(pool.completed()) == []  # nothing done, non-blocking
    futs["b"].finish(4.0)
    assert list(pool.completed()) == [("wb", "b")]
    assert len(pool) == 0


def test_without_completion_time_keeps_wait_fn_order():
    calls = []

    def reversed_wait(futures, timeout):
        calls.append(timeout)
        return [f for f in reversed(futures) if f.done()]

    pool = SampleTaskPool(wait_fn=reversed_wait)
    futs = [FakeFuture(i, with_time=False) for i in range(4)]
    for i, f in enumerate(futs):
        pool.add(i % 2, f)
    for f in futs:
        f.finish()
    assert list(pool.completed()) == [(1, 3), (0, 2), (1, 1), (0, 0)]
    assert calls == [0.0]
    assert list(pool.completed()) == [] and calls == [0.0]  # empty pool: no wait at all


def test_mixed_completion_times_keep_wait_fn_order():
    pool = SampleTaskPool()
    a, b = FakeFuture("a"), FakeFuture("b", with_time=False)
    pool.add("w", a)
    pool.add("w", b)
    a.finish(5.0)
    b.finish()
    assert [r for _, r in pool.completed()] == ["a", "b"]


def test_in_flight_counts():
    pool = SampleTaskPool()
    futs = [FakeFuture(i) for i in range(5)]
    workers = ["x", "x", "y", "z", "x"]
    for w, f in zip(workers, futs):
        pool.add(w, f)
    assert len(pool) == 5
    assert pool.in_flight_counts() == {"x": 3, "y": 1, "z": 1}
    assert pool.count("x") == 3 and pool.count("nobody") == 0
    futs[0].finish(1.0)
    futs[2].finish(2.0)
    assert list(pool.completed()) == [("x", 0), ("y", 2)]
    assert pool.in_flight_counts() == {"x": 2, "z": 1}
    assert pool.num_prefetched == 0


def test_completed_prefetch_max_yield():
    pool = SampleTaskPool()
    futs = [FakeFuture(i) for i in range(5)]
    for i, f in enumerate(futs):
        pool.add(f"w{i}", f)
    for i in (3, 0, 4, 1):
        futs[i].finish(float([3, 0, 4, 1].index(i)))
    got = list(pool.completed_prefetch(max_yield=2))
    assert got == [("w3", 3), ("w0", 0)]
    # The other two done ones are prefetched, not in flight, and their result is not fetched.
    assert pool.num_prefetched == 2 and len(pool) == 1
    assert pool.prefetched_counts() == {"w4": 1, "w1": 1}
    assert pool.in_flight_counts() == {"w2": 1}
    assert futs[4].result_calls == 0 and futs[1].result_calls == 0
    futs[2].finish(9.0)
    # Prefetched ones come first, then the newly done one.
    assert list(pool.completed_prefetch(max_yield=2)) == [("w4", 4), ("w1", 1)]
    assert list(pool.completed_prefetch()) == [("w2", 2)]
    assert pool.num_prefetched == 0 and len(pool) == 0


def test_completed_prefetch_max_yield_zero_only_fetches():
    pool = SampleTaskPool()
    f = FakeFuture("v")
    pool.add("w", f)
    f.finish(0.0)
    assert list(pool.completed_prefetch(max_yield=0)) == []
    assert pool.num_prefetched == 1 and len(pool) == 0
    assert list(pool.completed_prefetch()) == [("w", "v")]
    with pytest.raises(ValueError, match="max_yield=-1"):
        list(pool.completed_prefetch(max_yield=-1))


def test_early_break_leaves_the_rest_in_the_pool():
    pool = SampleTaskPool()
    futs = [FakeFuture(i) for i in range(3)]
    for i, f in enumerate(futs):
        pool.add("w", f)
        f.finish(float(i))
    gen = pool.completed()
    assert next(gen) == ("w", 0)
    gen.close()
    assert len(pool) == 2
    assert list(pool.completed()) == [("w", 1), ("w", 2)]


def test_result_error_propagates_and_pool_stays_consistent():
    pool = SampleTaskPool()
    good1 = FakeFuture("g1")
    bad = FakeFuture(error=RuntimeError("env exploded"))
    good2 = FakeFuture("g2")
    pool.add("a", good1)
    pool.add("b", bad)
    pool.add("c", good2)
    good1.finish(1.0)
    bad.finish(2.0)
    good2.finish(3.0)
    seen = []
    with pytest.raises(RuntimeError, match="env exploded"):
        for worker, result in pool.completed():
            seen.append((worker, result))
    assert seen == [("a", "g1")]
    # The failed request left the pool; the one after it is still there.
    assert pool.in_flight_counts() == {"c": 1}
    assert bad.result_calls == 1
    assert list(pool.completed()) == [("c", "g2")]


def test_prefetch_error_propagates_and_rest_stays_prefetched():
    pool = SampleTaskPool()
    bad = FakeFuture(error=ValueError("boom"))
    good = FakeFuture("ok")
    pool.add("b", bad)
    pool.add("g", good)
    bad.finish(1.0)
    good.finish(2.0)
    with pytest.raises(ValueError, match="boom"):
        list(pool.completed_prefetch())
    assert pool.num_prefetched == 1 and len(pool) == 0
    assert list(pool.completed_prefetch()) == [("g", "ok")]


def test_reset_workers_drops_dead_workers_everywhere():
    pool = SampleTaskPool()
    futs = {k: FakeFuture(k) for k in ("a1", "a2", "b1", "b2", "c1")}
    for k, f in futs.items():
        pool.add(k[0], f)
    futs["a1"].finish(1.0)
    futs["b1"].finish(2.0)
    futs["c1"].finish(3.0)
    assert list(pool.completed_prefetch(max_yield=0)) == []  # a1, b1, c1 prefetched
    dropped = pool.reset_workers(["a", "c"])
    assert sorted(f.value for _, f in dropped) == ["b1", "b2"]
    assert {w for w, _ in dropped} == {"b"}
    assert pool.in_flight_counts() == {"a": 1}
    assert pool.prefetched_counts() == {"a": 1, "c": 1}
    assert list(pool.completed_prefetch()) == [("a", "a1"), ("c", "c1")]
    futs["b2"].finish(4.0)
    futs["a2"].finish(5.0)
    assert list(pool.completed()) == [("a", "a2")]
    assert pool.reset_workers([]) == [] and len(pool) == 0


def test_reset_workers_while_generators_are_suspended():
    pool = SampleTaskPool()
    futs = [FakeFuture(i) for i in range(4)]
    for i, f in enumerate(futs):
        pool.add("dead" if i % 2 else "alive", f)
        f.finish(float(i))
    gen = pool.completed()
    assert next(gen) == ("alive", 0)
    pool.reset_workers(["alive"])
    assert list(gen) == [("alive", 2)]  # 1 and 3 belonged to the dead worker
    assert futs[1].result_calls == 0 and futs[3].result_calls == 0

    pool2 = SampleTaskPool()
    futs2 = [FakeFuture(i) for i in range(4)]
    for i, f in enumerate(futs2):
        pool2.add("dead" if i % 2 else "alive", f)
        f.finish(float(i))
    gen2 = pool2.completed_prefetch()
    assert next(gen2) == ("alive", 0)
    pool2.reset_workers(["alive"])
    assert list(gen2) == [("alive", 2)]


def test_blocking_wait_uses_blocking_timeout():
    seen = []

    def wait(futures, timeout):
        seen.append(timeout)
        return []

    pool = SampleTaskPool(wait_fn=wait, blocking_timeout=2.5)
    pool.add("w", FakeFuture())
    assert list(pool.completed(blocking_wait=True)) == []
    assert list(pool.completed()) == []
    assert list(pool.completed_prefetch(blocking_wait=True)) == []
    assert seen == [2.5, 0.0, 2.5]
    # A per-call timeout overrides blocking_timeout (None: no limit) only when blocking.
    list(pool.completed(blocking_wait=True, timeout=0.25))
    list(pool.completed_prefetch(blocking_wait=True, timeout=None))
    list(pool.completed_prefetch(timeout=7.0))
    assert seen == [2.5, 0.0, 2.5, 0.25, None, 0.0]


def test_prefetch_does_not_block_when_something_is_prefetched():
    seen = []

    def wait(futures, timeout):
        seen.append(timeout)
        return [f for f in futures if f.done()]

    pool = SampleTaskPool(wait_fn=wait)
    f1, f2 = FakeFuture(1), FakeFuture(2)
    pool.add("w", f1)
    pool.add("w", f2)
    f1.finish(0.0)
    assert list(pool.completed_prefetch(blocking_wait=True, max_yield=0)) == []
    assert list(pool.completed_prefetch(blocking_wait=True)) == [("w", 1)]
    assert seen == [10.0, 0.0]


def test_blocking_wait_with_poll_wait_and_a_thread():
    # The result comes from another thread, and only once the pool waits for it.
    fut = concurrent.futures.Future()
    waiting = threading.Event()

    def wait(futures, timeout):
        waiting.set()
        return poll_wait(futures, timeout)

    pool = SampleTaskPool(wait_fn=wait, blocking_timeout=None)
    pool.add("w", fut)
    answer = threading.Thread(target=lambda: waiting.wait(60) and fut.set_result("late"))
    answer.start()
    assert list(pool.completed(blocking_wait=True)) == [("w", "late")]
    answer.join()


class FakeTime:
    """A clock and a sleep on it: each sleep moves the clock on by its seconds (recorded)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.on_sleep = lambda: None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.on_sleep()


def test_poll_wait():
    a, b, c = FakeFuture(), FakeFuture(), FakeFuture()
    assert poll_wait([], None) == []
    t = FakeTime()
    assert poll_wait([a, b], 0.05, clock=t.clock, sleep=t.sleep) == []
    # A doubling backoff from 0.5 ms, the last sleep cut at the deadline: 0.05 s in all.
    assert t.sleeps == pytest.approx([0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.0185])
    assert t.now == pytest.approx(100.05)
    c.finish()
    a.finish()
    assert poll_wait([a, b, c], 0) == [a, c]
    # No timeout: it polls until one is done, its sleeps capped at max_sleep.
    t = FakeTime()
    t.on_sleep = lambda: len(t.sleeps) == 9 and b.finish()
    assert poll_wait([b], None, clock=t.clock, sleep=t.sleep, max_sleep=0.004) == [b]
    assert t.sleeps == [0.0005, 0.001, 0.002] + [0.004] * 6


def test_same_worker_many_requests_and_hashable_workers():
    pool = SampleTaskPool()
    w = ("host", 3)  # any hashable object is a worker
    futs = [FakeFuture(i) for i in range(3)]
    for f in futs:
        pool.add(w, f)
    assert pool.count(w) == 3
    futs[1].finish(0.5)
    assert list(pool.completed()) == [(w, 1)]
    assert pool.count(w) == 2


def test_owed_since_counts_from_the_later_of_the_request_and_the_last_answer():
    clock = [100.0]
    pool = SampleTaskPool(clock=lambda: clock[0])
    a1, a2, b1 = FakeFuture("a1"), FakeFuture("a2"), FakeFuture("b1")
    pool.add("a", a1)
    pool.add("a", a2)
    clock[0] = 101.0
    pool.add("b", b1)
    clock[0] = 110.0
    assert pool.owed_since() == {"a": 100.0, "b": 101.0}  # since the oldest request
    a1.finish(109.0)  # a answered its first request: from now on it owes the second
    assert pool.owed_since() == {"a": 110.0, "b": 101.0}
    clock[0] = 120.0
    assert list(pool.completed()) == [("a", "a1")]
    assert pool.owed_since() == {"a": 120.0, "b": 101.0}  # seen answering at the hand-out
    b1.finish(121.0)
    assert pool.owed_since() == {"a": 120.0}  # a done request is owed no more
    pool.reset_workers(["b"])  # a is dropped, and what the pool knew of it
    assert pool.owed_since() == {} and pool._last_answer == {"b": 120.0}
    assert len(pool._sent_at) == len(pool) == 1  # b1: done, not handed out yet
