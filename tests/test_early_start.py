"""The workers start before the learner: they sample with the learner's version-0 weights,
computed in numpy, while TensorFlow loads.

That is only on-policy if those weights are the learner's, bit for bit, for every kind of
model; and starting processes before TensorFlow loads must not leave them behind when the
learner cannot be built.
"""

from __future__ import annotations

import functools
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import impala_lab.driver.impala as impala_module
from impala_lab import Impala, ImpalaConfig
from impala_lab.driver import warm_start
from impala_lab.driver.build import initial_weights
from impala_lab.errors import WorkerError
from impala_lab.learner.vtrace_policy import VTracePolicy
from tests.envs import WrongObsEnv
from tests.leaks import no_leaks, wait_gone

# Every env returns a (1, 4) observation from its 15th step: a worker's second sample of 10.
WRONG_AFTER_FIRST_SAMPLE = functools.partial(WrongObsEnv, kind="batched", at_step=15, length=5)
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
    real_start, real_build = Impala._start_workers_early, impala_module.build_learner

    def capture_run(self):
        seen["run"] = self
        return real_start(self)

    def build_once_a_worker_has_answered(config, backend, *spaces):
        tasks = seen["run"].supervisor.tasks
        seen["workers_asked"] = len(tasks.in_flight_counts())
        # A worker that owes nothing has answered every request it was sent: it sampled
        # before any learner existed.
        seen["answered_first"] = _wait(lambda: len(tasks.owed_since()) < seen["workers_asked"])
        return real_build(config, backend, *spaces)

    monkeypatch.setattr(Impala, "_start_workers_early", capture_run)
    monkeypatch.setattr(impala_module, "build_learner", build_once_a_worker_has_answered)
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        assert seen == {"run": run, "workers_asked": 2, "answered_first": True}
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
    real_start = Impala._start_workers_early

    def start_and_note_pids(self):
        weights = real_start(self)
        seen["pids"] = self.backend.worker_pids()
        return weights

    def fail(self, *args, **kwargs):
        raise error("TensorFlow failed to load")

    monkeypatch.setattr(Impala, "_start_workers_early", start_and_note_pids)
    monkeypatch.setattr(VTracePolicy, "__init__", fail)
    with pytest.raises(error, match="TensorFlow failed to load"):
        Impala(ImpalaConfig(**SMALL))
    assert len(seen["pids"]) == 2
    assert wait_gone(seen["pids"]) == []



# ---------------------------------------------------------------------- the warm start
def test_the_driver_queues_samples_while_the_learner_is_built_and_it_trains_them(monkeypatch):
    real_make = warm_start.make_learner
    seen: dict = {}

    def make_once_the_queue_is_full(config, *spaces, inqueue):
        seen["queue_filled"] = _wait(inqueue.full)
        seen["queued"] = [b.policy_versions.copy() for b in list(inqueue.queue)]
        return real_make(config, *spaces, inqueue=inqueue)

    monkeypatch.setattr(warm_start, "make_learner", make_once_the_queue_is_full)
    with Impala(ImpalaConfig(**SMALL, learner_queue_size=3)) as run:
        sampled_at_build = run.num_steps_sampled
        assert seen["queue_filled"] and len(seen["queued"]) == 3
        # every queued batch was sampled with the numpy weights the learner starts from
        assert all((v == 0).all() for v in seen["queued"])
        assert sampled_at_build >= 3 * 40
        assert run.loop.learner is run.learner and run.learner.is_alive()
        assert _wait(lambda: run.learner.num_steps >= 3)
        run.train(max_env_steps=sampled_at_build + 400)
        assert run.num_steps_trained > 0 and run.policy.version >= 3
        startup = run.stats()["startup"]  # the learner's steps reach the driver in train()
        assert 0 < startup["first_sample_s"] < startup["first_train_s"]


def test_no_warm_start_for_inline_workers_a_hand_stepped_learner_or_many_gpus():
    base = ImpalaConfig(**SMALL)
    assert warm_start.warm_start_applies(base, start_learner=True)
    assert not warm_start.warm_start_applies(base, start_learner=False)
    assert not warm_start.warm_start_applies(base.replace(backend="inline"), True)
    assert not warm_start.warm_start_applies(base.replace(num_gpus=2, fake_gpus=True), True)


def test_an_error_in_the_driver_while_the_learner_builds_never_starts_the_learner(monkeypatch):
    # The driver fails (a worker error, a Ctrl-C) while TensorFlow loads: the workers are shut
    # down, the error is raised, and the learner built afterwards is never started.
    seen: dict = {}
    real_start, real_make = Impala._start_workers_early, warm_start.make_learner

    def start_and_fail_the_next_step(self):
        weights = real_start(self)
        seen["pids"] = self.backend.worker_pids()

        def step(timeout):
            raise KeyboardInterrupt("Ctrl-C while TensorFlow loads")

        self.loop.step = step
        return weights

    def make_and_note(config, *spaces, inqueue):
        policy, learner = real_make(config, *spaces, inqueue=inqueue)
        seen["learner"] = learner
        return policy, learner

    monkeypatch.setattr(Impala, "_start_workers_early", start_and_fail_the_next_step)
    monkeypatch.setattr(warm_start, "make_learner", make_and_note)
    with pytest.raises(KeyboardInterrupt, match="Ctrl-C while TensorFlow loads"):
        Impala(ImpalaConfig(**SMALL))
    assert wait_gone(seen["pids"]) == []
    assert not [t for t in threading.enumerate() if t.name == "impala-warm-start"]
    assert seen["learner"].is_alive() is False and seen["learner"].num_steps == 0


def _sampling_thread_ended() -> bool:
    return not any(t.name == "impala-warm-start" for t in threading.enumerate())


@pytest.mark.parametrize("restart", [True, False])
def test_a_worker_that_fails_while_the_learner_builds_is_replaced_after_the_build(
        monkeypatch, restart):
    # Every worker's second sample fails. The sampling thread stops at the first failure (a
    # process started now would inherit the quiet import's stderr file); once the learner is
    # built the worker is replaced, or, with restarts off, the run ends with its error.
    real_make = warm_start.make_learner
    seen: dict = {}

    def make_once_sampling_stopped(config, *spaces, inqueue):
        seen["stopped"] = _wait(_sampling_thread_ended)
        seen["failures_before"] = run_ref["run"].supervisor.num_worker_failures
        return real_make(config, *spaces, inqueue=inqueue)

    run_ref: dict = {}
    real_start = Impala._start_workers_early

    def note_run(self):
        run_ref["run"] = self
        return real_start(self)

    monkeypatch.setattr(warm_start, "make_learner", make_once_sampling_stopped)
    monkeypatch.setattr(Impala, "_start_workers_early", note_run)
    cfg = ImpalaConfig(**{**SMALL, "env": WRONG_AFTER_FIRST_SAMPLE, "sample_batch_size": 10,
                          "learner_queue_size": 100, "restart_failed_workers": restart})
    if not restart:
        with no_leaks(), pytest.raises(WorkerError, match=r"observation of shape \(1, 4\)"):
            Impala(cfg)
        assert seen == {"stopped": True, "failures_before": 0}
        return
    with no_leaks(), Impala(cfg) as run:
        assert seen == {"stopped": True, "failures_before": 0}
        assert run.num_worker_failures == 1 and len(run.workers) == 2
        assert sorted(w.index for w in run.workers) != [0, 1]  # one of them is new
        assert run.learner.is_alive() and "replace_failed" not in vars(run.loop)
