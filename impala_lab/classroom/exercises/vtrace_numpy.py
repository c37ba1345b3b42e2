"""Exercise 3: V-trace in numpy.

The student writes ``vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0) -> (vs, pg_advantages)`` with
scalable_agent's time-major shapes (``[T, B]``, ``bootstrap_value`` ``[B]``; ``None``
disables a clip). The checker compares it with
`impala_lab.learner.vtrace.from_importance_weights_numpy` (the paper's explicit sum) on
seeded inputs: on- and off-policy, episode ends, clips on, off and unequal.
"""

from __future__ import annotations

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
)
from impala_lab.classroom.exercises._spec import Spec, run_check

RTOL, ATOL = 1e-5, 1e-6

# name, T, B, log_rho scale, episode ends, clip_rho, clip_pg_rho, seed, hint
_CASES = [
    ("one step, on-policy", 1, 2, 0.0, False, 1.0, 1.0, 0,
     "This case catches a wrong one-step target (or bootstrap): with T = 1, v_0 = V(x_0) + "
     "rho_0 (r_0 + gamma_0 V(x_1) - V(x_0)), where V(x_1) is bootstrap_value."),
    ("on-policy", 5, 3, 0.0, False, 1.0, 1.0, 1,
     "This case catches a wrong discounting of the return: on-policy (all rho = 1) v_s is "
     "the n-step return: the discounted rewards from s to T-1 plus the discounted "
     "bootstrap_value."),
    ("off-policy, clipped", 5, 3, 1.0, False, 1.0, 1.0, 2,
     "This case catches a missing rho clip, or c_i clipped at something other than 1: "
     "delta_t uses rho_t = min(clip_rho_threshold, exp(log_rho_t)); the trace uses "
     "c_i = min(1, exp(log_rho_i)): v_s = V(x_s) + sum_t (prod_{i=s}^{t-1} gamma_i c_i) "
     "delta_t."),
    ("episode ends (discount 0)", 6, 3, 0.5, True, 1.0, 1.0, 3,
     "This case catches one constant gamma where an episode ended: use the per-step "
     "discounts[t] (0 at an episode end) both in delta_t and in the trace product, so that "
     "nothing flows back across an episode end."),
    ("clips disabled (None)", 5, 2, 1.0, False, None, None, 4,
     "This case catches None taken as a number: None disables a clip, so use exp(log_rho) "
     "unclipped (c_i stays min(1, exp(log_rho)))."),
    ("unequal clips", 5, 2, 1.0, True, 0.5, 2.0, 5,
     "This case catches clipping c_i with clip_rho_threshold instead of 1, or the two "
     "thresholds swapped. Three separate clips: clip_rho_threshold (0.5 here) clips only the "
     "rho in delta_t; the trace's c_i = min(1, rho_i) whatever clip_rho_threshold is; "
     "clip_pg_rho_threshold clips the rho of pg_advantages."),
    ("pg clip only", 4, 3, 1.5, False, 3.7, None, 6,
     "This case catches V(x_{s+1}) where v_{s+1} belongs, or a missing pg clip: "
     "pg_advantages_s = min(clip_pg_rho_threshold, rho_s) (r_s + gamma_s v_{s+1} - V(x_s)) "
     "with v_T = bootstrap_value (None: no clip)."),
    ("long unroll, far off-policy", 20, 4, 2.0, True, 1.0, 1.0, 7,
     "This case catches a trace product that stops early or runs across an episode end, "
     "on a long, strongly off-policy unroll."),
]


def make_inputs(T: int, B: int, scale: float, ends: bool, seed: int) -> dict[str, np.ndarray]:
    """Seeded V-trace inputs: log_rhos/discounts/rewards/values [T, B], bootstrap_value [B]."""
    rng = np.random.default_rng(seed)
    discounts = np.full((T, B), 0.9)
    if ends:
        discounts[rng.random((T, B)) < 0.25] = 0.0
    return {"log_rhos": scale * rng.standard_normal((T, B)),
            "discounts": discounts,
            "rewards": rng.standard_normal((T, B)),
            "values": rng.standard_normal((T, B)),
            "bootstrap_value": rng.standard_normal(B)}


def _split(out: Any) -> tuple[Any, Any]:
    if isinstance(out, dict) and {"vs", "pg_advantages"} <= out.keys():
        return out["vs"], out["pg_advantages"]
    if hasattr(out, "vs") and hasattr(out, "pg_advantages"):
        return out.vs, out.pg_advantages
    if isinstance(out, tuple | list) and len(out) == 2:
        return out[0], out[1]
    raise Mismatch("what vtrace returns", "(vs, pg_advantages)", out,
                   "Return a pair (vs, pg_advantages) of [T, B] arrays.")


def _inputs(case: Case) -> dict[str, Any]:
    p = case.params
    return {**make_inputs(p["T"], p["B"], p["scale"], p["ends"], p["seed"]),
            "clip_rho_threshold": p["clip_rho"], "clip_pg_rho_threshold": p["clip_pg"]}


def _answer_trace(answer: Any, case: Case) -> dict[str, np.ndarray]:
    vs, pg = _split(call_answer(answer, **_inputs(case)))
    shape = (case.params["T"], case.params["B"])
    return {"vs": as_array(vs, "vs", shape), "pg_advantages": as_array(pg, "pg_advantages",
                                                                         shape)}


def _reference_trace(case: Case) -> dict[str, np.ndarray]:
    from impala_lab.learner.vtrace import from_importance_weights_numpy  # imports TensorFlow

    ref = from_importance_weights_numpy(**_inputs(case))
    return {"vs": np.asarray(ref.vs, np.float64),
            "pg_advantages": np.asarray(ref.pg_advantages, np.float64)}


def _compare(case: Case, ref: dict[str, np.ndarray], ans: dict[str, np.ndarray]) -> None:
    p = case.params
    for name in ("vs", "pg_advantages"):
        actual, expected = ans[name], ref[name]
        idx = first_difference(expected, actual, RTOL, ATOL)
        if idx is None:
            continue
        t, b = idx
        what = f"{name}[{t}, {b}] (time step t={t}, column b={b})"
        if name == "pg_advantages":
            hint = ("vs is right, pg_advantages is not: this catches V(x_{s+1}) where "
                    "v_{s+1} belongs, or the wrong clip; pg_advantages_s = "
                    "min(clip_pg_rho_threshold, rho_s) * "
                    "(r_s + gamma_s * v_{s+1} - V(x_s)), with v_T = bootstrap_value.")
        elif t == p["T"] - 1:
            hint = ("The last step is wrong: this catches a missing bootstrap. It bootstraps "
                    "from bootstrap_value, v_{T-1} = V(x_{T-1}) + rho_{T-1} (r + gamma V(x_T) "
                    "- V(x_{T-1})).")
        else:
            hint = ""
        if p["T"] * p["B"] <= 15:  # small: show the whole arrays
            raise Mismatch(what + f"; whole {name} [T={p['T']}, B={p['B']}] below",
                           expected, actual, hint)
        raise Mismatch(what, float(expected[t, b]), float(actual[t, b]), hint)


def _case(name: str, T: int, B: int, scale: float, ends: bool, clip_rho: float | None,
          clip_pg: float | None, seed: int, hint: str) -> Case:
    desc = (f"{name}: T={T}, B={B}, log_rhos ~ {scale} * N(0, 1), discounts 0.9"
            f"{' (0 at about 1 in 4 steps)' if ends else ''}, rewards, values, "
            f"bootstrap_value ~ N(0, 1) (seed {seed}), clip_rho_threshold={clip_rho}, "
            f"clip_pg_rho_threshold={clip_pg}")
    return Case(desc, hint, {"T": T, "B": B, "scale": scale, "ends": ends,
                             "clip_rho": clip_rho, "clip_pg": clip_pg, "seed": seed})


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    clips = [None, 0.5, 1.0, 2.0]
    return _case("drawn", rng.randint(1, 12), rng.randint(1, 4), round(rng.uniform(0, 2), 2),
                 rng.random() < 0.5, rng.choice(clips), rng.choice(clips),
                 rng.randrange(10**6), "A case drawn at random: it catches slips in the "
                 "clips, the discounts or the trace product that the fixed cases miss.")


_LIBRARY = ("from_importance_weights_numpy", "from_importance_weights", "from_logits_numpy",
            "from_logits")
SPEC = Spec("vtrace_numpy", lambda: [_case(*row) for row in _CASES], _answer_trace,
            _reference_trace, _compare, lambda: loaded("impala_lab.learner.vtrace", *_LIBRARY),
            {name: f"the library's vtrace.{name}" for name in _LIBRARY}, draw)


def check_vtrace_numpy(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks a numpy ``vtrace(...) -> (vs, pg_advantages)`` against the library's."""
    return run_check(SPEC, answer, show=show)
