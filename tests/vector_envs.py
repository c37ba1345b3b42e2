"""A deterministic toy env in two implementations, one env and a SAME_STEP vector env, for
comparing the rollout workers' two paths (`tests/test_vector_env.py`).

`ActionCount`: the observation is float32 (steps taken, actions counted) / 10; an action
"counts" when it is 1 or 2 (Discrete(3)) or, for a Box(-1, 1, (2,)) space, when the sum of
its clipped entries is positive. The episode terminates at 3 counted actions and is
truncated at 6 steps (both on the same step is possible); the reward is the count plus 0.25
per step taken. Nothing is random, so both implementations give the same trajectories for
the same actions, and episode ends fall at different steps in different envs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

ENV_ID = "impala_lab_test/ActionCount-v0"
BOX_ENV_ID = "impala_lab_test/ActionCountBox-v0"
TERMINATE_AT, TRUNCATE_AT = 3, 6


def _action_space(box: bool) -> gym.Space:
    return gym.spaces.Box(-1.0, 1.0, (2,), np.float32) if box else gym.spaces.Discrete(3)


def _counts(actions: np.ndarray, box: bool) -> np.ndarray:
    if box:
        return (np.clip(actions, -1, 1).sum(axis=-1) > 0).astype(np.int64)
    return (np.asarray(actions) > 0).astype(np.int64)


class ActionCount(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, box: bool = False) -> None:
        self.box = box
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = _action_space(box)
        self.t = self.s = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.s], np.float32) / np.float32(10)

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = self.s = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        c = int(_counts(np.asarray(action)[None], self.box)[0])
        self.t += 1
        self.s += c
        reward = float(c + 0.25 * self.t)
        return self._obs(), reward, self.s >= TERMINATE_AT, self.t >= TRUNCATE_AT, {}


class ActionCountVector(VectorEnv):
    metadata: dict[str, Any] = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, box: bool = False) -> None:
        self.num_envs = num_envs
        self.box = box
        self.single_observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.single_action_space = _action_space(box)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.t = np.zeros(num_envs, np.int64)
        self.s = np.zeros(num_envs, np.int64)

    def _obs(self) -> np.ndarray:
        return np.stack([self.t, self.s], axis=1).astype(np.float32) / np.float32(10)

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        self.t[:] = 0
        self.s[:] = 0
        return self._obs(), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray, dict]:
        c = _counts(actions, self.box)
        self.t += 1
        self.s += c
        reward = (c + 0.25 * self.t).astype(np.float64)
        terminated, truncated = self.s >= TERMINATE_AT, self.t >= TRUNCATE_AT
        obs = self._obs()
        done = terminated | truncated
        info: dict[str, Any] = {}
        if done.any():
            final = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final[i] = obs[i].copy()
            info = {"final_obs": final, "_final_obs": done}
            self.t[done] = 0
            self.s[done] = 0
            obs = self._obs()
        return obs, reward, terminated, truncated, info


def register() -> None:
    for env_id, box in ((ENV_ID, False), (BOX_ENV_ID, True)):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=ActionCount, vector_entry_point=ActionCountVector,
                         kwargs={"box": box})
