"""`impala_lab.learner.graph_options`: the train step runs without Grappler for feed-forward
policies, only in the thread that calls it and only for that call, with the same result."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.config import ImpalaConfig

tf = pytest.importorskip("tensorflow")

from impala_lab.learner import graph_options  # noqa: E402
from impala_lab.learner.graph_options import GraphOptions, grappler_disabled_in_this_thread  # noqa: E402
from impala_lab.learner.vtrace_policy import VTracePolicy  # noqa: E402

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


@pytest.fixture(scope="module")
def batches():
    with RolloutWorker("CartPole-v1", num_envs=4, sample_batch_size=20, seed=3) as worker:
        return [worker.sample() for _ in range(3)]


def test_the_installed_tensorflow_has_the_call_options_it_needs():
    # If a TensorFlow release moves them, GraphOptions falls back to Grappler on: this test
    # says so instead of the first step silently getting slower.
    assert graph_options.available


def test_inside_grappler_is_off_for_this_thread_only_and_the_callers_options_come_back():
    from tensorflow.python.eager import context

    before = context.context().function_call_options
    off = GraphOptions(grappler=False)
    assert off.active and not grappler_disabled_in_this_thread()
    seen_by_other_thread = []
    with off:
        assert grappler_disabled_in_this_thread()
        other = threading.Thread(
            target=lambda: seen_by_other_thread.append(grappler_disabled_in_this_thread()))
        other.start()
        other.join()
    assert seen_by_other_thread == [False]
    assert not grappler_disabled_in_this_thread()
    assert context.context().function_call_options is before
    with pytest.raises(RuntimeError, match="inside"), off:
        raise RuntimeError("raised inside")
    assert context.context().function_call_options is before  # restored on an error too


def test_grappler_on_changes_nothing():
    on = GraphOptions(grappler=True)
    assert not on.active
    with on:
        assert not grappler_disabled_in_this_thread()


def test_feed_forward_policies_step_without_grappler_and_recurrent_ones_with_it():
    assert VTracePolicy(OBS, ACT, ImpalaConfig(seed=1))._graph_options.active
    lstm = VTracePolicy(OBS, ACT, ImpalaConfig(seed=1, use_lstm=True))
    assert not lstm._graph_options.active


def test_a_step_without_grappler_equals_one_with_it_and_leaves_the_caller_alone(batches):
    off = VTracePolicy(OBS, ACT, ImpalaConfig(seed=1))
    on = VTracePolicy(OBS, ACT, ImpalaConfig(seed=1))
    on._graph_options = GraphOptions(grappler=True)
    for batch in batches:
        stats_off, stats_on = off.learn_on_batch(batch), on.learn_on_batch(batch)
        assert not grappler_disabled_in_this_thread()
        for key in ("total_loss", "grad_gnorm"):
            assert stats_off[key] == pytest.approx(stats_on[key], rel=1e-5, abs=1e-6)
    for a, b in zip(off.get_weights()[0], on.get_weights()[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
