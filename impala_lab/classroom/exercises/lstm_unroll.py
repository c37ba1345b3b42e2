"""Exercise 6: the masked LSTM unroll in numpy.

The student writes ``lstm_unroll(xs, state_in, dones, kernel, recurrent_kernel, bias) ->
(hs, state_out)``: Keras's LSTM cell (gates input, forget, cell, output) over ``xs``
[T, B, F] from ``state_in`` [B, 2, C], zeroing a column's state after the step where its
episode ended (``dones`` [T, B]). The checker compares it with
`impala_lab.actor.layers.lstm_sequence` and names the usual slip (`_SLIPS`) where they differ.
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
    named_slip,
)
from impala_lab.classroom.exercises._spec import Spec, run_check

RTOL, ATOL = 1e-5, 1e-5

# name, T, B, F, C, carried state, where episodes end ("none", "middle", "edges", "random"),
# seed, hint
_CASES = [
    ("one step from zeros", 1, 2, 3, 4, False, "none", 0,
     "This case catches the gates in another order or a wrong activation. One step of the "
     "cell: z = x @ kernel + h @ recurrent_kernel + bias, split into four blocks of C in the "
     "order input, forget, cell, output: i, f, o = sigmoid, g = tanh; c' = f * c + i * g, "
     "h' = o * tanh(c')."),
    ("one step from a carried state", 1, 2, 3, 4, True, "none", 1,
     "This case catches h and c read from the wrong half of state_in. From a nonzero "
     "state_in: h = state_in[:, 0], c = state_in[:, 1]; the new state is (h', c') stacked "
     "the same way."),
    ("a sequence, no episode ends", 6, 3, 3, 4, True, "none", 2,
     "This case catches a state not carried from step to step: carry (h, c) to the next "
     "step; hs[t] is h after step t."),
    ("an episode ends in the middle", 8, 3, 3, 4, True, "middle", 3,
     "This case catches the reset a step early or late. Where dones[t, b] is True, column "
     "b's state is zeroed after step t: step t + 1 starts from zeros, step t itself does "
     "not."),
    ("episodes end at the first and the last step", 6, 4, 2, 5, True, "edges", 4,
     "This case catches a reset skipped at the first or the last step: dones[0] resets the "
     "state before step 1; dones[T - 1] resets state_out, the state the next unroll starts "
     "from."),
    ("a long unroll, many ends", 30, 5, 4, 6, True, "random", 5,
     "This case catches slips in the reset's timing or the carried state that show only "
     "over a long unroll with many episode ends."),
]


def make_inputs(T: int, B: int, F: int, C: int, carried: bool, ends: str, seed: int
                ) -> dict[str, np.ndarray]:
    """Seeded inputs: xs [T, B, F], state_in [B, 2, C], dones [T, B] and the weights, all
    float32 (dones bool), large enough that every gate and the state matter."""
    rng = np.random.default_rng(seed)
    dones = np.zeros((T, B), bool)
    if ends == "middle":
        dones[T // 2, 1] = True
    elif ends == "edges":
        dones[0, 0] = dones[T - 1, 1] = dones[0, 2] = dones[T - 1, 2] = True
    elif ends == "random":
        dones = rng.random((T, B)) < 0.2
    f32 = np.float32
    return {"xs": rng.standard_normal((T, B, F)).astype(f32),
            "state_in": (rng.standard_normal((B, 2, C)) if carried
                         else np.zeros((B, 2, C))).astype(f32),
            "dones": dones,
            "kernel": (0.8 * rng.standard_normal((F, 4 * C))).astype(f32),
            "recurrent_kernel": (0.8 * rng.standard_normal((C, 4 * C))).astype(f32),
            "bias": (0.5 * rng.standard_normal(4 * C)).astype(f32)}


def _answer_trace(answer: Any, case: Case) -> dict[str, np.ndarray]:
    p = case.params
    # copies: an answer that writes into its inputs cannot change the reference's
    out = call_answer(answer, **{k: v.copy() for k, v in make_inputs(**case.params).items()})
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise Mismatch("what lstm_unroll returns", "(hs, state_out)", out,
                       "Return a pair (hs, state_out): hs [T, B, C], state_out [B, 2, C].")
    return {"hs": as_array(out[0], "hs", (p["T"], p["B"], p["C"])),
            "state_out": as_array(out[1], "state_out", (p["B"], 2, p["C"]))}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _variant(inputs: dict[str, np.ndarray], slip: str) -> dict[str, np.ndarray]:
    """The unroll with one of the usual slips, in float64 (to name what an answer did)."""
    xs, state, dones = inputs["xs"], inputs["state_in"].astype(np.float64), inputs["dones"]
    kernel, rk, bias = inputs["kernel"], inputs["recurrent_kernel"], inputs["bias"]
    C = rk.shape[0]
    order = {"gates ifog": (0, 1, 3, 2), "gates fiog": (1, 0, 2, 3)}.get(slip, (0, 1, 2, 3))
    if slip == "h and c swapped":
        state = state[:, ::-1]
    T = len(xs)
    hs = np.empty((T, state.shape[0], C))
    h, c = state[:, 0], state[:, 1]
    for t in range(T):
        if slip == "reset late" and t >= 2:
            h, c = h * ~dones[t - 2, :, None], c * ~dones[t - 2, :, None]
        if slip == "reset early":
            h, c = h * ~dones[t, :, None], c * ~dones[t, :, None]
        z = xs[t] @ kernel + h @ rk + bias
        blocks = [z[:, k * C:(k + 1) * C] for k in range(4)]
        i, f, g, o = (blocks[k] for k in order)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        hs[t] = h
        if slip not in ("reset late", "reset early", "no reset"):
            h, c = h * ~dones[t, :, None], c * ~dones[t, :, None]
    out = np.stack([h, c], axis=1)
    if slip == "h and c swapped":
        out = out[:, ::-1]
    return {"hs": hs, "state_out": out}


_SLIPS = {
    "reset late": "the reset comes one step late: zero column b's state before step t + 1 "
                  "when dones[t, b] (right after the step that ended the episode), not later.",
    "reset early": "the reset comes one step early: the step that ends an episode (dones[t, b]) "
                   "still runs from the carried state; zero the state after it, before step t + 1.",
    "no reset": "the state is never reset: zero column b's (h, c) after each step t where "
                "dones[t, b] is True.",
    **dict.fromkeys(("gates ifog", "gates fiog"),
                    "the gates are in the wrong order: Keras's blocks of z are input, forget, "
                    "cell (tanh), output, i.e. i, f, g, o."),
    "h and c swapped": "h and c are swapped: state[:, 0] is h (the output), state[:, 1] is c "
                       "(the cell).",
}


def _reference_trace(case: Case) -> dict[str, np.ndarray]:
    from impala_lab.actor.layers import lstm_sequence

    hs, state_out = lstm_sequence(**make_inputs(**case.params))
    return {"hs": np.asarray(hs, np.float64), "state_out": np.asarray(state_out, np.float64)}


def _compare(case: Case, ref: dict[str, np.ndarray], ans: dict[str, np.ndarray]) -> None:
    p = case.params
    inputs = make_inputs(**case.params)
    for name in ("hs", "state_out"):
        idx = first_difference(ref[name], ans[name], RTOL, ATOL)
        if idx is None:
            continue
        hint = named_slip(_SLIPS, lambda slip: _variant(inputs, slip), name, ans[name])
        if name == "hs":
            t, b, k = idx
            where = f"hs[{t}, {b}, {k}] (step t={t}, column b={b}, unit {k})"
            if not hint and t > 0 and inputs["dones"][t - 1, b]:
                hint = (f"column b={b}'s episode ended at step {t - 1}: step {t} must start "
                        "from a zero state.")
        else:
            b, which, k = idx
            where = (f"state_out[{b}, {which}, {k}] ({'h' if which == 0 else 'c'} of column "
                     f"b={b} after the last step)")
            if not hint and inputs["dones"][-1, b]:
                hint = (f"column b={b}'s episode ended at the last step: its state_out is "
                        "zeros (the next unroll starts a new episode).")
            elif not hint:
                hint = ("hs is right; state_out is (h, c) after the last step, stacked as "
                        "[B, 2, C], zeroed where dones[T - 1].")
        if p["T"] * p["B"] <= 2:  # tiny: show the whole arrays
            raise Mismatch(where + f"; whole {name} below", ref[name], ans[name], hint)
        raise Mismatch(where, float(ref[name][idx]), float(ans[name][idx]), hint)


def _case(name: str, T: int, B: int, F: int, C: int, carried: bool, ends: str, seed: int,
          hint: str) -> Case:
    where = {"none": "no episode ends", "middle": f"column 1 ends an episode at step {T // 2}",
             "edges": "episodes end at steps 0 and T - 1",
             "random": "about 1 in 5 steps ends an episode"}[ends]
    desc = (f"{name}: T={T}, B={B}, F={F}, C={C}, xs and weights ~ N(0, 1) x scale "
            f"(seed {seed}), state_in {'~ N(0, 1)' if carried else 'zeros'}, {where}")
    return Case(desc, hint, {"T": T, "B": B, "F": F, "C": C, "carried": carried,
                             "ends": ends, "seed": seed})


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    return _case("drawn", rng.randint(1, 12), rng.randint(1, 4), rng.randint(1, 4),
                 rng.randint(1, 5), True, "random", rng.randrange(10**6),
                 "A case drawn at random: it catches slips in the reset's timing or the "
                 "carried state that the fixed cases miss.")


def _references() -> list[Any]:
    return (loaded("impala_lab.actor.layers", "lstm_step", "lstm_sequence")
            + loaded("impala_lab.actor.numpy_model", "NumpyModel.step", "NumpyModel.unroll"))


SPEC = Spec("lstm_unroll", lambda: [_case(*row) for row in _CASES], _answer_trace,
            _reference_trace, _compare, _references,
            {"lstm_step": "the library's layers.lstm_step",
             "lstm_sequence": "the library's layers.lstm_sequence",
             ".unroll": "the library's NumpyModel.unroll",
             ".lstm_unroll": "the library's keras_model.lstm_unroll",
             "keras": "Keras's LSTM", "LSTMCell": "Keras's LSTMCell"}, draw)


def check_lstm_unroll(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks a numpy ``lstm_unroll(xs, state_in, dones, kernel, recurrent_kernel, bias) ->
    (hs, state_out)``: xs [T, B, F], state_in [B, 2, C], dones [T, B] bool, kernel [F, 4C],
    recurrent_kernel [C, 4C], bias [4C]; hs [T, B, C], state_out [B, 2, C]; against
    `impala_lab.actor.layers.lstm_sequence`."""
    return run_check(SPEC, answer, show=show)
