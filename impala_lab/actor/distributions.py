"""Action distributions, numpy side: what the actors sample from, picked by the action space.

The network's policy head outputs a distribution's *inputs* (for a Discrete space the logits
[N, A]); a distribution class says how many there are (`Categorical.inputs_size`), draws
actions from them (`sample`, the actors), and gives log-probabilities, entropies and KL
divergences (`logp`, `entropy`, `kl`). Each class has a TensorFlow twin in
`impala_lab.learner.distributions` with the same name and the same math on tensors, which the
learner's loss and the off-policy corrections call; tests hold the twins equal.

`pick_distribution` maps an action space to its class through `DISTRIBUTIONS`. A new kind
of action space is one class here, its twin there (listed in that module's ``TWINS``), and one
row in `DISTRIBUTIONS`: the model, the workers' buffers, the loss and the corrections read
what they need from the class. Batches hold Discrete actions as int64 [T, B] and Box actions
as float32 [T, B, D] (`impala_lab.batch.SampleBatch`).

Two classes today: `Categorical` for ``Discrete(n)`` and `DiagGaussian` for any ``Box``
(flattened to D numbers). Spaces with no row (``MultiDiscrete``, ``MultiBinary``, ``Dict``,
``Tuple``, ...) get a `ConfigError` naming the space.

The classes hold no state: their methods take the inputs array, so an actor's hot path makes
no object per step. numpy only (actor processes import it; never TensorFlow).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from impala_lab.errors import ConfigError

__all__ = ["DISTRIBUTIONS", "ActionDistribution", "Categorical", "DiagGaussian",
           "pick_distribution", "squash_to_bounds"]

_LOG_2PI = float(np.log(2.0 * np.pi))


class ActionDistribution(Protocol):
    """What every action distribution class offers (all static: inputs in, arrays out).

    ``inputs`` is the policy head's output [..., inputs_size]; actions are [..., *action_shape]
    of ``action_dtype``.
    """

    name: str
    action_dtype: np.dtype
    #: True when the inputs end in a log standard deviation that may be a free variable
    #: (`ModelSpec.free_log_std`): the head then computes only the first half of the inputs
    has_log_std: bool

    @staticmethod
    def check_space(action_space: Any) -> None: ...
    @staticmethod
    def inputs_size(action_space: Any) -> int: ...
    @staticmethod
    def action_shape(action_space: Any) -> tuple[int, ...]: ...
    @staticmethod
    def sample(inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...
    @staticmethod
    def mode(inputs: np.ndarray) -> np.ndarray: ...
    @staticmethod
    def logp(inputs: np.ndarray, actions: np.ndarray) -> np.ndarray: ...
    @staticmethod
    def entropy(inputs: np.ndarray) -> np.ndarray: ...
    @staticmethod
    def kl(inputs: np.ndarray, other_inputs: np.ndarray) -> np.ndarray: ...
    @staticmethod
    def env_action(action: np.ndarray, action_space: Any, clip: bool,
                   squash: bool = False) -> Any: ...


class Categorical:
    """A softmax policy over ``n`` actions (a ``Discrete(n)`` space); inputs are logits [..., n].

    Log-probabilities, entropies and KLs are computed in float64 from a max-shifted
    log-softmax (stable for large and -inf logits) and returned in the logits' dtype.
    """

    #: the twins' shared name (`impala_lab.learner.distributions` looks its twin up by it)
    name = "categorical"
    #: the dtype of the actions `sample` returns (the batches' ``actions``)
    action_dtype = np.dtype(np.int64)
    has_log_std = False

    @staticmethod
    def check_space(action_space: Any) -> None:
        """Raise `ConfigError` if ``action_space`` is a Discrete this class cannot serve."""
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

    @staticmethod
    def sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One action per row from softmax(logits), by the Gumbel-max trick.

        argmax(logits + Gumbel noise) is distributed as softmax(logits), needs no
        normalisation and handles -inf (masked) logits. The draw is one
        ``rng.gumbel(size=logits.shape)``: the same generator state gives the same actions.

        Args:
          logits: float [N, A].
          rng: the numpy Generator to draw from.

        Returns:
          int64 [N], actions in [0, A).
        """
        noise = rng.gumbel(size=logits.shape)
        noise += logits
        return noise.argmax(axis=1).astype(np.int64, copy=False)

    @staticmethod
    def mode(logits: np.ndarray) -> np.ndarray:
        """The most likely action of each row (greedy play): float [N, A] -> int64 [N]."""
        return logits.argmax(axis=1).astype(np.int64, copy=False)

    @staticmethod
    def log_softmax(logits: np.ndarray) -> np.ndarray:
        """float64 log softmax over the last axis: [..., A] -> [..., A]."""
        x = np.asarray(logits, np.float64)
        shifted = x - x.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

    @classmethod
    def logp(cls, logits: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(a | x): logits [..., A] and int actions [...] -> [...]."""
        log_pi = cls.log_softmax(logits)
        taken = np.take_along_axis(log_pi, np.asarray(actions, np.int64)[..., None], axis=-1)
        return taken[..., 0].astype(np.result_type(logits), copy=False)

    @classmethod
    def entropy(cls, logits: np.ndarray) -> np.ndarray:
        """H(pi) = -sum_a pi(a) log pi(a): logits [..., A] -> [...]."""
        log_pi = cls.log_softmax(logits)
        return (-(np.exp(log_pi) * log_pi).sum(axis=-1)).astype(np.result_type(logits),
                                                                copy=False)

    @classmethod
    def kl(cls, logits: np.ndarray, other_logits: np.ndarray) -> np.ndarray:
        """KL(pi || pi') = sum_a pi(a) (log pi(a) - log pi'(a)): two [..., A] -> [...]."""
        log_p, log_q = cls.log_softmax(logits), cls.log_softmax(other_logits)
        return (np.exp(log_p) * (log_p - log_q)).sum(axis=-1).astype(
            np.result_type(logits), copy=False)

    @staticmethod
    def env_action(action: np.ndarray, action_space: Any, clip: bool,
                   squash: bool = False) -> Any:
        """What ``env.step`` gets for one sampled action: the index itself."""
        return action


class DiagGaussian:
    """A diagonal Gaussian over a ``Box`` space's D numbers; inputs are [..., 2D] = (mean,
    log_std).

    The Box is flattened: an action is a float32 vector [D], D = prod(space.shape), reshaped
    to the space's shape only at ``env.step`` (`env_action`). With ``ModelSpec.free_log_std``
    (the default) the network's head computes the mean alone and ``log_std`` is a learned
    vector [D] that does not depend on the state; the inputs still carry both halves, so the
    batches, the loss and the twins do not care which. The sample is not squashed: `env_action`
    clips it to the space's finite bounds on the way to the env, and the batch keeps the
    unclipped draw, whose log-probability the loss uses (the clip is the env's business).

    Log-probabilities, entropies and KLs are computed in float64 and returned in the inputs'
    dtype.
    """

    name = "diag_gaussian"
    action_dtype = np.dtype(np.float32)
    has_log_std = True

    @staticmethod
    def check_space(action_space: Any) -> None:
        """Raise `ConfigError` if ``action_space`` is a Box this class cannot serve (integer
        dtype, or no numbers at all)."""
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

    @staticmethod
    def split(inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, log_std), each [..., D], from inputs [..., 2D] (views)."""
        d = inputs.shape[-1] // 2
        return inputs[..., :d], inputs[..., d:]

    @classmethod
    def sample(cls, inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw per row: mean + exp(log_std) * eps, eps ~ N(0, I) from ``rng``.

        Args:
          inputs: float [N, 2D].
          rng: the numpy Generator to draw from (one ``standard_normal`` of [N, D]).

        Returns:
          float32 [N, D], not clipped.
        """
        mean, log_std = cls.split(inputs)
        noise = rng.standard_normal(size=mean.shape)
        noise *= np.exp(log_std)
        noise += mean
        return noise.astype(np.float32)

    @classmethod
    def mode(cls, inputs: np.ndarray) -> np.ndarray:
        """The most likely action of each row, the mean: float [N, 2D] -> float32 [N, D]."""
        return cls.split(inputs)[0].astype(np.float32)

    @classmethod
    def logp(cls, inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(a | x) = -sum_d [(a_d - m_d)^2 / (2 s_d^2) + log s_d + log(2 pi) / 2]:
        inputs [..., 2D] and actions [..., D] -> [...]."""
        mean, log_std = (np.asarray(x, np.float64) for x in cls.split(inputs))
        z = (np.asarray(actions, np.float64) - mean) * np.exp(-log_std)
        out = -(0.5 * np.square(z) + log_std).sum(axis=-1) - 0.5 * _LOG_2PI * mean.shape[-1]
        return out.astype(np.result_type(inputs), copy=False)

    @classmethod
    def entropy(cls, inputs: np.ndarray) -> np.ndarray:
        """H(pi) = sum_d [log s_d + (1 + log(2 pi)) / 2]: inputs [..., 2D] -> [...]."""
        log_std = np.asarray(cls.split(inputs)[1], np.float64)
        out = log_std.sum(axis=-1) + 0.5 * (1.0 + _LOG_2PI) * log_std.shape[-1]
        return out.astype(np.result_type(inputs), copy=False)

    @classmethod
    def kl(cls, inputs: np.ndarray, other_inputs: np.ndarray) -> np.ndarray:
        """KL(pi || pi') = sum_d [log s'_d - log s_d + (s_d^2 + (m_d - m'_d)^2) / (2 s'_d^2)
        - 1/2]: two [..., 2D] -> [...]."""
        m, ls = (np.asarray(x, np.float64) for x in cls.split(inputs))
        m2, ls2 = (np.asarray(x, np.float64) for x in cls.split(other_inputs))
        ratio = np.exp(2.0 * (ls - ls2)) + np.square((m - m2) * np.exp(-ls2))
        out = (ls2 - ls + 0.5 * ratio - 0.5).sum(axis=-1)
        return out.astype(np.result_type(inputs), copy=False)

    @staticmethod
    def env_action(action: np.ndarray, action_space: Any, clip: bool,
                   squash: bool = False) -> Any:
        """What ``env.step`` gets for one action [D]: squashed into the space's bounds
        (``squash``, `squash_to_bounds`), else clipped to them where they are finite
        (``clip``); in the space's shape and dtype."""
        low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
        if squash:
            action = squash_to_bounds(action, low, high)
        elif clip:
            action = np.clip(action, low, high)
        return np.asarray(action, action_space.dtype).reshape(action_space.shape)


def squash_to_bounds(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """low + (tanh(a) + 1) (high - low) / 2: any real [..., D] into finite bounds [D].

    The batch keeps ``a``, and the loss scores it with the Gaussian: the ratio of two
    policies' densities of the squashed action is the ratio of their densities of ``a`` (the
    tanh's Jacobian cancels), and so is the policy gradient, whose Jacobian term does not
    depend on the weights. Only the entropy bonus differs: it is the Gaussian's, before the
    squash."""
    return low + (np.tanh(actions) + 1.0) * (0.5 * (high - low))


# Each action space type and its distribution, first match wins: a new one is one line here.
DISTRIBUTIONS: tuple[tuple[type, type[ActionDistribution]], ...] = (
    (spaces.Discrete, Categorical),
    (spaces.Box, DiagGaussian),
)

# What to do about the spaces that have no row, for the error message.
_HINTS = {
    "MultiDiscrete": "flatten it to one Discrete (a wrapper mapping index -> tuple of choices)",
    "MultiBinary": "map it to a Discrete(2**n) or a Box in [0, 1] with a wrapper",
    "Dict": "flatten it to a Box with a wrapper (gymnasium.spaces.flatten)",
    "Tuple": "flatten it to a Box with a wrapper (gymnasium.spaces.flatten)",
}


def pick_distribution(action_space: Any) -> type[ActionDistribution]:
    """The action distribution class for ``action_space`` (`DISTRIBUTIONS`).

    Raises:
      ConfigError: no distribution serves the space (the message names the space and what
        is supported), or its class cannot (e.g. a Discrete that does not start at 0).
    """
    for space_type, distribution in DISTRIBUTIONS:
        if isinstance(action_space, space_type):
            distribution.check_space(action_space)
            return distribution
    names = ", ".join(s.__name__ for s, _ in DISTRIBUTIONS)
    pairs = ", ".join(f"{s.__name__} -> {d.__name__}" for s, d in DISTRIBUTIONS)
    hint = _HINTS.get(type(action_space).__name__, "wrap the env to give it one of those")
    raise ConfigError(
        f"action space {action_space} is not supported: "
        f"impala_lab supports {names} action spaces (action distributions: {pairs}); {hint}")
