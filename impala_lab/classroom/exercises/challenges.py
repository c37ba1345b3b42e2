"""The optional challenges (``<exercise>_challenge``): each exercise's cases, reference and
comparison, less scaffolding in the notebook and, for some, a `Rule`: the ring with no base
class (1), V-trace (3) and the Gaussian (7) with no Python loop, the V-trace loss without the
library's ``vtrace`` module (5), the LSTM's reset with masks and no ``if`` (6).
"""

from __future__ import annotations

import ast
import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np

from impala_lab.classroom.exercises import (
    diag_gaussian,
    driver_step,
    lstm_unroll,
    minibatch_get,
    replay_mix,
    vtrace_loss,
    vtrace_numpy,
)
from impala_lab.classroom.exercises._common import (
    Case,
    CheckResult,
    Mismatch,
    loaded,
    same,
    verbatim,
)
from impala_lab.classroom.exercises._spec import Spec, run_check
from impala_lab.classroom.exercises._static import Rule

# ------------------------------------------------------------------ 1: the whole ring
_NO_BASE_CLASS = Rule(
    "no base class", "this rule catches an answer that inherits its state and constructor "
    "(the library's MinibatchBuffer gives both): write `class MyMinibatchBuffer:` with no "
    "base, and your own __init__ and get().", plain_class=True)


def _ring_answer_trace(answer_cls: Any, case: Case) -> list[Any]:
    def build(*args: Any) -> SimpleNamespace:  # get() only: its state is its own design
        buffer = answer_cls(*args)
        return SimpleNamespace(get=lambda: buffer.get())

    return minibatch_get._serve(build, case, answer=True)


def _ring_show(out: Any, state: dict[str, Any]) -> Any:
    return verbatim(f"returned {out!r}; items taken from the queue={state['items_taken']}")


def _ring_hint(exp_out: Any, out: Any, exp: dict[str, Any], act: dict[str, Any]) -> str:
    if not (isinstance(out, tuple) and len(out) == 2):
        return "get() must return a pair (item, released)."
    if act["items_taken"] > exp["items_taken"]:
        return ("Too many items taken: this catches taking a new item while the slot's item "
                "still has passes left (or more than one per call). Take one only when the "
                "slot you serve is empty.")
    if act["items_taken"] < exp["items_taken"]:
        return ("Too few items taken: this catches serving an item again after its last "
                "pass. A slot whose item was released takes a new item on its next visit.")
    if not same(out[0], exp_out[0]):
        return ("A different item: this catches a wrong slot order. Each call serves the "
                "next slot of the ring, wrapping around after `size` slots, one pass each.")
    return ("released differs: this catches a wrong ttl. The k-th new item gets "
            "min(k, num_sgd_iter) passes (the ramp 1, 2, ..., num_sgd_iter), and released "
            "is True on the call that uses its last pass.")


def _ring_compare(case: Case, expected: list[Any], actual: list[Any]) -> None:
    minibatch_get.compare_calls(expected, actual, _ring_show, _ring_hint)


# ------------------------------------------------------------------ 3: no Python loop
_LOOPS = {ast.For: "a for loop", ast.AsyncFor: "a for loop", ast.While: "a while loop",
          **dict.fromkeys((ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp),
                          "a comprehension (a loop too)")}
# Loops that a call hides, and classes that a loop drives.
_LOOP_NAMES = {
    **dict.fromkeys(("map", "filter", "reduce", "accumulate", "starmap", "iter",
                     "vectorize", "frompyfunc", "apply_along_axis", "apply_over_axes",
                     "fromiter"), "a loop inside a call"),
    **dict.fromkeys(("def:__iter__", "def:__next__", "def:__getitem__"),
                    "an iterator's method (a loop drives it)")}


def _no_loop(hint: str) -> Rule:
    return Rule("no Python loop", hint, _LOOPS, _LOOP_NAMES, recursion=True)


_NO_VTRACE_LOOP = _no_loop(
    "this rule catches the backward recursion written as a loop over t. Build the [T, T] "
    "matrix of trace products prod_{i=s}^{t-1} gamma_i c_i (upper triangular: np.cumprod "
    "along time, or np.triu of the ratios), then v - V = matrix @ delta per column "
    "(np.einsum).")


def _vtrace_compare(case: Case, ref: dict[str, Any], ans: dict[str, Any]) -> None:
    for name in ("vs", "pg_advantages"):
        bad = ~np.isfinite(ans[name]) & np.isfinite(ref[name])
        if bad.any():
            t, b = (int(k) for k in np.argwhere(bad)[0])
            raise Mismatch(f"{name}[{t}, {b}] (time step t={t}, column b={b})",
                           float(ref[name][t, b]), float(ans[name][t, b]),
                           "nan or inf: this catches log(0) or a division by a zero "
                           "discount in the product matrix (an episode end makes gamma_i c_i "
                           "= 0). Multiply the factors (np.cumprod) or mask the zeros before "
                           "any log.")
    vtrace_numpy.SPEC.compare(case, ref, ans)


# ------------------------------------------------------------------ 5: V-trace in TensorFlow
_VTRACE_NAMES = ("vtrace", "from_logits", "from_importance_weights", "from_logits_numpy",
                 "from_importance_weights_numpy", "log_probs_from_logits_and_actions")


def _vtrace_loss_references() -> list[Any]:
    return vtrace_loss.SPEC.references() + loaded(
        "impala_lab.learner.vtrace", "from_logits", "from_importance_weights",
        "log_probs_from_logits_and_actions", "_discounted_sum_reverse")


_NO_LIBRARY_VTRACE = Rule(
    "no library V-trace", "this rule catches handing V-trace to the library's vtrace module "
    "(from_logits, from_importance_weights). Compute log pi(a) - log mu(a) from the two logits "
    "(tf.nn.log_softmax at the actions), then the targets with a loop over the T steps "
    "backwards (or tf.scan), as in exercise 3.",
    names=dict.fromkeys(_VTRACE_NAMES, "calls the library's V-trace"))


# The exercise's hints name vtrace.from_logits, which this challenge does without.
_OWN_VTRACE = (("vtrace.from_logits(...) gives vs", "your V-trace gives vs"),
               ("to from_logits", "to your V-trace"),
               ("vtrace.from_logits)", "your V-trace)"),
               ("as vtrace.from_logits returns them", "yours must return them"))


def _own_vtrace(text: str) -> str:
    for old, new in _OWN_VTRACE:
        text = text.replace(old, new)
    return text


def _vtrace_loss_cases() -> list[Case]:
    out = vtrace_loss.SPEC.cases()
    for case in out:
        case.hint = _own_vtrace(case.hint)
    return out


def _vtrace_loss_compare(case: Case, expected: Any, actual: Any) -> None:
    try:
        vtrace_loss.SPEC.compare(case, expected, actual)
    except Mismatch as diff:
        diff.hint = _own_vtrace(diff.hint or "")
        raise


# ------------------------------------------------------------------ 6: masks, no if
_NO_IF = Rule(
    "no if", "this rule catches the reset written as a branch on dones (per step or per "
    "column). Multiply instead: keep = 1 - dones[t][:, None], then h, c = h * keep, c * keep "
    "after the step.",
    {ast.If: "an if statement", ast.IfExp: "a conditional expression (x if c else y)",
     ast.Match: "a match statement (a branch)", ast.While: "a while loop (it branches)",
     ast.BoolOp: "a short-circuit and/or (a branch)", ast.Try: "a try statement (a branch)",
     ast.TryStar: "a try statement (a branch)", ast.Assert: "an assert (a branch)",
     ast.comprehension: "a comprehension's if"})

# ------------------------------------------------------------------ 7: the Gaussian, no loop
_NO_GAUSSIAN_LOOP = _no_loop(
    "this rule catches a loop over the rows or over the D dimensions: numpy does both at "
    "once. Split inputs into its halves (inputs[:, :D], inputs[:, D:]), work on the [N, D] "
    "arrays, and sum over axis=-1.")


def _challenge(spec: Spec, **changes: Any) -> Spec:
    return dataclasses.replace(spec, exercise=spec.exercise + "_challenge", **changes)


SPECS: dict[str, Spec] = {s.exercise: s for s in (
    _challenge(minibatch_get.SPEC, answer_trace=_ring_answer_trace,
               compare=_ring_compare, rule=_NO_BASE_CLASS),
    _challenge(replay_mix.SPEC),
    _challenge(vtrace_numpy.SPEC, compare=_vtrace_compare, rule=_NO_VTRACE_LOOP),
    _challenge(driver_step.SPEC),
    _challenge(vtrace_loss.SPEC, cases=_vtrace_loss_cases, compare=_vtrace_loss_compare,
               references=_vtrace_loss_references, rule=_NO_LIBRARY_VTRACE),
    _challenge(lstm_unroll.SPEC, rule=_NO_IF),
    _challenge(diag_gaussian.SPEC, rule=_NO_GAUSSIAN_LOOP),
)}


def check_minibatch_get_challenge(answer_cls: Any, *, show: bool = True) -> CheckResult:
    """Checks a ring buffer written from scratch (``answer_cls(inqueue, size,
    num_sgd_iter)``, no base class, ``get() -> (item, released)``) against the library's."""
    return run_check(SPECS["minibatch_get_challenge"], answer_cls, show=show)


def check_replay_mix_challenge(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks ``mix`` (written from the rule in words) as `check_replay_mix` does."""
    return run_check(SPECS["replay_mix_challenge"], answer, show=show)


def check_vtrace_numpy_challenge(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks a loop-free numpy V-trace as `check_vtrace_numpy` does."""
    return run_check(SPECS["vtrace_numpy_challenge"], answer, show=show)


def check_driver_step_challenge(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks ``driver_step`` (written from the invariants) as `check_driver_step` does."""
    return run_check(SPECS["driver_step_challenge"], answer, show=show)


def check_vtrace_loss_challenge(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks a V-trace loss without the library's vtrace module, as `check_vtrace_loss`."""
    return run_check(SPECS["vtrace_loss_challenge"], answer, show=show)


def check_lstm_unroll_challenge(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks an LSTM unroll with a mask reset and no ``if``, as `check_lstm_unroll` does."""
    return run_check(SPECS["lstm_unroll_challenge"], answer, show=show)


def check_diag_gaussian_challenge(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks a loop-free ``logp_and_entropy`` as `check_diag_gaussian` does."""
    return run_check(SPECS["diag_gaussian_challenge"], answer, show=show)
