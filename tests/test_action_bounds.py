"""How a Gaussian's draw meets a Box's bounds: clipped, or squashed by tanh
(``squash_actions``), the same way in the actors, evaluation and ``play``; and the penalty
that keeps the mean inside the bounds (``action_bound_coeff``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.actor.distributions import DiagGaussian, squash_to_bounds
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.errors import ConfigError
from impala_lab.model_spec import ModelSpec
from tests.envs import RecordingBoxEnv

LOW, HIGH = np.array([-2.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32)


def test_squashing_maps_every_real_into_the_bounds_centre_at_zero():
    draws = np.array([[0.0, 0.0], [50.0, -50.0], [0.5, -0.5]])
    got = squash_to_bounds(draws, LOW, HIGH)
    np.testing.assert_allclose(got[0], (LOW + HIGH) / 2)
    np.testing.assert_allclose(got[1], [HIGH[0], LOW[1]])
    np.testing.assert_allclose(got[2], LOW + (np.tanh([0.5, -0.5]) + 1) * (HIGH - LOW) / 2)
    wide = squash_to_bounds(np.random.default_rng(0).normal(0, 10, (1000, 2)), LOW, HIGH)
    assert (wide >= LOW).all() and (wide <= HIGH).all()


OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACTION_SPACE = gym.spaces.Box(LOW, HIGH, (2,), np.float32)


class BoundedEnv(RecordingBoxEnv):
    """`RecordingBoxEnv` (it records the actions it gets) with finite, unequal bounds."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = ACTION_SPACE


@pytest.mark.parametrize("squash", [True, False], ids=["squash", "clip"])
def test_the_env_gets_the_bounded_draw_and_the_batch_keeps_the_draw(squash):
    with RolloutWorker(BoundedEnv, num_envs=2, sample_batch_size=10,
                       model_spec=ModelSpec((8,)), seed=0, squash_actions=squash) as worker:
        weights = [w.copy() for w in worker.model.initial_weights(0)]
        weights[-3][:] = np.log(4.0)  # std 4: most draws land past the bounds
        worker.set_weights(weights, version=1)
        batch = worker.sample()
        assert (batch.actions > HIGH).any() and (batch.actions < LOW).any()
        for b, env in enumerate(worker._envs):
            drawn = batch.actions[:, b]
            want = squash_to_bounds(drawn, LOW, HIGH) if squash else np.clip(drawn, LOW, HIGH)
            np.testing.assert_allclose(np.stack(env.actions), want, rtol=1e-6, atol=1e-6)


def test_evaluation_bounds_actions_as_the_actors_do():
    from impala_lab.actor.numpy_model import NumpyModel
    from impala_lab.driver.evaluation import play_episodes

    model = NumpyModel(OBS_SPACE, ACTION_SPACE, ModelSpec((8,)))
    weights = model.initial_weights(1)
    weights[-4][:] = 5.0  # the mean's bias: far above both upper bounds
    model.set_weights(weights)
    for squash in (True, False):
        env = BoundedEnv()
        play_episodes(env, model, [0], greedy=True, rng=np.random.default_rng(0),
                      clip=True, squash=squash)
        mean = DiagGaussian.mode(model.logits(np.zeros((1, 2), np.float32)))[0]
        want = squash_to_bounds(mean, LOW, HIGH) if squash else np.clip(mean, LOW, HIGH)
        np.testing.assert_allclose(env.actions[0], want, rtol=1e-6)


def test_squashing_an_unbounded_space_is_a_config_error_before_anything_starts():
    class Unbounded(BoundedEnv):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    with pytest.raises(ConfigError) as info:
        Impala(ImpalaConfig(env=Unbounded, squash_actions=True, backend="inline",
                            num_workers=1))
    assert "squash_actions=True is invalid" in str(info.value)
    assert "infinite bounds" in str(info.value) and "squash_actions=False" in str(info.value)


@pytest.mark.parametrize("value", [-0.1, float("nan")])
def test_a_negative_bound_coefficient_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"action_bound_coeff="):
        ImpalaConfig(action_bound_coeff=value)


def test_action_bound_gives_the_range_the_env_can_tell_apart():
    from impala_lab.learner.vtrace_policy import action_bound

    assert action_bound(gym.spaces.Discrete(3), squash=False) is None
    assert action_bound(gym.spaces.Box(-np.inf, 1.0, (2,)), squash=False) is None
    center, half = action_bound(ACTION_SPACE, squash=False)
    np.testing.assert_allclose(center, [-0.5, 1.5])
    np.testing.assert_allclose(half, [1.5, 1.5])
    center, half = action_bound(ACTION_SPACE, squash=True)
    np.testing.assert_allclose(center, [0.0, 0.0])
    np.testing.assert_allclose(half, [2.0, 2.0])


@pytest.mark.parametrize("squash", [False, True], ids=["clip", "squash"])
def test_the_bound_penalty_is_the_squared_distance_of_the_means_past_the_bounds(squash):
    import tensorflow as tf

    from impala_lab.learner.keras_model import keras_forward
    from impala_lab.learner.vtrace_policy import VTracePolicy, action_bound, batch_to_tensors
    from tests.batches import make_batch

    space = ACTION_SPACE
    obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    batch = make_batch(T=5, B=4, obs_shape=(3,), seed=4)
    batch.actions = np.zeros((5, 4, 2), np.float32)
    batch.behaviour_logits = np.zeros((5, 4, 4), np.float32)
    policies = [VTracePolicy(obs_space, space, ImpalaConfig(
        env="Pendulum-v1", seed=0, action_bound_coeff=coeff, squash_actions=squash))
        for coeff in (0.0, 2.5)]
    weights = policies[0].model.get_weights()
    weights[-4][:] = [3.0, -4.0]  # mean biases past the upper bound of one, the lower of other
    for policy in policies:
        policy.model.set_weights(weights)
    tensors = {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()}
    (free_loss, free), (loss, stats) = (p.loss_and_stats(tensors) for p in policies)
    logits, _ = keras_forward(policies[0].model, batch.obs.reshape(20, 3))
    center, half = action_bound(space, squash)
    excess = np.maximum(np.abs((logits[:, :2] - center) / half) - 1.0, 0.0)
    want = np.square(excess).sum()
    assert want > 1.0
    np.testing.assert_allclose(float(stats["action_bound_loss"]) * 20, want, rtol=1e-5)
    np.testing.assert_allclose(float(free["action_bound_loss"]) * 20, want, rtol=1e-5)
    np.testing.assert_allclose(float(loss) - float(free_loss), 2.5 * want, rtol=1e-4)
