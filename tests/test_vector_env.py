"""Vectorised envs (``vector_env=True``): the same batches as the per-env worker, gymnasium's
CartPole physics with the reset moved into the ending step, and clear errors for envs that
have no SAME_STEP vectorised implementation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from impala_lab.actor import make_rollout_worker
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.actor.vector_rollout_worker import VectorRolloutWorker
from impala_lab.config import ImpalaConfig
from impala_lab.driver import build
from impala_lab.envs.vector import SameStepCartPole, make_vector_env, vector_env_problem
from impala_lab.errors import ConfigError
from impala_lab.model_spec import ModelSpec
from tests import vector_envs
from tests.batches import assert_batches_equal

vector_envs.register()


@pytest.mark.parametrize(("env_id", "spec"), [
    (vector_envs.ENV_ID, ModelSpec((16,))),
    (vector_envs.ENV_ID, ModelSpec((16,), use_lstm=True, lstm_cell_size=8)),
    (vector_envs.BOX_ENV_ID, ModelSpec((16,))),
], ids=["discrete", "lstm", "box"])
def test_vector_worker_gives_the_per_env_workers_batches(env_id, spec):
    """Deterministic envs and one action stream: the two paths must agree bit for bit on
    every field, including episode ends, truncation values and LSTM start states."""
    kw = dict(env=env_id, num_envs=5, sample_batch_size=7, model_spec=spec, seed=11,
              worker_index=1)
    per_env, vector = RolloutWorker(**kw), VectorRolloutWorker(**kw)
    saw = {"terminated": 0, "truncated": 0}
    for _ in range(4):
        a, b = per_env.sample(), vector.sample()
        assert_batches_equal(a, b)
        if spec.use_lstm:
            np.testing.assert_array_equal(a.state_in, b.state_in)
        saw["terminated"] += int(a.terminateds.sum())
        saw["truncated"] += int(a.truncateds.sum())
    assert saw["terminated"] > 0 and saw["truncated"] > 0, saw  # both ends were exercised
    assert (per_env.num_env_steps, per_env.num_episodes) == (vector.num_env_steps,
                                                              vector.num_episodes)
    per_env.close()
    vector.close()


def test_a_truncated_episode_bootstraps_from_its_final_observation():
    w = VectorRolloutWorker(vector_envs.ENV_ID, num_envs=3, sample_batch_size=12, seed=0,
                            model_spec=ModelSpec((8,)))
    b = w.sample()
    t, i = (int(k) for k in np.argwhere(b.truncateds)[0])
    # The final observation of a truncated episode is (6 steps, its count) / 10; obs[t + 1]
    # is already the next episode's first (0, 0).
    np.testing.assert_array_equal(b.obs[t + 1, i] if t + 1 < b.T else b.bootstrap_obs[i],
                                  np.zeros(2, np.float32))
    count = vector_envs._counts(b.actions[t - 5:t + 1, i], False).sum()
    final = np.array([6, count], np.float32) / np.float32(10)
    _, value = w.model(final[None])
    np.testing.assert_allclose(b.truncation_values[t, i], value[0], rtol=1e-6)
    w.close()


def test_make_rollout_worker_picks_the_path():
    w = make_rollout_worker(vector_env=make_vector_env, env="CartPole-v1", num_envs=4,
                            sample_batch_size=3)
    assert type(w) is VectorRolloutWorker and w.sample().obs.shape == (3, 4, 4)
    w.close()
    w = make_rollout_worker(vector_env=True, env=vector_envs.ENV_ID, num_envs=2)
    assert type(w) is VectorRolloutWorker  # the registered SAME_STEP vector env as it is
    w.close()
    w = make_rollout_worker(env="CartPole-v1", num_envs=2, sample_batch_size=3)
    assert type(w) is RolloutWorker
    w.close()


def test_a_vector_env_that_resets_next_step_is_refused_by_the_worker():
    # gymnasium's own CartPoleVectorEnv resets in the step after; the worker must not use it
    with pytest.raises(ValueError) as info:
        VectorRolloutWorker("CartPole-v1", num_envs=2)
    text = str(info.value)
    assert "CartPoleVectorEnv of 'CartPole-v1' resets with autoreset mode NEXT_STEP" in text
    assert "make_vector_env" in text and "vector_env=False" in text


def _cartpoles_from(venv: SameStepCartPole) -> list[CartPoleEnv]:
    """One gymnasium CartPoleEnv per cart of ``venv``, in the same state."""
    envs = []
    for i in range(venv.num_envs):
        e = CartPoleEnv()
        e.reset(seed=0)
        e.state = venv.state[:, i].astype(np.float64).copy()
        envs.append(e)
    return envs


def test_same_step_cartpole_has_gymnasiums_physics_and_resets_in_the_ending_step():
    n, limit = 6, 40
    venv = SameStepCartPole(num_envs=n, max_episode_steps=limit)
    venv.reset(seed=3)
    singles = _cartpoles_from(venv)
    steps = np.zeros(n, np.int64)
    rng = np.random.default_rng(5)
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(400):
        actions = rng.integers(0, 2, n)
        obs, reward, term, trunc, info = venv.step(actions)
        steps += 1
        for i, e in enumerate(singles):
            o, r, te, _, _ = e.step(int(actions[i]))
            tr = steps[i] >= limit
            assert (r, te, tr) == (reward[i], term[i], trunc[i])
            if te or tr:
                ended["terminated" if te else "truncated"] += 1
                # The final observation is in info; obs[i] is the next episode's first.
                assert info["_final_obs"][i]
                np.testing.assert_allclose(info["final_obs"][i], o, atol=1e-5)
                assert np.all(np.abs(obs[i]) <= 0.05)
                e.state = venv.state[:, i].astype(np.float64).copy()
                e.steps_beyond_terminated = None
                steps[i] = 0
            else:
                np.testing.assert_allclose(obs[i], o, atol=1e-5)
                assert not info or not info["_final_obs"][i]
    assert ended["terminated"] > 5 and ended["truncated"] > 0, ended


def test_make_vector_env_uses_the_registrations_time_limit():
    venv = make_vector_env("CartPole-v1", 2)
    assert isinstance(venv, SameStepCartPole) and venv.max_episode_steps == 500
    assert venv.single_action_space == gym.spaces.Discrete(2)
    venv.close()


def test_envs_without_a_same_step_vector_env_are_named_with_the_fix():
    assert vector_env_problem("CartPole-v1") is None
    assert vector_env_problem(vector_envs.ENV_ID) is None
    text = vector_env_problem("Pendulum-v1")
    assert "no vectorised implementation of 'Pendulum-v1'" in text
    assert "vector_env=False" in text
    assert "env factory" in vector_env_problem(lambda: CartPoleEnv())
    gym.register(id="impala_lab_test/NextStep-v0", entry_point=CartPoleEnv,
                 vector_entry_point=_NextStepVector)
    try:
        text = vector_env_problem("impala_lab_test/NextStep-v0")
        assert "autoreset mode NEXT_STEP" in text and "SAME_STEP" in text
    finally:
        del gym.registry["impala_lab_test/NextStep-v0"]


class _NextStepVector(gym.vector.VectorEnv):
    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}


def test_vector_env_on_an_env_without_one_is_a_config_error_before_any_process():
    with pytest.raises(ConfigError) as info:
        build.check_env(ImpalaConfig(env="Pendulum-v1", vector_env=True))
    text = str(info.value)
    assert text.startswith("vector_env=True is invalid for env='Pendulum-v1'")
    assert "set vector_env=False" in text
    assert build.check_env(ImpalaConfig(env="CartPole-v1", vector_env=True))[1].n == 2


class _WrongShape(vector_envs.ActionCountVector):
    def step(self, actions):
        obs, *rest = super().step(actions)
        return (obs[:, :1], *rest)


class _NoFinalObs(vector_envs.ActionCountVector):
    def step(self, actions):
        obs, r, te, tr, _ = super().step(actions)
        return obs, r, te, tr, {}


@contextlib.contextmanager
def _registered(cls: type) -> Iterator[str]:
    """An id whose vector env is ``cls`` (an `ActionCountVector`), removed again afterwards."""
    env_id = f"impala_lab_test/{cls.__name__}-v0"
    gym.register(id=env_id, entry_point=vector_envs.ActionCount, vector_entry_point=cls)
    try:
        yield env_id
    finally:
        del gym.registry[env_id]


@pytest.mark.parametrize(("cls", "message"), [
    (_WrongShape, "observation of shape (1,)"),
    (_NoFinalObs, "without info['final_obs']"),
])
def test_a_vector_env_that_breaks_the_contract_is_named(cls, message):
    with _registered(cls) as env_id:
        w = VectorRolloutWorker(env_id, num_envs=3, sample_batch_size=12, seed=0,
                                model_spec=ModelSpec((8,)))
        with pytest.raises(ValueError) as info:
            w.sample()
        assert message in str(info.value) and env_id in str(info.value)
        w.close()


class _RaisesAtStep3(vector_envs.ActionCountVector):
    def step(self, actions):
        if self.t[0] == 2:
            raise RuntimeError("boom")
        return super().step(actions)


def test_a_vector_envs_exception_carries_a_note_of_where_it_was_raised():
    with _registered(_RaisesAtStep3) as env_id:
        w = VectorRolloutWorker(env_id, num_envs=2, sample_batch_size=5, seed=0, worker_index=3,
                                model_spec=ModelSpec((8,)))
        with pytest.raises(RuntimeError) as info:
            w.sample()
        assert str(info.value) == "boom"
        assert info.value.__notes__ == [f"(RolloutWorker 3, env {env_id!r}: raised while "
                                        "stepping the vector env, at step 2 of the fragment, "
                                        "env step 3)"]
        w.close()


def test_a_process_run_with_vector_envs_learns_cartpole():
    """The whole pipeline on the vector path: worker processes build the vector env from the
    config, and the tuned preset learns from its batches."""
    from impala_lab.driver.impala import Impala

    cfg = ImpalaConfig.tuned("CartPole-v1", vector_env=True, num_envs_per_worker=16, seed=0)
    with Impala(cfg) as run:
        result = run.train(lambda s: s["episode_return_count"] >= 20
                           and s["episode_return_mean"] >= 195,
                           max_env_steps=1_500_000, report_interval=0.5)
    assert result["stop_reason"] == "stop condition", result["episode_return_mean"]


def test_the_memory_task_has_a_vector_env_without_velocities():
    import impala_lab  # noqa: F401  (registers the memory task)
    from impala_lab.envs.stateless_cartpole import ENV_ID, StatelessCartPoleVector

    assert vector_env_problem(ENV_ID) is None
    venv = make_vector_env(ENV_ID, 3)
    assert isinstance(venv, StatelessCartPoleVector) and venv.max_episode_steps == 500
    obs, _ = venv.reset(seed=1)
    assert obs.shape == (3, 2) and venv.single_observation_space.shape == (2,)
    # (position, angle) of the full state, no velocities
    np.testing.assert_allclose(obs, venv.state[[0, 2]].T, atol=1e-7)
    for _ in range(100):
        obs, _, terminated, _, info = venv.step(np.ones(3, np.int64))
        if terminated.any():
            break
    i = int(np.flatnonzero(terminated)[0])
    assert info["final_obs"][i].shape == (2,) and abs(info["final_obs"][i][1]) > 0.2
    w = VectorRolloutWorker(ENV_ID, num_envs=4, sample_batch_size=5,
                            model_spec=ModelSpec((8,), use_lstm=True, lstm_cell_size=4))
    b = w.sample()
    assert b.obs.shape == (5, 4, 2) and b.state_in.shape == (4, 2, 4)
    w.close()


def test_a_maker_that_builds_the_wrong_number_of_envs_is_named():
    with pytest.raises(ValueError, match=r"holds num_envs=2 envs, but the worker was asked "
                       r"for 3"):
        VectorRolloutWorker("CartPole-v1", num_envs=3,
                            make_vector_env=lambda env_id, n: make_vector_env(env_id, 2))


def test_the_final_obs_mask_handed_out_is_not_changed_by_later_steps():
    venv = SameStepCartPole(num_envs=4, max_episode_steps=3)
    venv.reset(seed=0)
    masks = [venv.step(np.zeros(4, np.int64))[4].get("_final_obs") for _ in range(6)]
    assert masks[2] is not None and masks[2].all()  # the time limit ends every cart at 3
    assert masks[5].all() and not any(m is not None and m.any() for m in masks[3:5])
    assert masks[2].all()  # still as it was handed out
