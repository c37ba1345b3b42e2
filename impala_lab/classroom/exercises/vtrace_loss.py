"""Exercise 5: the V-trace loss of `impala_lab.learner.vtrace_policy.VTracePolicy`.

The student writes ``vtrace_loss(target_logits, values, bootstrap_value, batch, config) ->
(total_loss, policy_loss, vf_loss, entropy)`` (sums over the batch) from the network's outputs
(float32 ``target_logits`` [T, B, A], ``values`` [T, B], ``bootstrap_value`` [B]), the batch
as ``batch_to_tensors`` returns it, and the `ImpalaConfig`. The checker compares the four
numbers and the gradient of ``total_loss`` with ``VTracePolicy.loss_and_stats``'s. The answer
runs first on numpy arrays (a stub's check never imports TensorFlow), then on watched tensors.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from impala_lab.classroom.exercises._common import (
    AnswerRaised,
    Case,
    CheckResult,
    Mismatch,
    call_answer,
    first_difference,
    loaded,
    verbatim,
)
from impala_lab.classroom.exercises._guard import Raised, portable
from impala_lab.classroom.exercises._spec import Spec, run_check

RTOL, ATOL = 1e-4, 1e-4
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-4
GRADIENTS = ("target_logits", "values", "bootstrap_value")
COMPONENTS = ("total_loss", "policy_loss", "vf_loss", "entropy")

# name, T, B, A, off-policy scale, p(terminated), p(truncated), both, config changes, seed, hint
_CASES = [
    ("on-policy, no episode ends", 4, 2, 3, 0.0, 0.0, 0.0, False, {}, 0,
     "This case catches a wrong loss on the simplest batch. With no episode ends: "
     "discounts = gamma everywhere; vtrace.from_logits(...) gives vs, pg_advantages and "
     "target_action_log_probs."),
    ("off-policy", 5, 3, 3, 1.0, 0.0, 0.0, False, {}, 1,
     "This case catches the two policies swapped. Off-policy: pass batch['behaviour_logits'] "
     "as the behaviour policy and target_logits as the target policy to from_logits, with "
     "the config's clips."),
    ("terminations", 6, 3, 2, 0.5, 0.2, 0.0, False, {}, 2,
     "This case catches a nonzero discount after a terminated step: discounts = gamma * "
     "(1 - terminateds)."),
    ("truncations", 6, 3, 2, 0.5, 0.0, 0.2, False, {}, 3,
     "This case catches a truncated step treated as terminated (no bootstrap). At a "
     "truncated step the episode did not end in the MDP: add gamma * truncation_values to "
     "the reward there, and use discount 0 (the next step belongs to a new episode)."),
    ("terminated and truncated at once", 6, 4, 3, 0.5, 0.25, 0.25, True, {}, 4,
     "This case catches a bootstrap at a step that also terminated. A step both terminated "
     "and truncated counts as terminated: bootstrap only where truncateds * (1 - "
     "terminateds), and the discount is 0 where either is set."),
    ("clips disabled (None)", 5, 2, 3, 1.5, 0.1, 0.1, False,
     {"vtrace_clip_rho_threshold": None, "vtrace_clip_pg_rho_threshold": None}, 5,
     "This case catches clips written in instead of read from the config. Pass "
     "config.vtrace_clip_rho_threshold and config.vtrace_clip_pg_rho_threshold to "
     "from_logits (None disables a clip)."),
    ("other coefficients", 5, 3, 4, 1.0, 0.1, 0.1, False,
     {"gamma": 0.9, "vf_loss_coeff": 0.25, "entropy_coeff": 0.05,
      "vtrace_clip_rho_threshold": 0.8, "vtrace_clip_pg_rho_threshold": 2.0}, 6,
     "This case catches coefficients or gamma written in instead of read from the config: "
     "total = policy_loss + config.vf_loss_coeff * vf_loss - config.entropy_coeff * entropy, "
     "with config.gamma in the discounts."),
    ("a bigger batch", 20, 8, 3, 1.0, 0.05, 0.05, True, {}, 7,
     "This case catches a mean where the loss takes a sum over T and B (a bigger batch)."),
]

_COMPONENT_HINTS = {
    "policy_loss": "policy_loss = -sum(target_action_log_probs * pg_advantages) over T and B.",
    "vf_loss": "vf_loss = 0.5 * sum((vs - values) ** 2) over T and B.",
    "entropy": ("entropy = sum over T and B of -sum_a pi(a) log pi(a), with pi = "
                "softmax(target_logits): a sum, not a mean."),
    "total_loss": ("total_loss = policy_loss + config.vf_loss_coeff * vf_loss - "
                   "config.entropy_coeff * entropy."),
}

NO_GRADIENT_HINT = ("The learner minimises total_loss by its gradient, so build it with "
                    "TensorFlow ops on target_logits and values (tf.nn.log_softmax, "
                    "tf.reduce_sum, vtrace.from_logits): numpy results carry no gradient.")
_TARGETS = ("the V-trace targets vs and pg_advantages are constants for the gradient "
            "(tf.stop_gradient, as vtrace.from_logits returns them)")
GRADIENT_HINTS = {
    "target_logits": ("Only log pi(a_t) (the policy loss) and the entropy carry the gradient "
                      f"to target_logits; {_TARGETS}."),
    "values": (f"Only the value loss carries the gradient to values: {_TARGETS}, so "
               "d vf_loss / d values = values - vs."),
    "bootstrap_value": (f"bootstrap_value only enters the V-trace targets, and {_TARGETS}: "
                        "its gradient is 0."),
}


def make_case(T: int, B: int, A: int, scale: float, p_term: float, p_trunc: float,
              both: bool, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Seeded network outputs (target_logits [T, B, A], values [T, B], bootstrap_value [B])
    and a batch as `batch_to_tensors` returns it (obs [T, B, 4], actions, rewards,
    terminateds, truncateds, truncation_values [T, B], behaviour_logits [T, B, A],
    bootstrap_obs [B, 4]); float32 but the int32 actions."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    target_logits = rng.standard_normal((T, B, A)).astype(f32)
    terminateds = rng.random((T, B)) < p_term
    truncateds = rng.random((T, B)) < p_trunc
    if not both:
        truncateds &= ~terminateds
    truncation_values = np.where(truncateds, rng.standard_normal((T, B)), 0.0).astype(f32)
    outputs = {"target_logits": target_logits,
               "values": rng.standard_normal((T, B)).astype(f32),
               "bootstrap_value": rng.standard_normal(B).astype(f32)}
    batch = {"obs": rng.standard_normal((T, B, 4)).astype(f32),
             "actions": rng.integers(0, A, (T, B)).astype(np.int32),
             "rewards": rng.standard_normal((T, B)).astype(f32),
             "terminateds": terminateds.astype(f32),
             "truncateds": truncateds.astype(f32),
             "truncation_values": truncation_values,
             "behaviour_logits": (target_logits
                                  + scale * rng.standard_normal((T, B, A))).astype(f32),
             "bootstrap_obs": rng.standard_normal((B, 4)).astype(f32)}
    return outputs, batch


class _Reference:
    """A `VTracePolicy` whose network is replaced by fixed outputs (built once)."""

    policy: Any = None

    @classmethod
    def loss(cls, outputs: dict[str, np.ndarray], batch: dict[str, np.ndarray],
             config: Any) -> dict[str, float]:
        import gymnasium as gym
        import tensorflow as tf

        from impala_lab.learner.vtrace_policy import VTracePolicy

        A = outputs["target_logits"].shape[-1]
        if cls.policy is None or cls.policy.action_space.n != A:
            cls.policy = VTracePolicy(gym.spaces.Box(-10, 10, (4,), np.float32),
                                      gym.spaces.Discrete(A), config)
        policy = cls.policy
        policy.config = config
        policy.set_entropy_coeff(config.entropy_coeff)
        T, B = outputs["values"].shape
        logits = np.concatenate([outputs["target_logits"].reshape(T * B, A),
                                 np.zeros((B, A), np.float32)])
        values = np.concatenate([outputs["values"].reshape(T * B), outputs["bootstrap_value"]])
        logits_t, values_t = tf.constant(logits), tf.constant(values)
        policy.model = lambda x, **kw: (logits_t, values_t)  # this policy's only network
        with tf.GradientTape() as tape:
            tape.watch([logits_t, values_t])
            total, stats = policy.loss_and_stats(batch)
        g_logits, g_values = (g.numpy() for g in tape.gradient(total, [logits_t, values_t]))
        grads = {"target_logits": g_logits[:T * B].reshape(T, B, A),
                 "values": g_values[:T * B].reshape(T, B),
                 "bootstrap_value": g_values[T * B:]}
        return {"total_loss": float(total), "policy_loss": float(stats["policy_loss"]),
                "vf_loss": float(stats["vf_loss"]),
                "entropy": float(stats["entropy"]) * T * B, "grads": grads}


def _components(out: Any) -> dict[str, float]:
    if isinstance(out, dict):
        missing = [k for k in COMPONENTS if k not in out]
        if missing:
            raise Mismatch("what vtrace_loss returns", verbatim(str(list(COMPONENTS))),
                           verbatim(f"a dict without {missing}"),
                           "Return (total_loss, policy_loss, vf_loss, entropy).")
        values = [out[k] for k in COMPONENTS]
    elif isinstance(out, tuple | list) and len(out) == 4:
        values = list(out)
    else:
        raise Mismatch("what vtrace_loss returns",
                       verbatim("(total_loss, policy_loss, vf_loss, entropy)"), portable(out),
                       "Return a tuple of four scalars (numpy or TensorFlow).")
    result = {}
    for name, value in zip(COMPONENTS, values):
        arr = np.asarray(value, dtype=np.float64)
        if arr.size != 1:
            raise Mismatch(f"{name} (a scalar)", verbatim("shape []"),
                           verbatim(f"shape {list(arr.shape)}"),
                           f"{name} is a sum over T and B: reduce it to one number.")
        result[name] = float(arr.reshape(()))
    return result


def _inputs(case: Case) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Any]:
    from impala_lab.config import ImpalaConfig

    p = case.params
    outputs, batch = make_case(p["T"], p["B"], p["A"], p["scale"], p["p_term"], p["p_trunc"],
                               p["both"], p["seed"])
    return outputs, batch, ImpalaConfig(**p["config"])


def _gradients(answer: Any, outputs: dict[str, np.ndarray], batch: dict[str, np.ndarray],
               config: Any) -> dict[str, Any] | None:
    """The gradient of the answer's total_loss with respect to the network's outputs
    (zeros where it does not depend on one), or None when it has none at all."""
    import tensorflow as tf

    watched = [tf.constant(v) for v in outputs.values()]
    with tf.GradientTape() as tape:
        tape.watch(watched)
        out = call_answer(answer, *watched, {k: v.copy() for k, v in batch.items()}, config)
    total = out.get("total_loss") if isinstance(out, dict) else (
        out[0] if isinstance(out, tuple | list) and out else None)
    if not tf.is_tensor(total) or isinstance(total, tf.Variable):
        return None
    grads = tape.gradient(total, watched, unconnected_gradients=tf.UnconnectedGradients.NONE)
    if all(g is None for g in grads[:2]):
        return None
    return {name: np.zeros(v.shape, np.float64) if g is None else np.asarray(g, np.float64)
            for name, v, g in zip(GRADIENTS, outputs.values(), grads)}


def _answer_trace(answer: Any, case: Case) -> dict[str, Any]:
    outputs, batch, config = _inputs(case)
    out = call_answer(answer, *(v.copy() for v in outputs.values()),
                      {k: v.copy() for k, v in batch.items()}, config)
    trace: dict[str, Any] = _components(out)
    try:
        trace["grads"] = _gradients(answer, outputs, batch, config)
    except AnswerRaised as raised:
        trace["grads"] = Raised.of(raised)
    return trace


def _reference_trace(case: Case) -> dict[str, Any]:
    outputs, batch, config = _inputs(case)
    return _Reference.loss(outputs, batch, config)


def _compare(case: Case, expected: dict[str, Any], actual: dict[str, Any]) -> None:
    for name in ("policy_loss", "vf_loss", "entropy", "total_loss"):
        if not (isinstance(actual[name], float)
                and np.isclose(actual[name], expected[name], rtol=RTOL, atol=ATOL)):
            raise Mismatch(name, expected[name], actual[name], _COMPONENT_HINTS[name])
    grads = actual["grads"]
    if isinstance(grads, Raised):
        grads.text += (" (the check calls vtrace_loss a second time with tf.Tensor inputs, "
                       "to take the gradient of total_loss)")
        raise grads
    if grads is None:
        raise Mismatch("the gradient of total_loss with respect to target_logits and values",
                       verbatim("a gradient (the learner trains on it)"),
                       verbatim("none: total_loss does not depend on them through "
                                "TensorFlow ops"), NO_GRADIENT_HINT)
    for name in GRADIENTS:
        exp, act = expected["grads"][name], grads[name]
        idx = first_difference(exp, act, GRAD_RTOL, GRAD_ATOL)
        if idx is not None:
            where = ", ".join(str(i) for i in idx)
            raise Mismatch(f"d total_loss / d {name}[{where}] (the numbers are right, the "
                           f"gradient is not)", float(exp[idx]), float(act[idx]),
                           GRADIENT_HINTS[name])


def _case(name: str, T: int, B: int, A: int, scale: float, p_term: float, p_trunc: float,
          both: bool, changes: dict[str, Any], seed: int, hint: str) -> Case:
    conf = ", ".join(f"{k}={v}" for k, v in changes.items()) or "the default config"
    desc = (f"{name}: T={T}, B={B}, {A} actions, behaviour logits = target logits + "
            f"{scale} * N(0, 1), P(terminated)={p_term}, P(truncated)={p_trunc}, {conf} "
            f"(seed {seed})")
    return Case(desc, hint, {"T": T, "B": B, "A": A, "scale": scale, "p_term": p_term,
                             "p_trunc": p_trunc, "both": both, "config": changes,
                             "seed": seed})


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    changes = rng.choice([{}, {"gamma": 0.95, "vf_loss_coeff": 0.4, "entropy_coeff": 0.02},
                          {"vtrace_clip_rho_threshold": 1.5,
                           "vtrace_clip_pg_rho_threshold": 0.7}])
    return _case("drawn", rng.randint(2, 8), rng.randint(1, 4), rng.randint(2, 4),
                 round(rng.uniform(0, 1.5), 2), 0.15, 0.15, rng.random() < 0.5, changes,
                 rng.randrange(10**6), "A case drawn at random: it catches slips in the "
                 "discounts, the truncations or a term's sum that the fixed cases miss.")


def _references() -> list[Any]:
    return [_Reference.loss,
            *loaded("impala_lab.learner.vtrace_policy", "VTracePolicy.loss_and_stats")]


SPEC = Spec("vtrace_loss", lambda: [_case(*row) for row in _CASES], _answer_trace,
            _reference_trace, _compare, _references,
            {"_Reference": "the checker's own reference loss",
             ".loss_and_stats": "the library's VTracePolicy.loss_and_stats",
             "VTracePolicy": "the library's VTracePolicy"}, draw)


def check_vtrace_loss(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks ``vtrace_loss(target_logits, values, bootstrap_value, batch, config) ->
    (total_loss, policy_loss, vf_loss, entropy)`` against
    `impala_lab.learner.vtrace_policy.VTracePolicy.loss_and_stats`."""
    return run_check(SPEC, answer, show=show)
