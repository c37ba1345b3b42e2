"""Exercise 6, the masked LSTM unroll: the right unroll passes and is the recurrence the
actors run (NumpyModel.unroll's states and logits), every usual slip (a reset a step late or
early, or never, the gates in the wrong order, h and c swapped, a state left unreset at the
last step) fails at the first case that tells it from the right answer with a hint that names
it, and a result of the wrong shape gets a hint from its shape. (The stub and solution
notebooks are run by tests/test_exercises.py and tests/test_notebooks.py, which cover every
entry of EXERCISES.)"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import impala_lab.classroom.exercises as ex
from impala_lab.model_spec import ModelSpec
from tests.exercise_helpers import fails


def _lstm_unroll_with(slip: str):
    """The masked unroll with one slip; "" is right."""
    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    def lstm_unroll(xs, state_in, dones, kernel, recurrent_kernel, bias):
        T, C = len(xs), recurrent_kernel.shape[0]
        h, c = state_in[:, 0], state_in[:, 1]
        hs = np.empty((T, len(state_in), C), np.float32)
        order = (0, 1, 3, 2) if slip == "gates" else (0, 1, 2, 3)
        for t in range(T):
            if slip == "late" and t >= 2:
                h, c = h * ~dones[t - 2, :, None], c * ~dones[t - 2, :, None]
            if slip == "early":
                h, c = h * ~dones[t, :, None], c * ~dones[t, :, None]
            z = xs[t] @ kernel + h @ recurrent_kernel + bias
            i, f, g, o = (z[:, k * C:(k + 1) * C] for k in order)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            hs[t] = h
            last_kept = slip == "end not reset" and t == T - 1
            if slip not in ("late", "early", "none") and not last_kept:
                h, c = h * ~dones[t, :, None], c * ~dones[t, :, None]
        out = np.stack([h, c], axis=1)
        return hs, out[:, ::-1] if slip == "swapped" else out

    return lstm_unroll


def test_lstm_unroll_by_hand_passes_and_equals_the_numpy_models_unroll():
    from impala_lab.actor.layers import lstm_sequence
    from impala_lab.actor.numpy_model import NumpyModel
    from impala_lab.classroom.exercises.lstm_unroll import make_inputs

    assert ex.check_lstm_unroll(_lstm_unroll_with(""), show=False).passed
    # The reference is the recurrence the actors run: NumpyModel.unroll's states.
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    model = NumpyModel(obs_space, gym.spaces.Discrete(2),
                       ModelSpec((), use_lstm=True, lstm_cell_size=4))
    rng = np.random.default_rng(0)
    model.set_weights([(0.7 * rng.standard_normal(s)).astype(np.float32)
                       for s in model.weight_shapes()])
    x = make_inputs(7, 3, 3, 4, True, "random", 1)
    kernel, rk, bias = model._lstm
    hs, state_out = lstm_sequence(x["xs"], x["state_in"], x["dones"], kernel, rk, bias)
    logits, _, model_out = model.unroll(x["xs"], x["state_in"], x["dones"])
    np.testing.assert_array_equal(state_out, model_out)
    # The heads on each step's h give the model's logits.
    kernel, bias = model._pi_head
    np.testing.assert_allclose(hs @ kernel + bias, logits, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("slip, case, where, hint", [
    ("late", 4, "hs[5, 1, 0]", "the reset comes one step late"),
    ("early", 4, "hs[4, 1, 0]", "the reset comes one step early"),
    ("none", 4, "hs[5, 1, 0]", "the state is never reset"),
    ("gates", 1, "hs[0, 0, 0]", "the gates are in the wrong order"),
    ("swapped", 1, "state_out[0, 0, 0] (h of column b=0", "h and c are swapped"),
    ("end not reset", 5, "state_out[1, 0, 0]", "ended at the last step: its state_out is zeros"),
])
def test_lstm_unroll_names_the_slip(slip, case, where, hint):
    fails(ex.check_lstm_unroll(_lstm_unroll_with(slip), show=False), case,
          f"where:    {where}", f"hint:     {hint}" if slip != "end not reset" else hint)


def test_lstm_unroll_with_wrong_shapes_says_which():
    def flat(xs, state_in, dones, kernel, recurrent_kernel, bias):
        hs, out = _lstm_unroll_with("")(xs, state_in, dones, kernel, recurrent_kernel, bias)
        return hs, out.reshape(len(out), -1)

    fails(ex.check_lstm_unroll(flat, show=False), 1, "where:    shape of state_out",
          "expected: [2, 2, 4]", "actual:   [2, 8]")
    fails(ex.check_lstm_unroll(lambda **inputs: None, show=False), 1,
          "what lstm_unroll returns", "Return a pair (hs, state_out)")

