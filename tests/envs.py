"""Tiny deterministic gymnasium envs for the project's tests (registered nowhere).

Pass them to a worker as factories, e.g. ``functools.partial(FixedLengthEnv, length=3)``
or the class itself. All but `RecordingBoxEnv` have ``Discrete(n_actions)`` actions; all but
`ImageEnv` (uint8 images) have ``Box`` float32 observations. They are importable
(``tests.envs``) so spawned worker processes can unpickle them.

Every env refuses ``step()`` after its episode ended until ``reset()`` is called, so a
worker with an autoreset bug fails loudly instead of recording a bogus transition.
`factory_cycle` makes one factory of several, for a worker whose envs differ.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


class FixedLengthEnv(gym.Env):
    """An episode ends exactly after ``length`` steps (terminated, or truncated if asked).

    Observation (float32, shape [obs_dim]): ``obs[0]`` = steps taken in the episode (0
    after reset, ``length`` in the final obs); ``obs[1]`` = episode index (resets since
    construction, the first episode is 0); ``obs[2]`` = the last action taken (-1 after
    reset); further entries are 0. So a test can read the episode boundaries off the obs.
    A seeded ``reset(seed=...)`` restarts the episode count.

    Reward: ``reward`` per step; if ``rewarded_action`` is given, ``reward`` only when the
    action equals it and 0 otherwise (a one-step bandit a learner can solve).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        length: int = 5,
        obs_dim: int = 2,
        n_actions: int = 2,
        reward: float = 1.0,
        truncate: bool = False,
        rewarded_action: int | None = None,
    ) -> None:
        if length < 1:
            raise ValueError(f"FixedLengthEnv: length={length} must be >= 1.")
        if obs_dim < 1:
            raise ValueError(f"FixedLengthEnv: obs_dim={obs_dim} must be >= 1.")
        self.length = length
        self.obs_dim = obs_dim
        self.reward = float(reward)
        self.truncate = truncate
        self.rewarded_action = rewarded_action
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(n_actions)
        self.t = 0
        self.episode = -1
        self.total_steps = 0  # step() calls since construction
        self.last_seed: int | None = None
        self._done = True

    def _obs(self, last_action: int) -> np.ndarray:
        obs = np.zeros(self.obs_dim, np.float32)
        values = (self.t, self.episode, last_action)
        obs[: min(self.obs_dim, 3)] = values[: self.obs_dim]
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:  # a seeded reset restarts the episode count (deterministic obs)
            self.last_seed = seed
            self.episode = -1
        self.t = 0
        self.episode += 1
        self._done = False
        return self._obs(-1), {}

    def _reward(self, action: int) -> float:
        if self.rewarded_action is None or action == self.rewarded_action:
            return self.reward
        return 0.0

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError(
                f"{type(self).__name__}.step() called after the episode ended (episode "
                f"{self.episode}, t={self.t}) without reset()"
            )
        action = int(action)
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action} for {self.action_space}")
        self.total_steps += 1
        self.t += 1
        done = self.t >= self.length
        self._done = done
        terminated = done and not self.truncate
        truncated = done and self.truncate
        return self._obs(action), self._reward(action), terminated, truncated, {}


class RaisingEnv(FixedLengthEnv):
    """A `FixedLengthEnv` whose ``step()`` raises ``RuntimeError("boom at step N")`` on every
    ``every``-th call (N counts step() calls since construction, from 1)."""

    def __init__(self, every: int = 10, length: int = 5, **kwargs: Any) -> None:
        super().__init__(length=length, **kwargs)
        self.every = every

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if (self.total_steps + 1) % self.every == 0:
            self.total_steps += 1
            raise RuntimeError(f"boom at step {self.total_steps}")
        return super().step(action)


class NaNEnv(FixedLengthEnv):
    """A `FixedLengthEnv` that returns a NaN observation (or reward, ``field="reward"``) from
    the ``at_step``-th ``step()`` call since construction (from 1); ``at_step=0`` makes the
    first ``reset()`` return a NaN observation. ``value`` replaces NaN (e.g. ``1e39``, a
    reward finite as a Python float and infinite as float32)."""

    def __init__(self, at_step: int = 3, field: str = "obs", length: int = 5,
                 value: float = float("nan"), **kwargs: Any) -> None:
        if field not in ("obs", "reward"):
            raise ValueError(f"NaNEnv: field={field!r} must be 'obs' or 'reward'.")
        super().__init__(length=length, **kwargs)
        self.at_step = at_step
        self.field = field
        self.value = value

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = super().reset(**kwargs)
        if self.at_step == 0 and self.episode == 0:
            obs[0] = np.nan
        return obs, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self.total_steps == self.at_step:
            if self.field == "obs":
                obs[0] = self.value
            else:
                reward = self.value
        return obs, reward, terminated, truncated, info


class WrongObsEnv(FixedLengthEnv):
    """A `FixedLengthEnv` (observation space ``(obs_dim,)``, default 4) whose ``step()``
    returns a wrongly made observation from its ``at_step``-th call since construction (from
    1) on; ``at_step=0`` makes every ``reset()`` return it instead.

    ``kind``: ``"scalar"`` (the first entry as a Python float), ``"batched"`` (shape
    ``(1, obs_dim)``), ``"short"`` (the first ``obs_dim - 1`` entries), or ones the worker
    accepts as they are: ``"list"`` (a Python list), ``"float64"``, ``"int64"``.
    """

    KINDS = ("scalar", "batched", "short", "list", "float64", "int64")

    def __init__(self, kind: str = "batched", at_step: int = 3, obs_dim: int = 4,
                 length: int = 5, **kwargs: Any) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"WrongObsEnv: kind={kind!r} must be one of {self.KINDS}.")
        super().__init__(length=length, obs_dim=obs_dim, **kwargs)
        self.kind = kind
        self.at_step = at_step

    def _wrong(self, obs: np.ndarray) -> Any:
        return {"scalar": lambda: float(obs[0]), "batched": lambda: obs[None],
                "short": lambda: obs[:-1], "list": lambda: [float(x) for x in obs],
                "float64": lambda: obs.astype(np.float64),
                "int64": lambda: obs.astype(np.int64)}[self.kind]()

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(**kwargs)
        return (self._wrong(obs) if self.at_step == 0 else obs), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if 0 < self.at_step <= self.total_steps:
            obs = self._wrong(obs)
        return obs, reward, terminated, truncated, info


class SlowEnv(FixedLengthEnv):
    """A `FixedLengthEnv` that sleeps ``delay_s`` seconds in every ``step()`` (for timeouts,
    backpressure and throughput tests); ``sleep`` is the sleep it calls."""

    def __init__(self, delay_s: float = 0.01, length: int = 5,
                 sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> None:
        super().__init__(length=length, **kwargs)
        self.delay_s = delay_s
        self.sleep = sleep

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.sleep(self.delay_s)
        return super().step(action)


class HangOnceEnv(FixedLengthEnv):
    """A `FixedLengthEnv` whose ``step()`` blocks (sleeps ``hang_s``, an hour by default) at
    its ``at_step``-th call since construction, in exactly one env of a run: the first to
    create the file ``marker`` (any process; ``O_EXCL``). Every other env steps on as usual,
    so one worker of a run hangs and its replacement does not."""

    def __init__(self, marker: str, at_step: int = 25, hang_s: float = 3600.0, length: int = 5,
                 **kwargs: Any) -> None:
        super().__init__(length=length, **kwargs)
        self.marker = marker
        self.at_step = at_step
        self.hang_s = hang_s

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.total_steps + 1 == self.at_step:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # another env hangs already
            else:
                time.sleep(self.hang_s)
        return super().step(action)


class RecordingBoxEnv(gym.Env):
    """Box actions of shape (1, 2), the first number bounded by [-1, 1], the second unbounded;
    records every action it is given. Episodes last ``length`` (7) steps (truncated)."""

    metadata: dict = {"render_modes": []}
    length = 7

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(np.array([[-1.0, -np.inf]], np.float32),
                                           np.array([[1.0, np.inf]], np.float32))
        self.actions: list[np.ndarray] = []
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if self.t >= self.length:
            raise RuntimeError("RecordingBoxEnv.step() called after the episode ended; call "
                               "reset() first")
        self.actions.append(np.array(action, copy=True))
        self.t += 1
        obs = np.full(2, 0.1 * self.t, np.float32)
        return obs, float(-np.sum(action**2)), False, self.t >= self.length, {}


class ImageEnv(gym.Env):
    """Image observations ``Box(0, 255, (size, size, 3), uint8)`` for CNN tests.

    ``size`` defaults to 20, the smallest image `impala_lab.actor.numpy_model`'s CNN accepts
    (its conv stack needs at least 20x20). The episode ends (terminated) after ``length`` steps.
    Pixel [0, 0, 0] holds the step in the episode, channel 1 is a fixed gradient, channel 2
    is the last action * 100 (0 after reset). Reward 1.0 when the action equals
    ``rewarded_action`` (default 0), else 0.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self, length: int = 5, n_actions: int = 3, rewarded_action: int = 0, size: int = 20
    ) -> None:
        self.length = length
        self.size = size
        self.rewarded_action = rewarded_action
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(n_actions)
        self._gradient = (np.arange(size * size).reshape(size, size) % 256).astype(np.uint8)
        self.t = 0
        self._done = True

    def _obs(self, last_action: int) -> np.ndarray:
        obs = np.zeros((self.size, self.size, 3), np.uint8)
        obs[:, :, 1] = self._gradient
        obs[:, :, 2] = min(255, max(0, last_action) * 100)
        obs[0, 0, 0] = self.t % 256
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self._done = False
        return self._obs(0), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("ImageEnv.step() called after the episode ended without reset()")
        action = int(action)
        self.t += 1
        self._done = self.t >= self.length
        reward = 1.0 if action == self.rewarded_action else 0.0
        return self._obs(action), reward, self._done, False, {}


def factory_cycle(*makers):
    """A zero-argument factory returning makers[0](), makers[1](), ... in turn, and a list
    of the envs built (so tests can inspect them)."""
    it = itertools.cycle(makers)
    built = []

    def make():
        env = next(it)()
        built.append(env)
        return env

    return make, built
