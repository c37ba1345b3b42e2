"""What RolloutWorker refuses, and how it says so: a NaN or inf observation or reward, an
observation of the wrong shape or dtype (numpy would broadcast it into the batch silently), a
reward too large for float32, an env id or factory that cannot build an env, unsupported or
mismatched spaces. Each error names the env, its index, the worker and the env step, so that
a failure deep in a run points at its cause; an env's own exception keeps its traceback and
gains a note that says where it was raised. The rest of the worker is in test_rollout.py.
"""

from __future__ import annotations

import functools
import re

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.model_spec import ModelSpec
from tests.envs import FixedLengthEnv, ImageEnv, NaNEnv, RaisingEnv, WrongObsEnv, factory_cycle


def test_nan_observation_guard():
    make, _ = factory_cycle(FixedLengthEnv, functools.partial(NaNEnv, at_step=4, length=10))
    w = RolloutWorker(make, num_envs=2, sample_batch_size=3, seed=0, worker_index=3,
                      model_spec=ModelSpec((8,)))
    w.sample()  # steps 1-3 are fine
    with pytest.raises(ValueError) as info:
        w.sample()
    msg = str(info.value)
    assert msg.startswith(
        "env 'factory_cycle.<locals>.make' (env index 1 of worker 3) returned a non-finite "
        "observation at env step 4: [nan "
    )
    assert "NaN loss" in msg


def test_nan_reward_guard():
    w = RolloutWorker(functools.partial(NaNEnv, at_step=2, field="reward"), num_envs=2,
                      sample_batch_size=5, seed=0, model_spec=ModelSpec((8,)))
    with pytest.raises(ValueError, match=r"^env 'NaNEnv' \(env index 0 of worker 0\) returned "
                       r"a non-finite reward at env step 2: nan"):
        w.sample()


def test_nan_guard_at_reset_and_in_final_obs():
    with pytest.raises(ValueError, match=r"env 'NaNEnv' \(env index 0 of worker 0\) returned "
                       r"a non-finite observation from reset\(\) before any step: \[nan "):
        RolloutWorker(functools.partial(NaNEnv, at_step=0), model_spec=ModelSpec((8,)))
    # The NaN is in the final obs of a truncated episode, needed for its bootstrap value.
    w = RolloutWorker(functools.partial(NaNEnv, at_step=3, length=3, truncate=True),
                      sample_batch_size=5, model_spec=ModelSpec((8,)))
    with pytest.raises(ValueError, match=r"non-finite observation at env step 3 \(the final "
                       r"observation of a truncated episode, needed for its bootstrap value\)"):
        w.sample()


@pytest.mark.parametrize("kind, got", [("scalar", r"shape \(\) \(float, dtype float64\)"),
                                       ("batched", r"shape \(1, 4\) \(ndarray, dtype float32\)"),
                                       ("short", r"shape \(3,\) \(ndarray, dtype float32\)")])
def test_wrong_shaped_observations_are_rejected_naming_the_env_step_and_space(kind, got):
    # Before this check numpy broadcast a scalar or a (1, 4) observation into the (4,) row.
    w = RolloutWorker(functools.partial(WrongObsEnv, kind=kind, at_step=4, length=100), num_envs=2,
                      sample_batch_size=3, seed=0, worker_index=2, model_spec=ModelSpec((8,)))
    w.sample()  # steps 1-3 are fine
    with pytest.raises(ValueError) as info:
        w.sample()
    msg = str(info.value)
    assert re.match(r"env 'WrongObsEnv' \(env index 0 of worker 2\) returned an observation of "
                    + got + r" from step\(\) at env step 4, but its observation space "
                    # numpy 1.26 prints float32(1e6) as 1000000.0, numpy 2.4 as 1e+06
                    r"Box\(-1(e\+06|000000\.0), 1(e\+06|000000\.0), \(4,\), float32\) "
                    r"expects shape \(4,\) and dtype float32\.", msg), msg
    assert "corrupted data" in msg
    assert not getattr(info.value, "__notes__", None)  # located already: no second note


def test_wrong_shaped_observations_from_reset_are_rejected():
    with pytest.raises(ValueError, match=r"returned an observation of shape \(1, 4\) .*from "
                       r"reset\(\) before any step, but its observation space"):
        RolloutWorker(functools.partial(WrongObsEnv, kind="batched", at_step=0),
                      model_spec=ModelSpec((8,)))
    # from the reset that follows an episode's end, inside sample(): the first episode's
    # reset was made right, the later ones wrong
    envs = [WrongObsEnv(kind="scalar", at_step=10**9, length=3)]
    w = RolloutWorker(lambda: envs[0], sample_batch_size=5, model_spec=ModelSpec((8,)))
    envs[0].at_step = 0  # from now on every reset() returns a scalar
    with pytest.raises(ValueError, match=r"returned an observation of shape \(\) \(float, "
                       r"dtype float64\) from reset\(\) after env step 3, but"):
        w.sample()


@pytest.mark.parametrize("kind", ["list", "float64", "int64"])
def test_observations_that_convert_exactly_are_accepted(kind):
    reference = RolloutWorker(functools.partial(FixedLengthEnv, obs_dim=4, length=3), num_envs=2,
                              sample_batch_size=7, seed=0, model_spec=ModelSpec((8,)))
    other = RolloutWorker(functools.partial(WrongObsEnv, kind=kind, at_step=1, length=3),
                          num_envs=2, sample_batch_size=7, seed=0, model_spec=ModelSpec((8,)))
    a, b = reference.sample(), other.sample()
    assert b.obs.dtype == np.float32
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.rewards, b.rewards)


def test_a_float_image_observation_is_rejected_and_small_ints_accepted():
    class FloatImage(ImageEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            return obs.astype(np.float32) / 255.0, *rest  # would truncate to 0 as uint8

    class IntImage(ImageEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            return obs.astype(np.int64), *rest

    w = RolloutWorker(FloatImage, num_envs=2, sample_batch_size=3, model_spec=ModelSpec((8,)))
    with pytest.raises(ValueError, match=r"env '.*FloatImage' \(env index 0 of worker 0\) "
                       r"returned an observation of dtype float32 \(ndarray, shape \(20, 20, 3\)\) "
                       r"from step\(\) at env step 1, but its observation space Box\(0, 255, "
                       r"\(20, 20, 3\), uint8\) expects shape \(20, 20, 3\) and dtype uint8"):
        w.sample()
    ints = RolloutWorker(IntImage, num_envs=2, sample_batch_size=3, seed=0,
                         model_spec=ModelSpec((8,)))
    ref = RolloutWorker(ImageEnv, num_envs=2, sample_batch_size=3, seed=0,
                        model_spec=ModelSpec((8,)))
    np.testing.assert_array_equal(ints.sample().obs, ref.sample().obs)


def test_a_reward_too_large_for_float32_is_rejected():
    # 1e39 is finite as a Python float (the old check summed Python floats) and inf as float32
    w = RolloutWorker(functools.partial(NaNEnv, at_step=3, field="reward", value=1e39), num_envs=2,
                      sample_batch_size=5, seed=0, worker_index=1, model_spec=ModelSpec((8,)))
    with pytest.raises(ValueError, match=r"^env 'NaNEnv' \(env index 0 of worker 1\) returned "
                       r"a reward of 1e\+39 at env step 3: the batch holds rewards as float32, "
                       r"whose largest finite value is 3\.403e\+38, so it would become inf"):
        w.sample()
    # -inf and a float32-sized reward
    w = RolloutWorker(functools.partial(NaNEnv, at_step=2, field="reward", value=-np.inf),
                      num_envs=1, sample_batch_size=5, model_spec=ModelSpec((8,)))
    with pytest.raises(ValueError, match=r"non-finite reward at env step 2: -inf"):
        w.sample()
    w = RolloutWorker(functools.partial(NaNEnv, at_step=2, field="reward", value=3e38), num_envs=1,
                      sample_batch_size=5, model_spec=ModelSpec((8,)))
    assert w.sample().rewards[1, 0] == np.float32(3e38)


def test_env_exception_propagates_with_location():
    w = RolloutWorker(functools.partial(RaisingEnv, every=4, length=100), num_envs=2,
                      sample_batch_size=3, worker_index=1, model_spec=ModelSpec((8,)))
    w.sample()
    with pytest.raises(RuntimeError) as info:
        w.sample()
    assert str(info.value) == "boom at step 4"
    assert info.value.__notes__ == [
        "(RolloutWorker 1, env 'RaisingEnv': raised while stepping env index 0, at step 0 of "
        "the fragment, env step 4)"
    ]


def test_unknown_env_id():
    with pytest.raises(ValueError, match=r"^RolloutWorker could not build env 'NoSuchEnv-v0' "
                       r"\(env index 0 of worker 0\): gymnasium.make raised NameNotFound"):
        RolloutWorker("NoSuchEnv-v0")


def test_factory_errors():
    def bad():
        raise OSError("no display")

    with pytest.raises(ValueError, match=r"could not build env 'test_factory_errors.<locals>"
                       r".bad' \(env index 0 of worker 0\): the env factory raised OSError: "
                       r"no display"):
        RolloutWorker(bad)
    with pytest.raises(TypeError, match=r"returned int, expected a gymnasium\.Env"):
        RolloutWorker(lambda: 3)
    with pytest.raises(TypeError, match="must be a gymnasium env id"):
        RolloutWorker(3)
    with pytest.raises(ValueError, match="num_envs=0 must be an int >= 1"):
        RolloutWorker("CartPole-v1", num_envs=0)
    with pytest.raises(ValueError, match="sample_batch_size=0 must be an int >= 1"):
        RolloutWorker("CartPole-v1", sample_batch_size=0)


def test_unsupported_spaces():
    class MultiDiscreteEnv(FixedLengthEnv):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.MultiDiscrete([2, 3])

    with pytest.raises(ValueError, match=r"^RolloutWorker: env 'test_unsupported_spaces.*"
                                         r"action space MultiDiscrete\(\[2 3\]\)"):
        RolloutWorker(MultiDiscreteEnv)

    class DictObsEnv(FixedLengthEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Dict({"x": self.observation_space})

    with pytest.raises(ValueError, match=r"^RolloutWorker: env 'test_unsupported_spaces"):
        RolloutWorker(DictObsEnv)


def test_mismatched_spaces_across_envs():
    make, _ = factory_cycle(functools.partial(FixedLengthEnv, n_actions=2),
                                functools.partial(FixedLengthEnv, n_actions=3))
    with pytest.raises(ValueError, match=r"env index 1 of .* has spaces .*Discrete\(3\).* but "
                       r"env 0 has"):
        RolloutWorker(make, num_envs=2)

