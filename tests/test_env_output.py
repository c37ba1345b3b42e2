"""An env's reward must be a real number and its end flags bools: anything else is named.

gymnasium's ``Env.step`` returns ``(obs, reward, terminated, truncated, info)``. Before these
checks a string reward was parsed by ``float()``, ``terminated=None`` never ended an episode
and ``"no"`` ended every one; now each is a ValueError naming the env, the env index, the
step, the value and its type. Numpy scalars and Python ints stay accepted, as gymnasium does.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np
import pytest

from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.model_spec import ModelSpec
from tests.envs import FixedLengthEnv


class OddStepEnv(FixedLengthEnv):
    """FixedLengthEnv whose step ``at_step`` (counted from 1) returns ``field`` as ``value``."""

    def __init__(self, field: str, value: Any, at_step: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.field, self.value, self.at_step = field, value, at_step

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = super().step(action)
        if self.total_steps == self.at_step:
            out = {"reward": reward, "terminated": terminated, "truncated": truncated}
            out[self.field] = self.value
            reward, terminated, truncated = out["reward"], out["terminated"], out["truncated"]
        return obs, reward, terminated, truncated, info


def worker(field: str, value: Any, **kwargs: Any) -> RolloutWorker:
    return RolloutWorker(functools.partial(OddStepEnv, field, value, **kwargs), num_envs=2,
                         sample_batch_size=6, seed=0, model_spec=ModelSpec((8,)))


@pytest.mark.parametrize("field, value, text", [
    ("terminated", None, "terminated=None (NoneType)"),
    ("terminated", "no", "terminated='no' (str)"),
    ("truncated", 1, "truncated=1 (int)"),
    ("truncated", np.array([False]), "truncated=array([False]) (ndarray)"),
    ("reward", "1.5", "reward='1.5' (str)"),
    ("reward", None, "reward=None (NoneType)"),
    ("reward", 1 + 2j, "reward=(1+2j) (complex)"),
    ("reward", True, "reward=True (bool)"),
    ("reward", np.array([1.0]), "reward=array([1.]) (ndarray)"),
])
def test_a_wrong_step_output_is_named_with_the_env_the_step_and_the_value(field, value, text):
    expected = "a bool" if field != "reward" else "a real number"
    with pytest.raises(ValueError, match=rf"^env 'OddStepEnv' \(env index 0 of worker 0\) "
                                         rf"returned {re.escape(text)} from step\(\) at env "
                                         rf"step 2: "
                                         rf"{field} must be {expected}"):
        worker(field, value).sample()


@pytest.mark.parametrize("field, value", [
    ("reward", 2), ("reward", np.float32(2.0)), ("reward", np.int64(2)),
    ("reward", np.array(2.0)), ("terminated", np.bool_(False)), ("truncated", np.False_),
])
def test_numpy_scalars_and_ints_are_read_as_the_numbers_they_are(field, value):
    batch = worker(field, value, length=50).sample()
    want = 2.0 if field == "reward" else 1.0
    np.testing.assert_array_equal(batch.rewards[1], [want, want])  # env step 2 is row 1
    assert not batch.terminateds.any() and not batch.truncateds.any()


def test_numpy_true_ends_the_episode():
    batch = worker("terminated", np.bool_(True), length=50).sample()
    assert batch.terminateds[1].all() and not batch.terminateds[0].any()
