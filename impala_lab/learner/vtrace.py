"""V-trace off-policy correction (Espeholt et al. 2018, arXiv 1802.01561), TensorFlow 2.

The public API and semantics are scalable_agent's ``vtrace.py``:

  * `from_importance_weights` computes the V-trace targets ``vs`` and the policy-gradient
    advantages from log importance weights ``log(pi(a|x) / mu(a|x))``;
  * `from_logits` first computes those weights from the behaviour and target policy logits;
  * `log_probs_from_logits_and_actions` is the log-softmax picked at the taken actions.

Every tensor is time-major: ``T`` is the unroll length, ``B`` the batch size. Optional
trailing dimensions ``[T, B, ...]`` broadcast elementwise, as in scalable_agent.

For an unroll of length ``T`` with bootstrap value ``V(x_T)``, clipped weights
``rho_t = min(rho_bar, pi/mu)`` and trace cutting ``c_t = min(1, pi/mu)`` (c-bar is fixed
at 1, as in the paper's experiments)::

    delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_s     = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i * c_i) * delta_t
    pg_adv_s = min(rho_pg_bar, pi/mu)_s * (r_s + gamma_s * v_{s+1} - V(x_s)),  v_T = V(x_T)

The TensorFlow functions compute ``v_s`` with the recursion
``v_s - V(x_s) = delta_s + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))``, run backwards in time:
unrolled into one op chain when T is known while tracing (T <= 128), else in a reverse
`tf.scan`. They run eagerly and inside `tf.function` (one trace per input shape).

`from_importance_weights_numpy` / `from_logits_numpy` are an independent numpy reference
written as the paper's explicit sum (no recursion); tests and notebooks compare against them.

This module imports TensorFlow at the top: only the learner imports it, never an actor.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "VTraceReturns",
    "VTraceFromLogitsReturns",
    "log_probs_from_logits_and_actions",
    "from_importance_weights",
    "from_logits",
    "log_probs_from_logits_and_actions_numpy",
    "from_importance_weights_numpy",
    "from_logits_numpy",
    "vtrace_numpy",
]

VTraceFromLogitsReturns = collections.namedtuple(
    "VTraceFromLogitsReturns",
    ["vs", "pg_advantages", "log_rhos", "behaviour_action_log_probs", "target_action_log_probs"],
)

VTraceReturns = collections.namedtuple("VTraceReturns", "vs pg_advantages")


def _check_rank(name: str, tensor: tf.Tensor, rank: int, expected: str) -> None:
    """Raises a ValueError naming `name`, its shape and the expected layout."""
    actual = tensor.shape.rank
    if actual is not None and actual != rank:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape.as_list())} (rank {actual}) but must have "
            f"rank {rank}: expected {expected}"
        )


def log_probs_from_logits_and_actions(policy_logits: Any, actions: Any) -> tf.Tensor:
    """Computes action log-probs from policy logits and actions.

    In the notation used throughout this module, T is the unroll length, B the batch size
    and NUM_ACTIONS the number of discrete actions.

    Args:
      policy_logits: A float32 tensor of shape [T, B, NUM_ACTIONS] with un-normalized
        log-probabilities parameterizing a softmax policy.
      actions: An int32 or int64 tensor of shape [T, B] with the actions taken.

    Returns:
      A float32 tensor of shape [T, B] with the log-probabilities of taking `actions`
      under the softmax policy.

    Raises:
      ValueError: `policy_logits` is not rank 3 or `actions` is not rank 2.
    """
    policy_logits = tf.convert_to_tensor(policy_logits, dtype=tf.float32)
    actions = tf.convert_to_tensor(actions)
    if not actions.dtype.is_integer:
        raise ValueError(
            f"actions has dtype {actions.dtype.name} but must be an integer tensor "
            "(int32 or int64) of action indices"
        )
    _check_rank("policy_logits", policy_logits, 3, "[T, B, NUM_ACTIONS]")
    _check_rank("actions", actions, 2, "[T, B]")
    return -tf.nn.sparse_softmax_cross_entropy_with_logits(logits=policy_logits, labels=actions)


def from_logits(
    behaviour_policy_logits: Any,
    target_policy_logits: Any,
    actions: Any,
    discounts: Any,
    rewards: Any,
    values: Any,
    bootstrap_value: Any,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    name: str = "vtrace_from_logits",
) -> VTraceFromLogitsReturns:
    r"""V-trace for softmax policies.

    Calculates V-trace actor critic targets for softmax polices as described in

    "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
    Architectures" by Espeholt, Soyer, Munos et al.

    Target policy refers to the policy we are interested in improving and behaviour policy
    refers to the policy that generated the given rewards and actions.

    In the notation used throughout this module, T is the unroll length, B the batch size
    and NUM_ACTIONS the number of discrete actions.

    Args:
      behaviour_policy_logits: A float32 tensor of shape [T, B, NUM_ACTIONS] with
        un-normalized log-probabilities parametrizing the softmax behaviour policy.
      target_policy_logits: A float32 tensor of shape [T, B, NUM_ACTIONS] with
        un-normalized log-probabilities parametrizing the softmax target policy.
      actions: An int32 or int64 tensor of shape [T, B] of actions sampled from the
        behaviour policy.
      discounts: A float32 tensor of shape [T, B] with the discount encountered when
        following the behaviour policy (0 where an episode terminated).
      rewards: A float32 tensor of shape [T, B] with the rewards generated by following
        the behaviour policy.
      values: A float32 tensor of shape [T, B] with the value function estimates wrt. the
        target policy.
      bootstrap_value: A float32 tensor of shape [B] with the value function estimate at
        time T.
      clip_rho_threshold: A scalar float32 tensor with the clipping threshold for
        importance weights (rho) when calculating the baseline targets (vs); rho^bar in
        the paper. None disables the clip.
      clip_pg_rho_threshold: A scalar float32 tensor with the clipping threshold on rho_s
        in \rho_s \delta log \pi(a|x) (r + \gamma v_{s+1} - V(x_s)). None disables it.
      name: The name scope that all V-trace operations will be created in.

    Returns:
      A `VTraceFromLogitsReturns` namedtuple with the following fields:
        vs: A float32 tensor of shape [T, B], the V-trace targets; no gradient flows
          through it.
        pg_advantages: A float32 tensor of shape [T, B], the advantages to use in the
          policy-gradient loss; no gradient flows through it.
        log_rhos: A float32 tensor of shape [T, B] with the log importance sampling
          weights, log(target_policy(a) / behaviour_policy(a)). Carries gradient
          (like scalable_agent).
        behaviour_action_log_probs: A float32 tensor of shape [T, B], log(mu(a)).
        target_action_log_probs: A float32 tensor of shape [T, B], log(pi(a)); carries
          gradient wrt. `target_policy_logits`.

    Raises:
      ValueError: an argument has the wrong rank (the message names it and its shape).
    """
    behaviour_policy_logits = tf.convert_to_tensor(behaviour_policy_logits, dtype=tf.float32)
    target_policy_logits = tf.convert_to_tensor(target_policy_logits, dtype=tf.float32)
    actions = tf.convert_to_tensor(actions)

    # Make sure tensor ranks are as expected. The rest will be checked by
    # from_importance_weights.
    _check_rank("behaviour_policy_logits", behaviour_policy_logits, 3, "[T, B, NUM_ACTIONS]")
    _check_rank("target_policy_logits", target_policy_logits, 3, "[T, B, NUM_ACTIONS]")
    _check_rank("actions", actions, 2, "[T, B]")

    with tf.name_scope(name):
        target_action_log_probs = log_probs_from_logits_and_actions(target_policy_logits, actions)
        behaviour_action_log_probs = log_probs_from_logits_and_actions(
            behaviour_policy_logits, actions
        )
        log_rhos = target_action_log_probs - behaviour_action_log_probs
        vtrace_returns = from_importance_weights(
            log_rhos=log_rhos,
            discounts=discounts,
            rewards=rewards,
            values=values,
            bootstrap_value=bootstrap_value,
            clip_rho_threshold=clip_rho_threshold,
            clip_pg_rho_threshold=clip_pg_rho_threshold,
        )
        return VTraceFromLogitsReturns(
            log_rhos=log_rhos,
            behaviour_action_log_probs=behaviour_action_log_probs,
            target_action_log_probs=target_action_log_probs,
            **vtrace_returns._asdict(),
        )


def from_importance_weights(
    log_rhos: Any,
    discounts: Any,
    rewards: Any,
    values: Any,
    bootstrap_value: Any,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    name: str = "vtrace_from_importance_weights",
) -> VTraceReturns:
    r"""V-trace from log importance weights.

    Calculates V-trace actor critic targets as described in

    "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
    Architectures" by Espeholt, Soyer, Munos et al.

    In the notation used throughout this module, T is the unroll length and B the batch
    size. All tensors may carry the same extra trailing dimensions ``...`` (sizes broadcast
    elementwise, as in scalable_agent); the shapes below show the usual ``[T, B]`` case
    and ``bootstrap_value`` must then be ``[B, ...]`` matching ``values.shape[1:]``.

    Args:
      log_rhos: A float32 tensor of shape [T, B] representing the log importance sampling
        weights, i.e. log(target_policy(a) / behaviour_policy(a)). V-trace performs
        operations on rhos in log-space for numerical stability.
      discounts: A float32 tensor of shape [T, B] with discounts encountered when following
        the behaviour policy (0 where an episode terminated).
      rewards: A float32 tensor of shape [T, B] containing rewards generated by following
        the behaviour policy.
      values: A float32 tensor of shape [T, B] with the value function estimates wrt. the
        target policy.
      bootstrap_value: A float32 tensor of shape [B] with the value function estimate at
        time T.
      clip_rho_threshold: A scalar float32 tensor with the clipping threshold for
        importance weights (rho) when calculating the baseline targets (vs); rho^bar in
        the paper. None disables the clip.
      clip_pg_rho_threshold: A scalar float32 tensor with the clipping threshold on rho_s
        in \rho_s \delta log \pi(a|x) (r + \gamma v_{s+1} - V(x_s)). None disables it.
      name: The name scope that all V-trace operations will be created in.

    Returns:
      A `VTraceReturns` namedtuple (vs, pg_advantages) where:
        vs: A float32 tensor of shape [T, B], the V-trace targets.
        pg_advantages: A float32 tensor of shape [T, B], the advantages to use in the
          policy-gradient loss.
      Neither carries gradient (both pass through tf.stop_gradient).

    Raises:
      ValueError: an argument has the wrong rank, `bootstrap_value` does not match
        `values.shape[1:]`, or a clip threshold is not a scalar.
    """
    log_rhos = tf.convert_to_tensor(log_rhos, dtype=tf.float32)
    discounts = tf.convert_to_tensor(discounts, dtype=tf.float32)
    rewards = tf.convert_to_tensor(rewards, dtype=tf.float32)
    values = tf.convert_to_tensor(values, dtype=tf.float32)
    bootstrap_value = tf.convert_to_tensor(bootstrap_value, dtype=tf.float32)
    if clip_rho_threshold is not None:
        clip_rho_threshold = tf.convert_to_tensor(clip_rho_threshold, dtype=tf.float32)
    if clip_pg_rho_threshold is not None:
        clip_pg_rho_threshold = tf.convert_to_tensor(clip_pg_rho_threshold, dtype=tf.float32)

    # Make sure tensor ranks are consistent.
    rho_rank = log_rhos.shape.rank  # Usually 2.
    if rho_rank is None or rho_rank < 2:
        shape = None if rho_rank is None else tuple(log_rhos.shape.as_list())
        raise ValueError(
            f"log_rhos has shape {shape} but must have a known rank of at least 2: "
            "expected [T, B] (time-major, optionally with trailing dims [T, B, ...])"
        )
    if log_rhos.shape[0] == 0:
        raise ValueError(
            f"log_rhos has shape {tuple(log_rhos.shape.as_list())} with T = 0 steps: "
            "expected an unroll of at least one step, [T, B] with T >= 1"
        )
    _check_rank("values", values, rho_rank, "the rank of log_rhos, [T, B] (time-major)")
    _check_rank("bootstrap_value", bootstrap_value, rho_rank - 1, "[B], the value at time T")
    _check_rank("discounts", discounts, rho_rank, "the rank of log_rhos, [T, B] (time-major)")
    _check_rank("rewards", rewards, rho_rank, "the rank of log_rhos, [T, B] (time-major)")
    if clip_rho_threshold is not None:
        _check_rank("clip_rho_threshold", clip_rho_threshold, 0, "a scalar (or None)")
    if clip_pg_rho_threshold is not None:
        _check_rank("clip_pg_rho_threshold", clip_pg_rho_threshold, 0, "a scalar (or None)")
    # values[1:] and bootstrap_value are concatenated: their per-step shapes must agree.
    if not values.shape[1:].is_compatible_with(bootstrap_value.shape):
        raise ValueError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape.as_list())} but values has "
            f"shape {tuple(values.shape.as_list())}: expected bootstrap_value of shape "
            f"values.shape[1:] = {tuple(values.shape[1:].as_list())}"
        )

    with tf.name_scope(name):
        # The targets are constants for the loss: stopping here also keeps the loop out of
        # any GradientTape.
        log_rhos = tf.stop_gradient(log_rhos)
        discounts = tf.stop_gradient(discounts)
        rewards = tf.stop_gradient(rewards)
        values = tf.stop_gradient(values)
        bootstrap_value = tf.stop_gradient(bootstrap_value)

        rhos = tf.exp(log_rhos)
        if clip_rho_threshold is not None:
            clipped_rhos = tf.minimum(clip_rho_threshold, rhos, name="clipped_rhos")
        else:
            clipped_rhos = rhos

        cs = tf.minimum(1.0, rhos, name="cs")  # c-bar = 1.
        # Append bootstrapped value to get [v1, ..., v_t+1]
        values_t_plus_1 = tf.concat([values[1:], tf.expand_dims(bootstrap_value, 0)], axis=0)
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

        # deltas has the full broadcast shape; give the factors the same shape so that
        # the accumulator keeps one shape from step to step.
        decay = tf.broadcast_to(discounts * cs, tf.shape(deltas))

        vs_minus_v_xs = _discounted_sum_reverse(decay, deltas)

        # Add V(x_s) to get v_s.
        vs = tf.add(vs_minus_v_xs, values, name="vs")

        # Advantage for policy gradient.
        vs_t_plus_1 = tf.concat(
            [vs[1:], tf.broadcast_to(tf.expand_dims(bootstrap_value, 0), tf.shape(vs[:1]))],
            axis=0,
        )
        if clip_pg_rho_threshold is not None:
            clipped_pg_rhos = tf.minimum(clip_pg_rho_threshold, rhos, name="clipped_pg_rhos")
        else:
            clipped_pg_rhos = rhos
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)

        # Make sure no gradients backpropagated through the returned values.
        return VTraceReturns(vs=tf.stop_gradient(vs), pg_advantages=tf.stop_gradient(pg_advantages))


# Unrolls longer than this use tf.scan (a While loop) instead of one op chain per step.
_MAX_UNROLL = 128


def _discounted_sum_reverse(decay: tf.Tensor, deltas: tf.Tensor) -> tf.Tensor:
    """acc_s = deltas_s + decay_s * acc_{s+1}, acc_T = 0, for s = T-1 .. 0.

    Args:
      decay: A float32 tensor of shape [T, B, ...] (gamma_s * c_s).
      deltas: A float32 tensor of shape [T, B, ...], the same shape as `decay`.

    Returns:
      A float32 tensor of shape [T, B, ...] with vs - V(x).
    """
    num_steps = deltas.shape[0]
    if num_steps is not None and num_steps <= _MAX_UNROLL:
        # With T known when tracing, a Python loop builds 2 ops a step: inside tf.function
        # this measured ~10x faster than tf.scan's While loop (T=50: 0.06 vs 0.6 ms).
        decay_ts = tf.unstack(decay, num=num_steps)
        delta_ts = tf.unstack(deltas, num=num_steps)
        acc = delta_ts[-1]
        out = [acc]
        for t in range(num_steps - 2, -1, -1):
            acc = delta_ts[t] + decay_ts[t] * acc
            out.append(acc)
        return tf.stack(out[::-1], axis=0)

    def scanfunc(acc: tf.Tensor, sequence_item: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        decay_t, delta_t = sequence_item
        return delta_t + decay_t * acc

    return tf.scan(
        fn=scanfunc,
        elems=(decay, deltas),
        initializer=tf.zeros(tf.shape(deltas)[1:], dtype=deltas.dtype),
        parallel_iterations=1,
        reverse=True,
        name="scan",
    )


# --------------------------------------------------------------------------------------
# Numpy reference: the paper's definition written out as an explicit sum.
# --------------------------------------------------------------------------------------


def log_probs_from_logits_and_actions_numpy(
    policy_logits: np.ndarray, actions: np.ndarray
) -> np.ndarray:
    """Numpy log-softmax at the taken actions (float64).

    Args:
      policy_logits: A float array of shape [T, B, NUM_ACTIONS].
      actions: An int array of shape [T, B].

    Returns:
      A float64 array of shape [T, B] with log pi(actions).
    """
    logits = np.asarray(policy_logits, dtype=np.float64)
    actions = np.asarray(actions)
    if logits.ndim != 3:
        raise ValueError(
            f"policy_logits has shape {logits.shape} but must have rank 3: "
            "expected [T, B, NUM_ACTIONS]"
        )
    if actions.shape != logits.shape[:2]:
        raise ValueError(
            f"actions has shape {actions.shape} but must have shape policy_logits.shape[:2] "
            f"= {logits.shape[:2]}: expected [T, B]"
        )
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.take_along_axis(log_softmax, actions[..., None].astype(np.int64), axis=-1)[..., 0]


def from_importance_weights_numpy(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace in numpy, straight from the paper's definition (eq. 1), in float64.

    For every start step s the n-step sum (n = T - s, bootstrapping on V(x_T)) is formed
    explicitly, with per-step discounts in place of gamma^{t-s}::

        v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t,
        delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),   V(x_T) = bootstrap_value.

    It does not use the recursion the TensorFlow version uses, so the two check each other.
    It costs O(T^2) numpy work: fine for tests and notebooks, not for training.

    Args:
      log_rhos: A float array of shape [T, B] (or [T, B, ...]).
      discounts: A float array of shape [T, B] (or [T, B, ...]).
      rewards: A float array of shape [T, B] (or [T, B, ...]).
      values: A float array of shape [T, B] (or [T, B, ...]).
      bootstrap_value: A float array of shape [B] (or [B, ...]).
      clip_rho_threshold: rho-bar for the targets; None disables the clip.
      clip_pg_rho_threshold: rho-bar for the policy-gradient advantages; None disables it.

    Returns:
      A `VTraceReturns` of float64 arrays: vs [T, B] and pg_advantages [T, B] (with the
      broadcast trailing dims, if any).
    """
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    rank = log_rhos.ndim
    arrays = {
        "discounts": np.asarray(discounts, dtype=np.float64),
        "rewards": np.asarray(rewards, dtype=np.float64),
        "values": np.asarray(values, dtype=np.float64),
    }
    if rank < 2:
        raise ValueError(
            f"log_rhos has shape {log_rhos.shape} but must have rank of at least 2: expected [T, B]"
        )
    for key, arr in arrays.items():
        if arr.ndim != rank:
            raise ValueError(
                f"{key} has shape {arr.shape} (rank {arr.ndim}) but must have rank {rank}: "
                "expected the rank of log_rhos, [T, B] (time-major)"
            )
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    if bootstrap_value.ndim != rank - 1:
        raise ValueError(
            f"bootstrap_value has shape {bootstrap_value.shape} (rank {bootstrap_value.ndim}) "
            f"but must have rank {rank - 1}: expected [B], the value at time T"
        )

    discounts, rewards, values = arrays["discounts"], arrays["rewards"], arrays["values"]
    # values_ext[t] = V(x_t) for t = 0..T (the last one is the bootstrap value).
    values_ext = np.concatenate([values, bootstrap_value[None]], axis=0)
    log_rhos, discounts, rewards, values = np.broadcast_arrays(log_rhos, discounts, rewards, values)
    num_steps = log_rhos.shape[0]
    values_ext = np.broadcast_to(values_ext, (num_steps + 1, *log_rhos.shape[1:]))

    rhos = np.exp(log_rhos)
    rho_bar = np.inf if clip_rho_threshold is None else clip_rho_threshold
    pg_rho_bar = np.inf if clip_pg_rho_threshold is None else clip_pg_rho_threshold
    clipped_rhos = np.minimum(rho_bar, rhos)
    cs = np.minimum(1.0, rhos)
    deltas = clipped_rhos * (rewards + discounts * values_ext[1:] - values_ext[:-1])

    vs = np.empty_like(deltas)
    for s in range(num_steps):
        total = np.zeros_like(deltas[0])
        for t in range(s, num_steps):
            # prod_{i=s}^{t-1} gamma_i c_i (the empty product is 1 at t = s).
            trace = np.prod(discounts[s:t] * cs[s:t], axis=0)
            total = total + trace * deltas[t]
        vs[s] = values_ext[s] + total

    vs_ext = np.concatenate([vs, values_ext[-1:]], axis=0)  # v_T = V(x_T)
    pg_advantages = np.minimum(pg_rho_bar, rhos) * (
        rewards + discounts * vs_ext[1:] - values_ext[:-1]
    )
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


# Short alias used in notebooks.
vtrace_numpy = from_importance_weights_numpy


def from_logits_numpy(
    behaviour_policy_logits: np.ndarray,
    target_policy_logits: np.ndarray,
    actions: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceFromLogitsReturns:
    """Numpy reference of `from_logits` (float64); shapes as in `from_logits`.

    Returns:
      A `VTraceFromLogitsReturns` of float64 arrays, each of shape [T, B].
    """
    target_action_log_probs = log_probs_from_logits_and_actions_numpy(target_policy_logits, actions)
    behaviour_action_log_probs = log_probs_from_logits_and_actions_numpy(
        behaviour_policy_logits, actions
    )
    log_rhos = target_action_log_probs - behaviour_action_log_probs
    returns = from_importance_weights_numpy(
        log_rhos,
        discounts,
        rewards,
        values,
        bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )
    return VTraceFromLogitsReturns(
        log_rhos=log_rhos,
        behaviour_action_log_probs=behaviour_action_log_probs,
        target_action_log_probs=target_action_log_probs,
        **returns._asdict(),
    )
