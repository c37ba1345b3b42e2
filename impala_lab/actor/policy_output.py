"""What a rollout worker does with its policy's output before the envs see it.

`Fragment` holds the arrays one `RolloutWorker.sample` fills. `PolicyOutput` checks each
forward pass's distribution inputs (a non-finite mean, log-std or logit is named, with the
weights version, instead of surfacing later as a NaN loss) and turns the sampled actions
[N, *action_shape] into what each env's ``step`` takes: a Discrete index as it is, a Box
action clipped to the space's finite bounds (``clip_actions``) or squashed into them
(``squash_actions``), in the space's shape. The batch keeps the draw itself. numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from impala_lab.actor.distributions import squash_to_bounds

__all__ = ["Fragment", "PolicyOutput"]


class Fragment:
    """The arrays one `RolloutWorker.sample` fills, time-major: ``obs`` [T + 1, B, ...] (row
    T: after the last step), ``actions`` [T, B, *action_shape], ``logits`` [T, B, A],
    ``rewards64`` [T, B] float64 (checked before the cast), ``terminateds``, ``truncateds``
    and ``truncation_values`` [T, B]; ``done_returns``/``done_lengths`` of the episodes that
    ended, in (step, env index) order; ``finals``: (env index, step, final observation).
    """

    __slots__ = ("actions", "done_lengths", "done_returns", "finals", "logits", "obs",
                 "rewards64", "terminateds", "truncateds", "truncation_values")

    def __init__(self, T: int, n: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                 num_actions: int, action_shape: tuple[int, ...], action_dtype: np.dtype
                 ) -> None:
        self.obs = np.empty((T + 1, n, *obs_shape), obs_dtype)
        self.actions = np.empty((T, n, *action_shape), action_dtype)
        self.logits = np.empty((T, n, num_actions), np.float32)
        self.rewards64 = np.empty((T, n), np.float64)
        self.terminateds = np.zeros((T, n), np.bool_)
        self.truncateds = np.zeros((T, n), np.bool_)
        self.truncation_values = np.zeros((T, n), np.float32)
        self.done_returns: list[float] = []
        self.done_lengths: list[int] = []
        self.finals: list[tuple[int, int, np.ndarray]] = []

    def final_obs(self) -> np.ndarray:
        """The batch's ``final_obs`` [N, *obs_shape]: ``finals`` by env, then by step."""
        rows = [o for _, _, o in sorted(self.finals, key=lambda f: f[:2])]
        if not rows:
            return np.empty((0, *self.obs.shape[2:]), self.obs.dtype)
        return np.stack(rows).astype(self.obs.dtype, copy=False)


class PolicyOutput:
    """One worker's checks of its policy's output and its actions' way to the envs.

    Args: the action ``distribution`` class (`impala_lab.actor.distributions`), the envs'
    ``action_space``, ``clip_actions`` and ``squash_actions`` (`squash_to_bounds`) as the
    config's.
    """

    def __init__(self, distribution: Any, action_space: Any, clip_actions: bool,
                 squash_actions: bool = False) -> None:
        self.distribution = distribution
        self.continuous = distribution.has_log_std
        self.clip_actions = bool(clip_actions)
        self.squash_actions = bool(squash_actions)
        if self.continuous:
            self._low = np.asarray(action_space.low, np.float64).reshape(-1)
            self._high = np.asarray(action_space.high, np.float64).reshape(-1)
            self._clip = self.clip_actions and bool(
                np.isfinite(self._low).any() or np.isfinite(self._high).any())
            self._shape = tuple(action_space.shape)
            self._dtype = np.dtype(action_space.dtype)

    def check(self, inputs: np.ndarray, version: int) -> None:
        """Raise ValueError naming the part of ``inputs`` [N, A] that is not finite."""
        if np.isfinite(inputs).all():
            return
        row, col = (int(k) for k in np.argwhere(~np.isfinite(inputs))[0])
        if self.continuous:
            d = inputs.shape[1] // 2
            part = f"mean[{col}]" if col < d else f"log_std[{col - d}]"
        else:
            part = f"logits[{col}]"
        raise ValueError(
            f"the policy's output {part} is {inputs[row, col]} for env index {row} (weights "
            f"version {version}): the weights hold NaN or inf, or overflow on this "
            "observation. The learner's updates were not finite (lower lr or grad_clip), or "
            "the observations are far out of scale (normalise them).")

    def env_actions(self, actions: np.ndarray, inputs: np.ndarray, version: int) -> Any:
        """What each env's ``step`` takes, per row of ``actions``: the index (Discrete), or the
        [D] row squashed or clipped and in the space's shape (Box)."""
        if not self.continuous:
            return actions
        if not np.isfinite(actions).all():
            row = int(np.argwhere(~np.isfinite(actions).all(axis=1))[0, 0])
            raise ValueError(
                f"the policy's sampled action for env index {row} is not finite "
                f"({actions[row]}) although its mean and log_std are (weights version "
                f"{version}): exp(log_std) overflowed; max log_std is "
                f"{float(np.max(inputs[row, inputs.shape[1] // 2:])):.4g}")
        if self.squash_actions:
            out = squash_to_bounds(actions, self._low, self._high)
        else:
            out = np.clip(actions, self._low, self._high) if self._clip else actions
        out = out.astype(self._dtype, copy=False)
        return [a.reshape(self._shape) for a in out]
