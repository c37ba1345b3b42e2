"""What a rollout worker checks in its envs' output, and the errors that name the culprit.

An observation must fit the batch exactly (shape, and a dtype the batch holds without loss);
observations and rewards must be finite. A bad value would otherwise be broadcast or cast into
the batch, or surface much later as a NaN loss. Every error names the env, the env index, the
worker and the env step, and is marked located (``_impala_lab_located``: no second note).
`fast_int64_action_check` swaps a Discrete action space for an equal one with a cheaper
``contains``. numpy and gymnasium only (actor processes import it).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["FLOAT32_MAX", "EnvOutputChecks", "Int64Discrete", "fast_int64_action_check"]

FLOAT32_MAX = float(np.finfo(np.float32).max)


class EnvOutputChecks:
    """The slow paths of a worker's checks (the fast ones are inline in its sampling loop),
    for the envs' ``observation_space`` and the batch's ``obs_dtype`` (float32, or uint8 for
    images); ``env_id`` and ``worker_index`` name the culprit."""

    def __init__(self, env_id: str, worker_index: int, observation_space: gym.Space,
                 obs_dtype: np.dtype) -> None:
        self.env_id = env_id
        self.worker_index = worker_index
        self.observation_space = observation_space
        self.obs_shape = tuple(observation_space.shape)
        self.space_dtype = np.dtype(observation_space.dtype)
        self.obs_dtype = obs_dtype

    def check_rewards(self, rewards: np.ndarray, first_step: int) -> None:
        """Raise for the first reward (in step order) that float32 cannot hold finitely."""
        t, i = (int(k) for k in np.argwhere(~(np.abs(rewards) <= FLOAT32_MAX))[0])
        r = float(rewards[t, i])
        when = f"at env step {first_step + t}"
        if not math.isfinite(r):
            self.raise_nonfinite(i, "reward", r, when)
        # finite as a Python float, infinite in the batch's float32
        raise _located(
            f"env {self.env_id!r} (env index {i} of worker {self.worker_index}) returned "
            f"a reward of {r:g} {when}: the batch holds rewards as float32, whose largest "
            f"finite value is {FLOAT32_MAX:.4g}, so it would become inf. Fix the env (or wrap "
            "it to scale or clip its rewards); an infinite reward would otherwise surface as "
            "a NaN loss much later.")

    def checked_obs(self, index: int, obs: Any, when: str) -> np.ndarray:
        """The slow path of the observation check: ``obs`` as an array if the batch can hold
        it exactly, else a ValueError naming the env, the step and what the space expects.

        Accepted: the space's shape exactly (numpy would broadcast others), with, for a float
        batch, any bool, integer or float dtype, and for a uint8 (image) batch, uint8 or
        bool/integer values within 0-255 (floats would be truncated).
        """
        try:
            arr = np.asarray(obs)
        except Exception as exc:  # ragged lists and the like
            self._raise_bad_obs(index, when, f"that numpy cannot read as an array "
                                f"({type(obs).__name__}; {type(exc).__name__}: {exc})")
        got = f"{type(obs).__name__}, dtype {arr.dtype}"
        if arr.shape != self.obs_shape:
            self._raise_bad_obs(index, when, f"of shape {arr.shape} ({got})")
        kind = arr.dtype.kind
        if self.obs_dtype == np.uint8:
            ok = arr.dtype == np.uint8 or (kind in "biu" and (
                arr.size == 0 or (int(arr.min()) >= 0 and int(arr.max()) <= 255)))
        else:
            ok = kind in "biuf"
        if not ok:
            self._raise_bad_obs(index, when, f"of dtype {arr.dtype} ({type(obs).__name__}, "
                                f"shape {arr.shape})")
        return arr

    def checked_step(self, index: int, reward: Any, terminated: Any, truncated: Any,
                     step: int) -> tuple[float, bool, bool]:
        """The slow path of the check on step()'s reward and end flags: a real number and two
        bools (Python's or numpy's), returned as ``float`` and ``bool``; anything else is a
        ValueError naming the env, the step, the value and its type (``terminated=None`` would
        otherwise never end an episode, ``"no"`` end every step)."""
        for name, value in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(value, bool | np.bool_):
                self._raise_bad_step(index, step, name, value, "a bool (True or False)")
        real = (isinstance(reward, int | float | np.integer | np.floating)
                or (isinstance(reward, np.ndarray) and reward.shape == ()
                    and reward.dtype.kind in "iuf"))
        if not real or isinstance(reward, bool | np.bool_):
            self._raise_bad_step(index, step, "reward", reward, "a real number (int or float)")
        return float(reward), bool(terminated), bool(truncated)

    def _raise_bad_step(self, index: int, step: int, name: str, value: Any, expected: str
                        ) -> None:
        raise _located(
            f"env {self.env_id!r} (env index {index} of worker {self.worker_index}) returned "
            f"{name}={value!r} ({type(value).__name__}) from step() at env step {step}: "
            f"{name} must be {expected}, as gymnasium's Env.step documents. Fix the env (or "
            "wrap it to convert its output); impala_lab will not guess what the value means.")

    def _raise_bad_obs(self, index: int, when: str, what: str) -> None:
        raise _located(
            f"env {self.env_id!r} (env index {index} of worker {self.worker_index}) returned "
            f"an observation {what} {when}, but its observation space "
            f"{self.observation_space} expects shape {self.obs_shape} and dtype "
            f"{self.space_dtype}. Fix the env (or wrap it to reshape or cast its "
            "observation); numpy would otherwise broadcast or cast it into the batch and the "
            "policy would train on corrupted data.")

    def check_row(self, row: np.ndarray, t: int, step: int, terminateds: np.ndarray,
                  truncateds: np.ndarray) -> None:
        """Raise for the first env whose observation in ``row`` (the one after row ``t``'s
        step, env step ``step``) is not finite."""
        bad = ~np.isfinite(row.reshape(len(row), -1)).all(axis=1)
        i = int(np.argmax(bad))
        reset = bool(terminateds[t, i] or truncateds[t, i])
        when = f"from reset() after env step {step}" if reset else f"at env step {step}"
        self.raise_nonfinite(i, "observation", row[i], when)

    def raise_nonfinite(self, index: int, quantity: str, value: Any, when: str) -> None:
        """Raise a ValueError: env ``index`` returned a non-finite ``quantity``."""
        text = np.array2string(np.asarray(value), threshold=8, precision=4)
        raise _located(
            f"env {self.env_id!r} (env index {index} of worker {self.worker_index}) returned "
            f"a non-finite {quantity} {when}: {text}. "
            "Fix the env (or wrap it to clip/validate its output); a NaN here would "
            "otherwise surface as a NaN loss much later.")


def _located(message: str) -> ValueError:
    """A ValueError marked located: the worker adds no second note."""
    err = ValueError(message)
    err._impala_lab_located = True  # type: ignore[attr-defined]
    return err


class Int64Discrete(gym.spaces.Discrete):
    """A `Discrete` space whose ``contains`` answers an ``np.int64`` scalar (the worker's
    actions) with the range test alone; envs such as CartPole call it on every step, and
    gymnasium's dtype tests are a large share of such a worker's CPU."""

    def contains(self, x: Any) -> bool:
        if type(x) is np.int64:
            return bool(self.start <= x < self.start + self.n)
        return super().contains(x)

    @classmethod
    def like(cls, space: gym.spaces.Discrete) -> Int64Discrete:
        """An `Int64Discrete` equal to ``space`` that draws from ``space``'s generator."""
        return cls(int(space.n), seed=space.np_random, start=int(space.start))


def fast_int64_action_check(env: gym.Env) -> None:
    """Replaces ``env``'s own int64 `Discrete` action space by an equal `Int64Discrete`
    (the same answers, faster); any other action space is left alone."""
    unwrapped = env.unwrapped
    space = getattr(unwrapped, "action_space", None)
    if type(space) is gym.spaces.Discrete and space.dtype == np.int64:
        unwrapped.action_space = Int64Discrete.like(space)
