"""V-trace (Espeholt et al. 2018, arXiv 1802.01561, section 4.1) in TensorFlow 2.

The function names, argument names, time-major shapes and return fields follow
scalable_agent's ``vtrace.py`` (Apache-2.0), so code written against it reads the same here;
the implementation and its documentation are this project's.

  * `from_importance_weights`: targets ``vs`` and policy-gradient advantages, given the log of
    each step's importance ratio ``log(pi(a_t|x_t) / mu(a_t|x_t))``.
  * `from_logits`: the same, computing the ratios from the two policies' logits first.
  * `log_probs_from_logits_and_actions`: ``log pi(a_t|x_t)`` of a softmax policy.

Shapes: ``T`` steps of an unroll by ``B`` unrolls, time first (``[T, B]``). Extra trailing
axes ``[T, B, ...]`` are allowed and broadcast elementwise.

The quantities, with ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)``, ``rho-bar`` and ``rho-bar_pg``
the two clip thresholds, and the trace factor ``c_t = min(1, rho_t)`` (the paper's
experiments fix c-bar at 1)::

    delta_t  = min(rho-bar, rho_t) * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_s      = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i * c_i) * delta_t
    pg_adv_s = min(rho-bar_pg, rho_s) * (r_s + gamma_s * v_{s+1} - V(x_s)),   v_T = V(x_T)

``delta_t`` carries its clipped ratio (the notebooks' notation). The sum is evaluated
backwards with ``v_s - V(x_s) = delta_s + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))``: one chain
of ops when T is known at trace time (T <= 128), else a reversed `tf.scan`; eagerly or inside
`tf.function`. `impala_lab.learner.vtrace_reference` holds the explicit sum in numpy; its
names are re-exported here (``from_importance_weights_numpy``, ...).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

# The numpy reference's names are re-exported, and both versions share one pair of result
# types, so results compare field by field.
from impala_lab.learner.vtrace_reference import (
    VTraceFromLogitsReturns,
    VTraceReturns,
    from_importance_weights_numpy,
    from_logits_numpy,
    log_probs_from_logits_and_actions_numpy,
    vtrace_numpy,
)

__all__ = ["VTraceReturns", "VTraceFromLogitsReturns", "log_probs_from_logits_and_actions",
           "from_importance_weights", "from_logits", "log_probs_from_logits_and_actions_numpy",
           "from_importance_weights_numpy", "from_logits_numpy", "vtrace_numpy"]


# Unrolls longer than this use tf.scan (a While loop) instead of one op chain per step.
_MAX_UNROLL = 128


def _check_rank(name: str, tensor: tf.Tensor, rank: int, expected: str) -> None:
    """Raises a ValueError naming `name`, its shape and the expected layout."""
    actual = tensor.shape.rank
    if actual is not None and actual != rank:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape.as_list())} (rank {actual}) but must have "
            f"rank {rank}: expected {expected}")


def log_probs_from_logits_and_actions(policy_logits: Any, actions: Any) -> tf.Tensor:
    """``log pi(a_t|x_t)`` of a softmax policy at the actions taken: float32 [T, B], the
    log-softmax of ``policy_logits`` (float32 [T, B, NUM_ACTIONS]) at ``actions`` (int32 or
    int64 [T, B]); a ValueError for other dtypes or ranks."""
    policy_logits = tf.convert_to_tensor(policy_logits, dtype=tf.float32)
    actions = tf.convert_to_tensor(actions)
    if not actions.dtype.is_integer:
        raise ValueError(f"actions has dtype {actions.dtype.name} but must be an integer "
                         "tensor (int32 or int64) of action indices")
    _check_rank("policy_logits", policy_logits, 3, "[T, B, NUM_ACTIONS]")
    _check_rank("actions", actions, 2, "[T, B]")
    return -tf.nn.sparse_softmax_cross_entropy_with_logits(logits=policy_logits, labels=actions)


def from_logits(behaviour_policy_logits: Any, target_policy_logits: Any, actions: Any,
                discounts: Any, rewards: Any, values: Any, bootstrap_value: Any,
                clip_rho_threshold: float | None = 1.0,
                clip_pg_rho_threshold: float | None = 1.0,
                name: str = "vtrace_from_logits") -> VTraceFromLogitsReturns:
    """V-trace for two softmax policies given by their logits.

    ``mu`` is the behaviour policy the actor sampled with (its logits travel in the batch),
    ``pi`` the learner's current one; ``log pi(a) - log mu(a)`` goes to
    `from_importance_weights`.

    Args:
      behaviour_policy_logits: float32 [T, B, NUM_ACTIONS], logits of ``mu``.
      target_policy_logits: float32 [T, B, NUM_ACTIONS], logits of ``pi``.
      actions: int32 or int64 [T, B], the actions ``mu`` sampled.
      discounts, rewards, values: float32 [T, B]; bootstrap_value: float32 [B]; the
        clip thresholds and name: as `from_importance_weights`'s.

    Returns:
      `VTraceFromLogitsReturns`, every field float32 [T, B]: vs and pg_advantages of
      `from_importance_weights` (no gradient); log_rhos ``log pi(a_t) - log mu(a_t)``,
      behaviour_action_log_probs ``log mu(a_t)`` and target_action_log_probs
      ``log pi(a_t)``, the first and last differentiable in `target_policy_logits`.

    Raises:
      ValueError: an argument has the wrong rank (the message names it and its shape).
    """
    behaviour_policy_logits = tf.convert_to_tensor(behaviour_policy_logits, dtype=tf.float32)
    target_policy_logits = tf.convert_to_tensor(target_policy_logits, dtype=tf.float32)
    actions = tf.convert_to_tensor(actions)
    # The logits' ranks are checked here; from_importance_weights checks the rest.
    _check_rank("behaviour_policy_logits", behaviour_policy_logits, 3, "[T, B, NUM_ACTIONS]")
    _check_rank("target_policy_logits", target_policy_logits, 3, "[T, B, NUM_ACTIONS]")
    _check_rank("actions", actions, 2, "[T, B]")

    with tf.name_scope(name):
        target_action_log_probs = log_probs_from_logits_and_actions(target_policy_logits, actions)
        behaviour_action_log_probs = log_probs_from_logits_and_actions(
            behaviour_policy_logits, actions)
        log_rhos = target_action_log_probs - behaviour_action_log_probs
        returns = from_importance_weights(
            log_rhos=log_rhos, discounts=discounts, rewards=rewards, values=values,
            bootstrap_value=bootstrap_value, clip_rho_threshold=clip_rho_threshold,
            clip_pg_rho_threshold=clip_pg_rho_threshold)
        return VTraceFromLogitsReturns(
            log_rhos=log_rhos, behaviour_action_log_probs=behaviour_action_log_probs,
            target_action_log_probs=target_action_log_probs, **returns._asdict())


def _as_inputs(log_rhos: Any, discounts: Any, rewards: Any, values: Any,
               bootstrap_value: Any) -> tuple[tf.Tensor, ...]:
    """The five inputs as float32 tensors, their ranks and shapes checked."""
    log_rhos, discounts, rewards, values, bootstrap_value = (
        tf.convert_to_tensor(x, dtype=tf.float32)
        for x in (log_rhos, discounts, rewards, values, bootstrap_value))
    rank = log_rhos.shape.rank
    if rank is None or rank < 2:
        shape = None if rank is None else tuple(log_rhos.shape.as_list())
        raise ValueError(
            f"log_rhos has shape {shape} but must have a known rank of at least 2: "
            "expected [T, B] (time-major, optionally with trailing dims [T, B, ...])")
    if log_rhos.shape[0] == 0:
        raise ValueError(
            f"log_rhos has shape {tuple(log_rhos.shape.as_list())} with T = 0 steps: "
            "expected an unroll of at least one step, [T, B] with T >= 1")
    same = "the rank of log_rhos, [T, B] (time-major)"
    _check_rank("values", values, rank, same)
    _check_rank("bootstrap_value", bootstrap_value, rank - 1, "[B], the value at time T")
    _check_rank("discounts", discounts, rank, same)
    _check_rank("rewards", rewards, rank, same)
    # bootstrap_value is appended to values[1:], so one step of each must have one shape.
    if not values.shape[1:].is_compatible_with(bootstrap_value.shape):
        raise ValueError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape.as_list())} but values has "
            f"shape {tuple(values.shape.as_list())}: expected bootstrap_value of shape "
            f"values.shape[1:] = {tuple(values.shape[1:].as_list())}")
    # The targets are constants of the loss; stopping the gradient here also keeps the
    # backwards loop off any GradientTape.
    return tuple(tf.stop_gradient(x) for x in (log_rhos, discounts, rewards, values,
                                                bootstrap_value))


def _as_threshold(name: str, threshold: float | None) -> tf.Tensor | None:
    """A clip threshold as a float32 scalar tensor, or None (no clip)."""
    if threshold is None:
        return None
    threshold = tf.convert_to_tensor(threshold, dtype=tf.float32)
    _check_rank(name, threshold, 0, "a scalar (or None)")
    return threshold


def from_importance_weights(log_rhos: Any, discounts: Any, rewards: Any, values: Any,
                            bootstrap_value: Any, clip_rho_threshold: float | None = 1.0,
                            clip_pg_rho_threshold: float | None = 1.0,
                            name: str = "vtrace_from_importance_weights") -> VTraceReturns:
    """V-trace targets and policy-gradient advantages from log importance ratios.

    Args:
      log_rhos: float32 [T, B], ``log rho_t = log pi(a_t|x_t) - log mu(a_t|x_t)`` (a log
        ratio: a caller subtracts log-probabilities and never divides by a tiny ``mu``).
      discounts: float32 [T, B], ``gamma_t``: 0 after a step that ended its episode.
      rewards: float32 [T, B], ``r_t``.
      values: float32 [T, B], the learner's ``V(x_t)``.
      bootstrap_value: float32 [B], ``V(x_T)``. With trailing axes ``[T, B, ...]`` it is
        ``[B, ...]``, the shape of ``values.shape[1:]``.
      clip_rho_threshold: ``rho-bar``, the clip on ``rho_t`` inside ``delta_t`` (the
        targets); a scalar, or None for no clip.
      clip_pg_rho_threshold: ``rho-bar_pg``, the clip on ``rho_s`` in the advantage; a
        scalar, or None for no clip.
      name: the name scope of the ops.

    Returns:
      `VTraceReturns`:
        vs: float32 [T, B], the targets ``v_s`` the value head regresses on;
        pg_advantages: float32 [T, B], the weights of ``log pi(a_s|x_s)`` in the policy loss.
      Both are constants: no gradient flows through them.

    Raises:
      ValueError: an argument has the wrong rank, `bootstrap_value` does not match
        `values.shape[1:]`, or a clip threshold is not a scalar.
    """
    log_rhos, discounts, rewards, values, bootstrap_value = _as_inputs(
        log_rhos, discounts, rewards, values, bootstrap_value)
    rho_bar = _as_threshold("clip_rho_threshold", clip_rho_threshold)
    pg_rho_bar = _as_threshold("clip_pg_rho_threshold", clip_pg_rho_threshold)

    with tf.name_scope(name):
        rhos = tf.exp(log_rhos)
        clipped_rhos = rhos if rho_bar is None else tf.minimum(rho_bar, rhos, name="clipped_rhos")
        cs = tf.minimum(1.0, rhos, name="cs")  # the trace factor, c-bar = 1
        # V(x_{t+1}) for t = 0..T-1: the values shifted by one step, V(x_T) appended.
        next_values = tf.concat([values[1:], tf.expand_dims(bootstrap_value, 0)], axis=0)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        # The recursion's factor must have the deltas' (broadcast) shape at every step.
        decay = tf.broadcast_to(discounts * cs, tf.shape(deltas))
        vs = tf.add(_discounted_sum_reverse(decay, deltas), values, name="vs")

        # v_{s+1} for s = 0..T-1, with v_T = V(x_T).
        next_vs = tf.concat(
            [vs[1:], tf.broadcast_to(tf.expand_dims(bootstrap_value, 0), tf.shape(vs[:1]))], 0)
        pg_rhos = rhos if pg_rho_bar is None else tf.minimum(pg_rho_bar, rhos,
                                                             name="clipped_pg_rhos")
        pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
        return VTraceReturns(vs=tf.stop_gradient(vs), pg_advantages=tf.stop_gradient(pg_advantages))


def _discounted_sum_reverse(decay: tf.Tensor, deltas: tf.Tensor) -> tf.Tensor:
    """acc_s = deltas_s + decay_s * acc_{s+1}, acc_T = 0, for s = T-1 .. 0.

    Args:
      decay: float32 [T, B, ...], ``gamma_s * c_s``.
      deltas: float32 [T, B, ...], the same shape as `decay`.

    Returns:
      float32 [T, B, ...]: ``v_s - V(x_s)`` for every s.
    """
    num_steps = deltas.shape[0]
    if num_steps is not None and num_steps <= _MAX_UNROLL:
        # With T known when tracing, a Python loop builds 2 ops a step: inside tf.function
        # far cheaper than tf.scan's While loop (docs/performance.md).
        decay_ts = tf.unstack(decay, num=num_steps)
        delta_ts = tf.unstack(deltas, num=num_steps)
        acc = delta_ts[-1]
        out = [acc]
        for t in range(num_steps - 2, -1, -1):
            acc = delta_ts[t] + decay_ts[t] * acc
            out.append(acc)
        return tf.stack(out[::-1], axis=0)

    def one_step_back(acc: tf.Tensor, step: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        decay_t, delta_t = step
        return delta_t + decay_t * acc

    return tf.scan(fn=one_step_back, elems=(decay, deltas),
                   initializer=tf.zeros(tf.shape(deltas)[1:], dtype=deltas.dtype),
                   parallel_iterations=1, reverse=True, name="scan")
