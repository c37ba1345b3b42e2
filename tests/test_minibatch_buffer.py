"""Tests of impala_lab.learner.minibatch_buffer.MinibatchBuffer."""

from __future__ import annotations

import itertools
import queue
import threading

import pytest

from impala_lab.learner.minibatch_buffer import LearnerQueueTimeout, MinibatchBuffer

T, F = True, False


def reference_sequence(size: int, num_sgd_iter: int, n_gets: int) -> list[tuple[int, bool]]:
    """RLlib's algorithm, restated independently: items 0, 1, 2, ... arrive in order.

    Each slot keeps [item, passes_left]. A visit to an exhausted slot takes the next item
    and gives it min(number of items taken so far, num_sgd_iter) passes (the ramp).
    """
    slots = [[None, 0] for _ in range(size)]
    taken = 0
    out = []
    for k in range(n_gets):
        slot = slots[k % size]
        if slot[1] == 0:
            taken += 1
            slot[:] = [taken - 1, min(taken, num_sgd_iter)]
        slot[1] -= 1
        out.append((slot[0], slot[1] == 0))
    return out


def module_sequence(size: int, num_sgd_iter: int, n_gets: int) -> list[tuple[int, bool]]:
    q: queue.Queue = queue.Queue()
    for i in range(n_gets):
        q.put(i)
    buf = MinibatchBuffer(q, size, num_sgd_iter)
    return [buf.get() for _ in range(n_gets)]


@pytest.mark.parametrize("size, num_sgd_iter", list(itertools.product([1, 2, 3], [1, 2, 3, 4])))
def test_matches_reference(size, num_sgd_iter):
    n = 40
    assert module_sequence(size, num_sgd_iter, n) == reference_sequence(size, num_sgd_iter, n)


LITERAL = {
    (1, 1): [(0, T), (1, T), (2, T), (3, T)],
    (1, 2): [(0, T), (1, F), (1, T), (2, F), (2, T), (3, F)],
    (1, 3): [(0, T), (1, F), (1, T), (2, F), (2, F), (2, T), (3, F)],
    (2, 1): [(0, T), (1, T), (2, T), (3, T)],
    (2, 3): [(0, T), (1, F), (2, F), (1, T), (2, F), (3, F), (2, T), (3, F), (4, F), (3, T)],
    (3, 2): [(0, T), (1, F), (2, F), (3, F), (1, T), (2, T), (3, T), (4, F), (5, F), (6, F),
             (4, T)],
}


@pytest.mark.parametrize("key", sorted(LITERAL))
def test_literal_sequences(key):
    size, num_sgd_iter = key
    expected = LITERAL[key]
    assert module_sequence(size, num_sgd_iter, len(expected)) == expected
    assert reference_sequence(size, num_sgd_iter, len(expected)) == expected


def test_each_item_served_with_ramping_passes():
    size, num_sgd_iter = 3, 4
    seq = module_sequence(size, num_sgd_iter, 200)
    served: dict[int, int] = {}
    for item, _ in seq:
        served[item] = served.get(item, 0) + 1
    released = [item for item, r in seq if r]
    # Items released so far got their full ttl: 1, 2, 3, then num_sgd_iter each.
    for item in released:
        assert served[item] == min(item + 1, num_sgd_iter)
    assert len(released) == len(set(released))


def test_slots_view_and_ttl_ramp():
    q: queue.Queue = queue.Queue()
    for i in range(10):
        q.put(i)
    buf = MinibatchBuffer(q, 2, 3)
    assert buf.slots() == [(F, 0), (F, 0)] and buf.cur_max_ttl == 1 and buf.next_index == 0
    assert buf.get() == (0, T)
    assert buf.slots() == [(F, 0), (F, 0)] and buf.cur_max_ttl == 2 and buf.next_index == 1
    assert buf.get() == (1, F)
    assert buf.slots() == [(F, 0), (T, 1)] and buf.cur_max_ttl == 3 and buf.next_index == 0
    assert buf.get() == (2, F)
    assert buf.slots() == [(T, 2), (T, 1)] and buf.cur_max_ttl == 3
    assert buf.buffers == [2, 1]
    assert buf.get() == (1, T)
    assert buf.slots() == [(T, 2), (F, 0)] and buf.buffers == [2, None]
    assert buf.num_sgd_iter == 3 and buf.size == 2


def test_block_timeout_raises_empty_and_leaves_state_unchanged():
    q: queue.Queue = queue.Queue()
    buf = MinibatchBuffer(q, 2, 2)
    with pytest.raises(queue.Empty):
        buf.get(block_timeout=0)
    with pytest.raises(queue.Empty):
        buf.get(block_timeout=0.01)
    assert buf.slots() == [(F, 0), (F, 0)] and buf.cur_max_ttl == 1 and buf.next_index == 0
    q.put("a")
    assert buf.get(block_timeout=0) == ("a", T)
    # A slot that still holds an item never touches the queue.
    q.put("b")
    assert buf.get(block_timeout=0) == ("b", F)
    with pytest.raises(queue.Empty):
        buf.get(block_timeout=0)  # slot 0 is empty again and the queue is empty
    assert buf.next_index == 0 and buf.slots() == [(F, 0), (T, 1)]
    q.put("c")
    assert buf.get(block_timeout=0) == ("c", F)
    assert buf.get(block_timeout=0) == ("b", T)


class ArrivesWhileBlocked(queue.Queue):
    """A queue whose item arrives (from another thread) only while a get blocks without a
    timeout: a get that does not block, or gives up, finds it empty."""

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if block and timeout is None:
            threading.Thread(target=self.put, args=("late",)).start()
        return super().get(block, timeout)


def test_blocking_get_waits_for_an_item():
    buf = MinibatchBuffer(ArrivesWhileBlocked(), 1, 1)
    assert buf.get() == ("late", T)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ClockedQueue:
    """A ``queue.Queue`` on a fake clock: a get on the empty queue blocks for exactly the
    seconds asked (the clock moves on by them), then raises ``queue.Empty``, as
    ``Queue.get(timeout=...)`` does. ``waits`` lists the seconds each empty get blocked."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.items: list[object] = []
        self.waits: list[float] = []

    def put(self, item: object) -> None:
        self.items.append(item)

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if self.items:
            return self.items.pop(0)
        assert timeout is not None or not block, "a get that would block forever"
        waited = timeout if block else 0.0
        self.waits.append(waited)
        self.clock.now += waited
        raise queue.Empty


def clocked_buffer(timeout: float) -> tuple[MinibatchBuffer, ClockedQueue, FakeClock]:
    clock = FakeClock()
    q = ClockedQueue(clock)
    return MinibatchBuffer(q, 1, 1, timeout=timeout, clock=clock), q, clock


def test_learner_queue_timeout_without_block_timeout():
    buf, q, _ = clocked_buffer(timeout=0.1)
    with pytest.raises(LearnerQueueTimeout) as info:
        buf.get()
    assert q.waits == [0.1]  # one wait of the whole timeout, then the error
    err = info.value
    assert isinstance(err, TimeoutError) and not isinstance(err, queue.Empty)
    msg = str(err)
    assert "learner queue stayed empty for 0.1 s (learner_queue_timeout)" in msg
    assert "raise learner_queue_timeout or check the workers" in msg


def test_learner_queue_timeout_summed_over_short_calls():
    buf, q, clock = clocked_buffer(timeout=0.2)
    empties = 0
    with pytest.raises(LearnerQueueTimeout):
        while True:
            try:
                buf.get(block_timeout=0.03)
            except queue.Empty:
                empties += 1
    # 0.2 s of waiting in slices of 0.03 s: 6 Empty (0.18 s), then the last 0.02 s and the error.
    assert empties == 6
    assert q.waits == pytest.approx([0.03] * 6 + [0.02])
    assert clock.now == pytest.approx(0.2)
    # After the error the sum restarts: a short call is a plain Empty again.
    with pytest.raises(queue.Empty) as info:
        buf.get(block_timeout=0.01)
    assert not isinstance(info.value, LearnerQueueTimeout)


def test_item_arrival_resets_the_waited_time():
    buf, q, clock = clocked_buffer(timeout=0.5)
    for round_ in range(5):  # 0.6 s of waiting in all, over the limit but never in one go
        for _ in range(4):  # 0.12 s of waiting per round, well under the 0.5 s limit
            with pytest.raises(queue.Empty):
                buf.get(block_timeout=0.03)
        q.put(round_)
        assert buf.get(block_timeout=0.03) == (round_, T)
    assert clock.now == pytest.approx(0.6)


def test_time_outside_get_does_not_count():
    buf, _, clock = clocked_buffer(timeout=0.3)
    with pytest.raises(queue.Empty):
        buf.get(block_timeout=0.02)
    clock.now += 0.4  # e.g. a student pausing between step-through cells
    with pytest.raises(queue.Empty) as info:
        buf.get(block_timeout=0.02)
    assert not isinstance(info.value, LearnerQueueTimeout)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": 0, "num_sgd_iter": 1}, "size=0 is invalid.*minibatch_buffer_size >= 1"),
        ({"size": 1, "num_sgd_iter": 0}, "num_sgd_iter=0 is invalid.*num_sgd_iter >= 1"),
        ({"size": 1.5, "num_sgd_iter": 1}, "size=1.5 is invalid"),
        ({"size": 1, "num_sgd_iter": 1, "timeout": 0}, "timeout=0 is invalid"),
        ({"size": 1, "num_sgd_iter": 1, "timeout": -3.0}, "timeout=-3.0 is invalid"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MinibatchBuffer(queue.Queue(), **kwargs)


def test_block_timeout_validation():
    buf = MinibatchBuffer(queue.Queue(), 1, 1)
    with pytest.raises(ValueError, match="block_timeout=-1 is invalid"):
        buf.get(block_timeout=-1)


def test_concurrent_slots_reads_are_consistent():
    q: queue.Queue = queue.Queue()
    buf = MinibatchBuffer(q, 3, 4)
    stop = threading.Event()

    def learner():
        i = 0
        while not stop.is_set():
            if q.qsize() < 2:
                q.put(i)
                i += 1
            buf.get(block_timeout=0.01)

    t = threading.Thread(target=learner)
    t.start()
    try:
        for _ in range(2000):
            snap = buf.slots()
            assert len(snap) == 3
            assert all(occ == (ttl > 0) and 0 <= ttl < 4 for occ, ttl in snap)
    finally:
        stop.set()
        t.join()
