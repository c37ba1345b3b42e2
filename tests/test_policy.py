"""VTracePolicy: loss, one compiled step without retracing, weights, non-finite guard."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.batch import SampleBatch
from impala_lab.config import ImpalaConfig
from impala_lab.errors import NonFiniteLossError
from impala_lab.learner.vtrace_policy import STAT_KEYS, VTracePolicy
from impala_lab.model_spec import ModelSpec

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


@pytest.fixture(scope="module")
def cartpole_batch() -> SampleBatch:
    with RolloutWorker("CartPole-v1", num_envs=4, sample_batch_size=20, seed=3) as worker:
        return worker.sample()


def make_policy(**kw) -> VTracePolicy:
    return VTracePolicy(OBS, ACT, ImpalaConfig(seed=1, **kw))


def test_learn_on_batch_returns_every_stat_and_bumps_the_version(cartpole_batch):
    policy = make_policy()
    stats = policy.learn_on_batch(cartpole_batch)
    assert set(STAT_KEYS) | {"policy_version"} == set(stats)
    assert stats["policy_version"] == 1 == policy.version
    assert all(np.isfinite(v) for v in stats.values())
    # on the first step the behaviour and target policies are the same weights
    assert stats["mean_rho"] == pytest.approx(1.0, abs=1e-3)


def test_loss_falls_on_a_fixed_batch(cartpole_batch):
    # lr 0.002: at 0.005 sixty Adam steps on one batch make the policy so deterministic that
    # the V-trace targets (clipped importance weights) move faster than the value net follows.
    policy = make_policy(lr=0.002)
    first = policy.learn_on_batch(cartpole_batch)
    for _ in range(60):
        last = policy.learn_on_batch(cartpole_batch)
    assert last["vf_loss"] < 0.5 * first["vf_loss"]
    assert last["total_loss"] < first["total_loss"]


def test_no_retracing_for_batches_of_the_same_shape(cartpole_batch):
    policy = make_policy()
    for _ in range(3):
        policy.learn_on_batch(cartpole_batch)
    other = RolloutWorker("CartPole-v1", num_envs=4, sample_batch_size=20, seed=9).sample()
    policy.learn_on_batch(other)
    policy.set_lr(0.01)  # a live knob is a variable: no retrace either
    policy.set_entropy_coeff(0.0)
    policy.learn_on_batch(cartpole_batch)
    assert policy.num_traces == 1


def test_weights_round_trip_and_match_the_actors_numpy_forward(cartpole_batch):
    source = make_policy()
    source.learn_on_batch(cartpole_batch)
    weights, version = source.get_weights()
    assert version == 1 and all(isinstance(w, np.ndarray) for w in weights)
    target = VTracePolicy(OBS, ACT, ImpalaConfig(seed=99))
    target.set_weights(weights, version)
    assert target.version == 1
    for a, b in zip(target.get_weights()[0], weights):
        np.testing.assert_array_equal(a, b)
    obs = cartpole_batch.obs.reshape(-1, 4)
    keras_logits, keras_values = target.compute_logits_and_values(obs)
    actor = NumpyModel(OBS, ACT, ModelSpec((64, 64)))
    actor.set_weights(weights)
    np_logits, np_values = actor(obs)
    np.testing.assert_allclose(np_logits, keras_logits, atol=1e-5)
    np.testing.assert_allclose(np_values, keras_values, atol=1e-5)


def test_set_weights_rejects_wrong_shapes():
    policy = make_policy()
    weights, _ = policy.get_weights()
    with pytest.raises(ValueError, match="weights do not fit the model"):
        policy.set_weights(weights[:-1])


def test_rmsprop_uses_rllibs_settings():
    policy = make_policy(opt_type="rmsprop")
    opt = policy.optimizer
    assert type(opt).__name__ == "TF1RMSprop"  # TF1's semantics: see impala_lab.learner.optimizers
    assert opt.rho == pytest.approx(0.99) and opt.momentum == 0.0
    assert opt.epsilon == pytest.approx(0.1)


def test_non_finite_loss_stops_with_the_batch_statistics(cartpole_batch):
    policy = make_policy()
    before, _ = policy.get_weights()
    rewards = cartpole_batch.rewards.copy()
    rewards[3, 1] = np.nan
    bad = SampleBatch(**{**cartpole_batch.to_dict(), "rewards": rewards})
    with pytest.raises(NonFiniteLossError) as info:
        policy.learn_on_batch(bad)
    text = str(info.value)
    assert "non-finite loss" in text and "rewards:" in text and "non-finite 1" in text
    after, version = policy.get_weights()
    assert version == 0  # the update was not counted ...
    for a, b in zip(before, after):  # ... and not applied
        np.testing.assert_array_equal(a, b)


def _one_step_batch(terminated: bool, truncated: bool, truncation_value: float) -> SampleBatch:
    f32 = np.float32
    return SampleBatch(
        obs=np.zeros((1, 1, 4), f32), actions=np.zeros((1, 1), np.int64),
        rewards=np.ones((1, 1), f32), terminateds=np.array([[terminated]]),
        truncateds=np.array([[truncated]]),
        truncation_values=np.full((1, 1), truncation_value, f32),
        behaviour_logits=np.zeros((1, 1, 2), f32), bootstrap_obs=np.ones((1, 4), f32),
        policy_versions=np.zeros(1, np.int64), episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64))


@pytest.mark.parametrize("terminated, truncated, expected", [
    (True, False, "r"),          # termination: no bootstrap at all
    (False, True, "r+g*tv"),     # truncation: bootstrap from the final observation's value
    (False, False, "r+g*V(x1)"),  # mid-episode: bootstrap from the next observation
])
def test_episode_ends_set_the_value_target(terminated, truncated, expected):
    import tensorflow as tf

    from impala_lab.learner.vtrace_policy import batch_to_tensors

    policy = make_policy(gamma=0.9)
    batch = _one_step_batch(terminated, truncated, truncation_value=5.0)
    tensors = {k: tf.convert_to_tensor(v) for k, v in batch_to_tensors(batch).items()}
    _, stats = policy.loss_and_stats(tensors)
    _, values = policy.compute_logits_and_values(np.concatenate(
        [batch.obs[0], batch.bootstrap_obs]))
    v0, v1 = values
    target = {"r": 1.0, "r+g*tv": 1.0 + 0.9 * 5.0, "r+g*V(x1)": 1.0 + 0.9 * v1}[expected]
    # vf_loss = 0.5 * (vs - V(x0))^2 with vs = target on-policy (rho = 1)
    assert float(stats["vf_loss"]) == pytest.approx(0.5 * (target - v0) ** 2, rel=1e-4)


def test_get_weights_is_the_models_weights_bitwise_through_every_path(cartpole_batch):
    policy = make_policy()

    def same_as_model(weights: list[np.ndarray]) -> None:
        expected = policy.model.get_weights()
        assert [w.shape for w in weights] == [w.shape for w in expected]
        for a, b in zip(weights, expected, strict=True):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, b)

    weights, version = policy.get_weights()  # no step yet: the compiled read
    same_as_model(weights)
    assert version == 0
    for step in (1, 2):  # after a step: the flat copy the step left
        policy.learn_on_batch(cartpole_batch)
        weights, version = policy.get_weights()
        assert version == step
        same_as_model(weights)
    new = [w + 1.0 for w in weights]
    policy.set_weights(new, version=7)  # the step's copy is stale now
    weights, version = policy.get_weights()
    assert version == 7
    for a, b in zip(weights, new, strict=True):
        np.testing.assert_array_equal(a, b)


def _with_nan_reward(batch: SampleBatch) -> SampleBatch:
    rewards = batch.rewards.copy()
    rewards[3, 1] = np.nan
    return SampleBatch(**{**batch.to_dict(), "rewards": rewards})


def _learner_state(policy: VTracePolicy) -> list[bytes]:
    """The weights and every optimizer variable (slots, iterations, lr), as raw bytes."""
    return ([np.asarray(w).tobytes() for w in policy.model.get_weights()]
            + [np.asarray(v).tobytes() for v in policy.optimizer_state()])


@pytest.mark.parametrize("opt_type", ["adam", "rmsprop"])
def test_a_rejected_update_leaves_weights_and_optimizer_state_bitwise_unchanged(
        cartpole_batch, opt_type):
    # After a good step Adam's momentum is non-zero, so applying a zeroed gradient would
    # still move the weights; the rejected step must not run the optimizer at all.
    policy = make_policy(opt_type=opt_type)
    policy.learn_on_batch(cartpole_batch)
    before = _learner_state(policy)
    iterations = int(policy.optimizer.iterations.numpy())
    with pytest.raises(NonFiniteLossError):
        policy.learn_on_batch(_with_nan_reward(cartpole_batch))
    assert _learner_state(policy) == before
    assert int(policy.optimizer.iterations.numpy()) == iterations == 1
    assert policy.version == 1 and policy.num_updates_skipped == 1
    weights, version = policy.get_weights()  # what the actors would receive
    assert version == 1
    for a, b in zip(weights, policy.model.get_weights(), strict=True):
        assert a.tobytes() == b.tobytes()
    # training goes on from there, still with the one compiled step
    stats = policy.learn_on_batch(cartpole_batch)
    assert stats["policy_version"] == 2 and int(policy.optimizer.iterations.numpy()) == 2
    assert _learner_state(policy) != before
    assert policy.num_traces == 1


def test_the_loss_takes_its_entropy_from_the_action_distribution(cartpole_batch):
    import tensorflow as tf

    from impala_lab.actor.distributions import Categorical
    from impala_lab.learner.distributions import TFCategorical
    from impala_lab.learner.vtrace_policy import batch_to_tensors

    policy = make_policy()
    assert policy.distribution is TFCategorical
    tensors = {k: tf.convert_to_tensor(v) for k, v in batch_to_tensors(cartpole_batch).items()}
    _, stats = policy.loss_and_stats(tensors)
    logits, _ = policy.compute_logits_and_values(cartpole_batch.obs.reshape(-1, 4))
    # the stat is the mean entropy per env step; the numpy twin gives the same number
    assert float(stats["entropy"]) == pytest.approx(float(Categorical.entropy(logits).mean()),
                                                    abs=1e-6)
    assert 0.5 < float(stats["entropy"]) <= np.log(2.0)  # near-uniform first policy


def test_a_policy_for_an_action_space_without_a_distribution_is_refused():
    from impala_lab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"action space MultiDiscrete\(\[2 3\]\) is "
                                          r"not supported: impala_lab supports Discrete, Box"):
        VTracePolicy(OBS, gym.spaces.MultiDiscrete([2, 3]), ImpalaConfig(seed=1))
