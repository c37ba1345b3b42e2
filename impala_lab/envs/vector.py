"""Vectorised envs: all of a worker's copies of an env stepped in one numpy call
(``vector_env=True``, `impala_lab.actor.vector_rollout_worker`), where gymnasium registers a
``vector_entry_point`` for the id (CartPole-v1's ``CartPoleVectorEnv``).

The batches need an ended episode reset in the same step (``AutoresetMode.SAME_STEP``: the
step returns the next episode's first observation, the final one in ``info["final_obs"]``,
which a truncated episode's bootstrap needs). gymnasium's CartPole vector env resets in the
next step instead (NEXT_STEP: a step no policy took); `ADAPTERS` maps such a class to a
SAME_STEP adapter (`SameStepCartPole`). Any other NEXT_STEP env is refused before a worker
starts (`vector_env_problem`). Imports numpy and gymnasium only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, VectorEnv

__all__ = ["ADAPTERS", "SameStepCartPole", "make_vector_env", "vector_env_problem"]


class SameStepCartPole(CartPoleVectorEnv):
    """gymnasium's ``CartPoleVectorEnv`` (its ``step`` unchanged) with SAME_STEP autoreset:
    a finished cart's ``obs[i]`` is the new episode's first observation and
    ``info["final_obs"][i]`` the old one's last."""

    metadata = {**CartPoleVectorEnv.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500,
                 render_mode: str | None = None, sutton_barto_reward: bool = False) -> None:
        super().__init__(num_envs=num_envs, max_episode_steps=max_episode_steps,
                         render_mode=render_mode, sutton_barto_reward=sutton_barto_reward)
        # The parent's step state this class relies on; a gymnasium that renamed it would
        # otherwise fail deep inside a worker's first step.
        missing = [a for a in ("steps", "prev_done", "low", "high") if not hasattr(self, a)]
        if missing:
            raise RuntimeError(
                f"SameStepCartPole: gymnasium {gym.__version__}'s CartPoleVectorEnv has no "
                f"{', '.join(missing)}; install the gymnasium that pyproject.toml names or set "
                "vector_env=False")
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self._no_resets = np.zeros(num_envs, np.bool_)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 np.ndarray, dict[str, Any]]:
        # The parent resets the carts flagged in prev_done at the start of its step; none are,
        # as this class resets them as they finish (the parent replaces the array, so one
        # all-False array serves every step).
        self.prev_done = self._no_resets
        obs, reward, terminated, truncated, _ = super().step(action)
        done = self.prev_done  # the parent's new array: terminated | truncated
        if not done.any():
            return obs, reward, terminated, truncated, {}
        n = int(done.sum())
        # The parent's reset draw for a subset of carts (its step draws the same way).
        self.state[:, done] = self.np_random.uniform(low=self.low, high=self.high, size=(4, n))
        self.steps[done] = 0
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i in np.flatnonzero(done):
            final_obs[i] = obs[i].copy()
        obs[done] = self.state[:, done].T.astype(np.float32)
        return obs, reward, terminated, truncated, {"final_obs": final_obs, "_final_obs": done}


# A NEXT_STEP vector env class -> its SAME_STEP adapter (same constructor arguments).
ADAPTERS: dict[type, type] = {CartPoleVectorEnv: SameStepCartPole}


def _resolve(entry: Any) -> Any:
    """A ``vector_entry_point`` (a class or a "module:attr" string) as the class."""
    if isinstance(entry, str):
        from gymnasium.envs.registration import load_env_creator

        return load_env_creator(entry)
    return entry


def _autoreset_mode(cls: Any) -> Any:
    mode = (getattr(cls, "metadata", None) or {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    return AutoresetMode(mode) if isinstance(mode, str) else mode


def vector_env_problem(env: Any) -> str | None:
    """Why ``env`` cannot run with ``vector_env=True`` (with the fix), or None."""
    if not isinstance(env, str):
        return ("an env factory has no vectorised implementation; give a registered env id "
                "whose vector_entry_point gymnasium knows (CartPole-v1 has one), or set "
                "vector_env=False")
    entry = getattr(gym.spec(env), "vector_entry_point", None)
    if entry is None:
        return (f"gymnasium has no vectorised implementation of {env!r} (its registration "
                "names no vector_entry_point; CartPole-v1 has one); set vector_env=False, or "
                "register the id with a vector_entry_point")
    try:
        cls = _resolve(entry)
    except Exception as exc:  # an entry point whose module does not import
        return f"its vector_entry_point {entry!r} could not be loaded ({type(exc).__name__}: {exc})"
    if cls in ADAPTERS or _autoreset_mode(cls) == AutoresetMode.SAME_STEP:
        return None
    return (f"its vectorised implementation {getattr(cls, '__name__', cls)!r} resets an "
            f"ended episode with autoreset mode {_autoreset_mode(cls).name}, and the batches "
            "need SAME_STEP (the reset in the step that ended the episode); set "
            "vector_env=False, or register a vector_entry_point that resets SAME_STEP")


def make_vector_env(env_id: str, num_envs: int) -> VectorEnv:
    """``num_envs`` copies of ``env_id`` as one SAME_STEP ``VectorEnv`` (the id's registered
    vector env, or its adapter from `ADAPTERS`), with the registration's keyword arguments
    and time limit.

    Raises:
      ValueError: if `vector_env_problem` names a problem.
    """
    problem = vector_env_problem(env_id)
    if problem is not None:
        raise ValueError(f"vector_env=True with env={env_id!r}: {problem}")
    spec = gym.spec(env_id)
    adapter = ADAPTERS.get(_resolve(spec.vector_entry_point))
    if adapter is not None:  # a copy of the registration: gymnasium's own stays as it is
        spec = dataclasses.replace(spec, vector_entry_point=adapter)
    # gymnasium passes the registration's keyword arguments and time limit on
    return gym.make_vec(spec, num_envs, vectorization_mode="vector_entry_point")
