"""Action distributions, numpy side: what the actors sample from.

The policy head outputs a distribution's *inputs* (for a Discrete space the logits [N, A]); a
distribution class draws actions from them (`sample`) and gives log-probabilities, entropies
and KL divergences. Which space gets which distribution, and the space's checks and sizes,
are `impala_lab.spaces`'s (each class extends its space kind). Each class has a TensorFlow
twin of the same name in `impala_lab.learner.distributions`, for the loss; tests hold them
equal. The classes hold no state (no object per step on the hot path). numpy only.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from impala_lab.spaces import BoxActions, DiscreteActions, action_space_kind

__all__ = ["DISTRIBUTIONS", "ActionDistribution", "Categorical", "DiagGaussian",
           "pick_distribution", "squash_to_bounds"]

_LOG_2PI = float(np.log(2.0 * np.pi))


class ActionDistribution(Protocol):
    """What every action distribution class offers (all static): ``inputs`` is the policy
    head's output [..., inputs_size]; actions are [..., *action_shape] of ``action_dtype``;
    ``has_log_std``: the inputs end in a log-std that may be free (`ModelSpec.free_log_std`).
    """

    name: str
    action_dtype: np.dtype
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


class Categorical(DiscreteActions):
    """A softmax policy over ``n`` actions (a ``Discrete(n)`` space); inputs are logits [..., n].
    Log-probabilities, entropies and KLs are computed in float64 from a max-shifted log-softmax
    (stable for large and -inf logits), returned in the logits' dtype."""

    @staticmethod
    def sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One action per row, int64 [N] in [0, A), from softmax(logits [N, A]) by the
        Gumbel-max trick: argmax(logits + Gumbel noise) needs no normalisation and handles
        -inf (masked) logits; one ``rng.gumbel(size=logits.shape)`` per call."""
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


class DiagGaussian(BoxActions):
    """A diagonal Gaussian over a ``Box`` space's D numbers; inputs are [..., 2D] = (mean,
    log_std).

    An action is a float32 vector [D], D = prod(space.shape), reshaped to the space's shape
    only at ``env.step`` (`env_action`, which also clips or squashes it: the batch keeps the
    draw, whose log-probability the loss uses). With ``ModelSpec.free_log_std`` ``log_std`` is
    a learned vector [D]; the inputs carry both halves either way. Log-probabilities,
    entropies and KLs are computed in float64 and returned in the inputs' dtype.
    """

    @staticmethod
    def split(inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, log_std), each [..., D], from inputs [..., 2D] (views)."""
        d = inputs.shape[-1] // 2
        return inputs[..., :d], inputs[..., d:]

    @classmethod
    def sample(cls, inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw per row of inputs [N, 2D]: mean + exp(log_std) * eps, eps ~ N(0, I) (one
        ``rng.standard_normal`` of [N, D]); float32 [N, D], not clipped."""
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

    The batch keeps ``a`` and the loss scores it with the Gaussian: the tanh's Jacobian cancels
    in the ratio of two policies' densities and does not depend on the weights; only the
    entropy bonus is the Gaussian's, before the squash."""
    return low + (np.tanh(actions) + 1.0) * (0.5 * (high - low))


#: Each distribution by its name (the space kind's ``name``, `impala_lab.spaces`).
DISTRIBUTIONS: dict[str, type[ActionDistribution]] = {
    cls.name: cls for cls in (Categorical, DiagGaussian)}


def pick_distribution(action_space: Any) -> type[ActionDistribution]:
    """The numpy distribution class for ``action_space`` (raises `ConfigError` for a space
    no kind in `impala_lab.spaces.ACTION_SPACES` serves)."""
    return DISTRIBUTIONS[action_space_kind(action_space).name]
