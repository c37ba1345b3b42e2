"""Observation normalisation and reward scaling (`normalize_obs`, `reward_scale`).

The statistics are exact (Chan's merge equals numpy on the whole data, whatever the split),
the numpy and Keras models normalise alike, the learner counts each train batch once however
often it trains on it, the statistics reach the actors with the weights and survive a
checkpoint, an image env is refused by name, and ``reward_scale`` scales the env rewards in
the loss and nothing else.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.batch import SampleBatch
from impala_lab.errors import ConfigError
from impala_lab.learner.obs_normalizer import merge_moments
from impala_lab.model_spec import OBS_NORM_CLIP, ModelSpec

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
DISCRETE = gym.spaces.Discrete(2)


@pytest.mark.parametrize("sizes", [(1, 1), (7, 300, 2), (1000,), (5, 0, 5)])
def test_merging_batch_moments_equals_the_moments_of_all_the_data(sizes):
    rng = np.random.default_rng(sum(sizes))
    data = rng.normal([1e3, -2.0, 0.0], [1.0, 50.0, 1e-3], (sum(sizes), 3))
    mean, var, count = np.zeros(3), np.ones(3), 0.0
    start = 0
    for size in sizes:
        mean, var, count = merge_moments(mean, var, count, data[start: start + size])
        start += size
    assert count == len(data)
    np.testing.assert_allclose(mean, data.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, data.var(axis=0), rtol=1e-9, atol=1e-15)


def _obs(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.normal([5.0, -3.0, 0.0], [10.0, 0.1, 1.0], (n, 3)).astype(np.float32)


@pytest.mark.parametrize("spec", [ModelSpec(normalize_obs=True),
                                  ModelSpec(normalize_obs=True, vf_share_layers=True),
                                  ModelSpec(normalize_obs=True, hiddens=())],
                         ids=["two-trunks", "one-trunk", "no-hidden"])
@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_the_numpy_and_keras_models_normalise_alike(spec, action_space):
    from impala_lab.learner.keras_model import build_keras_model, keras_forward
    from impala_lab.learner.obs_normalizer import update_obs_statistics

    rng = np.random.default_rng(3)
    keras_model = build_keras_model(OBS, action_space, spec, seed=5)
    names = [w.path for w in keras_model.weights[:3]]
    assert names == ["obs_filter/mean", "obs_filter/var", "obs_filter/count"]
    update_obs_statistics(keras_model, _obs(rng, 400))
    numpy_model = NumpyModel(OBS, action_space, spec)
    numpy_model.set_weights(keras_model.get_weights())
    obs = _obs(rng, 64)
    obs[0, 1] = 1e4  # 1e5 standard deviations away: clipped to +OBS_NORM_CLIP on both sides
    logits_k, values_k = keras_forward(keras_model, obs)
    logits_n, values_n = numpy_model(obs)
    np.testing.assert_allclose(logits_n, logits_k, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values_n, values_k, rtol=1e-5, atol=1e-5)
    assert np.abs(numpy_model._input(obs)).max() == pytest.approx(OBS_NORM_CLIP)


def test_a_fresh_filter_is_the_identity_and_leaves_the_other_weights_as_they_were():
    plain, normed = NumpyModel(OBS, BOX), NumpyModel(OBS, BOX, ModelSpec(normalize_obs=True))
    weights = normed.initial_weights(seed=9)
    mean, var, count = weights[:3]
    np.testing.assert_array_equal(mean, 0.0)
    np.testing.assert_array_equal(var, 1.0)
    np.testing.assert_array_equal(count, [0.0])
    for a, b in zip(weights[3:], plain.initial_weights(seed=9), strict=True):
        np.testing.assert_array_equal(a, b)
    plain.set_weights(plain.initial_weights(seed=9))
    normed.set_weights(weights)
    obs = _obs(np.random.default_rng(0), 32).clip(-9.0, 9.0)
    for a, b in zip(normed(obs), plain(obs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_image_observations_are_refused_by_name():
    with pytest.raises(ValueError, match=r"normalize_obs=True needs vector observations"):
        NumpyModel(gym.spaces.Box(0, 255, (10, 10, 3), np.uint8), DISCRETE,
                   ModelSpec(normalize_obs=True))


def test_an_image_env_with_normalize_obs_stops_before_anything_starts():
    pytest.importorskip("minatar", reason="MinAtar is part of the dev install")
    with pytest.raises(ConfigError) as info:
        Impala(ImpalaConfig(env="MinAtar/Breakout-v1", normalize_obs=True, backend="inline",
                            num_workers=1))
    text = str(info.value)
    assert "normalize_obs=True is invalid for env='MinAtar/Breakout-v1'" in text
    assert "set normalize_obs=False" in text


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_reward_scale_that_cannot_work_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"reward_scale="):
        ImpalaConfig(reward_scale=value)


# ---------------------------------------------------------------------- the learner
def _batch(rng: np.random.Generator, T: int = 5, B: int = 4) -> SampleBatch:
    return SampleBatch(
        obs=_obs(rng, T * B).reshape(T, B, 3),
        actions=rng.normal(0.0, 1.0, (T, B, 1)).astype(np.float32),
        rewards=rng.normal(-5.0, 2.0, (T, B)).astype(np.float32),
        terminateds=np.zeros((T, B), bool),
        truncateds=np.eye(T, B, dtype=bool),
        truncation_values=rng.normal(0.0, 1.0, (T, B)).astype(np.float32),
        behaviour_logits=np.zeros((T, B, 2), np.float32),
        bootstrap_obs=_obs(rng, B),
        policy_versions=np.zeros(B, np.int64),
        episode_returns=np.zeros(0), episode_lengths=np.zeros(0, np.int64),
    )


def _policy(**overrides):
    from impala_lab.learner.vtrace_policy import VTracePolicy

    config = ImpalaConfig(env="Pendulum-v1", backend="inline", num_workers=1, seed=0,
                          **overrides)
    return VTracePolicy(OBS, BOX, config)


def test_the_learner_counts_each_train_batch_once_however_often_it_trains_on_it():
    from impala_lab.learner.learner_thread import LearnerThread

    rng = np.random.default_rng(1)
    policy = _policy(normalize_obs=True)
    batches = [_batch(rng) for _ in range(4)]
    # A ring of 2 slots, up to 3 passes each: batches come back in turns (a, b, a, b, ...)
    learner = LearnerThread(policy, minibatch_buffer_size=2, num_sgd_iter=3,
                            learner_queue_size=8, learner_queue_timeout=5.0)
    for batch in batches:
        learner.put_batch(batch, timeout=1.0)
    steps = 0
    while learner.step(block_timeout=0.5):
        steps += 1
    assert steps == policy.version >= 2 * len(batches)  # each batch trained on repeatedly
    mean, var, count = policy.model.get_weights()[:3]
    seen = np.concatenate([b.obs.reshape(-1, 3) for b in batches])
    assert count[0] == len(seen)
    np.testing.assert_allclose(mean, seen.mean(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(var, seen.var(axis=0), rtol=1e-4)
    # what the driver broadcasts carries them
    np.testing.assert_array_equal(policy.get_weights()[0][2], count)


def test_reward_scale_multiplies_the_env_rewards_and_not_the_truncation_values():
    import tensorflow as tf

    from impala_lab.learner.vtrace_policy import batch_to_tensors

    batch = _batch(np.random.default_rng(2))
    scaled = dict(batch_to_tensors(batch))
    scaled["rewards"] = scaled["rewards"] * np.float32(2.5)
    plain, scaling = _policy(reward_scale=1.0), _policy(reward_scale=2.5)
    scaling.model.set_weights(plain.model.get_weights())
    by_hand = plain.loss_and_stats({k: tf.constant(v) for k, v in scaled.items()})[1]
    by_config = scaling.loss_and_stats(
        {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()})[1]
    for key in ("total_loss", "policy_loss", "vf_loss"):
        np.testing.assert_allclose(float(by_config[key]), float(by_hand[key]), rtol=1e-6)
    unscaled = plain.loss_and_stats(
        {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()})[1]
    assert abs(float(unscaled["vf_loss"]) - float(by_config["vf_loss"])) > 1.0


# ---------------------------------------------------------------------- a run
def test_a_run_shares_its_statistics_with_the_actors_and_its_checkpoint(tmp_path):
    config = ImpalaConfig(env="Pendulum-v1", backend="inline", num_workers=1,
                          num_envs_per_worker=4, sample_batch_size=25, train_batch_size=200,
                          normalize_obs=True, reward_scale=0.01, seed=3)
    by_version = {}
    with Impala(config, start_learner=False) as run:
        worker = run.workers[0].worker
        while run.policy.version < 6 or worker.weights_version < 3:
            run.step()
            while run.learner.step(block_timeout=0.0):
                weights, version = run.policy.get_weights()
                by_version[version] = [w.copy() for w in weights[:3]]
        # the actor normalises with exactly the statistics of the weights it was sent
        for a, b in zip(worker.model.get_weights()[:3], by_version[worker.weights_version],
                        strict=True):
            np.testing.assert_array_equal(a, b)
        run.save(tmp_path / "ckpt")
        mean, var, count = run.policy.get_weights()[0][:3]
    assert count[0] >= 6 * 200 and np.all(var > 0)
    assert var[2] > 5 * max(var[0], var[1])  # angular velocity (+-8) against cos, sin (+-1)
    with Impala.restore(tmp_path / "ckpt", start_learner=False) as restored:
        for a, b in zip(restored.policy.get_weights()[0][:3], (mean, var, count), strict=True):
            np.testing.assert_array_equal(a, b)
        assert restored.config.normalize_obs and restored.config.reward_scale == 0.01
