"""The workers start before the learner: they sample with the learner's first weights, computed
in numpy, while TensorFlow loads.

That is only on-policy if those weights are the learner's, bit for bit, for every kind of
model; and starting processes before TensorFlow loads must not leave them behind when the
learner cannot be built.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

import impala_lab.driver.impala as impala_module
from impala_lab import Impala, ImpalaConfig
from impala_lab.driver.build import initial_weights
from impala_lab.learner.vtrace_policy import VTracePolicy
from tests.leaks import wait_gone

SMALL = dict(env="CartPole-v1", backend="process", num_workers=2, num_envs_per_worker=2,
             sample_batch_size=10, train_batch_size=40, seed=3)


@pytest.mark.parametrize("kind", ["mlp", "lstm", "gaussian_normalized", "cnn"])
def test_the_numpy_initial_weights_are_the_learners_version_0_weights(kind):
    env, fields = {
        "mlp": ("CartPole-v1", {}),
        "lstm": ("CartPole-v1", {"use_lstm": True, "lstm_cell_size": 16}),
        "gaussian_normalized": ("Pendulum-v1", {"normalize_obs": True}),
        "cnn": ("MinAtar/Breakout-v1", {"conv_net": "cnn"}),
    }[kind]
    config = ImpalaConfig(env=env, seed=11, **fields)
    probe = gym.make(env)
    spaces = (probe.observation_space, probe.action_space)
    probe.close()
    weights = initial_weights(config, *spaces)
    policy_weights, version = VTracePolicy(*spaces, config).get_weights()
    assert version == 0
    assert len(weights) == len(policy_weights)
    for ours, theirs in zip(weights, policy_weights, strict=True):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def _wait(predicate, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_workers_sample_while_the_learner_is_built(monkeypatch):
    seen: dict = {}
    real_make = impala_module.make_learner
    real_start = impala_module.DriverLoop.start

    def start_and_note(loop, *args):
        seen["loop"] = loop
        return real_start(loop, *args)

    def make_once_a_worker_has_answered(config, *spaces):
        tasks = seen["loop"].actors.tasks
        seen["workers_asked"] = len(tasks.in_flight_counts())
        # A worker that owes nothing has answered every request it was sent: it sampled
        # before any learner existed.
        seen["answered_first"] = _wait(lambda: len(tasks.owed_since()) < seen["workers_asked"])
        return real_make(config, *spaces)

    monkeypatch.setattr(impala_module.DriverLoop, "start", start_and_note)
    monkeypatch.setattr(impala_module, "make_learner", make_once_a_worker_has_answered)
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        assert seen == {"loop": run.loop, "workers_asked": 2, "answered_first": True}
        assert run.num_broadcasts == 1  # the numpy weights, published once
        assert run.policy.version == 0
        sampled, _ = run.step(timeout=10.0)
        assert sampled > 0
        # Tagged version 0, the learner's: no lag (the workers' own start is version -1).
        assert run.run_stats.largest_policy_lag == 0
        assert run.learner.step(block_timeout=10.0) is True
        assert run.policy.version == 1


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_learner_that_cannot_be_built_leaves_no_worker_behind(monkeypatch, error):
    seen: dict = {}
    real_start = impala_module.DriverLoop.start

    def start_and_note_pids(loop, *args):
        real_start(loop, *args)
        seen["pids"] = loop.actors.backend.worker_pids()

    def fail(self, *args, **kwargs):
        raise error("TensorFlow failed to load")

    monkeypatch.setattr(impala_module.DriverLoop, "start", start_and_note_pids)
    monkeypatch.setattr(VTracePolicy, "__init__", fail)
    with pytest.raises(error, match="TensorFlow failed to load"):
        Impala(ImpalaConfig(**SMALL))
    assert len(seen["pids"]) == 2
    assert wait_gone(seen["pids"]) == []
