"""APPO's policy term (``loss="appo"``): PPO's clipped surrogate on V-trace advantages.

IMPALA's policy gradient is one step's worth of a batch: a second pass over the same batch
keeps pushing each action's probability the same way, however far it has already moved.
RLlib's APPO (asynchronous PPO) replaces it by PPO's clipped surrogate, which stops pulling a
step's probability once it has moved by a factor ``1 +- clip_param`` from the policy that
sampled the batch; the learner may then take many updates per batch (``num_sgd_iter``
passes through the `MinibatchBuffer`, ``minibatch_size`` minibatches per pass)::

    rho_t  = pi(a_t|x_t) / mu(a_t|x_t)                      # the learner's over the actor's
    Ahat_t = r_t + gamma_t * v_{t+1} - V(x_t)               # V-trace targets v, v_T = V(x_T)
    policy_loss = -sum_t min(rho_t * Ahat_t, clip(rho_t, 1 - clip_param, 1 + clip_param) * Ahat_t)
    kl_loss     = sum_t KL(mu(.|x_t) || pi(.|x_t))          # with use_kl_loss only
    total_loss  = policy_loss + kl_coeff * kl_loss + vf_loss_coeff * vf_loss
                  - entropy_coeff * entropy

The value loss, the entropy and the targets ``v`` (V-trace with the learner's current
policy) are IMPALA's (`impala_lab.learner.vtrace_policy`); sums over the batch's steps (RLlib's
APPO takes means: the same gradient divided by T * B).

The reference policy is the behaviour policy ``mu`` that every batch carries, fixed over all
its passes: RLlib's surrogate with its target network equal to the actors' weights (its factor
``clip(mu / pi_target, 0, 2)`` is then 1). ``Ahat_t`` is V-trace's advantage without its
clipped weight, since the ratio weights each step itself; the targets run with ``pi`` (RLlib's
with the target network), so the value function learns ``pi``'s values.

``use_kl_loss`` adds RLlib's KL penalty toward ``mu``, its coefficient adapted after every
update (`adapt_kl_coeff`).
"""

from __future__ import annotations

import tensorflow as tf

#: The stats `VTracePolicy.learn_on_batch` adds for ``loss="appo"``.
APPO_STAT_KEYS = ("clip_fraction", "kl", "kl_coeff")


def appo_advantages(vs: tf.Tensor, rewards: tf.Tensor, discounts: tf.Tensor,
                    values: tf.Tensor, bootstrap_value: tf.Tensor) -> tf.Tensor:
    """Ahat_t = r_t + gamma_t * v_{t+1} - V(x_t), [T, B], without gradient, from the V-trace
    targets ``vs`` and the loss's rewards, discounts, values (all [T, B]; a truncated step's
    bootstrap already in its reward) and ``bootstrap_value`` [B], V(x_T)."""
    next_vs = tf.concat([vs[1:], bootstrap_value[None]], axis=0)
    return tf.stop_gradient(rewards + discounts * next_vs - values)


def clipped_surrogate(log_rhos: tf.Tensor, advantages: tf.Tensor, clip_param: float
                      ) -> tuple[tf.Tensor, tf.Tensor]:
    """(PPO's clipped surrogate loss summed over the steps, the fraction of steps whose ratio
    lies outside [1 - clip_param, 1 + clip_param]) from ``log_rhos`` [T, B], log pi - log mu
    (the gradient through pi), and `appo_advantages` [T, B]."""
    ratio = tf.exp(log_rhos)
    clipped = tf.clip_by_value(ratio, 1.0 - clip_param, 1.0 + clip_param)
    surrogate = tf.minimum(ratio * advantages, clipped * advantages)
    outside = tf.cast(tf.abs(ratio - 1.0) > clip_param, tf.float32)
    return -tf.reduce_sum(surrogate), tf.reduce_mean(outside)


def adapt_kl_coeff(kl_coeff: float, kl: float, kl_target: float) -> float:
    """RLlib's rule for the KL penalty's coefficient after an update whose mean KL per step
    was ``kl``: up by half when over twice the target, halved when under half of it."""
    if kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    if kl < 0.5 * kl_target:
        return kl_coeff * 0.5
    return kl_coeff
