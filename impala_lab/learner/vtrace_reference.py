"""V-trace in numpy, written as the paper's explicit sum: the reference that the tests and the
course check `impala_lab.learner.vtrace` against.

Nothing here is recursive: each ``v_s`` is section 4.1's n-step sum formed in full, so a
slip in the TensorFlow version's backwards recursion shows up as a difference. O(T^2) work,
float64, numpy only (checkers import it cheaply). Shapes as in `impala_lab.learner.vtrace`.
"""

from __future__ import annotations

import collections

import numpy as np

VTraceReturns = collections.namedtuple("VTraceReturns", "vs pg_advantages")
VTraceFromLogitsReturns = collections.namedtuple(
    "VTraceFromLogitsReturns",
    ["vs", "pg_advantages", "log_rhos", "behaviour_action_log_probs", "target_action_log_probs"])


def log_probs_from_logits_and_actions_numpy(policy_logits: np.ndarray, actions: np.ndarray
                                            ) -> np.ndarray:
    """``log pi(a_t|x_t)`` of a softmax policy, in float64.

    Args:
      policy_logits: float [T, B, NUM_ACTIONS], unnormalised log-probabilities.
      actions: int [T, B], the actions taken.

    Returns:
      float64 [T, B]: the log-softmax of `policy_logits` at `actions`.
    """
    logits = np.asarray(policy_logits, dtype=np.float64)
    actions = np.asarray(actions)
    if logits.ndim != 3:
        raise ValueError(f"policy_logits has shape {logits.shape} but must have rank 3: "
                         "expected [T, B, NUM_ACTIONS]")
    if actions.shape != logits.shape[:2]:
        raise ValueError(
            f"actions has shape {actions.shape} but must have shape policy_logits.shape[:2] "
            f"= {logits.shape[:2]}: expected [T, B]")
    shifted = logits - logits.max(axis=-1, keepdims=True)  # exp cannot overflow
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.take_along_axis(log_softmax, actions[..., None].astype(np.int64), axis=-1)[..., 0]


def _checked_float64(log_rhos: np.ndarray, discounts: np.ndarray, rewards: np.ndarray,
                     values: np.ndarray, bootstrap_value: np.ndarray) -> tuple[np.ndarray, ...]:
    """The five inputs as float64 arrays, their ranks checked against ``log_rhos``'s."""
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    rank = log_rhos.ndim
    if rank < 2:
        raise ValueError(f"log_rhos has shape {log_rhos.shape} but must have rank of at least "
                         "2: expected [T, B]")
    same_rank = {"discounts": discounts, "rewards": rewards, "values": values}
    for key, arr in same_rank.items():
        same_rank[key] = arr = np.asarray(arr, dtype=np.float64)
        if arr.ndim != rank:
            raise ValueError(
                f"{key} has shape {arr.shape} (rank {arr.ndim}) but must have rank {rank}: "
                "expected the rank of log_rhos, [T, B] (time-major)")
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    if bootstrap_value.ndim != rank - 1:
        raise ValueError(
            f"bootstrap_value has shape {bootstrap_value.shape} (rank {bootstrap_value.ndim}) "
            f"but must have rank {rank - 1}: expected [B], the value at time T")
    return (log_rhos, same_rank["discounts"], same_rank["rewards"], same_rank["values"],
            bootstrap_value)


def from_importance_weights_numpy(log_rhos: np.ndarray, discounts: np.ndarray,
                                  rewards: np.ndarray, values: np.ndarray,
                                  bootstrap_value: np.ndarray,
                                  clip_rho_threshold: float | None = 1.0,
                                  clip_pg_rho_threshold: float | None = 1.0) -> VTraceReturns:
    """V-trace targets and advantages as the paper defines them (eq. 1), in float64.

    Each ``v_s`` is formed as its own sum, the discounts taken step by step (an episode's end
    sets one to 0) instead of as a power of one gamma::

        delta_t = min(rho-bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)),  V(x_T) = bootstrap
        v_s     = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t

    Args:
      log_rhos, discounts, rewards, values: float [T, B] (or [T, B, ...]),
        ``log pi(a_t) - log mu(a_t)``, ``gamma_t``, ``r_t`` and ``V(x_t)``.
      bootstrap_value: float [B] (or [B, ...]), ``V(x_T)``.
      clip_rho_threshold, clip_pg_rho_threshold: ``rho-bar`` of the targets and
        ``rho-bar_pg`` of the advantages; None: no clip.

    Returns:
      `VTraceReturns` of float64 arrays, vs [T, B] and pg_advantages [T, B] (with the
      broadcast trailing axes, if any).
    """
    log_rhos, discounts, rewards, values, bootstrap_value = _checked_float64(
        log_rhos, discounts, rewards, values, bootstrap_value)
    # all_values[t] = V(x_t) for t = 0..T, the bootstrap value last.
    all_values = np.concatenate([values, bootstrap_value[None]], axis=0)
    log_rhos, discounts, rewards, values = np.broadcast_arrays(log_rhos, discounts, rewards, values)
    num_steps = log_rhos.shape[0]
    all_values = np.broadcast_to(all_values, (num_steps + 1, *log_rhos.shape[1:]))

    rhos = np.exp(log_rhos)
    rho_bar = np.inf if clip_rho_threshold is None else clip_rho_threshold
    pg_rho_bar = np.inf if clip_pg_rho_threshold is None else clip_pg_rho_threshold
    cs = np.minimum(1.0, rhos)
    deltas = np.minimum(rho_bar, rhos) * (rewards + discounts * all_values[1:] - all_values[:-1])

    vs = np.empty_like(deltas)
    for s in range(num_steps):
        total = np.zeros_like(deltas[0])
        for t in range(s, num_steps):
            # prod_{i=s}^{t-1} gamma_i c_i: the product of no factors (t = s) is 1.
            trace = np.prod(discounts[s:t] * cs[s:t], axis=0)
            total = total + trace * deltas[t]
        vs[s] = all_values[s] + total

    next_vs = np.concatenate([vs[1:], all_values[-1:]], axis=0)  # v_T = V(x_T)
    pg_advantages = np.minimum(pg_rho_bar, rhos) * (rewards + discounts * next_vs
                                                    - all_values[:-1])
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


# The short name the notebooks use.
vtrace_numpy = from_importance_weights_numpy


def from_logits_numpy(behaviour_policy_logits: np.ndarray, target_policy_logits: np.ndarray,
                      actions: np.ndarray, discounts: np.ndarray, rewards: np.ndarray,
                      values: np.ndarray, bootstrap_value: np.ndarray,
                      clip_rho_threshold: float | None = 1.0,
                      clip_pg_rho_threshold: float | None = 1.0) -> VTraceFromLogitsReturns:
    """`impala_lab.learner.vtrace.from_logits` in float64 numpy; the same arguments and shapes.

    Returns:
      `VTraceFromLogitsReturns` of float64 arrays, each [T, B].
    """
    target_action_log_probs = log_probs_from_logits_and_actions_numpy(target_policy_logits, actions)
    behaviour_action_log_probs = log_probs_from_logits_and_actions_numpy(
        behaviour_policy_logits, actions)
    log_rhos = target_action_log_probs - behaviour_action_log_probs
    returns = from_importance_weights_numpy(
        log_rhos, discounts, rewards, values, bootstrap_value,
        clip_rho_threshold=clip_rho_threshold, clip_pg_rho_threshold=clip_pg_rho_threshold)
    return VTraceFromLogitsReturns(
        log_rhos=log_rhos, behaviour_action_log_probs=behaviour_action_log_probs,
        target_action_log_probs=target_action_log_probs, **returns._asdict())
