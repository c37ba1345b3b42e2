"""The learner port: the only way the driver loop reaches the learner.

The weights-updated flag has one owner (the learner sets it, the driver takes it: read and
clear in one step), and any object with the port's members can drive `DriverLoop.step`.
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from impala_lab.batch import SampleBatch, policy_lag
from impala_lab.driver.actors import Actors
from impala_lab.driver.driver_loop import DriverLoop
from impala_lab.driver.replay_mixer import ReplayMixer
from impala_lab.driver.run_stats import RunStats
from impala_lab.learner.learner_thread import LearnerThread
from impala_lab.learner.port import LearnerPort, UpdateFlag
from tests.waiting import wait_for

T = 2


class Batch:
    def __init__(self, count: int) -> None:
        self.count = count


class CountingPolicy:
    """Counts its updates, like VTracePolicy's version."""

    def __init__(self) -> None:
        self.version = 0

    def learn_on_batch(self, batch: Batch) -> dict:
        self.version += 1
        return {"total_loss": 1.0}

    def get_weights(self) -> tuple[list, int]:
        return [np.full(2, self.version, np.float32)], self.version


def test_the_flag_is_set_by_the_learner_thread_and_taken_once_by_the_driver():
    learner = LearnerThread(CountingPolicy(), learner_queue_size=8)
    assert isinstance(learner, LearnerPort)
    assert learner.take_weights_updated() is False and learner.drain_trained() == 0
    learner.start()
    try:
        for count in (10, 20, 30):
            assert learner.put_batch(Batch(count), timeout=1.0)
        wait_for(lambda: learner.num_steps == 3, "three updates")
        # Three updates, one take: the driver broadcasts once for all of them.
        assert learner.weights_updated  # a look does not take it
        assert learner.take_weights_updated() is True
        assert learner.take_weights_updated() is False
        assert not learner.weights_updated
        assert learner.drain_trained() == 60 and learner.drain_trained() == 0
        assert learner.get_weights()[1] == learner.weights_version == 3
        with pytest.raises(AttributeError):
            learner.weights_updated = False  # only a take clears it
        assert learner.put_batch(Batch(5), timeout=1.0)
        wait_for(lambda: learner.num_steps == 4, "the fourth update")
        assert learner.take_weights_updated() is True and learner.drain_trained() == 5
    finally:
        learner.stop()
    learner.raise_if_failed()


def test_an_update_landing_between_two_takes_is_never_lost():
    # The learner sets the flag after each update; the driver takes it in a loop and reads the
    # version whenever it gets True. The last update must always be seen: a read-then-clear
    # on a plain attribute could clear a set that landed between the two.
    flag, n = UpdateFlag(), 20_000
    state = {"version": 0, "done": False}

    def learner() -> None:
        for v in range(1, n + 1):
            state["version"] = v
            flag.set()
        state["done"] = True

    thread = threading.Thread(target=learner)
    seen, takes = 0, 0
    thread.start()
    while not state["done"]:
        if flag.take():
            takes += 1
            seen = state["version"]
    thread.join()
    if flag.take():
        takes += 1
        seen = state["version"]
    assert seen == n and 1 <= takes <= n
    assert flag.take() is False


class PutRecordingQueue(queue.Queue):
    """A ``queue.Queue`` that records how each put was asked to block: ``(block, timeout)``."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.puts: list[tuple[bool, float | None]] = []

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        self.puts.append((block, timeout))
        super().put(item, block, timeout)


def test_put_batch_says_when_the_queue_stayed_full():
    learner = LearnerThread(CountingPolicy(), learner_queue_size=1)
    learner.inqueue = PutRecordingQueue(maxsize=1)
    assert learner.put_batch(Batch(1), timeout=0.0) is True
    assert learner.put_batch(Batch(2), timeout=0.05) is False
    # It waited the 0.05 s for room (Queue.put's own timeout), then said so.
    assert learner.inqueue.puts == [(True, 0.0), (True, 0.05)]
    assert learner.inqueue.qsize() == 1 and learner.inqueue.queue[0].count == 1


# ---------------------------------------------------------------------- a fake drives the loop
class FakeLearnerPort:
    """A learner port that records what the driver asks and trains only when told to."""

    def __init__(self) -> None:
        self.batches: list[SampleBatch] = []
        self.version = 0
        self.trained = 0
        self.takes = 0
        self._flag = UpdateFlag()

    def put_batch(self, batch: SampleBatch, timeout: float) -> bool:
        self.batches.append(batch)
        return True

    def drain_trained(self) -> int:
        trained, self.trained = self.trained, 0
        return trained

    def take_weights_updated(self) -> bool:
        self.takes += 1
        return self._flag.take()

    @property
    def weights_version(self) -> int:
        return self.version

    def get_weights(self) -> tuple[list, int]:
        return [f"w{self.version}"], self.version

    def raise_if_failed(self) -> None:
        return None

    def is_alive(self) -> bool:
        return True

    def update(self, env_steps: int) -> None:
        self.version += 1
        self.trained += env_steps
        self._flag.set()


class FakeTasks:
    def __init__(self) -> None:
        self.next_turn: list = []
        self.requests: list[int] = []

    def completed_prefetch(self, blocking_wait: bool, timeout: float):
        done, self.next_turn = self.next_turn, []
        yield from done

    def add(self, worker, future) -> None:
        self.requests.append(worker.index)


def _batch(version: int) -> SampleBatch:
    B = 1
    return SampleBatch(
        obs=np.zeros((T, B, 1), np.float32), actions=np.zeros((T, B), np.int64),
        rewards=np.zeros((T, B), np.float32), terminateds=np.zeros((T, B), bool),
        truncateds=np.zeros((T, B), bool), truncation_values=np.zeros((T, B), np.float32),
        behaviour_logits=np.zeros((T, B, 2), np.float32), bootstrap_obs=np.zeros((B, 1)),
        policy_versions=np.full(B, version, np.int64),
        episode_returns=np.zeros(0, np.float64), episode_lengths=np.zeros(0, np.int64))


def test_a_learner_port_fake_drives_the_driver_loop_step():
    config = SimpleNamespace(train_batch_size=4, broadcast_interval=2, max_policy_lag=100,
                             max_sample_requests_in_flight_per_worker=1, learner_queue_size=4,
                             extra_policy_lag=0)
    learner, tasks = FakeLearnerPort(), FakeTasks()
    assert isinstance(learner, LearnerPort)
    sent = []
    workers = [SimpleNamespace(index=i, set_weights=sent.append, sample=lambda: None)
               for i in range(2)]
    supervisor = SimpleNamespace(workers=workers, start_workers=lambda: workers,
                                 sample_returned=lambda w: None)
    backend = SimpleNamespace(put_weights=lambda weights, version: (weights[0], version))
    run_stats = RunStats()
    loop = DriverLoop(config, ReplayMixer(0.0, 0, 4, T, seed=0), learner, run_stats,
                      actors=Actors(backend, tasks, supervisor))
    loop.start(*learner.get_weights())
    assert loop.weights_ref == ("w0", 0) and tasks.requests == [0, 1] and learner.takes == 0

    w0, w1 = workers
    tasks.next_turn = [(w0, _batch(0)), (w1, _batch(0))]
    assert loop.step(0.0) == (4, 0)
    assert len(learner.batches) == 1 and learner.batches[0].B == 2
    # num_sent stayed below the interval: the flag was not even asked for
    assert learner.takes == 0 and run_stats.num_broadcasts == 1 and loop.num_sent == 2

    learner.update(4)
    tasks.next_turn = [(w0, _batch(0))]
    assert loop.step(0.0) == (2, 4)
    assert learner.takes == 1 and run_stats.num_broadcasts == 2
    assert loop.weights_ref == ("w1", 1) and sent[-1] == ("w1", 1) and loop.num_sent == 1
    assert run_stats.policy_lag.stats()["max"] == 1.0  # measured against weights_version 1

    learner.update(4)  # the flag is set, but below the interval it is left for later
    tasks.next_turn = [(w1, _batch(1))]
    assert loop.step(0.0) == (2, 4)
    assert learner.takes == 1 and run_stats.num_broadcasts == 2 and len(learner.batches) == 2
    assert sent[-1] == ("w1", 1)
    tasks.next_turn = [(w0, _batch(1))]
    assert loop.step(0.0) == (2, 0)
    assert learner.takes == 2 and run_stats.num_broadcasts == 3 and sent[-1] == ("w2", 2)
    tasks.next_turn = [(w1, _batch(2))]
    loop.step(0.0)
    assert learner.takes == 2 and loop.num_sent == 2
    tasks.next_turn = [(w0, _batch(2))]
    loop.step(0.0)  # the interval is reached, but no update since the last take
    assert learner.takes == 3 and run_stats.num_broadcasts == 3 and loop.num_sent == 3


def test_policy_lag_is_one_function_of_the_version_and_each_column():
    lag = policy_lag(7, np.array([7, 5, 3], np.int64))
    assert lag.tolist() == [0, 2, 4] and lag.dtype == np.int64
    stats = RunStats()
    stats.record_sample(_batch(3), policy_version=7)
    assert stats.largest_policy_lag == 4 and list(stats.arrival_lags) == [4]
