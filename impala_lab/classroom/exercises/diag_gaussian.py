"""Exercise 7: the diagonal Gaussian's log-probability and entropy in numpy.

The student writes ``logp_and_entropy(inputs, actions) -> (logp, entropy)``: from ``inputs``
[N, 2D] (D means, then D log-stds, as `impala_lab.actor.distributions.DiagGaussian` reads
them) and the actions [N, D], log pi(a | x) [N] and H(pi(. | x)) [N]. The checker compares
both with ``DiagGaussian``; where they differ, it names the usual slip (`_SLIPS`) that gives
the answer's numbers, or reads a hint off a wrong shape. Never imports TensorFlow.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from impala_lab.classroom.exercises._common import (
    Case,
    CheckResult,
    Mismatch,
    as_array,
    call_answer,
    first_difference,
    loaded,
    named_slip,
    verbatim,
)
from impala_lab.classroom.exercises._spec import Spec, run_check

RTOL, ATOL = 1e-5, 1e-6
_LOG_2PI = math.log(2.0 * math.pi)
WIDE_LOG_STD, NARROW_LOG_STD = 100.0, -110.0  # past float32's exp range (about -103 to 88)

# name, N, D, kind (how the inputs are drawn: see make_inputs), dtype, seed, hint
_CASES = [
    ("the unit Gaussian, one dimension", 4, 1, "unit", "float64", 0,
     "This case catches a missing or wrong constant: with mean 0 and log_std 0, "
     "log pi(a) = -a²/2 - log(2π)/2 and H = (1 + log 2π)/2 ≈ 1.4189."),
    ("one dimension, a free log-std", 5, 1, "free", "float64", 1,
     "This case catches the variance where the standard deviation belongs, or log s missing "
     "or doubled: with s = exp(log_std) ≠ 1, log pi(a) = -z²/2 - log_std - log(2π)/2 where "
     "z = (a - m) / s."),
    ("one row, two dimensions", 1, 2, "rows", "float64", 2,
     "This case catches a result that loses its row axis when N = 1 (np.squeeze() drops it "
     "too): one row still gives shape [1]."),
    ("three dimensions", 5, 3, "free", "float64", 3,
     "This case catches a mean over the D dimensions where a sum belongs, the constant added "
     "once instead of once per dimension, or the halves of inputs read wrong: D means "
     "first, then D log-stds."),
    ("as many rows as dimensions", 4, 4, "rows", "float64", 4,
     "This case catches a sum over the wrong axis: with N = D the shapes agree, but the sum "
     "runs over each row's D numbers (axis=-1), not over the N rows."),
    ("a log-std per row", 6, 2, "rows", "float64", 5,
     "This case catches one row's log-std used for every row: with free_log_std=False the "
     "head gives each state its own, so read inputs[:, D:] row by row."),
    ("draws past a Box's bounds [-2, 2]", 6, 1, "bounds", "float64", 6,
     "This case catches actions clipped before they are scored: the actor clips only what "
     "env.step gets; the batch keeps the unclipped draw, and log pi is that draw's."),
    ("a very wide policy, float32", 3, 2, "wide", "float32", 7,
     "This case catches log(exp(log_std)): exp(100) overflows float32 to inf, but log s is "
     "log_std itself. Use log_std wherever log s appears, and exp(-log_std) for 1 / s."),
    ("a very narrow policy, float32, entropy only", 3, 2, "narrow", "float32", 8,
     "This case catches log(exp(log_std)) in the entropy: exp(-110) underflows float32 to 0, "
     "whose log is -inf; H = sum_d (log_std_d + (1 + log 2π)/2) needs no exp."),
    ("a batch of the policy's own draws", 32, 6, "draws", "float64", 9,
     "This case catches slips in the sum, the constant or the log-std that show only on a "
     "larger batch of draws."),
]

_KINDS = {
    "unit": "means 0, log_std 0, actions ~ N(0, 1)",
    "free": "means ~ N(0, 1.5²), one log_std per dimension shared by every row "
            "(free_log_std), actions drawn from the policy",
    "rows": "means ~ N(0, 1.5²), log_std ~ U(-1.5, 1) per row and dimension, actions drawn "
            "from the policy",
    "bounds": "means ~ U(-2.5, 2.5), log_std 0, actions drawn from the policy and not "
              "clipped (some past ±2)",
    "wide": f"means ~ N(0, 1), log_std = {WIDE_LOG_STD:g}, actions = means + N(0, 3²)",
    "narrow": f"means ~ N(0, 1), log_std = {NARROW_LOG_STD:g}, actions = means; only the "
              "entropy is compared (no float32 log-prob is finite that narrow)",
    "draws": "means ~ N(0, 1), log_std ~ U(-2, 1) per row and dimension, actions drawn from "
             "the policy",
}


def make_inputs(N: int, D: int, kind: str, dtype: str, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: ``inputs`` [N, 2D] (means, then log-stds) and ``actions`` [N, D], both
    of `dtype`; `kind` is how they are drawn (a key of ``_KINDS``)."""
    rng = np.random.default_rng(seed)
    mean = rng.normal(0.0, 1.5 if kind in ("free", "rows") else 1.0, (N, D))
    if kind == "unit":
        mean[:] = 0.0
    if kind == "bounds":
        mean = rng.uniform(-2.5, 2.5, (N, D))
    log_std = {"unit": lambda: np.zeros((N, D)), "bounds": lambda: np.zeros((N, D)),
               "free": lambda: np.tile(rng.choice([-1.0, 1.0], D) * rng.uniform(0.4, 1.2, D),
                                       (N, 1)),
               "rows": lambda: rng.uniform(-1.5, 1.0, (N, D)),
               "draws": lambda: rng.uniform(-2.0, 1.0, (N, D)),
               "wide": lambda: np.full((N, D), WIDE_LOG_STD),
               "narrow": lambda: np.full((N, D), NARROW_LOG_STD)}[kind]()
    if kind == "wide":
        actions = mean + rng.normal(0.0, 3.0, (N, D))
    elif kind == "narrow":
        actions = mean.copy()
    else:
        actions = mean + np.exp(log_std) * rng.standard_normal((N, D))
    return {"inputs": np.concatenate([mean, log_std], axis=1).astype(dtype),
            "actions": actions.astype(dtype)}


def _compared(case: Case) -> tuple[str, ...]:
    return ("entropy",) if case.params["kind"] == "narrow" else ("logp", "entropy")


def _shape_hint(shape: tuple[int, ...], N: int, D: int) -> str:
    """What a result of `shape` (not [N]) says about the answer."""
    if shape == (N, 1):
        return ("This catches keepdims=True (or a [N, 1] column): return one number per row, "
                "shape [N].")
    if shape == () and N == 1:
        return ("This catches np.squeeze(): with N = 1 it drops the row axis too. Sum over "
                "axis=-1 without keepdims instead.")
    if shape == (D,):
        return ("This catches a sum over the rows (axis 0): sum over each row's D numbers, "
                "axis=-1." + (" (Or one row's log-std used for all: each row has its own.)"
                              if D == 1 else ""))
    if shape == (N, D):
        return ("This catches a missing sum over the D dimensions: the coordinates are "
                "independent, so their log-densities (and entropies) add up, one number per "
                "row.")
    if shape in ((), (1,)):
        return ("This catches a result without its row axis: a sum or a mean over the whole "
                "batch, or the log-std of one row only (inputs[0, D:]; every row carries its "
                "own). Work on [N, D] arrays and sum over axis=-1.")
    return f"The result must have shape [N] = [{N}], one number per row."


def _answer_trace(answer: Any, case: Case) -> dict[str, np.ndarray]:
    p = case.params
    # copies: an answer that writes into its inputs cannot change the reference's; the far
    # log-stds overflow exp on purpose (the values are judged, not numpy's warnings)
    with np.errstate(all="ignore"):
        out = call_answer(answer, **{k: v.copy() for k, v in make_inputs(**case.params).items()})
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise Mismatch("what logp_and_entropy returns", verbatim("(logp, entropy)"), out,
                       "Return a pair (logp, entropy), two arrays of shape [N].")
    N, D = p["N"], p["D"]
    return {name: as_array(value, name, (N,), lambda shape: _shape_hint(shape, N, D))
            for name, value in zip(("logp", "entropy"), out)}


def _reference_trace(case: Case) -> dict[str, np.ndarray]:
    from impala_lab.actor.distributions import DiagGaussian

    x = make_inputs(**case.params)
    return {"logp": np.asarray(DiagGaussian.logp(x["inputs"], x["actions"]), np.float64),
            "entropy": np.asarray(DiagGaussian.entropy(x["inputs"]), np.float64)}


# slip -> what multiplies log_std in z and where log s belongs
_LOG_STD_FACTORS = {"variance everywhere": (2.0, 2.0), "variance in z": (2.0, 1.0),
                    "log variance": (1.0, 2.0), "log-std as log-variance": (0.5, 0.5),
                    "no log s": (1.0, 0.0)}


def _variant(inputs: np.ndarray, actions: np.ndarray, slip: str) -> dict[str, np.ndarray]:
    """Log-prob and entropy with one of the usual slips, in float64."""
    x, a = np.asarray(inputs, np.float64), np.asarray(actions, np.float64)
    D = x.shape[-1] // 2
    mean, log_std = x[:, :D], x[:, D:]
    if slip == "halves swapped":
        mean, log_std = log_std, mean
    elif slip == "halves interleaved":
        mean, log_std = x[:, 0::2], x[:, 1::2]
    elif slip == "one row's log-std":
        log_std = np.broadcast_to(log_std[:1], log_std.shape)
    elif slip.startswith("clipped to "):
        bound = float(slip.rsplit(" ", 1)[1])
        a = np.clip(a, -bound, bound)
    with np.errstate(all="ignore"):
        # z = (a - m) * exp(-z_scale); log_term stands where log s belongs
        z_factor, log_factor = _LOG_STD_FACTORS.get(slip, (1.0, 1.0))
        z_scale, log_term = z_factor * log_std, log_factor * log_std
        if slip == "std as log-std":
            z_scale = log_term = np.log(log_std)
        z2 = np.square((a - mean) * np.exp(-z_scale))
        z2 = z2 if slip == "z² without 1/2" else 0.5 * z2
        c_logp, c_ent = 0.5 * _LOG_2PI, 0.5 * (1.0 + _LOG_2PI)
        if slip == "no constant":
            c_logp = c_ent = 0.0
        elif slip == "entropy without 1/2":
            c_ent = 0.5 * _LOG_2PI
        per_logp, per_ent = -(z2 + log_term + c_logp), log_term + c_ent
        reduce = {"mean over dims": lambda v: v.mean(axis=-1),
                  "wrong axis": lambda v: v.sum(axis=0)}.get(slip, lambda v: v.sum(axis=-1))
        if slip == "constant once":
            logp = reduce(per_logp + c_logp) - c_logp
            entropy = reduce(per_ent - c_ent) + c_ent
        else:
            logp, entropy = reduce(per_logp), reduce(per_ent)
    if slip == "sign flipped":
        logp, entropy = -logp, -entropy
    return {"logp": logp, "entropy": entropy}


_SLIPS = {
    "no constant": "the constant is missing: each dimension adds -log(2π)/2 to log pi and "
                   "(1 + log 2π)/2 to the entropy.",
    "constant once": "the constant is added once, not once per dimension: log pi has "
                     "-D log(2π)/2, the entropy D (1 + log 2π)/2.",
    "entropy without 1/2": "the entropy lacks the 1/2 per dimension that E[z²]/2 = 1/2 "
                           "gives: H = sum_d (log s_d + 1/2 + log(2π)/2).",
    "mean over dims": "a mean over the D dimensions where a sum belongs: independent "
                      "coordinates' log-densities add (and so do their entropies).",
    "wrong axis": "a sum over the rows (axis 0): sum over each row's D numbers, axis=-1.",
    "variance everywhere": "the variance s² where the standard deviation s belongs: "
                           "z = (a - m) / s, and log s = log_std (not log s² = 2 log_std).",
    "variance in z": "(a - m) divided by the variance s² where the standard deviation "
                     "belongs: z = (a - m) / s, and z²/2 squares s once.",
    "log variance": "log s² = 2 log_std where log s belongs: the density's normaliser is "
                    "1 / (s √(2π)), so its log is -log_std - log(2π)/2 per dimension.",
    "log-std as log-variance": "log_std read as the log of the variance (s = "
                               "exp(log_std / 2)): it is log s itself, s = exp(log_std).",
    "std as log-std": "the second half of inputs taken as s: it is log s, so s = "
                      "exp(log_std) and log s = log_std.",
    "no log s": "the -log s term is missing: the density's normaliser 1 / (s √(2π)) "
                "gives -log_std - log(2π)/2 per dimension (and +log_std in the entropy).",
    "z² without 1/2": "z² where z²/2 belongs: the exponent of the normal density is "
                      "-z²/2.",
    "halves swapped": "the halves swapped: inputs[:, :D] are the means, inputs[:, D:] the "
                      "log-stds.",
    "halves interleaved": "inputs read as (mean, log_std) pairs: they are all D means first, "
                          "then all D log-stds (inputs[:, :D], inputs[:, D:]).",
    "one row's log-std": "the first row's log-std used for every row: each row has its own "
                         "(free_log_std=False), so use inputs[:, D:] whole.",
    "sign flipped": "the sign: log pi(a) = -sum_d (z²/2 + log s + log(2π)/2) and "
                    "H = +sum_d (log s + (1 + log 2π)/2).",
    **dict.fromkeys(("clipped to 1", "clipped to 2"),
                    "the actions clipped before they are scored: the batch holds the "
                    "unclipped draw, and the loss needs its log-prob (the clip is only for "
                    "env.step)."),
}

_NOT_FINITE = ("inf or nan where the reference is finite: this catches exp(log_std) "
               "overflowing to inf (or underflowing to 0) before a log or a division, or a "
               "log of log_std (it is log s already, and may be negative). Use log_std itself "
               "where log s appears, and (a - m) * exp(-log_std) for z.")


def _compare(case: Case, ref: dict[str, np.ndarray], ans: dict[str, np.ndarray]) -> None:
    N = case.params["N"]
    x = make_inputs(**case.params)
    for name in _compared(case):
        expected, actual = ref[name], ans[name]
        bad = ~np.isfinite(actual) & np.isfinite(expected)
        idx = (int(np.argwhere(bad)[0][0]),) if bad.any() else first_difference(
            expected, actual, RTOL, ATOL)
        if idx is None:
            continue
        i = idx[0]
        hint = _NOT_FINITE if bad.any() else named_slip(
            _SLIPS, lambda slip: _variant(x["inputs"], x["actions"], slip), name, actual)
        if not hint and name == "entropy" and "logp" in _compared(case):
            hint = ("logp is right, the entropy is not: H = sum_d (log_std_d + (1 + log 2π)/2)"
                    ", the same whatever the action and the mean.")
        where = f"{name}[{i}] (row {i})"
        if N <= 8:  # small: show the whole results
            raise Mismatch(where + f"; whole {name} [N={N}] below", expected, actual, hint)
        raise Mismatch(where, float(expected[i]), float(actual[i]), hint)


def _references() -> list[Any]:
    # numpy only: imported here, so that it is trapped even where no cell imported it
    import impala_lab.actor.distributions  # noqa: F401

    return (loaded("impala_lab.actor.distributions", "DiagGaussian.logp", "DiagGaussian.entropy")
            + loaded("impala_lab.learner.distributions", "TFDiagGaussian.logp",
                     "TFDiagGaussian.entropy"))


def _case(name: str, N: int, D: int, kind: str, dtype: str, seed: int, hint: str) -> Case:
    desc = f"{name}: N={N}, D={D}, {_KINDS[kind]}, {dtype} (seed {seed})"
    return Case(desc, hint, {"N": N, "D": D, "kind": kind, "dtype": dtype, "seed": seed})


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    return _case("drawn", rng.randint(1, 16), rng.randint(1, 6),
                 rng.choice(["free", "rows", "draws", "bounds"]), "float64",
                 rng.randrange(10**6), "A case drawn at random: it catches slips in the sum, "
                 "the constant or the log-std that the fixed cases miss.")


SPEC = Spec("diag_gaussian", lambda: [_case(*row) for row in _CASES], _answer_trace,
            _reference_trace, _compare, _references,
            {"DiagGaussian": "the library's DiagGaussian",
             "TFDiagGaussian": "the library's TFDiagGaussian",
             "pick_distribution": "the library's pick_distribution",
             "tf_distribution": "the library's tf_distribution",
             ".logpdf": "a library's normal log-density (logpdf)"}, draw)


def check_diag_gaussian(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks a numpy ``logp_and_entropy(inputs, actions) -> (logp, entropy)`` (inputs [N, 2D]:
    D means, then D log-stds; actions [N, D]; logp and entropy [N]) against
    `impala_lab.actor.distributions.DiagGaussian`."""
    return run_check(SPEC, answer, show=show)
