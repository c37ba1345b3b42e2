"""The diagonal Gaussian policy for Box actions, from the twins' math to a short training run.

The numpy side (`DiagGaussian`, the actors) and the TensorFlow side (`TFDiagGaussian`, the
loss) must compute the same log-probabilities, entropies and KLs; the numpy model and the Keras
model the same distribution inputs (free or state-dependent log-std, MLP, CNN and LSTM trunks);
the worker clips at the env but stores the unclipped draw; other action spaces are refused by
name; a NaN policy output is named; and Pendulum-v1 trains under every off-policy correction.
"""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.actor.distributions import DiagGaussian, pick_distribution
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.backends.inline import InlineWorkerHandle
from impala_lab.batch import SampleBatch, concat_samples
from impala_lab.errors import ConfigError, WorkerError
from impala_lab.model_spec import ModelSpec
from tests.envs import RecordingBoxEnv

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def _inputs(rng: np.random.Generator, n: int, d: int, low: float, high: float) -> np.ndarray:
    mean = rng.normal(0.0, 2.0, (n, d))
    log_std = rng.uniform(low, high, (n, d))
    return np.concatenate([mean, log_std], axis=1).astype(np.float32)


# ---------------------------------------------------------------------- the twins
@pytest.mark.parametrize("low, high", [(-3.0, 2.0), (-20.0, 10.0)])
def test_the_numpy_and_tf_twins_agree_on_logp_entropy_and_kl(low, high):
    import tensorflow as tf

    from impala_lab.learner.distributions import TFDiagGaussian, tf_distribution

    assert tf_distribution(ACT) is TFDiagGaussian and pick_distribution(ACT) is DiagGaussian
    rng = np.random.default_rng(0)
    p, q = _inputs(rng, 256, 3, low, high), _inputs(rng, 256, 3, low, high)
    actions = DiagGaussian.sample(p, rng)  # draws of p itself, and arbitrary points
    other = rng.normal(0.0, 3.0, actions.shape).astype(np.float32)
    for a in (actions, other):
        np.testing.assert_allclose(
            TFDiagGaussian.logp(tf.constant(p), tf.constant(a)).numpy(),
            DiagGaussian.logp(p, a), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(TFDiagGaussian.entropy(tf.constant(p)).numpy(),
                               DiagGaussian.entropy(p), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(TFDiagGaussian.kl(tf.constant(p), tf.constant(q)).numpy(),
                               DiagGaussian.kl(p, q), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(DiagGaussian.kl(p, p), 0.0, atol=1e-6)
    # time-major [T, B, 2D] inputs and [T, B, D] actions, as the loss feeds them
    tb = p.reshape(16, 16, 6)
    np.testing.assert_allclose(
        TFDiagGaussian.logp(tf.constant(tb), tf.constant(actions.reshape(16, 16, 3))).numpy(),
        DiagGaussian.logp(p, actions).reshape(16, 16), rtol=1e-5, atol=1e-5)


def test_samples_have_the_distributions_mean_and_std_and_logp_is_the_normal_density():
    rng = np.random.default_rng(1)
    mean, std = np.array([0.5, -1.0]), np.array([0.3, 2.0])
    inputs = np.tile(np.concatenate([mean, np.log(std)]).astype(np.float32), (200_000, 1))
    draws = DiagGaussian.sample(inputs, rng)
    assert draws.dtype == np.float32 and draws.shape == (200_000, 2)
    np.testing.assert_allclose(draws.mean(0), mean, atol=4 * std.max() / math.sqrt(2e5))
    np.testing.assert_allclose(draws.std(0), std, rtol=0.01)
    # the entropy is the mean of -log p over draws; logp is the product of normal densities
    np.testing.assert_allclose(-DiagGaussian.logp(inputs, draws).mean(),
                               DiagGaussian.entropy(inputs[:1])[0], rtol=0.01)
    a = np.array([[0.2, 0.0]], np.float32)
    z = (a[0] - mean) / std
    expected = float(np.sum(-0.5 * z**2 - np.log(std) - 0.5 * math.log(2 * math.pi)))
    assert DiagGaussian.logp(inputs[:1], a)[0] == pytest.approx(expected, rel=1e-6)
    np.testing.assert_array_equal(DiagGaussian.mode(inputs[:2]), np.tile(mean, (2, 1)))


# ---------------------------------------------------------------------- the models
@pytest.mark.parametrize("kind, free_log_std", [("mlp", True), ("mlp", False), ("cnn", True),
                                                ("lstm", True), ("lstm", False)])
def test_the_numpy_model_computes_the_keras_models_mean_and_log_std(kind, free_log_std):
    from impala_lab.learner.keras_model import build_keras_model

    obs_space = gym.spaces.Box(0, 255, (20, 20, 2), np.uint8) if kind == "cnn" else OBS
    spec = ModelSpec((16,), use_lstm=kind == "lstm", lstm_cell_size=8,
                     free_log_std=free_log_std)
    numpy_model = NumpyModel(obs_space, ACT, spec)
    keras_model = build_keras_model(obs_space, ACT, spec, seed=0)
    assert numpy_model.num_actions == 4 and numpy_model.free_log_std is free_log_std
    assert [tuple(w.shape) for w in keras_model.weights] == numpy_model.weight_shapes()
    for a, b in zip(keras_model.get_weights(), numpy_model.initial_weights(0), strict=True):
        np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(2)
    weights = [rng.normal(0, 0.3, s).astype(np.float32) for s in numpy_model.weight_shapes()]
    numpy_model.set_weights(weights)
    keras_model.set_weights(weights)
    obs = (rng.integers(0, 256, (5, *obs_space.shape)).astype(np.uint8) if kind == "cnn"
           else rng.standard_normal((5, 3)).astype(np.float32))
    if kind == "lstm":
        state = rng.standard_normal((5, 2, 8)).astype(np.float32)
        inputs, values, _ = numpy_model.step(obs, state)
        k_inputs, k_values, _ = keras_model([obs, state])
    else:
        inputs, values = numpy_model(obs)
        k_inputs, k_values = keras_model(obs)
        np.testing.assert_allclose(numpy_model.logits(obs), inputs, atol=1e-5)
    assert inputs.shape == (5, 4)
    np.testing.assert_allclose(inputs, np.asarray(k_inputs), atol=1e-5)
    np.testing.assert_allclose(values, np.asarray(k_values), atol=1e-5)
    if free_log_std:  # the same log-std for every state: the head's third weight
        np.testing.assert_array_equal(inputs[:, 2:], np.tile(weights[-3], (5, 1)))
    else:
        assert not np.allclose(inputs[:1, 2:], inputs[1:2, 2:])


@pytest.mark.parametrize("free_log_std", [True, False])
def test_log_std_init_is_the_first_policys_log_std_and_leaves_discrete_logits_alone(
        free_log_std):
    obs = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    model = NumpyModel(OBS, ACT, ModelSpec((16,), free_log_std=free_log_std, log_std_init=-1.5))
    model.set_weights(model.initial_weights(0))
    inputs, _ = model(obs)
    plain = NumpyModel(OBS, ACT, ModelSpec((16,), free_log_std=free_log_std))
    plain.set_weights(plain.initial_weights(0))
    # the same means; the log-stds moved by -1.5 (exactly, or through the head's bias)
    np.testing.assert_allclose(inputs, plain(obs)[0] + [0, 0, -1.5, -1.5], atol=1e-6)
    discrete = gym.spaces.Discrete(3)
    low = NumpyModel(OBS, discrete, ModelSpec((16,), log_std_init=-1.5)).initial_weights(0)
    for a, b in zip(low, NumpyModel(OBS, discrete, ModelSpec((16,))).initial_weights(0),
                    strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("value", [-5.01, 2.5])
def test_log_std_init_is_a_std_from_0_007_to_7_4(value: float) -> None:
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(log_std_init=value)
    assert str(info.value) == f"log_std_init={value!r} is invalid: it must be in [-5.0, 2.0]"
    assert ImpalaConfig(log_std_init=-5.0).model_spec.log_std_init == -5.0


# ---------------------------------------------------------------------- the actor
def _wide_worker(clip_actions: bool, log_std: float = math.log(5.0)) -> RolloutWorker:
    worker = RolloutWorker(RecordingBoxEnv, num_envs=2, sample_batch_size=20,
                           model_spec=ModelSpec((8,)), seed=0, clip_actions=clip_actions)
    weights = [w.copy() for w in worker.model.initial_weights(0)]
    weights[-3][:] = log_std  # the free log-std: std 5, far past the bound of 1
    worker.set_weights(weights, version=3)
    return worker


@pytest.mark.parametrize("clip_actions", [True, False])
def test_the_env_gets_clipped_actions_while_the_batch_keeps_the_draw(clip_actions):
    with _wide_worker(clip_actions) as worker:
        batch = worker.sample().validate(check_values=True)
        assert batch.actions.shape == (20, 2, 2) and batch.actions.dtype == np.float32
        assert batch.behaviour_logits.shape == (20, 2, 4)
        assert (np.abs(batch.actions[..., 0]) > 1).any()  # the stored draw is unclipped
        for b, env in enumerate(worker._envs):
            got = np.stack(env.actions)  # [20, 1, 2], the env's shape
            assert got.shape == (20, 1, 2) and got.dtype == np.float32
            drawn = batch.actions[:, b]
            want = np.stack([np.clip(drawn[:, 0], -1, 1), drawn[:, 1]], axis=1) if (
                clip_actions) else drawn
            np.testing.assert_array_equal(got[:, 0], want)
        # the loss's log-probabilities are of the draw: finite, from the stored inputs
        assert np.isfinite(DiagGaussian.logp(batch.behaviour_logits, batch.actions)).all()
        # batches of Box actions concatenate, slice and round-trip like any other
        both = concat_samples([batch, batch])
        assert both.actions.shape == (20, 4, 2)
        assert both.slice_columns(1, 3).actions.shape == (20, 2, 2)
        again = SampleBatch.from_dict(both.to_dict())
        np.testing.assert_array_equal(again.actions, both.actions)


def test_a_batch_refuses_box_actions_of_the_wrong_dtype():
    with _wide_worker(True) as worker:
        batch = worker.sample()
    batch.actions = batch.actions.astype(np.float64)
    with pytest.raises(ValueError, match=r"'actions' has dtype float64, expected float32"):
        batch.validate()


@pytest.mark.parametrize("where, part", [("log_std", r"log_std\[0\] is nan"),
                                         ("mean", r"mean\[0\] is nan")])
def test_a_nan_policy_output_is_a_worker_error_naming_it(where, part):
    with _wide_worker(True) as worker:
        weights = [w.copy() for w in worker.get_weights()[0]]
        weights[-3 if where == "log_std" else -4][0] = np.nan
        worker.set_weights(weights, version=7)
        with pytest.raises(WorkerError, match=part) as info:
            InlineWorkerHandle(0, worker).sample().result()
    assert "weights version 7" in str(info.value)


@pytest.mark.parametrize("space, shown", [
    (gym.spaces.MultiDiscrete([2, 3]), "MultiDiscrete([2 3])"),
    (gym.spaces.MultiBinary(4), "MultiBinary(4)"),
    (gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(3)]),
     "Tuple(Discrete(2), Discrete(3))"),
    (gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), "Dict('a': Discrete(2))"),
])
def test_other_action_spaces_are_a_config_error_naming_the_space(space, shown):
    with pytest.raises(ConfigError) as info:
        pick_distribution(space)
    assert f"action space {shown} is not supported" in str(info.value)
    assert "Discrete, Box" in str(info.value)


def test_a_run_with_a_multidiscrete_env_stops_before_anything_starts():
    class MultiDiscreteEnv(RecordingBoxEnv):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = gym.spaces.MultiDiscrete([2, 3])

    with pytest.raises(ConfigError, match=r"action space MultiDiscrete\(\[2 3\]\) is not "):
        Impala(ImpalaConfig(env=MultiDiscreteEnv, backend="inline", num_workers=1))


# ---------------------------------------------------------------------- training
def _train(steps: int, **overrides) -> dict:
    config = dict(env="Pendulum-v1", backend="inline", num_workers=1, num_envs_per_worker=4,
                  sample_batch_size=25, train_batch_size=200, model=(32, 32), lr=0.001,
                  entropy_coeff=0.0, gamma=0.95, seed=0, **overrides)
    # The deadline only guards against a hang: on a loaded machine the learner's first
    # traces alone can take tens of seconds, so the loop waits for work, not for a time.
    deadline = time.monotonic() + 600
    with Impala(ImpalaConfig(**config)) as run:
        # The learner's reported stats, not policy.version: the version moves before the
        # thread publishes the step's stats, which the tests then read.
        while run.num_steps_sampled < steps or (
                run.stats().get("learner") or {}).get("policy_version", 0) < 2:
            assert time.monotonic() < deadline, (
                f"no second policy version after {run.num_steps_sampled} env steps")
            run.step()
        return run.stats()


@pytest.mark.parametrize("correction", ["vtrace", "is1", "epsilon", "none"])
def test_pendulum_trains_under_every_correction(correction):
    stats = _train(2000, off_policy_correction=correction)
    learner = stats["learner"]
    assert learner["policy_version"] >= 2
    for key in ("total_loss", "policy_loss", "vf_loss", "entropy", "action_mean",
                "action_std"):
        assert math.isfinite(learner[key]), (key, learner)
    assert learner["action_std"] > 0


def test_pendulum_trains_a_recurrent_gaussian_policy():
    stats = _train(1000, use_lstm=True, lstm_cell_size=16, free_log_std=False)
    assert stats["learner"]["policy_version"] >= 2
    assert math.isfinite(stats["learner"]["total_loss"])
