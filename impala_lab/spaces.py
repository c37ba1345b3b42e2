"""The spaces a policy can take: which observations get which trunk (`observation_trunk`), which
action spaces get which action distribution (`action_space_kind`); actors and learner both ask
here. Each kind's distribution lives twice under its ``name``: numpy for the actors
(`impala_lab.actor.distributions`), TensorFlow for the learner
(`impala_lab.learner.distributions`). A new kind is one class here, one row in
`ACTION_SPACES` and its two distribution twins.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from impala_lab.errors import ConfigError

__all__ = ["ACTION_SPACES", "BoxActions", "DiscreteActions", "action_space_kind",
           "observation_trunk"]


class DiscreteActions:
    """``Discrete(n)`` starting at 0: the policy's inputs are n logits of a softmax, a batch's
    actions int64 [T, B]."""

    #: the distribution's name (the numpy and TensorFlow twins carry it too)
    name = "categorical"
    #: the dtype of a batch's actions
    action_dtype = np.dtype(np.int64)
    #: the inputs end in log standard deviations (that ``free_log_std`` may make a vector)
    has_log_std = False

    @staticmethod
    def check_space(action_space: Any) -> None:
        """Raise `ConfigError` if ``action_space`` is a Discrete this kind cannot serve."""
        start = int(action_space.start)
        if start != 0:
            raise ConfigError(
                f"action space {action_space} is not supported: impala_lab supports Discrete "
                f"action spaces starting at 0; wrap the env to map actions 0..n-1 to "
                f"{start}..{start + int(action_space.n) - 1}")

    @staticmethod
    def inputs_size(action_space: Any) -> int:
        """Width A of the policy head: the number of actions ``n``."""
        return int(action_space.n)

    @staticmethod
    def action_shape(action_space: Any) -> tuple[int, ...]:
        """Shape of one action: () (an index)."""
        return ()


class BoxActions:
    """A float ``Box``, flattened to D numbers: a diagonal Gaussian on inputs [2D] = (means,
    log-stds), a batch's actions float32 [T, B, D]."""

    name = "diag_gaussian"
    action_dtype = np.dtype(np.float32)
    has_log_std = True

    @staticmethod
    def check_space(action_space: Any) -> None:
        """Raise `ConfigError` if ``action_space`` is a Box this kind cannot serve (integer
        dtype, NaN bounds, or no numbers at all)."""
        if not np.issubdtype(action_space.dtype, np.floating):
            raise ConfigError(
                f"action space {action_space} is not supported: a Box action space must hold "
                "floats (a Gaussian policy samples real numbers); use Discrete or MultiDiscrete "
                "wrapped to Discrete for integer actions")
        if np.isnan(action_space.low).any() or np.isnan(action_space.high).any():
            raise ConfigError(f"action space {action_space} is not supported: its bounds hold "
                              "NaN; give finite bounds, or -inf/inf for an unbounded number")
        if int(np.prod(action_space.shape)) < 1:
            raise ConfigError(f"action space {action_space} is not supported: it has no "
                              "numbers to act with")

    @staticmethod
    def inputs_size(action_space: Any) -> int:
        """Width 2D of the distribution's inputs: D means, then D log standard deviations."""
        return 2 * int(np.prod(action_space.shape))

    @staticmethod
    def action_shape(action_space: Any) -> tuple[int, ...]:
        """Shape of one action: (D,), the Box flattened."""
        return (int(np.prod(action_space.shape)),)


# Each action space type and its kind, first match wins: a new one is one line here.
ACTION_SPACES: tuple[tuple[type, type], ...] = (
    (spaces.Discrete, DiscreteActions),
    (spaces.Box, BoxActions),
)

# What to do about the spaces that have no row, for the error message.
_HINTS = {
    "MultiDiscrete": "flatten it to one Discrete (a wrapper mapping index -> tuple of choices)",
    "MultiBinary": "map it to a Discrete(2**n) or a Box in [0, 1] with a wrapper",
    "Dict": "flatten it to a Box with a wrapper (gymnasium.spaces.flatten)",
    "Tuple": "flatten it to a Box with a wrapper (gymnasium.spaces.flatten)",
}

_SUPPORTED_OBS = "supported: Box observations of rank 1 (MLP) or rank 3 (HxWxC images, CNN)"


def action_space_kind(action_space: Any) -> type:
    """The kind of ``action_space`` (`ACTION_SPACES`), after its own checks.

    Raises:
      ConfigError: no kind serves the space (the message names the space and what is
        supported), or its kind cannot (e.g. a Discrete that does not start at 0).
    """
    for space_type, kind in ACTION_SPACES:
        if isinstance(action_space, space_type):
            kind.check_space(action_space)
            return kind
    names = ", ".join(s.__name__ for s, _ in ACTION_SPACES)
    pairs = ", ".join(f"{s.__name__} -> {kind.name}" for s, kind in ACTION_SPACES)
    hint = _HINTS.get(type(action_space).__name__, "wrap the env to give it one of those")
    raise ConfigError(f"action space {action_space} is not supported: impala_lab supports "
                      f"{names} action spaces (action distributions: {pairs}); {hint}")


def observation_trunk(observation_space: Any) -> str:
    """The trunk an observation space gets: ``"mlp"`` for a rank-1 Box (vectors), ``"cnn"``
    for a rank-3 Box (HxWxC images; `impala_lab.model_spec.check_spaces` checks their size
    against the conv layers).

    Raises:
      ValueError: any other space (the message names it and what is supported).
    """
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"observation space {observation_space} is not supported: {_SUPPORTED_OBS}; "
            "wrap the env with gymnasium.wrappers.FlattenObservation to turn Discrete, "
            "Dict or Tuple observations into a rank-1 Box")
    shape = tuple(observation_space.shape)
    if len(shape) in (1, 3):
        return "mlp" if len(shape) == 1 else "cnn"
    raise ValueError(
        f"observation space {observation_space} with shape {shape} (rank {len(shape)}) is not "
        f"supported: {_SUPPORTED_OBS}; flatten it with gymnasium.wrappers.FlattenObservation, "
        "or give images a channel axis")
