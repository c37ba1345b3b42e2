"""LearnerThread on its own: by hand, in the background, on errors and on an empty queue."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from impala_lab.errors import LearnerError, NonFiniteLossError
from impala_lab.learner.learner_thread import LearnerThread


class Batch:
    def __init__(self, count: int, tag: int = 0) -> None:
        self.count = count
        self.tag = tag


class RecordingPolicy:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def learn_on_batch(self, batch: Batch) -> dict:
        self.seen.append(batch.tag)
        return {"total_loss": float(len(self.seen))}


def test_step_by_hand_uses_each_batch_num_sgd_iter_times():
    policy = RecordingPolicy()
    learner = LearnerThread(policy, minibatch_buffer_size=1, num_sgd_iter=2)
    for tag in (1, 2, 3):
        learner.inqueue.put(Batch(10, tag))
    while learner.step(block_timeout=0):
        pass
    # the ttl ramps 1, 2, 2: batch 1 once, then batches 2 and 3 twice each
    assert policy.seen == [1, 2, 2, 3, 3]
    counts = [learner.outqueue.get_nowait() for _ in range(learner.outqueue.qsize())]
    assert counts == [10] * 5
    assert learner.weights_updated and learner.last_train_metrics == {"total_loss": 5.0}
    assert learner.grad_timer.count == 5
    assert learner.learner_queue_stat.stats()["count"] == 5


def test_background_thread_trains_and_stops():
    policy = RecordingPolicy()
    learner = LearnerThread(policy)
    fifth_step = threading.Event()
    learner.on_train_step = lambda metrics: len(policy.seen) == 5 and fifth_step.set()
    learner.start()
    for tag in range(5):
        learner.inqueue.put(Batch(1, tag))
    assert fifth_step.wait(60)
    learner.stop(timeout=60)
    assert policy.seen == [0, 1, 2, 3, 4]
    assert not learner.is_alive()


def test_exception_is_kept_and_raised_in_the_driver_with_the_stage_named():
    class Broken:
        def learn_on_batch(self, batch):
            raise KeyError("missing_loss_input")

    learner = LearnerThread(Broken())
    learner.start()
    learner.inqueue.put(Batch(1))
    learner.join(60)
    assert not learner.is_alive()
    with pytest.raises(LearnerError) as info:
        learner.raise_if_failed()
    assert info.value.stage == "learner thread"
    assert "missing_loss_input" in str(info.value)
    assert "learn_on_batch" in info.value.remote_traceback


def test_non_finite_loss_error_is_passed_through_unchanged():
    class NaNPolicy:
        def learn_on_batch(self, batch):
            raise NonFiniteLossError("non-finite loss (total_loss=nan)")

    learner = LearnerThread(NaNPolicy())
    learner.start()
    learner.inqueue.put(Batch(1))
    learner.join(60)
    with pytest.raises(NonFiniteLossError, match="total_loss=nan"):
        learner.raise_if_failed()


def test_an_empty_queue_past_learner_queue_timeout_is_an_error_not_a_hang():
    learner = LearnerThread(RecordingPolicy(), learner_queue_timeout=0.3)
    learner.poll_interval = 0.05
    learner.start()
    learner.join(60)
    assert not learner.is_alive()
    with pytest.raises(LearnerError, match="learner_queue_timeout"):
        learner.raise_if_failed()


def test_num_sgd_iter_can_change_between_steps():
    policy = RecordingPolicy()
    learner = LearnerThread(policy, num_sgd_iter=1)
    learner.set_num_sgd_iter(3)
    for tag in (1, 2, 3):
        learner.inqueue.put(Batch(1, tag))
    while learner.step(block_timeout=0):
        pass
    assert policy.seen == [1, 2, 2, 3, 3, 3]
    with pytest.raises(ValueError, match="num_sgd_iter=0"):
        learner.set_num_sgd_iter(0)
    assert np.isfinite(learner.timers()["learner_grad_time_ms"].mean)


def test_the_runs_cleanup_waits_for_a_train_step_in_flight(monkeypatch):
    # A run's cleanup also runs at interpreter exit, and a learner thread still inside a
    # TensorFlow call then crashes the process: the cleanup waits until the step is over.
    from impala_lab.driver import lifetime

    monkeypatch.setattr(lifetime, "LEARNER_STOP_WAIT_S", 0.0)  # the first wait gives up at once

    class BlockedPolicy:
        """Its train step lasts until the backend has shut down."""

        def __init__(self) -> None:
            self.started, self.release = threading.Event(), threading.Event()

        def learn_on_batch(self, batch: Batch) -> dict:
            self.started.set()
            assert self.release.wait(60)
            return {}

    class Backend:
        step_in_flight_at_shutdown = None

        def shutdown(self) -> None:
            self.step_in_flight_at_shutdown = learner.is_alive() and learner.num_steps == 0
            policy.release.set()

    policy, backend = BlockedPolicy(), Backend()
    learner = LearnerThread(policy)
    learner.start()
    learner.inqueue.put(Batch(1))
    assert policy.started.wait(60)
    lifetime.cleanup(backend, learner)
    assert backend.step_in_flight_at_shutdown  # the first wait ended with the step going on
    assert not learner.is_alive()  # the last one waited for it
    assert learner.num_steps == 1
