"""Off-policy corrections: four ways to learn from data that lagging actors sampled.

The IMPALA paper (Espeholt et al. 2018, section 5.2.2, table 2) compares them on the same
actor-critic loss. Its actors act with a behaviour policy ``mu`` (weights some learner updates
old); the learner's current policy is ``pi`` and its value estimate ``V``. For an unroll of
``T`` steps with rewards ``r_t``, discounts ``gamma_t`` (0 where an episode terminated) and the
bootstrap value ``V(x_T)``, every correction gives a value target ``v_t`` and a policy-gradient
term ``g_t``, and the loss (summed over ``[T, B]``) is::

    policy_loss = -sum_t g_t
    vf_loss     = 0.5 * sum_t (v_t - V(x_t))^2
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy

with the weights ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)`` and, for the corrections that ignore
them, the uncorrected n-step return (V-trace with every weight set to 1; no GAE, no lambda)::

    G_t = r_t + gamma_t * G_{t+1},   G_T = V(x_T)
        = sum_{s=t}^{T-1} (prod_{i=t}^{s-1} gamma_i) r_s + (prod_{i=t}^{T-1} gamma_i) V(x_T)

``"none"`` (the lagged data treated as on-policy; RLlib's ``vtrace=False``, with the learner's
V as in the paper)::

    v_t = G_t
    g_t = log pi(a_t|x_t) * (G_t - V(x_t))

``"epsilon"`` (GA3C's epsilon-correction, epsilon = 1e-6 inside the log, so an action that
``pi`` has all but ruled out cannot give an unbounded gradient)::

    v_t = G_t
    g_t = log(pi(a_t|x_t) + 1e-6) * (G_t - V(x_t))

``"is1"`` (1-step importance sampling: the policy gradient of each step weighted by its clipped
importance weight; the value target is not corrected)::

    v_t = G_t
    g_t = min(rho_pg_bar, rho_t) * log pi(a_t|x_t) * (G_t - V(x_t))

``"vtrace"`` (V-trace, `impala_lab.learner.vtrace`; ``rho_bar``, ``c_bar`` and ``rho_pg_bar``
are 1 in the paper)::

    v_t = V-trace target (clipped rho_t and c_t = min(1, rho_t) in the sum of TD errors)
    g_t = min(rho_pg_bar, rho_t) * log pi(a_t|x_t) * (r_t + gamma_t * v_{t+1} - V(x_t))

``rho_bar`` and ``rho_pg_bar`` are ``vtrace_clip_rho_threshold`` and
``vtrace_clip_pg_rho_threshold`` (None: no clip). Targets and advantages carry no gradient;
``log pi`` and ``log mu`` come from the action distribution
(`impala_lab.learner.distributions`), so every correction works for any action space.
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf

from impala_lab.learner import vtrace
from impala_lab.learner.distributions import TFCategorical

#: The constant inside the log of the "epsilon" correction (GA3C's).
EPSILON = 1e-6

CorrectionTerms = collections.namedtuple(
    "CorrectionTerms", ["vs", "pg_advantages", "log_probs", "log_rhos"])
CorrectionTerms.__doc__ = """The parts of the loss that a correction decides, each [T, B]:
vs, the value targets v_t, and pg_advantages, the (weighted) advantages (no gradient);
log_probs, log pi(a_t|x_t) (or log(pi + 1e-6) for "epsilon", with gradient); log_rhos,
log(pi(a_t|x_t) / mu(a_t|x_t)) (for the mean_rho stat)."""


def correction_terms(correction: str, behaviour_logits: Any, target_logits: Any,
                     actions: Any, discounts: Any, rewards: Any, values: Any,
                     bootstrap_value: Any, clip_rho_threshold: float | None = 1.0,
                     clip_pg_rho_threshold: float | None = 1.0,
                     distribution: type[TFCategorical] = TFCategorical) -> CorrectionTerms:
    """Value targets and policy-gradient terms of one correction (see the module docstring).

    Args:
      correction: "vtrace", "is1", "epsilon" or "none".
      behaviour_logits: float32 [T, B, A], the actors' distribution inputs (mu; logits).
      target_logits: float32 [T, B, A], the learner's distribution inputs (pi).
      actions: [T, B] (int for a Discrete space), the actions taken.
      discounts, rewards, values: float32 [T, B], gamma_t (0 where an episode terminated),
        r_t and the learner's V(x_t); bootstrap_value: float32 [B], V(x_T).
      clip_rho_threshold, clip_pg_rho_threshold: rho_bar of V-trace's targets, rho_pg_bar of
        "vtrace" and "is1" (None: no clip).
      distribution: the TensorFlow action distribution whose ``logp`` gives log pi and log mu.

    Returns:
      `CorrectionTerms`; the loss's policy term is ``-sum(log_probs * pg_advantages)``.
    """
    if correction not in ("vtrace", "is1", "epsilon", "none"):
        raise ValueError(f"off_policy_correction={correction!r} is invalid: choose one of "
                         "'vtrace', 'is1', 'epsilon', 'none'")
    target_log_probs = distribution.logp(tf.convert_to_tensor(target_logits, tf.float32),
                                         actions)
    behaviour_log_probs = distribution.logp(
        tf.convert_to_tensor(behaviour_logits, tf.float32), actions)
    log_rhos = target_log_probs - behaviour_log_probs
    if correction == "vtrace":
        returns = vtrace.from_importance_weights(
            log_rhos=log_rhos, discounts=discounts, rewards=rewards, values=values,
            bootstrap_value=bootstrap_value, clip_rho_threshold=clip_rho_threshold,
            clip_pg_rho_threshold=clip_pg_rho_threshold)
        return CorrectionTerms(vs=returns.vs, pg_advantages=returns.pg_advantages,
                               log_probs=target_log_probs, log_rhos=log_rhos)
    # Every weight 1: v_t = G_t, the n-step return, and the advantage G_t - V(x_t).
    returns = vtrace.from_importance_weights(
        log_rhos=tf.zeros_like(log_rhos), discounts=discounts, rewards=rewards, values=values,
        bootstrap_value=bootstrap_value, clip_rho_threshold=None, clip_pg_rho_threshold=None)
    advantages = returns.pg_advantages
    log_probs = target_log_probs
    if correction == "is1":
        rhos = tf.exp(tf.stop_gradient(log_rhos))
        if clip_pg_rho_threshold is not None:
            rhos = tf.minimum(tf.cast(clip_pg_rho_threshold, tf.float32), rhos)
        advantages = tf.stop_gradient(rhos * advantages)
    elif correction == "epsilon":
        probs = tf.exp(target_log_probs)
        log_probs = tf.math.log(probs + EPSILON)
    return CorrectionTerms(vs=returns.vs, pg_advantages=advantages, log_probs=log_probs,
                           log_rhos=log_rhos)
