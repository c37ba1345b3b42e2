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
what they need from the class. (`impala_lab.batch.SampleBatch` still checks for [T, B] int64
actions: continuous actions widen that.)

The classes hold no state: their methods take the inputs array, so an actor's hot path makes
no object per step. numpy only (actor processes import it; never TensorFlow).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from impala_lab.errors import ConfigError

__all__ = ["DISTRIBUTIONS", "ActionDistribution", "Categorical", "pick_distribution"]


class ActionDistribution(Protocol):
    """What every action distribution class offers (all static: inputs in, arrays out).

    ``inputs`` is the policy head's output [..., inputs_size]; actions are [..., *action_shape]
    of ``action_dtype``.
    """

    name: str
    action_dtype: np.dtype

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


class Categorical:
    """A softmax policy over ``n`` actions (a ``Discrete(n)`` space); inputs are logits [..., n].

    Log-probabilities, entropies and KLs are computed in float64 from a max-shifted
    log-softmax (stable for large and -inf logits) and returned in the logits' dtype.
    """

    #: the twins' shared name (`impala_lab.learner.distributions` looks its twin up by it)
    name = "categorical"
    #: the dtype of the actions `sample` returns (the batches' ``actions``)
    action_dtype = np.dtype(np.int64)

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


# Each action space type and its distribution, first match wins: a new one is one line here.
DISTRIBUTIONS: tuple[tuple[type, type[ActionDistribution]], ...] = (
    (spaces.Discrete, Categorical),
)


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
    raise ConfigError(
        f"action space {action_space} is not supported: impala_lab supports {names} action "
        f"spaces (action distributions: {pairs}); wrap the env to give it one of those")
