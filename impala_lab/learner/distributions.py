"""Action distributions, TensorFlow side: the twins of `impala_lab.actor.distributions`.

The actors sample with the numpy class; the learner's loss (`impala_lab.learner.vtrace_policy`)
and the off-policy corrections (`impala_lab.learner.corrections`) take log-probabilities,
entropies and KLs from its twin here, on tensors, with gradients. `tf_distribution` picks the
twin for an action space through the numpy side's `pick_distribution`, so the two sides never
disagree on which distribution a space gets. A new distribution is one class here, named as its
numpy twin and listed in `TWINS`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from impala_lab.actor.distributions import pick_distribution

__all__ = ["TWINS", "TFCategorical", "tf_distribution"]


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


#: each numpy distribution's twin, by their shared name
TWINS: dict[str, type[TFCategorical]] = {twin.name: twin for twin in (TFCategorical,)}


def tf_distribution(action_space: Any) -> type[TFCategorical]:
    """The TensorFlow twin of ``pick_distribution(action_space)``.

    Raises:
      ConfigError: as `pick_distribution` (the space has no distribution).
    """
    return TWINS[pick_distribution(action_space).name]
