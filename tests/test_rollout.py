"""Tests for impala_lab.actor.rollout_worker.RolloutWorker (and the test envs in tests/envs.py):
autoreset, the policy and its weights, seeding, observation dtypes. What the worker refuses
(non-finite or wrong-shaped observations, bad rewards, factories and spaces) and how an env's
error reaches the caller are in test_rollout_guards.py."""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.actor import numpy_model as models
from impala_lab.actor.distributions import Categorical
from impala_lab.actor.rollout_worker import RolloutWorker, env_description
from impala_lab.batch import FIELDS, concat_samples
from impala_lab.model_spec import ModelSpec
from tests.envs import FixedLengthEnv, ImageEnv, NaNEnv, RaisingEnv, SlowEnv, factory_cycle


def reference_model(worker: RolloutWorker) -> models.NumpyModel:
    """A fresh NumpyModel holding the worker's current weights."""
    m = models.NumpyModel(worker.observation_space, worker.action_space, ModelSpec((16,)))
    m.set_weights(worker.get_weights()[0])
    return m


def time_concat(batches):
    """Joins consecutive samples of one worker along time: [sum T, B]."""
    return {
        name: np.concatenate([getattr(b, name) for b in batches], axis=0)
        for name in ("obs", "actions", "rewards", "terminateds", "truncateds",
                     "truncation_values", "behaviour_logits")
    }


# ---------------------------------------------------------------------- autoreset


def test_autoreset_boundaries_exact():
    # env 0: length 3, terminated; env 1: length 7, truncated; env 2: length 1, truncated.
    lengths = (3, 7, 1)
    rewards = (1.0, 2.0, 0.5)
    make, built = factory_cycle(
        lambda: FixedLengthEnv(length=3, obs_dim=3, reward=1.0, truncate=False),
        lambda: FixedLengthEnv(length=7, obs_dim=3, reward=2.0, truncate=True),
        lambda: FixedLengthEnv(length=1, obs_dim=3, reward=0.5, truncate=True),
    )
    T, n_samples = 10, 4
    w = RolloutWorker(make, num_envs=3, sample_batch_size=T, seed=3, model_spec=ModelSpec((16,)))
    batches = [w.sample() for _ in range(n_samples)]
    for b in batches:
        b.validate(check_values=True)
        assert (b.T, b.B) == (T, 3)
    # bootstrap_obs is the obs after the last step: the next fragment's first obs.
    for prev, nxt in itertools.pairwise(batches):
        np.testing.assert_array_equal(prev.bootstrap_obs, nxt.obs[0])
    cat = time_concat(batches)
    g = np.arange(T * n_samples)  # global step index
    ref = reference_model(w)
    expected_episodes = []
    for b, (L, r) in enumerate(zip(lengths, rewards, strict=True)):
        obs = cat["obs"][:, b]
        # Every recorded obs is a pre-action observation: step-in-episode < L, never final.
        np.testing.assert_array_equal(obs[:, 0], g % L)
        np.testing.assert_array_equal(obs[:, 1], g // L)
        # obs[2] is the previous action within the episode, -1 right after a reset.
        prev_action = np.where(g % L == 0, -1, np.roll(cat["actions"][:, b], 1))
        np.testing.assert_array_equal(obs[:, 2], prev_action)
        ends = (g + 1) % L == 0
        terminal = env_terminates = not built[b].truncate
        assert env_terminates == (b == 0)
        np.testing.assert_array_equal(cat["terminateds"][:, b], ends & terminal)
        np.testing.assert_array_equal(cat["truncateds"][:, b], ends & (not terminal))
        np.testing.assert_array_equal(cat["rewards"][:, b], np.full(len(g), r, np.float32))
        # Truncation values: V(final obs) exactly at truncated steps, 0 elsewhere.
        tv = cat["truncation_values"][:, b]
        if terminal:
            np.testing.assert_array_equal(tv, 0.0)
        else:
            steps = np.flatnonzero(ends)
            final_obs = np.stack(
                [np.array([L, s // L, cat["actions"][s, b]], np.float32) for s in steps]
            )
            _, v_final = ref(final_obs)
            np.testing.assert_allclose(tv[steps], v_final, rtol=1e-5, atol=1e-6)
            assert np.all(tv[steps] != 0)
            np.testing.assert_array_equal(tv[~ends], 0.0)
        for s in np.flatnonzero(ends):
            expected_episodes.append((s, b, L * r, L))
    # Episode returns/lengths per fragment, ordered by (step, env index).
    for k, batch in enumerate(batches):
        eps = sorted(e for e in expected_episodes if k * T <= e[0] < (k + 1) * T)
        np.testing.assert_array_equal(batch.episode_returns, [e[2] for e in eps])
        np.testing.assert_array_equal(batch.episode_lengths, [e[3] for e in eps])
    assert w.num_env_steps == 3 * T * n_samples
    assert w.num_episodes == sum(len(b.episode_lengths) for b in batches)
    assert w.num_episodes == 40 // 3 + 40 // 7 + 40
    # The envs were never stepped past an episode end (FixedLengthEnv would raise).
    assert [e.total_steps for e in built] == [40, 40, 40]
    w.close()


def test_episode_spanning_fragments_reports_full_length():
    w = RolloutWorker(functools.partial(FixedLengthEnv, length=7, reward=0.5), num_envs=1,
                      sample_batch_size=5, seed=0, model_spec=ModelSpec((8,)))
    b1, b2, b3 = w.sample(), w.sample(), w.sample()
    assert len(b1.episode_lengths) == 0
    np.testing.assert_array_equal(b2.episode_lengths, [7])  # steps 0..6 end in fragment 2
    np.testing.assert_array_equal(b2.episode_returns, [3.5])
    np.testing.assert_array_equal(b3.episode_lengths, [7])  # steps 7..13 end in fragment 3
    assert b2.terminateds[1, 0] and b3.terminateds[3, 0]
    assert b2.terminateds.sum() + b3.terminateds.sum() + b1.terminateds.sum() == 2


class BothEnv(FixedLengthEnv):
    """Reports terminated and truncated together at the episode's end."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, term or trunc, term or trunc, info


def test_terminated_and_truncated_counts_as_terminated():
    w = RolloutWorker(functools.partial(BothEnv, length=2), num_envs=2, sample_batch_size=6,
                      seed=0, model_spec=ModelSpec((8,)))
    b = w.sample()
    expected = np.tile(np.array([False, True] * 3)[:, None], (1, 2))
    np.testing.assert_array_equal(b.terminateds, expected)
    assert not b.truncateds.any()
    assert not b.truncation_values.any()


class BufferReusingEnv(FixedLengthEnv):
    """Returns the same obs array every time, overwritten in place (some envs do)."""

    def _obs(self, last_action):
        if not hasattr(self, "_buf"):
            self._buf = np.zeros(self.obs_dim, np.float32)
        self._buf[:] = super()._obs(last_action)
        return self._buf


def test_truncation_value_survives_env_reusing_its_obs_buffer():
    w = RolloutWorker(functools.partial(BufferReusingEnv, length=2, obs_dim=3, truncate=True),
                      num_envs=2, sample_batch_size=6, seed=0, model_spec=ModelSpec((16,)))
    b = w.sample()
    g = np.arange(6)
    np.testing.assert_array_equal(b.obs[:, 1, 0], g % 2)
    np.testing.assert_array_equal(b.obs[:, 1, 1], g // 2)
    steps = np.flatnonzero(b.truncateds[:, 1])
    np.testing.assert_array_equal(steps, [1, 3, 5])
    final_obs = np.array([[2, s // 2, b.actions[s, 1]] for s in steps], np.float32)
    _, v_final = reference_model(w)(final_obs)
    np.testing.assert_allclose(b.truncation_values[steps, 1], v_final, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- policy and weights


def test_behaviour_logits_and_actions_follow_the_numpy_model():
    w = RolloutWorker("CartPole-v1", num_envs=4, sample_batch_size=20, seed=11,
                      model_spec=ModelSpec((16,)))
    b = w.sample()
    ref = reference_model(w)
    logits, _ = ref(b.obs.reshape(-1, *b.obs_shape))
    np.testing.assert_allclose(
        b.behaviour_logits, logits.reshape(b.T, b.B, -1), rtol=1e-5, atol=1e-6
    )
    # Actions are the Categorical's sample(logits, rng) with the documented action rng.
    seq = np.random.SeedSequence(11, spawn_key=(0,))
    rng = np.random.default_rng(seq.spawn(5)[0])
    expected = np.stack([Categorical.sample(b.behaviour_logits[t], rng) for t in range(b.T)])
    np.testing.assert_array_equal(b.actions, expected)
    assert b.actions.dtype == np.int64


def test_set_weights_changes_version_and_logits():
    w = RolloutWorker("CartPole-v1", num_envs=2, sample_batch_size=8, seed=1,
                      model_spec=ModelSpec((16,)))
    assert w.weights_version == -1
    b0 = w.sample()
    np.testing.assert_array_equal(b0.policy_versions, [-1, -1])
    weights, version = w.get_weights()
    assert version == -1
    new = [2.0 * x + 0.1 for x in weights]
    w.set_weights(new, 5)
    assert w.weights_version == 5
    got, v = w.get_weights()
    assert v == 5 and all(np.array_equal(a, b) for a, b in zip(got, new, strict=True))
    b1 = w.sample()
    np.testing.assert_array_equal(b1.policy_versions, [5, 5])
    m = models.NumpyModel(w.observation_space, w.action_space, ModelSpec((16,)))
    m.set_weights(new)
    logits, _ = m(b1.obs.reshape(-1, 4))
    np.testing.assert_allclose(b1.behaviour_logits.reshape(-1, 2), logits, rtol=1e-5, atol=1e-6)
    m.set_weights(weights)
    old_logits, _ = m(b1.obs.reshape(-1, 4))
    assert not np.allclose(old_logits, logits)
    joined = concat_samples([b0, b1])
    np.testing.assert_array_equal(joined.policy_versions, [-1, -1, 5, 5])


def test_initial_weights_come_from_seed():
    w = RolloutWorker("CartPole-v1", num_envs=1, sample_batch_size=4, seed=42,
                      model_spec=ModelSpec((16,)))
    m = models.NumpyModel(w.observation_space, w.action_space, ModelSpec((16,)))
    expected = m.initial_weights(42)
    got, _ = w.get_weights()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------- seeding


def test_same_seed_same_batches_different_index_or_seed_differs():
    def run(seed, index):
        w = RolloutWorker("CartPole-v1", num_envs=3, sample_batch_size=30, seed=seed,
                          worker_index=index, model_spec=ModelSpec((16,)))
        out = [w.sample() for _ in range(3)]
        w.close()
        return out

    a, b = run(7, 2), run(7, 2)
    for x, y in zip(a, b, strict=True):
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
    c = run(7, 3)
    d = run(8, 2)
    assert not np.array_equal(a[0].obs[0], c[0].obs[0])
    assert not np.array_equal(a[0].obs[0], d[0].obs[0])
    # Within a worker, the envs start differently too.
    assert not np.array_equal(a[0].obs[0, 0], a[0].obs[0, 1])


def test_env_seeds_follow_seed_sequence():
    make, built = factory_cycle(FixedLengthEnv)
    RolloutWorker(make, num_envs=3, sample_batch_size=2, seed=5, worker_index=4,
                  model_spec=ModelSpec((8,))).close()
    children = np.random.SeedSequence(5, spawn_key=(4,)).spawn(4)
    assert [e.last_seed for e in built] == [
        int(c.generate_state(1, np.uint32)[0]) for c in children[1:]
    ]


def test_seed_none_is_random():
    spec = ModelSpec((8,))
    a = RolloutWorker("CartPole-v1", num_envs=2, sample_batch_size=5, model_spec=spec).sample()
    b = RolloutWorker("CartPole-v1", num_envs=2, sample_batch_size=5, model_spec=spec).sample()
    assert not np.array_equal(a.obs, b.obs)


# ---------------------------------------------------------------------- obs dtypes


def test_image_obs_stay_uint8():
    w = RolloutWorker(functools.partial(ImageEnv, length=4), num_envs=2, sample_batch_size=6,
                      seed=0, model_spec=ModelSpec((16,)))
    b = w.sample()
    b.validate(check_values=True)
    assert b.obs.dtype == np.uint8 and b.obs.shape == (6, 2, 20, 20, 3)
    assert b.bootstrap_obs.dtype == np.uint8 and b.bootstrap_obs.shape == (2, 20, 20, 3)
    np.testing.assert_array_equal(b.obs[:, 0, 0, 0, 0], [0, 1, 2, 3, 0, 1])
    np.testing.assert_array_equal(b.terminateds[:, 0], [0, 0, 0, 1, 0, 0])
    assert b.behaviour_logits.shape == (6, 2, 3)
    logits, _ = reference_model(w)(b.obs.reshape(-1, 20, 20, 3))
    np.testing.assert_allclose(b.behaviour_logits.reshape(-1, 3), logits, rtol=1e-5, atol=1e-6)


def test_float64_box_obs_become_float32():
    class F64Env(FixedLengthEnv):
        def __init__(self):
            super().__init__(length=4)
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)

        def _obs(self, last_action):
            return super()._obs(last_action).astype(np.float64)

    b = RolloutWorker(F64Env, sample_batch_size=5, seed=0, model_spec=ModelSpec((8,))).sample()
    assert b.obs.dtype == np.float32 and b.bootstrap_obs.dtype == np.float32
    np.testing.assert_array_equal(b.obs[:, 0, 0], [0, 1, 2, 3, 0])


# ---------------------------------------------------------------------- misc API


def test_properties_and_lifetime():
    w = RolloutWorker("CartPole-v1", num_envs=2, sample_batch_size=7, seed=0, worker_index=2,
                      model_spec=ModelSpec((8,)))
    assert w.env_id == "CartPole-v1"
    assert (w.num_envs, w.sample_batch_size, w.num_actions) == (2, 7, 2)
    assert w.observation_space.shape == (4,) and w.action_space.n == 2
    assert "RolloutWorker(env='CartPole-v1', num_envs=2" in repr(w)
    assert w.sample().count == 14
    assert (w.num_env_steps, w.num_episodes) == (14, 0)
    w.close()
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="RolloutWorker 2 is closed"):
        w.sample()
    with RolloutWorker(FixedLengthEnv, model_spec=ModelSpec((8,))) as w2:
        assert w2.env_id == "FixedLengthEnv"
    with pytest.raises(RuntimeError, match="closed"):
        w2.sample()


def test_env_description():
    assert env_description("CartPole-v1") == "CartPole-v1"
    assert env_description(FixedLengthEnv) == "FixedLengthEnv"
    assert env_description(functools.partial(SlowEnv, delay_s=0.0)) == "SlowEnv"
    assert env_description(lambda: None) == "test_env_description.<locals>.<lambda>"


def test_rollout_does_not_import_tensorflow():
    code = (
        "import sys, impala_lab.actor.rollout_worker, impala_lab.batch; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')]; "
        "assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------- test envs


def test_test_envs_pass_gymnasium_checker():
    from gymnasium.utils.env_checker import check_env

    for env in (FixedLengthEnv(), RaisingEnv(every=1000), NaNEnv(at_step=1000),
                SlowEnv(delay_s=0.0), ImageEnv()):
        check_env(env, skip_render_check=True)


def test_test_envs_behaviour():
    env = FixedLengthEnv(length=2, obs_dim=4, reward=3.0, rewarded_action=1)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs, [0, 0, -1, 0])
    assert env.step(0)[1:4] == (0.0, False, False)
    obs, r, term, trunc, _ = env.step(1)
    np.testing.assert_array_equal(obs, [2, 0, 1, 0])
    assert (r, term, trunc) == (3.0, True, False)
    with pytest.raises(RuntimeError, match="called after the episode ended"):
        env.step(0)
    assert env.reset()[0][1] == 1

    env = RaisingEnv(every=3, length=100)
    env.reset()
    env.step(0)
    env.step(0)
    with pytest.raises(RuntimeError, match=r"^boom at step 3$"):
        env.step(0)
    env.step(0)

    env = NaNEnv(at_step=2)
    env.reset()
    assert np.isfinite(env.step(0)[0]).all()
    assert np.isnan(env.step(0)[0][0])

    slept: list[float] = []
    env = SlowEnv(delay_s=0.02, length=3, sleep=slept.append)
    env.reset()
    env.step(0)
    env.step(0)
    assert slept == [0.02, 0.02]


def test_int64_discrete_answers_every_contains_like_discrete():
    from impala_lab.actor.env_checks import Int64Discrete, fast_int64_action_check

    values = [np.int64(v) for v in (-3, -1, 0, 1, 2, 3, 4, 5, 2**62)] + [
        0, 1, 4, -1, 2.0, np.int32(1), np.int8(3), np.uint64(2), np.float64(1.0),
        np.array(1), np.array([1]), "1", None, True]
    for start, n in ((0, 2), (-2, 5), (3, 1)):
        reference = gym.spaces.Discrete(n, start=start)
        fast = Int64Discrete.like(reference)
        assert fast == reference and repr(fast) == repr(reference)
        assert fast.np_random is reference.np_random  # samples draw from the same stream
        for v in values:
            assert fast.contains(v) == reference.contains(v), (start, n, v)
            assert type(fast.contains(v)) is bool

    env = gym.make("CartPole-v1")
    fast_int64_action_check(env)
    assert type(env.unwrapped.action_space) is Int64Discrete
    assert env.action_space is env.unwrapped.action_space  # the wrappers pass it on
    assert env.action_space == gym.spaces.Discrete(2)
    env.reset(seed=0)
    env.step(np.int64(1))  # CartPole's own contains() check accepts the worker's actions
    # Only exactly Discrete over int64 is changed: subclasses and other dtypes are left alone.
    other = gym.make("CartPole-v1")
    other.unwrapped.action_space = gym.spaces.Discrete(2, dtype=np.int32)
    fast_int64_action_check(other)
    assert type(other.unwrapped.action_space) is gym.spaces.Discrete
