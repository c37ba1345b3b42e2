"""`SampleBatch`: time-major rollout fragments, concatenated along the batch axis.

A rollout worker steps B envs for T steps and returns one `SampleBatch` of shape [T, B]
(T = ``sample_batch_size``, B = ``num_envs_per_worker``). The driver concatenates several
of them along B into a train batch, the learner may split a train batch across devices
along B again, and the replay buffer stores them as they are. Every array is plain numpy,
so a batch pickles cheaply between processes and saves to ``.npz`` with `to_dict`.

Fields (time-major; A = width of the action distribution's inputs, D = a Box action
space's flattened size, K = episodes that ended in the fragment):

    obs               [T, B, *obs_shape]  observation the action was taken in
                                          (float32, or uint8 for images)
    actions           [T, B]      int64, a Discrete space's action indices; or
                      [T, B, D]   float32, a Box space's actions as sampled (not clipped)
    rewards           [T, B]      float32, raw env reward
    terminateds       [T, B]      bool, episode ended by the MDP (discount 0)
    truncateds        [T, B]      bool, episode cut by a time limit (bootstrap)
    truncation_values [T, B]      float32, behaviour value V(final_obs) at truncated steps,
                                  0 elsewhere (the learner adds gamma * truncation_values
                                  to the reward there and uses discount 0)
    behaviour_logits  [T, B, A]   float32, the behaviour policy's distribution inputs:
                                  logits (Discrete), or D means then D log-stds (Box)
    bootstrap_obs     [B, *obs_shape]  observation after the last step (for V(x_T))
    policy_versions   [B]         int64, weights version that produced each column
    episode_returns   [K]         float64
    episode_lengths   [K]         int64
    state_in          [B, 2, C]   float32, recurrent policies only (None otherwise): each
                                  column's LSTM state (h, c) before step 0, as the actor
                                  held it (zeros at an episode's start); C = lstm_cell_size
    final_obs         [N, *obs_shape]  the final observation of each truncated step, column
                                  by column and in time order within a column (N =
                                  truncateds.sum()), for a bootstrap from the learner's value
                                  (``truncation_bootstrap="learner"``); None if not recorded

``state_in`` and ``final_obs`` are optional (None): `to_dict` leaves them out, and joining
needs each in all batches or in none. ``final_obs`` rows are in column order, so joining
along B appends them and a slice of columns owns one contiguous run. numpy only (actor
processes import this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SampleBatch", "concat_samples", "FIELDS", "OPTIONAL_FIELDS"]

# Fields laid out [T, B, ...]: concatenated along axis 1, sliced along axis 1.
_TIME_MAJOR = ("obs", "actions", "rewards", "terminateds", "truncateds", "truncation_values",
               "behaviour_logits")
# Fields laid out [B, ...]: concatenated and sliced along axis 0.
_PER_COLUMN = ("bootstrap_obs", "policy_versions")
# Fields laid out [K]: episodes that ended in the fragment; concatenated along axis 0.
_EPISODES = ("episode_returns", "episode_lengths")

# Every field, in declaration order.
FIELDS: tuple[str, ...] = _TIME_MAJOR + _PER_COLUMN + _EPISODES
# Fields that may be None (laid out [B, ...], like _PER_COLUMN).
OPTIONAL_FIELDS: tuple[str, ...] = ("state_in", "final_obs")

# Fixed dtypes; obs/bootstrap_obs may be float32 or uint8 (checked separately).
# actions: int64 [T, B] (Discrete) or float32 [T, B, D] (Box), by rank.
_ACTION_DTYPES = {2: np.dtype(np.int64), 3: np.dtype(np.float32)}
_DTYPES = {name: np.dtype(t) for name, t in (
    ("rewards", np.float32), ("terminateds", np.bool_), ("truncateds", np.bool_),
    ("truncation_values", np.float32), ("behaviour_logits", np.float32),
    ("policy_versions", np.int64), ("episode_returns", np.float64),
    ("episode_lengths", np.int64))}
_OBS_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8))


@dataclass(eq=False, repr=False)
class SampleBatch:
    """One or more rollout fragments, time-major [T, B] (see the module docstring).

    Arrays are stored as given (no copy, no check: call `validate`). ``eq=False``: compare
    batches with ``to_dict`` and numpy, not ``==``.
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    truncation_values: np.ndarray
    behaviour_logits: np.ndarray
    bootstrap_obs: np.ndarray
    policy_versions: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    state_in: np.ndarray | None = None
    final_obs: np.ndarray | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def T(self) -> int:
        """Unroll length: number of time steps per column."""
        return int(self.actions.shape[0])

    @property
    def B(self) -> int:
        """Number of columns (env trajectories side by side)."""
        return int(self.actions.shape[1])

    @property
    def count(self) -> int:
        """Env steps in the batch, T * B (RLlib's ``SampleBatch.count``)."""
        shape = self.actions.shape
        return int(shape[0] * shape[1])

    @property
    def num_actions(self) -> int:
        """A, the last axis of ``behaviour_logits``."""
        return int(self.behaviour_logits.shape[-1])

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """Shape of one observation, ``obs.shape[2:]``."""
        return tuple(self.obs.shape[2:])

    @property
    def nbytes(self) -> int:
        """Total bytes held by the arrays (what a pickle or an ``.npz`` roughly costs)."""
        return int(sum(getattr(self, name).nbytes for name in self._present()))

    def _present(self) -> tuple[str, ...]:
        """FIELDS, then the optional fields that are not None."""
        return FIELDS + tuple(n for n in OPTIONAL_FIELDS if getattr(self, n) is not None)

    def __repr__(self) -> str:
        parts = [f"T={self.T}", f"B={self.B}"]
        for name in self._present():
            a = getattr(self, name)
            parts.append(f"{name}={a.dtype}{list(a.shape)}")
        return "SampleBatch(" + ", ".join(parts) + ")"

    # ------------------------------------------------------------------ checks
    def validate(self, check_values: bool = False) -> SampleBatch:
        """Checks that every field has the documented shape and dtype; returns self.

        Args:
          check_values: also check the contents (a pass over the data, for debugging):
            floats finite, no step both terminated and truncated, truncation_values 0 off
            truncated steps, episode lengths >= 1.

        Raises:
          ValueError: naming the field, its shape or dtype, and what was expected.
        """
        for name in self._present():
            a = getattr(self, name)
            if not isinstance(a, np.ndarray):
                raise ValueError(
                    f"SampleBatch field {name!r} is {type(a).__name__}, expected a numpy array; "
                    "build batches from np.ndarray values.")
        action_dtype = _ACTION_DTYPES.get(self.actions.ndim)
        if action_dtype is None:
            raise ValueError(
                f"SampleBatch field 'actions' has shape {self.actions.shape}, expected [T, B] "
                "(Discrete) or [T, B, D] (Box).")
        if self.actions.dtype != action_dtype:
            raise ValueError(
                f"SampleBatch field 'actions' has dtype {self.actions.dtype}, expected "
                f"{action_dtype} for shape {self.actions.shape}; convert it with "
                f".astype(np.{action_dtype.name}).")
        T, B = self.actions.shape[:2]
        if self.obs.ndim < 2 or self.obs.shape[:2] != (T, B):
            raise ValueError(
                f"SampleBatch field 'obs' has shape {self.obs.shape}, expected [T, B, *obs_shape] "
                f"with T={T}, B={B} (from 'actions' {self.actions.shape}).")
        obs_shape = self.obs.shape[2:]
        expected = {"rewards": (T, B), "terminateds": (T, B), "truncateds": (T, B),
                    "truncation_values": (T, B), "bootstrap_obs": (B, *obs_shape),
                    "policy_versions": (B,)}
        for name, shape in expected.items():
            a = getattr(self, name)
            if a.shape != shape:
                raise ValueError(
                    f"SampleBatch field {name!r} has shape {a.shape}, expected {shape} "
                    f"(T={T}, B={B}, obs_shape={obs_shape}).")
        logits = self.behaviour_logits
        if logits.ndim != 3 or logits.shape[:2] != (T, B):
            raise ValueError(
                f"SampleBatch field 'behaviour_logits' has shape {logits.shape}, expected "
                f"[T, B, A] with T={T}, B={B}.")
        returns, lengths = self.episode_returns, self.episode_lengths
        if returns.ndim != 1 or lengths.shape != returns.shape:
            raise ValueError(
                f"SampleBatch fields 'episode_returns' {returns.shape} and 'episode_lengths' "
                f"{lengths.shape} must both have shape [K] (one entry per finished episode).")
        for name, dtype in _DTYPES.items():
            a = getattr(self, name)
            if a.dtype != dtype:
                raise ValueError(
                    f"SampleBatch field {name!r} has dtype {a.dtype}, expected {dtype}; "
                    f"convert it with .astype(np.{dtype.name}).")
        if self.obs.dtype not in _OBS_DTYPES:
            raise ValueError(
                f"SampleBatch field 'obs' has dtype {self.obs.dtype}, expected float32 (or uint8 "
                "for images); convert it with .astype(np.float32).")
        if self.bootstrap_obs.dtype != self.obs.dtype:
            raise ValueError(
                f"SampleBatch field 'bootstrap_obs' has dtype {self.bootstrap_obs.dtype} but "
                f"'obs' has {self.obs.dtype}; they must match.")
        state = self.state_in
        if state is not None:
            if state.ndim != 3 or state.shape[:2] != (B, 2):
                raise ValueError(
                    f"SampleBatch field 'state_in' has shape {state.shape}, expected [B, 2, C] "
                    f"with B={B} (each column's LSTM h and c).")
            if state.dtype != np.float32:
                raise ValueError(
                    f"SampleBatch field 'state_in' has dtype {state.dtype}, expected float32; "
                    "convert it with .astype(np.float32).")
        final = self.final_obs
        num_truncated = int(self.truncateds.sum())
        if final is not None and (final.shape != (num_truncated, *obs_shape)
                                  or final.dtype != self.obs.dtype):
            raise ValueError(
                f"SampleBatch field 'final_obs' is {final.dtype}{list(final.shape)}, expected "
                f"{self.obs.dtype}{[num_truncated, *obs_shape]}: one observation per truncated "
                "step (truncateds.sum()), with the dtype of 'obs'.")
        if check_values:
            self._check_values()
        return self

    def _check_values(self) -> None:
        for name in ("obs", "actions", "bootstrap_obs", "rewards", "truncation_values",
                     "behaviour_logits", "episode_returns", "state_in", "final_obs"):
            a = getattr(self, name)
            if a is None:
                continue
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                t_b = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
                raise ValueError(f"SampleBatch field {name!r} is not finite at index {t_b}.")
        both = self.terminateds & self.truncateds
        if both.any():
            t, b = (int(i) for i in np.argwhere(both)[0])
            raise ValueError(
                f"SampleBatch step [t={t}, b={b}] is both terminated and truncated; a step that "
                "is both counts as terminated (set truncateds False there).")
        stray = (self.truncation_values != 0) & ~self.truncateds
        if stray.any():
            t, b = (int(i) for i in np.argwhere(stray)[0])
            raise ValueError(
                f"SampleBatch field 'truncation_values' is {self.truncation_values[t, b]} at "
                f"[t={t}, b={b}], a step that is not truncated; it must be 0 there.")
        if (self.episode_lengths < 1).any():
            raise ValueError(
                f"SampleBatch field 'episode_lengths' has entries < 1: {self.episode_lengths}.")

    # ------------------------------------------------------------------ combine / split
    @staticmethod
    def concat_samples(batches: Sequence[SampleBatch]) -> SampleBatch:
        """Concatenates batches along B (see the module function `concat_samples`)."""
        return concat_samples(batches)

    def slice_columns(self, start: int, stop: int) -> SampleBatch:
        """The columns [start, stop) of the batch, 0 <= start < stop <= B: a `SampleBatch`
        [T, stop - start] of views (no copy).

        An episode is not tagged with its column, so the episode arrays go whole to the part
        that starts at column 0 and the others get empty ones (each episode counted once).
        """
        B = self.B
        if not (0 <= start < stop <= B):
            raise ValueError(
                f"slice_columns(start={start}, stop={stop}) is out of range for a batch with "
                f"B={B} columns; need 0 <= start < stop <= {B}.")
        cols = slice(start, stop)
        values = {name: getattr(self, name)[:, cols] for name in _TIME_MAJOR}
        for name in _PER_COLUMN:
            values[name] = getattr(self, name)[cols]
        for name in _EPISODES:
            a = getattr(self, name)
            values[name] = a if start == 0 else a[:0]
        values["state_in"] = None if self.state_in is None else self.state_in[cols]
        if self.final_obs is not None:  # the columns' rows: one run, in column order
            per_column = self.truncateds.sum(axis=0)
            first = int(per_column[:start].sum())
            values["final_obs"] = self.final_obs[first: first + int(per_column[cols].sum())]
        return SampleBatch(**values)

    def split_columns(self, n: int) -> list[SampleBatch]:
        """Splits B into ``n`` equal parts (e.g. one per learner device), as views; episode
        statistics go to the first (see `slice_columns`). A ValueError if n does not divide B.
        """
        B = self.B
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"split_columns(n={n!r}): n must be a positive int.")
        if B % n != 0:
            raise ValueError(
                f"split_columns: B={B} columns cannot be split into n={n} equal parts; choose "
                f"n dividing {B} (e.g. make train_batch_size / sample_batch_size a multiple "
                f"of the number of devices).")
        size = B // n
        return [self.slice_columns(i * size, (i + 1) * size) for i in range(n)]

    # ------------------------------------------------------------------ transport
    def to_dict(self) -> dict[str, np.ndarray]:
        """Returns ``{field: array}`` (the arrays themselves, no copy; optional fields only
        when not None); ``np.savez(path, **batch.to_dict())`` saves a batch."""
        return {name: getattr(self, name) for name in self._present()}

    @classmethod
    def from_dict(cls, data: Mapping[str, np.ndarray]) -> SampleBatch:
        """Builds a batch from `to_dict`'s output or an ``np.load(path)`` of it, and validates.

        Raises:
          ValueError: naming missing or unknown keys, or a field of the wrong shape/dtype.
        """
        keys = set(data.keys())
        missing = [name for name in FIELDS if name not in keys]
        unknown = sorted(keys - set(FIELDS) - set(OPTIONAL_FIELDS))
        if missing or unknown:
            raise ValueError(
                f"SampleBatch.from_dict: missing fields {missing}, unknown fields {unknown}; "
                f"expected exactly {list(FIELDS)}, and optionally {list(OPTIONAL_FIELDS)}.")
        present = FIELDS + tuple(n for n in OPTIONAL_FIELDS if n in keys)
        return cls(**{name: np.asarray(data[name]) for name in present}).validate()


def concat_samples(batches: Sequence[SampleBatch]) -> SampleBatch:
    """Concatenates batches along B: [T, B1] + [T, B2] + ... -> [T, B1 + B2 + ...].

    Per-column fields join along their column axis, episode arrays end to end, one
    ``np.concatenate`` per field (the driver's hot path). A single batch is returned as it is;
    two or more give fresh arrays.

    Raises:
      ValueError: the batches disagree on T, a field's trailing shape or a dtype, or a field
        is missing (naming the field, both batches and both shapes).
    """
    batches = list(batches)
    if not batches:
        raise ValueError("concat_samples needs at least one SampleBatch, got an empty list.")
    first = batches[0]
    for i, b in enumerate(batches):
        if not isinstance(b, SampleBatch):
            raise TypeError(
                f"concat_samples: item {i} is {type(b).__name__}, expected a SampleBatch.")
    if len(batches) == 1:
        return first
    _check_compatible(batches)
    values = {}
    for name in _TIME_MAJOR:
        values[name] = np.concatenate([getattr(b, name) for b in batches], axis=1)
    for name in _PER_COLUMN + _EPISODES:
        values[name] = np.concatenate([getattr(b, name) for b in batches], axis=0)
    for name in OPTIONAL_FIELDS:
        if getattr(first, name) is not None:
            values[name] = np.concatenate([getattr(b, name) for b in batches], axis=0)
    return SampleBatch(**values)


def _check_compatible(batches: list[SampleBatch]) -> None:
    """Raises ValueError unless every batch matches batch 0 outside the concatenated axis."""
    first = batches[0]
    why = {"state_in": "batches of a recurrent and a feed-forward policy (use_lstm) cannot be "
                       "joined.",
           "final_obs": "record the final observations in all batches or in none."}
    for name in OPTIONAL_FIELDS:
        has = [getattr(b, name) is not None for b in batches]
        if any(has) and not all(has):
            i = has.index(not has[0])
            raise ValueError(
                f"concat_samples: batch 0 {'has' if has[0] else 'has no'} {name!r} but batch "
                f"{i} {'has' if has[i] else 'has none'}; {why[name]}")
    for name in first._present():
        ref = getattr(first, name, None)
        if ref is None:
            raise ValueError(f"concat_samples: batch 0 is missing field {name!r} (it is None).")
        # Shape that must agree: all axes except the concatenated one.
        axis = 1 if name in _TIME_MAJOR else 0
        ref_key = ref.shape[:axis] + ref.shape[axis + 1:]
        for i in range(1, len(batches)):
            a = getattr(batches[i], name, None)
            if a is None:
                raise ValueError(
                    f"concat_samples: batch {i} is missing field {name!r} (it is None).")
            if a.ndim != ref.ndim or a.shape[:axis] + a.shape[axis + 1:] != ref_key:
                what = "T (axis 0) and trailing" if axis == 1 else "trailing"
                raise ValueError(
                    f"concat_samples: field {name!r} of batch {i} has shape {a.shape} but batch "
                    f"0 has {ref.shape}; batches are joined along axis {axis} and need equal "
                    f"{what} dims (same sample_batch_size, env and model).")
            if a.dtype != ref.dtype:
                raise ValueError(
                    f"concat_samples: field {name!r} of batch {i} has dtype {a.dtype} but batch "
                    f"0 has {ref.dtype}; convert one of them so the dtypes match.")


def policy_lag(current_version: int, policy_versions: np.ndarray) -> np.ndarray:
    """Each column's policy lag [B]: the learner updates between the weights that sampled it
    (``policy_versions`` [B]) and ``current_version``. The driver measures it when a batch
    arrives, the learner before it trains on one."""
    return int(current_version) - np.asarray(policy_versions, dtype=np.int64)
