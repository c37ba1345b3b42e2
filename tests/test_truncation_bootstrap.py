"""Truncation bootstrapped by the learner's value (``truncation_bootstrap="learner"``): the
batch's ``final_obs`` (one row per truncated step, column by column) through every stage that
moves a batch, and the learner's own values of those observations in the loss, on envs with a
short time limit."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_lab import Impala, ImpalaConfig
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.batch import SampleBatch, concat_samples
from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors
from impala_lab.speed.compiled_policy import CompiledPolicy
from tests.envs import FixedLengthEnv, ImageEnv

REPO = Path(__file__).resolve().parents[1]
LENGTHS = (3, 4, 5, 7)  # env i of a worker: truncated every LENGTHS[i] steps
T = 12


class ShortLimits:
    """An env factory (picklable): each call makes the next of ``LENGTHS``, so the columns of
    a worker are truncated at different steps and different numbers of times."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> gym.Env:
        length = LENGTHS[self.calls % len(LENGTHS)]
        self.calls += 1
        return FixedLengthEnv(length=length, obs_dim=3, truncate=True)


def sample(use_lstm: bool = False, seed: int = 4, rounds: int = 1) -> tuple:
    cfg = ImpalaConfig(env=ShortLimits(), seed=seed, use_lstm=use_lstm, sample_batch_size=T,
                       num_envs_per_worker=4, truncation_bootstrap="learner", gamma=0.9)
    with RolloutWorker(ShortLimits(), len(LENGTHS), T, cfg.model_spec, seed=seed) as worker:
        batches = [worker.sample() for _ in range(rounds)]
        spaces = (worker.observation_space, worker.action_space)
    return cfg, spaces, batches


def tensors(batch: SampleBatch, final_obs: bool) -> dict:
    return {k: tf.constant(v) for k, v in batch_to_tensors(batch, final_obs).items()}


# ---------------------------------------------------------------------- the batch
def test_a_worker_keeps_each_truncated_episodes_final_observation_in_column_order():
    cfg, spaces, (batch,) = sample()
    batch.validate(check_values=True)
    # FixedLengthEnv's obs: [steps into the episode, episode index, last action]
    rows = [(length, episode) for length in LENGTHS for episode in range(T // length)]
    assert batch.truncateds.sum(axis=0).tolist() == [T // n for n in LENGTHS]
    assert [tuple(r) for r in batch.final_obs[:, :2].astype(int)] == rows
    # the actor's bootstrap values are of these very observations, in this order
    model = NumpyModel(*spaces, cfg.model_spec)
    model.set_weights(model.initial_weights(cfg.seed))
    np.testing.assert_allclose(model(batch.final_obs)[1], batch.truncation_values.T[
        batch.truncateds.T], rtol=1e-6)


def test_image_batches_keep_one_uint8_frame_per_truncated_episode():
    def env() -> gym.Env:
        return gym.wrappers.TimeLimit(ImageEnv(length=100), max_episode_steps=3)

    with RolloutWorker(env, num_envs=2, sample_batch_size=8, seed=1) as worker:
        batch = worker.sample()
    assert batch.final_obs.dtype == np.uint8
    assert batch.final_obs.shape == (4, 20, 20, 3)  # 2 truncations a column, not T frames
    assert (batch.final_obs[:, 0, 0, 0] == 3).all()  # step 3 of its episode: the final frame


def test_concat_slice_pickle_and_dict_carry_the_rows_of_their_columns():
    _, _, (a, b) = sample(rounds=2)
    joined = concat_samples([a, b])
    np.testing.assert_array_equal(joined.final_obs, np.concatenate([a.final_obs, b.final_obs]))
    for lo, hi in ((0, 1), (1, 3), (3, 8), (2, 6)):
        part = joined.slice_columns(lo, hi).validate()
        np.testing.assert_array_equal(
            part.final_obs, joined.final_obs[[i for i, col in enumerate(
                np.nonzero(joined.truncateds.T)[0]) if lo <= col < hi]])
    halves = joined.split_columns(2)
    np.testing.assert_array_equal(concat_samples(halves).final_obs, joined.final_obs)
    again = SampleBatch.from_dict(pickle.loads(pickle.dumps(joined)).to_dict())
    np.testing.assert_array_equal(again.final_obs, joined.final_obs)


def test_a_wrong_or_missing_final_obs_is_refused_naming_the_field():
    _, _, (a, b) = sample(rounds=2)
    short = SampleBatch(**{**a.to_dict(), "final_obs": a.final_obs[1:]})
    with pytest.raises(ValueError, match=r"'final_obs' is float32\[\d+, 3\], expected "
                                         r"float32\[\d+, 3\]: one observation per truncated"):
        short.validate()
    b.final_obs = None
    with pytest.raises(ValueError, match="batch 0 has 'final_obs' but batch 1 has none; "
                                         "record the final observations in all batches"):
        concat_samples([a, b])
    with pytest.raises(ValueError, match="truncation_bootstrap='learner' needs the batch's "
                                         "final_obs"):
        batch_to_tensors(b, final_obs=True)


# ---------------------------------------------------------------------- the learner's values
@pytest.mark.parametrize("use_lstm", [False, True])
def test_with_the_actors_weights_the_learner_bootstraps_from_the_same_values(use_lstm):
    cfg, spaces, (batch,) = sample(use_lstm)
    learner = VTracePolicy(*spaces, cfg)  # the worker's weights: same seed
    actor = VTracePolicy(*spaces, cfg.replace(truncation_bootstrap="actor"))
    loss_learner, _ = learner.loss_and_stats(tensors(batch, True))
    loss_actor, _ = actor.loss_and_stats(tensors(batch, False))
    assert float(loss_learner) == pytest.approx(float(loss_actor), rel=1e-5)


def learner_values(policy: VTracePolicy, batch: SampleBatch) -> np.ndarray:
    """V(final obs) [T, B] (0 elsewhere) under the policy's current weights, computed apart
    from its loss: the Keras network on the rows, or for an LSTM the numpy twin stepped from
    each column's state after the truncated step."""
    out = np.zeros((batch.T, batch.B), np.float32)
    cols, steps = np.nonzero(batch.truncateds.T)
    if policy.trunk is None:
        out[steps, cols] = policy.compute_logits_and_values(batch.final_obs)[1]
        return out
    model = NumpyModel(policy.observation_space, policy.action_space, policy.config.model_spec)
    model.set_weights(policy.get_weights()[0])
    state = batch.state_in.copy()
    for t in range(batch.T):
        _, _, state = model.step(batch.obs[t], state)
        for k in np.flatnonzero(steps == t):
            out[t, cols[k]] = model.step(batch.final_obs[k:k + 1], state[cols[k]][None])[1][0]
        state[batch.terminateds[t] | batch.truncateds[t]] = 0.0
    return out


@pytest.mark.parametrize("use_lstm", [False, True])
def test_after_an_update_the_bootstrap_is_the_learners_value_of_the_final_observation(
        use_lstm):
    cfg, spaces, (batch, other) = sample(use_lstm, rounds=2)
    policy = VTracePolicy(*spaces, cfg.replace(lr=0.01))
    for _ in range(3):
        policy.learn_on_batch(other)  # the learner's weights move away from the actor's
    values = learner_values(policy, batch)
    moved = np.abs(values - batch.truncation_values)[batch.truncateds]
    assert moved.min() > 1e-3  # the actor's values are stale: the two settings differ
    with_learner_values = SampleBatch(**{**batch.to_dict(), "truncation_values": values})
    as_actor = VTracePolicy(*spaces, cfg.replace(lr=0.01, truncation_bootstrap="actor"))
    as_actor.set_weights(policy.get_weights()[0])
    loss, stats = policy.loss_and_stats(tensors(batch, True))
    expected, expected_stats = as_actor.loss_and_stats(tensors(with_learner_values, False))
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(stats["vf_loss"]) == pytest.approx(float(expected_stats["vf_loss"]), rel=1e-5)


def test_batches_with_different_truncation_counts_share_one_graph():
    cfg, spaces, batches = sample(rounds=3)
    parts = [b.slice_columns(0, 2) for b in batches] + [b.slice_columns(2, 4) for b in batches]
    assert len({len(p.final_obs) for p in parts}) > 1
    plain, compiled = VTracePolicy(*spaces, cfg), CompiledPolicy(*spaces, cfg)
    for part in parts:
        assert plain.learn_on_batch(part)["policy_version"] == compiled.learn_on_batch(part)[
            "policy_version"]
    assert plain.num_traces <= 2  # a second trace relaxes the row count, then no more
    assert len(compiled._graphs) == 1


# ---------------------------------------------------------------------- the pipeline
def test_a_run_with_replay_minibatches_and_passes_trains_saves_and_restores(tmp_path):
    cfg = ImpalaConfig(env=ShortLimits(), backend="inline", num_workers=2,
                       num_envs_per_worker=4, sample_batch_size=T, train_batch_size=96,
                       max_sample_requests_in_flight_per_worker=1, seed=0, loss="appo",
                       truncation_bootstrap="learner", minibatch_size=48, num_sgd_iter=2,
                       minibatch_buffer_size=2, replay_proportion=0.5,
                       replay_buffer_num_slots=20)
    with Impala(cfg, start_learner=False) as run:
        for _ in range(6):
            run.step()
            while run.learner.step(block_timeout=0.0):
                pass
        stats = run.stats()
        assert stats["num_steps_replayed"] > 0
        assert run.policy.version >= 4 and np.isfinite(stats["learner"]["total_loss"])
        path = run.save(tmp_path / "ckpt")
        version = run.policy.version
    with Impala.restore(path, env_creator=ShortLimits(), start_learner=False) as again:
        assert again.policy.version == version
        again.step()
        assert again.learner.step(block_timeout=5.0)
        assert again.policy.version == version + 2  # one batch: two minibatches


def test_the_process_backend_carries_final_obs_to_an_lstm_learner():
    cfg = ImpalaConfig(env=ShortLimits(), num_workers=2, num_envs_per_worker=4,
                       sample_batch_size=T, train_batch_size=96, seed=0, use_lstm=True,
                       loss="appo", truncation_bootstrap="learner", num_sgd_iter=2)
    with Impala(cfg) as run:
        result = run.train(max_env_steps=3000)
    assert result["num_steps_trained"] > 0 and np.isfinite(result["learner"]["total_loss"])


TOWERS = r'''
import json
import numpy as np
from impala_lab.config import ImpalaConfig
from impala_lab.learner.multi_gpu_learner import MultiGPULearner, configure_learner_devices
from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors
from tests.test_truncation_bootstrap import sample

cfg, spaces, (batch,) = sample(rounds=1)
cfg = cfg.replace(num_gpus=2, fake_gpus=True, loss="appo")
configure_learner_devices(cfg)
single, multi = VTracePolicy(*spaces, cfg), VTracePolicy(*spaces, cfg)
for _ in range(2):  # the learner's values differ from the actor's
    single.learn_on_batch(batch), multi.learn_on_batch(batch)
learner = MultiGPULearner(multi, cfg)
g1, _ = single.compute_gradients(batch_to_tensors(batch, True))
gn, _ = learner.compute_gradients(batch)
# use_kl_loss on the towers: each update adapts the coefficient as on one device
kl_cfg = cfg.replace(use_kl_loss=True, kl_coeff=2.0, kl_target=1e-9)
kl_policy = VTracePolicy(*spaces, kl_cfg)
kl_policy.set_weights(multi.get_weights()[0])  # moved away from the actors: KL > 0
kl_learner = MultiGPULearner(kl_policy, kl_cfg)
used = kl_learner.learn_on_parts(kl_learner.stage_batch(batch), batch)["kl_coeff"]
print(json.dumps({"diff": max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(g1, gn)),
                  "scale": max(float(np.abs(np.asarray(a)).max()) for a in g1),
                  "rows": [int(p["final_obs"].shape[0]) for p in learner.stage_batch(batch)],
                  "kl_coeff": [used, float(kl_policy.kl_coeff.numpy())]}))
'''


def test_towers_split_the_final_observations_with_their_columns_and_adapt_the_kl_coeff():
    proc = subprocess.run([sys.executable, "-c", TOWERS], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rows"] == [T // 3 + T // 4, T // 5 + T // 7]
    assert out["diff"] <= 1e-5 * out["scale"]
    assert out["kl_coeff"] == pytest.approx([2.0, 3.0])  # KL above twice the target: x1.5
