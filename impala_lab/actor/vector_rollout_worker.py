"""`VectorRolloutWorker`: a rollout worker whose B envs are one gymnasium ``VectorEnv``.

Same batches as `impala_lab.actor.rollout_worker.RolloutWorker` (layout, episode ends,
truncation bootstrap, LSTM resets, checks), but each row is one ``VectorEnv.step`` of all B
envs: for an env with a vectorised implementation (CartPole-v1's) one numpy call instead of B
Python calls. The vector env must reset SAME_STEP (`impala_lab.envs.vector.make_vector_env`):
the step that ends env ``i``'s episode returns the next episode's first observation at ``i``
and the final one in ``info["final_obs"][i]``. The B envs share one random generator (seeded
from env 0's seed), so the two workers' batches agree in law, not in bits. numpy and gymnasium
only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from impala_lab.actor.policy_output import Fragment
from impala_lab.actor.rollout_worker import RolloutWorker

__all__ = ["VectorRolloutWorker", "make_registered_vector_env"]

VectorEnvMaker = Callable[[str, int], gym.vector.VectorEnv]


def make_registered_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """The id's registered vectorised implementation, as gymnasium makes it."""
    return gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point")


class VectorRolloutWorker(RolloutWorker):
    """`RolloutWorker` over one vector env of ``num_envs`` copies of a registered env id.

    Args: ``env``, a registered env id; ``make_vector_env(env, num_envs)`` builds the vector
    env (None: `make_registered_vector_env`); the rest as `RolloutWorker`'s. Raises ValueError
    if the vector env cannot be built or does not reset SAME_STEP (naming the env and the
    fix), or as `RolloutWorker`.
    """

    _venv: gym.vector.VectorEnv | None = None

    def __init__(self, env: str, *args: Any, make_vector_env: VectorEnvMaker | None = None,
                 **kwargs: Any) -> None:
        self._make_vector_env = make_vector_env or make_registered_vector_env
        super().__init__(env, *args, **kwargs)

    def _build_envs(self, num_envs: int, conv_filters: Sequence[Sequence[int]] | None) -> None:
        if not isinstance(self._env_spec, str):
            raise ValueError(
                f"RolloutWorker: vector_env=True needs a registered env id, not the factory "
                f"{self.env_id!r}; set vector_env=False")
        try:
            self._venv = self._make_vector_env(self._env_spec, num_envs)
        except ValueError:
            raise
        except Exception as err:
            raise ValueError(
                f"RolloutWorker could not build the vector env of {self.env_id!r} (worker "
                f"{self.worker_index}): {type(err).__name__}: {err}") from err
        if getattr(self._venv, "num_envs", None) != num_envs:
            got = getattr(self._venv, "num_envs", None)
            self.close()
            raise ValueError(
                f"RolloutWorker: the vector env of {self.env_id!r} holds num_envs={got!r} "
                f"envs, but the worker was asked for {num_envs}; its maker must build "
                "exactly num_envs copies")
        mode = getattr(self._venv, "metadata", {}).get("autoreset_mode")
        if getattr(mode, "value", mode) != gym.vector.AutoresetMode.SAME_STEP.value:
            name = type(self._venv).__name__
            self.close()
            raise ValueError(
                f"RolloutWorker: the vector env {name} of {self.env_id!r} resets with "
                f"autoreset mode {getattr(mode, 'name', mode)}; the batches need SAME_STEP "
                "(the reset in the step that ended the episode). Make it with "
                "impala_lab.envs.vector.make_vector_env, which adapts CartPole's, or set "
                "vector_env=False")
        self._set_spaces(self._venv.single_observation_space, self._venv.single_action_space,
                         conv_filters)
        self._rows_shape = (num_envs, *self._obs_shape)
        self._ep_ret = np.zeros(num_envs, np.float64)  # each env's running return
        self._ep_len = np.zeros(num_envs, np.int64)

    def _reset_all(self, env_seeds: list[int]) -> None:
        obs, _ = self._venv.reset(seed=env_seeds[0])
        self._obs[:] = self._checked_rows(obs, "from reset() before any step")

    def _checked_rows(self, obs: Any, when: str) -> np.ndarray:
        """The vector env's ``obs`` [B, *obs_shape], checked as the per-env worker's are."""
        if (type(obs) is np.ndarray and obs.shape == self._rows_shape
                and obs.dtype is self._space_dtype):
            return obs
        if not hasattr(obs, "__len__") or len(obs) != self.num_envs:
            self._checks.checked_obs(0, obs, f"{when} (the vector env's observations, "
                                     f"expected {self.num_envs} rows)")
        return np.stack([self._checks.checked_obs(i, o, when) for i, o in enumerate(obs)])

    def _checked_flags(self, name: str, value: Any, step: int) -> np.ndarray:
        if type(value) is np.ndarray and value.dtype == np.bool_ and value.shape == (
                self.num_envs,):
            return value
        raise ValueError(
            f"env {self.env_id!r} (vector env of worker {self.worker_index}) returned "
            f"{name}={value!r} from step() at env step {step}: a vector env's {name} must be "
            f"a bool array of shape ({self.num_envs},). Fix the env or set vector_env=False.")

    def _step_all(self, frag: Fragment, first_step: int) -> None:
        """Fills ``frag``: T rows, each one policy forward and one step of the vector env."""
        venv, state, obs_buf = self._venv, self._state, frag.obs
        stack_actions = self._policy_output.continuous  # a Box's env actions: a list of rows
        t, where = 0, ""
        try:
            for t in range(self._T):
                where = "computing the policy's actions"
                acts, state = self._act(frag, t, state)
                where = "stepping the vector env"
                o, r, term, trunc, info = venv.step(np.stack(acts) if stack_actions else acts)
                step = first_step + t
                o = self._checked_rows(o, f"from step() at env step {step}")
                term = self._checked_flags("terminated", term, step)
                trunc = self._checked_flags("truncated", trunc, step)
                r = np.asarray(r, np.float64)  # checked per fragment, in sample()
                self._ep_ret += r
                self._ep_len += 1
                obs_buf[t + 1] = o
                finals = None
                ended = term | trunc
                if ended.any():
                    finals = self._end_episodes(frag, t, term, trunc, info)
                self._end_row(frag, t, r, finals, state)
            self._state = state
        except Exception as err:
            self._locate(err, where, t)
            raise

    def _end_episodes(self, frag: Fragment, t: int, term: np.ndarray, trunc: np.ndarray,
                      info: dict[str, Any]) -> list[tuple[int, Any]] | None:
        """Records the episodes that ended at row ``t``; returns the truncated ones' ``(index,
        final observation)``."""
        frag.terminateds[t] = term
        frag.truncateds[t] = trunc & ~term  # both set counts as terminated
        ended = np.flatnonzero(term | trunc)
        frag.done_returns.extend(self._ep_ret[ended].tolist())
        frag.done_lengths.extend(self._ep_len[ended].tolist())
        self._ep_ret[ended] = 0.0
        self._ep_len[ended] = 0
        truncated = np.flatnonzero(frag.truncateds[t])
        if not len(truncated):
            return None
        final_obs, mask = info.get("final_obs"), info.get("_final_obs")
        if final_obs is None or mask is None or not all(mask[i] for i in truncated):
            raise ValueError(
                f"env {self.env_id!r} (vector env of worker {self.worker_index}) truncated "
                f"env index {int(truncated[0])} at env step {self._steps_per_env + 1} without "
                "info['final_obs'] for it: a SAME_STEP vector env must return each ended "
                "episode's final observation there (its bootstrap value needs it)")
        when = f"at env step {self._steps_per_env + 1} (info['final_obs'])"
        return [(int(i), np.array(self._checks.checked_obs(int(i), final_obs[i], when)))
                for i in truncated]

    def close(self) -> None:
        """Closes the vector env (idempotent)."""
        self._closed = True
        venv, self._venv = self._venv, None
        if venv is not None:
            with contextlib.suppress(Exception):  # must not mask the error that led here
                venv.close()
