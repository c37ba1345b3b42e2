"""`StatelessCartPole`: CartPole-v1 without the velocities, a task that needs memory.

The observation keeps the cart's position and the pole's angle (RLlib's ``StatelessCartPole``):
a feed-forward policy sees where the pole is, not where it goes; a recurrent one
(``use_lstm=True``) can infer it. Rewards, ends and the 500-step limit are CartPole-v1's.
Importing `impala_lab` registers it as ``impala_lab/StatelessCartPole-v1``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.vector.utils import batch_space

from impala_lab.envs.vector import SameStepCartPole

__all__ = ["ENV_ID", "StatelessCartPole", "StatelessCartPoleVector", "register"]

ENV_ID = "impala_lab/StatelessCartPole-v1"
# The observation entries kept: cart position and pole angle (CartPole's indices 0 and 2).
_KEPT = np.array([0, 2])


class StatelessCartPole(CartPoleEnv):
    """CartPole whose observation is float32 [2]: (cart position, pole angle)."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        high = self.observation_space.high[_KEPT]
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[_KEPT], reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[_KEPT], info


class StatelessCartPoleVector(SameStepCartPole):
    """`SameStepCartPole`'s carts without their velocities (``vector_env=True``)."""

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500,
                 render_mode: str | None = None) -> None:
        super().__init__(num_envs=num_envs, max_episode_steps=max_episode_steps,
                         render_mode=render_mode)
        high = self.single_observation_space.high[_KEPT]
        self.single_observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 np.ndarray, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        if info:
            info["final_obs"] = np.array([None if o is None else o[_KEPT]
                                          for o in info["final_obs"]], dtype=object)
        return obs[:, _KEPT], reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[:, _KEPT], info


def register() -> None:
    """Registers ``impala_lab/StatelessCartPole-v1`` with its SAME_STEP vector env."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point=StatelessCartPole, max_episode_steps=500,
                     reward_threshold=475.0, vector_entry_point=StatelessCartPoleVector)
