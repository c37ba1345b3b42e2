"""Recurrent policies (use_lstm) through every stage: config, the numpy LSTM against Keras's,
the actors' state and its resets, state_in in batches (concat, slices, replay, the minibatch
ring, towers), the learner's unroll against the actors' forward, checkpoints, whole runs, and
the StatelessCartPole task.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.actor.layers import lstm_step
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.batch import SampleBatch, concat_samples
from impala_lab.driver.checkpoint import read_checkpoint
from impala_lab.driver.replay_mixer import ReplayMixer
from impala_lab.envs.stateless_cartpole import ENV_ID
from impala_lab.errors import ConfigError
from impala_lab.learner.minibatch_buffer import MinibatchBuffer
from impala_lab.model_spec import ModelSpec
from tests.envs import FixedLengthEnv

REPO = Path(__file__).resolve().parents[1]
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(3)
CELL = 8


def _random_weights(model: NumpyModel, seed: int, scale: float = 0.5) -> list[np.ndarray]:
    """Weights large enough that every gate and the state matter (initial ones barely do)."""
    rng = np.random.default_rng(seed)
    return [(scale * rng.standard_normal(s)).astype(np.float32) for s in model.weight_shapes()]


def _mixed_length_envs(lengths=(3, 5, 7, 4), truncate=(False, True, False, True)):
    """A factory whose successive envs end after the given lengths (some truncated)."""
    counter = itertools.count()

    def make() -> gym.Env:
        i = next(counter) % len(lengths)
        return FixedLengthEnv(length=lengths[i], obs_dim=4, n_actions=3, truncate=truncate[i])

    return make


def _recurrent_worker(seed: int = 0, num_envs: int = 4, T: int = 6) -> RolloutWorker:
    worker = RolloutWorker(_mixed_length_envs(), num_envs=num_envs, sample_batch_size=T, seed=seed,
                           model_spec=ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL))
    worker.set_weights(_random_weights(worker.model, seed + 1), version=0)
    return worker


# ---------------------------------------------------------------------- config
def test_config_defaults_are_rllibs_and_a_bad_cell_size_names_field_value_and_fix():
    c = ImpalaConfig()
    assert c.use_lstm is False and c.lstm_cell_size == 64
    with pytest.raises(ConfigError, match=r"lstm_cell_size=0 is invalid: it must be a positive "
                                          r"integer \(>= 1\)"):
        ImpalaConfig(use_lstm=True, lstm_cell_size=0)
    with pytest.raises(ConfigError, match=r"lstm_cell_size=2.5 has type float: it must be an "
                                          r"integer"):
        ImpalaConfig(lstm_cell_size=2.5)
    with pytest.raises(ConfigError, match=r"use_lstm='yes' has type str: it must be true or "
                                          r"false"):
        ImpalaConfig(use_lstm="yes")
    c = ImpalaConfig(use_lstm=True, lstm_cell_size=32)
    assert ImpalaConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c


# ---------------------------------------------------------------------- numpy LSTM vs Keras
def test_numpy_lstm_step_equals_keras_lstm_cell_over_a_sequence_with_resets():
    import keras

    rng = np.random.default_rng(0)
    F, N, T = 5, 3, 12
    cell = keras.layers.LSTMCell(CELL)
    cell.build((N, F))
    weights = [rng.standard_normal(w.shape).astype(np.float32) * 0.7 for w in cell.weights]
    cell.set_weights(weights)
    xs = rng.standard_normal((T, N, F)).astype(np.float32)
    resets = rng.random((T, N)) < 0.25
    np_state = np.zeros((N, 2, CELL), np.float32)
    h = np.zeros((N, CELL), np.float32)
    c = np.zeros((N, CELL), np.float32)
    for t in range(T):
        np_state[resets[t]] = 0.0
        h, c = np.where(resets[t][:, None], 0.0, h), np.where(resets[t][:, None], 0.0, c)
        out, (h, c) = cell(xs[t], [h, c])
        np_state = lstm_step(xs[t], np_state, *weights)
        np.testing.assert_allclose(np_state[:, 0], np.asarray(out), atol=1e-5)
        np.testing.assert_allclose(np_state[:, 1], np.asarray(c), atol=1e-5)
    assert resets.any() and np.abs(np_state).max() > 0.1  # the state and the resets mattered

    # And Keras's LSTM layer over a whole sequence (no resets), from a given state.
    layer = keras.layers.LSTM(CELL, return_state=True)
    init = rng.standard_normal((2, N, CELL)).astype(np.float32)
    out, h_last, c_last = layer(np.swapaxes(xs, 0, 1), initial_state=[init[0], init[1]])
    layer.set_weights(weights)
    out, h_last, c_last = layer(np.swapaxes(xs, 0, 1), initial_state=[init[0], init[1]])
    state = np.ascontiguousarray(np.swapaxes(init, 0, 1))
    for t in range(T):
        state = lstm_step(xs[t], state, *weights)
    np.testing.assert_allclose(state[:, 0], np.asarray(h_last), atol=1e-5)
    np.testing.assert_allclose(state[:, 1], np.asarray(c_last), atol=1e-5)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_numpy_model_step_equals_the_keras_model_step(kind):
    from impala_lab.learner.keras_model import build_keras_model

    obs_space = OBS if kind == "mlp" else gym.spaces.Box(0, 255, (20, 20, 2), np.uint8)
    numpy_model = NumpyModel(obs_space, ACT, ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL))
    keras_model = build_keras_model(obs_space, ACT,
                                    ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL), seed=0)
    assert [tuple(w.shape) for w in keras_model.weights] == numpy_model.weight_shapes()
    # The initial weights are the same too (the forget-gate bias is 1).
    for a, b in zip(keras_model.get_weights(), numpy_model.initial_weights(0), strict=True):
        np.testing.assert_array_equal(a, b)
    assert keras_model.get_weights()[-5][CELL: 2 * CELL].tolist() == [1.0] * CELL
    weights = _random_weights(numpy_model, 1, scale=0.3)
    numpy_model.set_weights(weights)
    keras_model.set_weights(weights)
    rng = np.random.default_rng(2)
    obs = (rng.integers(0, 256, (5, *obs_space.shape)).astype(np.uint8) if kind == "cnn"
           else rng.standard_normal((5, 4)).astype(np.float32))
    state = rng.standard_normal((5, 2, CELL)).astype(np.float32)
    logits, values, next_state = numpy_model.step(obs, state)
    k_logits, k_values, k_state = keras_model([obs, state])
    np.testing.assert_allclose(logits, np.asarray(k_logits), atol=1e-5)
    np.testing.assert_allclose(values, np.asarray(k_values), atol=1e-5)
    np.testing.assert_allclose(next_state, np.asarray(k_state), atol=1e-5)


def test_a_recurrent_numpy_model_refuses_a_stateless_call_and_a_wrong_state():
    model = NumpyModel(OBS, ACT, ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL))
    model.set_weights(model.initial_weights(0))
    obs = np.zeros((2, 4), np.float32)
    with pytest.raises(RuntimeError, match=r"this model is recurrent \(use_lstm=True\): call "
                                           r"step\(obs, state\)"):
        model(obs)
    with pytest.raises(RuntimeError, match=r"NumpyModel\.logits needs no state"):
        model.logits(obs)
    with pytest.raises(ValueError, match=r"state has shape \(2, 8\) .* need \[N, 2, C\] = "
                                         r"\[2, 2, 8\]"):
        model.step(obs, np.zeros((2, CELL), np.float32))
    assert model.initial_state(3).shape == (3, 2, CELL)


# ---------------------------------------------------------------------- actors
def test_the_actor_stores_the_start_state_and_resets_it_where_an_episode_ended():
    with _recurrent_worker() as worker:
        b1 = worker.sample()
        end_state = worker.state
        b2 = worker.sample()
    assert b1.state_in.shape == (4, 2, CELL) and b1.state_in.dtype == np.float32
    np.testing.assert_array_equal(b1.state_in, 0.0)  # every env starts an episode
    np.testing.assert_array_equal(b2.state_in, end_state)
    dones = b1.terminateds | b1.truncateds
    assert b1.terminateds.any() and b1.truncateds.any()
    # The numpy unroll with the resets reproduces the actor's logits and its end state.
    model = worker.model
    logits, _, state_out = model.unroll(b1.obs, b1.state_in, dones)
    np.testing.assert_array_equal(logits, b1.behaviour_logits)
    np.testing.assert_array_equal(state_out, b2.state_in)
    np.testing.assert_array_equal(b2.state_in[dones[-1]], 0.0)  # ended at the last step
    assert (np.abs(b2.state_in[~dones[-1]]).max(axis=(1, 2)) > 0).all()
    # Without the resets the logits differ after the first episode end.
    no_reset, _, _ = model.unroll(b1.obs, b1.state_in, np.zeros_like(dones))
    assert np.abs(no_reset - b1.behaviour_logits).max() > 1e-3


def test_truncation_values_read_the_state_after_the_final_step_before_its_reset():
    lengths, truncate = (3, 3), (True, True)
    worker = RolloutWorker(_mixed_length_envs(lengths, truncate), num_envs=2, sample_batch_size=4,
                           seed=0, model_spec=ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL))
    with worker:
        worker.set_weights(_random_weights(worker.model, 3), version=0)
        b = worker.sample()
    assert b.truncateds[2].all()
    model = worker.model
    state = b.state_in
    for t in range(3):
        _, _, state = model.step(b.obs[t], state)
    final_obs = np.array([[3, 0, a, 0] for a in b.actions[2]], np.float32)
    _, expected, _ = model.step(final_obs, state)
    np.testing.assert_allclose(b.truncation_values[2], expected, rtol=1e-6)
    np.testing.assert_array_equal(b.truncation_values[[0, 1, 3]], 0.0)


def test_a_feed_forward_worker_makes_batches_without_state_in():
    with RolloutWorker(_mixed_length_envs(), num_envs=2, sample_batch_size=3, seed=0) as worker:
        b = worker.sample()
        assert worker.state is None
    assert b.state_in is None and "state_in" not in b.to_dict()


# ---------------------------------------------------------------------- batches
@pytest.fixture(scope="module")
def batches() -> list[SampleBatch]:
    with _recurrent_worker(seed=5) as worker:
        return [worker.sample() for _ in range(3)]


def test_concat_slice_split_and_dict_round_trip_carry_state_in(batches):
    a, b, c = batches
    out = concat_samples([a, b, c])
    np.testing.assert_array_equal(out.state_in, np.concatenate([a.state_in, b.state_in,
                                                                c.state_in]))
    out.validate(check_values=True)
    part = out.slice_columns(4, 8)
    np.testing.assert_array_equal(part.state_in, b.state_in)
    halves = out.split_columns(3)
    np.testing.assert_array_equal(halves[2].state_in, c.state_in)
    assert out.nbytes == sum(v.nbytes for v in out.to_dict().values())
    assert "state_in=float32[12, 2, 8]" in repr(out)
    back = SampleBatch.from_dict(out.to_dict())
    np.testing.assert_array_equal(back.state_in, out.state_in)


def test_recurrent_and_feed_forward_batches_do_not_concat_and_a_bad_state_is_named(batches):
    a = batches[0]
    ff = SampleBatch(**{**a.to_dict(), "state_in": None})
    with pytest.raises(ValueError, match="batch 0 has 'state_in' but batch 1 has none; batches "
                                         "of a recurrent and a feed-forward policy"):
        concat_samples([a, ff])
    with pytest.raises(ValueError, match="batch 0 has no 'state_in' but batch 1 has"):
        concat_samples([ff, a])
    bad = SampleBatch(**{**a.to_dict(), "state_in": a.state_in[:, 0]})
    with pytest.raises(ValueError, match=r"'state_in' has shape \(4, 8\), expected \[B, 2, C\]"):
        bad.validate()
    bad = SampleBatch(**{**a.to_dict(), "state_in": a.state_in.astype(np.float64)})
    with pytest.raises(ValueError, match="'state_in' has dtype float64, expected float32"):
        bad.validate()


def test_the_replay_mixer_and_the_minibatch_ring_hand_on_state_in(batches):
    mixer = ReplayMixer(1.0, 4, train_batch_size=6, sample_batch_size=6, seed=0)
    out = list(mixer.mix((i, b) for i, b in enumerate(batches)))
    replays = [b for w, b in out if w is None]
    assert replays
    for r in replays:
        assert any(r is b for b in batches)
        np.testing.assert_array_equal(r.state_in, next(b for b in batches if b is r).state_in)
    inqueue: queue.Queue = queue.Queue()
    train_batches = [concat_samples(batches), concat_samples(batches[::-1])]
    for b in train_batches:
        inqueue.put(b)
    ring = MinibatchBuffer(inqueue, size=1, num_sgd_iter=2)
    served = [ring.get(block_timeout=5.0)[0] for _ in range(2)]  # the ttl ramps 1, 2
    assert [s is b for s, b in zip(served, train_batches, strict=True)] == [True, True]
    np.testing.assert_array_equal(served[0].state_in[4:8], batches[1].state_in)
    np.testing.assert_array_equal(served[1].state_in[0:4], batches[2].state_in)


# ---------------------------------------------------------------------- learner
def _policy(**overrides):
    from impala_lab.learner.vtrace_policy import VTracePolicy

    config = ImpalaConfig(model=(16,), use_lstm=True, lstm_cell_size=CELL, seed=0,
                          **overrides)
    return VTracePolicy(OBS, ACT, config)


def test_the_learner_unroll_equals_the_actors_forward_on_a_batch_with_resets(batches):
    import tensorflow as tf

    from impala_lab.learner.keras_model import lstm_unroll
    from impala_lab.learner.vtrace_policy import batch_to_tensors

    policy = _policy()
    with _recurrent_worker(seed=5) as worker:
        weights = worker.get_weights()[0]
    policy.set_weights(weights)
    batch = concat_samples(batches[:2])
    t = {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()}
    dones = batch.terminateds | batch.truncateds
    assert dones[1:-1].any()  # episode ends inside the unroll
    logits, values, bootstrap, state_out = lstm_unroll(
        policy.model, policy.trunk, t["obs"], t["state_in"],
        tf.constant(dones.astype(np.float32)), t["bootstrap_obs"])
    np.testing.assert_allclose(np.asarray(logits), batch.behaviour_logits, atol=1e-5)
    model = NumpyModel(OBS, ACT, ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL))
    model.set_weights(weights)
    np_logits, np_values, np_state = model.unroll(batch.obs, batch.state_in, dones)
    np.testing.assert_array_equal(np_logits, batch.behaviour_logits)
    np.testing.assert_allclose(np.asarray(values), np_values, atol=1e-5)
    # The state after the last step is the next unroll's state_in; the bootstrap value is
    # one more step from it on bootstrap_obs.
    next_state_in = np.concatenate([b.state_in for b in batches[1:3]])
    np.testing.assert_allclose(np.asarray(state_out), np_state, atol=1e-5)
    np.testing.assert_allclose(np_state[:4], batches[1].state_in, atol=1e-6)
    assert next_state_in.shape == np_state.shape
    _, np_bootstrap, _ = model.step(batch.bootstrap_obs, np_state)
    np.testing.assert_allclose(np.asarray(bootstrap), np_bootstrap, atol=1e-5)


def test_learn_on_batch_trains_a_recurrent_policy_and_its_loss_uses_state_in(batches):
    import tensorflow as tf

    from impala_lab.learner.vtrace_policy import batch_to_tensors

    policy = _policy(opt_type="rmsprop", lr=0.01)
    batch = concat_samples(batches)
    t = {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()}
    loss, _ = policy.loss_and_stats(t)
    zeroed = dict(t, state_in=tf.zeros_like(t["state_in"]))
    assert abs(float(policy.loss_and_stats(zeroed)[0]) - float(loss)) > 1e-4
    before = policy.get_weights()[0]
    stats = policy.learn_on_batch(batch)
    assert stats["policy_version"] == 1 and np.isfinite(stats["total_loss"])
    after = policy.get_weights()[0]
    lstm_kernel = len(after) - 7
    assert np.abs(after[lstm_kernel] - before[lstm_kernel]).max() > 0


# ---------------------------------------------------------------------- towers
TOWER_SCRIPT = r'''
import json
import numpy as np
from impala_lab.config import ImpalaConfig
from impala_lab.learner.multi_gpu_learner import MultiGPULearner, configure_learner_devices
cfg = ImpalaConfig(num_gpus=2, fake_gpus=True, num_envs_per_worker=4, sample_batch_size=6,
                   train_batch_size=48, model=[16], use_lstm=True, lstm_cell_size=8, seed=1,
                   opt_type="rmsprop", lr=0.01, num_data_loader_buffers=2)
configure_learner_devices(cfg)
import gymnasium as gym
import tensorflow as tf
from impala_lab.batch import concat_samples
from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors
from tests.test_recurrent import _recurrent_worker
with _recurrent_worker(seed=5) as worker:
    weights = worker.get_weights()[0]
    batch = concat_samples([worker.sample() for _ in range(2)])
spaces = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(3))
single, multi = VTracePolicy(*spaces, cfg), VTracePolicy(*spaces, cfg)
single.set_weights(weights)
multi.set_weights(weights)
learner = MultiGPULearner(multi, cfg)
parts = learner.stage_batch(batch)
with tf.device("/cpu:0"):
    g1, s1 = single.compute_gradients(batch_to_tensors(batch))
gn, sn = learner.compute_gradients(batch)
scale = max(float(np.abs(g).max()) for g in g1)
print(json.dumps({
    "devices": learner.devices,
    "part_states": [p["state_in"].shape.as_list() for p in parts],
    "part_state_equal": [bool(np.array_equal(np.asarray(p["state_in"]), s))
                         for p, s in zip(parts, np.split(batch.state_in, 2))],
    "grad_diff": max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(g1, gn)) / scale,
    "loss": [float(s1["total_loss"]), sn["total_loss"]],
}))
'''


def test_the_towers_split_state_in_along_b_and_their_gradient_equals_one_device():
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", TOWER_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == ["/cpu:0", "/cpu:1"]
    assert out["part_states"] == [[4, 2, 8], [4, 2, 8]]
    assert out["part_state_equal"] == [True, True]
    assert out["grad_diff"] < 1e-5
    assert out["loss"][0] == pytest.approx(out["loss"][1], rel=1e-5)


# ---------------------------------------------------------------------- runs
def _run_config(backend: str, **overrides) -> dict:
    return dict(env=ENV_ID, use_lstm=True, lstm_cell_size=CELL, model=(16,), backend=backend,
                num_workers=2, num_envs_per_worker=2, sample_batch_size=10,
                train_batch_size=40, seed=0, **overrides)


def test_an_inline_run_with_replay_and_sgd_passes_trains_and_checkpoints_round_trip(tmp_path):
    with Impala(**_run_config("inline", replay_proportion=0.5, replay_buffer_num_slots=8,
                              num_sgd_iter=2)) as run:
        for _ in range(30):
            run.step()
        stats = run.stats()
        assert stats["num_steps_replayed"] > 0
        assert run.policy.version > 0 and stats["learner"]["policy_version"] > 0
        path = run.save(tmp_path / "ckpt")
    state, weights, _ = read_checkpoint(path)
    spec = ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL)
    assert len(weights) == len(NumpyModel(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
                                          spec).weight_shapes())
    version = state["policy_version"]
    with Impala.restore(path, backend="inline") as restored:
        assert restored.config.use_lstm is True and restored.config.lstm_cell_size == CELL
        got, got_version = restored.policy.get_weights()  # no step yet: nothing trained
        assert got_version == version > 0
        for a, b in zip(weights, got, strict=True):
            np.testing.assert_array_equal(a, b)
        deadline = time.monotonic() + 60  # the restored learner traces its step first
        while restored.policy.version == version and time.monotonic() < deadline:
            restored.step()
        assert restored.policy.version > version


@pytest.mark.slow
def test_a_process_run_trains_on_stateless_cartpole():
    with Impala(**_run_config("process")) as run:
        run.train(stop={"num_steps_trained": 400}, max_seconds=120)
        assert run.policy.version > 0
        assert run.stats()["num_steps_trained"] >= 400


# ---------------------------------------------------------------------- the memory task
def test_stateless_cartpole_is_cartpole_without_the_velocities():
    import impala_lab  # noqa: F401  (registers the env)

    env, full = gym.make(ENV_ID), gym.make("CartPole-v1")
    assert env.observation_space.shape == (2,) and env.spec.max_episode_steps == 500
    obs, _ = env.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])
    for action in (0, 1, 1, 0, 1):
        obs, reward, term, trunc, _ = env.step(action)
        full_obs, full_reward, full_term, full_trunc, _ = full.step(action)
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])
        assert (reward, term, trunc) == (full_reward, full_term, full_trunc)
    assert obs.dtype == np.float32 and env.observation_space.contains(obs)


def test_the_cli_trains_a_recurrent_policy_on_stateless_cartpole(tmp_path):
    from impala_lab.cli.main import main

    code = main(["train", "--env", ENV_ID, "--use-lstm", "true", "--lstm-cell-size", "8",
                 "--backend", "inline", "--max-env-steps", "2000", "--quiet",
                 "--out", str(tmp_path / "run")])
    assert code == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["use_lstm"] is True and config["env"] == ENV_ID


def test_every_backend_builds_its_workers_recurrent_from_the_config():
    from impala_lab.actor import make_rollout_worker
    from impala_lab.backends import backend_class
    from impala_lab.backends.base import Backend

    config = ImpalaConfig(**_run_config("inline"))
    for name in ("inline", "process", "ray"):
        # No backend overrides the arguments its workers are built from (a Ray backend is
        # not started here: that would start Ray).
        assert backend_class(name).worker_kwargs is Backend.worker_kwargs, name
    kwargs = backend_class("inline")(config).worker_kwargs(1)
    assert kwargs["model_spec"] == ModelSpec((16,), use_lstm=True, lstm_cell_size=CELL)
    with make_rollout_worker(**kwargs) as worker:
        batch = worker.sample()
    assert type(worker) is RolloutWorker  # vector_env is off in this config
    assert batch.state_in.shape == (2, 2, CELL) and batch.obs.shape == (10, 2, 2)
