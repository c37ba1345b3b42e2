"""Action distributions, TensorFlow side: the twins of `impala_lab.actor.distributions`.

The actors sample with the numpy class; the loss and the corrections take log-probabilities,
entropies and KLs from its twin here, on tensors, with gradients. `tf_distribution` picks the
twin by the action space's kind (`impala_lab.spaces.action_space_kind`), the table the numpy
side reads. A new distribution is one class here, named as its numpy twin, in `TWINS`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from impala_lab.spaces import action_space_kind

__all__ = ["TWINS", "TFCategorical", "TFDiagGaussian", "tf_distribution"]

_LOG_2PI = float(np.log(2.0 * np.pi))


class TFCategorical:
    """A softmax policy on logits [..., A] (float32 tensors), twin of `Categorical`."""

    name = "categorical"
    #: the dtype the learner feeds actions in (``batch_to_tensors``)
    action_dtype = tf.int32

    @staticmethod
    def logp(logits: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        """log pi(a | x): logits [..., A] and int actions [...] -> [...] (with gradient).

        The fused softmax cross-entropy op: the same arithmetic as scalable_agent's
        ``log_probs_from_logits_and_actions``.
        """
        return -tf.nn.sparse_softmax_cross_entropy_with_logits(logits=logits, labels=actions)

    @staticmethod
    def entropy(logits: tf.Tensor) -> tf.Tensor:
        """H(pi) = -sum_a pi(a) log pi(a): logits [..., A] -> [...]."""
        log_pi = tf.nn.log_softmax(logits)
        return -tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=-1)

    @staticmethod
    def kl(logits: tf.Tensor, other_logits: tf.Tensor) -> tf.Tensor:
        """KL(pi || pi') = sum_a pi(a) (log pi(a) - log pi'(a)): two [..., A] -> [...]."""
        log_p, log_q = tf.nn.log_softmax(logits), tf.nn.log_softmax(other_logits)
        return tf.reduce_sum(tf.exp(log_p) * (log_p - log_q), axis=-1)


class TFDiagGaussian:
    """A diagonal Gaussian on inputs [..., 2D] = (mean, log_std) (float32 tensors), twin of
    `DiagGaussian`; actions are float32 [..., D], the unclipped draws the actors stored."""

    name = "diag_gaussian"
    action_dtype = tf.float32

    @staticmethod
    def split(inputs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(mean, log_std), each [..., D], from inputs [..., 2D]."""
        mean, log_std = tf.split(inputs, 2, axis=-1)
        return mean, log_std

    @classmethod
    def logp(cls, inputs: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        """log pi(a | x): inputs [..., 2D] and actions [..., D] -> [...] (with gradient)."""
        mean, log_std = cls.split(inputs)
        z = (tf.cast(actions, inputs.dtype) - mean) * tf.exp(-log_std)
        dims = tf.cast(tf.shape(mean)[-1], inputs.dtype)
        return -tf.reduce_sum(0.5 * tf.square(z) + log_std, axis=-1) - 0.5 * _LOG_2PI * dims

    @classmethod
    def entropy(cls, inputs: tf.Tensor) -> tf.Tensor:
        """H(pi) = sum_d [log s_d + (1 + log(2 pi)) / 2]: inputs [..., 2D] -> [...]."""
        _, log_std = cls.split(inputs)
        return tf.reduce_sum(log_std + 0.5 * (1.0 + _LOG_2PI), axis=-1)

    @classmethod
    def kl(cls, inputs: tf.Tensor, other_inputs: tf.Tensor) -> tf.Tensor:
        """KL(pi || pi'): two [..., 2D] -> [...] (see `DiagGaussian.kl`)."""
        m, ls = cls.split(inputs)
        m2, ls2 = cls.split(other_inputs)
        ratio = tf.exp(2.0 * (ls - ls2)) + tf.square((m - m2) * tf.exp(-ls2))
        return tf.reduce_sum(ls2 - ls + 0.5 * ratio - 0.5, axis=-1)


#: each numpy distribution's twin, by their shared name
TWINS: dict[str, Any] = {twin.name: twin for twin in (TFCategorical, TFDiagGaussian)}


def tf_distribution(action_space: Any) -> Any:
    """The TensorFlow distribution for ``action_space``.

    Raises:
      ConfigError: no kind in `impala_lab.spaces.ACTION_SPACES` serves the space.
    """
    return TWINS[action_space_kind(action_space).name]
