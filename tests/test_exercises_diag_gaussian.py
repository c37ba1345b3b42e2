"""Exercise 7, the diagonal Gaussian's log-prob and entropy: its cases reach the edges they
claim, every usual slip fails with a hint that names it (the first case that tells it from
the right answer), a result of the wrong shape gets a hint from its shape, the library's
own DiagGaussian is no answer, and grading goes through the sandboxed grader. (The stub and
solution notebooks are run by tests/test_exercises.py and tests/test_notebooks.py, which
cover every entry of EXERCISES.)"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

import impala_lab.classroom.exercises as ex
from impala_lab.actor.distributions import DiagGaussian
from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from impala_lab.classroom.exercises._spec import judge, run_answer
from impala_lab.classroom.exercises.diag_gaussian import (
    SPEC,
    _shape_hint,
    _variant,
    draw,
    make_inputs,
)
from impala_lab_grader.grade import grade_notebook
from impala_lab_grader.notebook import load_answer, source, tags

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "notebooks" / "solutions"
STUBS = ROOT / "notebooks" / "exercises"
NOTEBOOK = EXERCISES["diag_gaussian"].notebook
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def answer_with(slip: str = ""):
    """``logp_and_entropy`` as a student would write it, with one slip ("" is right)."""
    def logp_and_entropy(inputs, actions):
        D = inputs.shape[-1] // 2
        mean, log_std = inputs[:, :D], inputs[:, D:]
        if slip == "interleaved":
            mean, log_std = inputs[:, 0::2], inputs[:, 1::2]
        elif slip == "swapped":
            mean, log_std = log_std, mean
        elif slip == "first row":
            log_std = inputs[0, D:] * np.ones_like(mean)
        a = np.clip(actions, -2, 2) if slip == "clipped" else actions
        std = np.exp(log_std)
        z = (a - mean) / std**2 if slip in ("variance", "variance everywhere") else (
            (a - mean) * np.exp(-log_std))
        log_s = {"log(exp())": np.log(std), "log variance": np.log(std**2),
                 "variance everywhere": 2 * log_std, "no log s": 0 * log_std}.get(slip, log_std)
        const = 0.0 if slip == "no constant" else HALF_LOG_2PI
        per_logp = -(z**2 if slip == "z squared" else 0.5 * z**2) - log_s - const
        per_entropy = log_s + const + (0.0 if slip in ("no constant", "entropy 1/2") else 0.5)
        if slip == "mean":
            return per_logp.mean(-1), per_entropy.mean(-1)
        if slip == "axis 0":
            return per_logp.sum(0), per_entropy.sum(0)
        if slip == "keepdims":
            return per_logp.sum(-1, keepdims=True), per_entropy.sum(-1, keepdims=True)
        if slip == "squeeze":
            return (per_logp.sum(-1, keepdims=True).squeeze(),
                    per_entropy.sum(-1, keepdims=True).squeeze())
        if slip == "no sum":
            return per_logp, per_entropy
        if slip == "once":
            return ((per_logp + const).sum(-1) - const,
                    (per_entropy - const - 0.5).sum(-1) + const + 0.5)
        if slip == "sign":
            return -per_logp.sum(-1), -per_entropy.sum(-1)
        return per_logp.sum(-1), per_entropy.sum(-1)

    return logp_and_entropy


def check(answer):
    return ex.check_diag_gaussian(answer, show=False)


def fails(result, case: int | None, *parts: str) -> None:
    assert not result.passed and result.failed_case == case, result.message
    for part in parts:
        assert part in result.message, f"{part!r} not in:\n{result.message}"


# ------------------------------------------------------------------ the cases
def test_the_cases_reach_the_edges_they_name():
    cases = SPEC.cases()
    assert len(cases) == 10 and all(c.hint.startswith("This case catches ") for c in cases)
    inputs = {c.params["kind"] + str(c.params["seed"]): make_inputs(**c.params) for c in cases}
    shapes = [(c.params["N"], c.params["D"]) for c in cases]
    assert (1, 2) in shapes and (4, 4) in shapes and any(d > 2 for _, d in shapes)
    bounds = inputs["bounds6"]["actions"]
    assert (np.abs(bounds) > 2).sum() >= 2  # draws past the Box's bounds, unclipped
    for kind, seed, log_std in (("wide", 7, 100.0), ("narrow", 8, -110.0)):
        x = inputs[f"{kind}{seed}"]
        assert x["inputs"].dtype == np.float32 and np.all(x["inputs"][:, 2:] == log_std)
        with np.errstate(all="ignore"):
            assert not np.isfinite(np.log(np.exp(x["inputs"][:, 2:]))).any()
    rows = inputs["rows5"]["inputs"][:, 2:]
    assert len(np.unique(rows[:, 0])) == len(rows)  # a log-std per row
    free = inputs["free3"]["inputs"][:, 3:]
    assert (free == free[:1]).all() and len(np.unique(free[0])) == 3  # shared, per dimension


def test_the_reference_is_finite_where_it_is_compared_and_the_slips_build_on_it():
    for case in SPEC.cases():
        ref = SPEC.reference_trace(case)
        assert np.isfinite(ref["entropy"]).all()
        if case.params["kind"] != "narrow":
            assert np.isfinite(ref["logp"]).all()
        x = make_inputs(**case.params)
        if case.params["dtype"] == "float64":  # the slips' float64 twin of the library
            right = _variant(x["inputs"], x["actions"], "none")
            np.testing.assert_allclose(right["logp"], ref["logp"], rtol=1e-12)
            np.testing.assert_allclose(right["entropy"], ref["entropy"], rtol=1e-12)


def test_the_right_answer_passes_with_float32_inputs_and_drawn_cases():
    assert check(answer_with()).passed
    drawn = [draw(random.Random(seed)) for seed in range(20)]
    report = run_answer(SPEC, answer_with(), cases=drawn)
    assert judge(SPEC, "logp_and_entropy", report, cases=drawn, show=False).passed


# ------------------------------------------------------------------ slips and their hints
@pytest.mark.parametrize("slip, case, hint", [
    ("no constant", 1, "the constant is missing"),
    ("entropy 1/2", 1, "the entropy lacks the 1/2 per dimension"),
    ("z squared", 1, "z² where z²/2 belongs"),
    ("sign", 1, "hint:     the sign"),
    ("variance", 2, "divided by the variance s² where the standard deviation belongs"),
    ("log variance", 2, "log s² = 2 log_std where log s belongs"),
    ("variance everywhere", 2, "the variance s² where the standard deviation s belongs"),
    ("no log s", 2, "the -log s term is missing"),
    ("swapped", 2, "the halves swapped"),
    ("clipped", 2, "the actions clipped before they are scored"),
    ("mean", 3, "a mean over the D dimensions where a sum belongs"),
    ("once", 3, "the constant is added once, not once per dimension"),
    ("interleaved", 3, "inputs read as (mean, log_std) pairs"),
    ("first row", 5, "the first row's log-std used for every row"),
    ("log(exp())", 8, "this catches exp(log_std) overflowing to inf"),
])
def test_a_slip_gets_the_hint_that_names_it(slip, case, hint):
    result = check(answer_with(slip))
    fails(result, case, f"case {case} of 10 differs from the reference", hint,
          "more:     This case catches ")


def test_an_entropy_guarded_against_overflow_only_is_caught_by_the_narrow_case():
    right = answer_with()

    def logp_and_entropy(inputs, actions):
        logp, _ = right(inputs, actions)
        log_std = inputs[:, inputs.shape[-1] // 2:]
        # exp cannot overflow here; it still underflows to 0 below about -103 in float32
        log_s = np.log(np.exp(np.minimum(log_std, 0.0))) + np.maximum(log_std, 0.0)
        return logp, np.sum(log_s + 0.5 + HALF_LOG_2PI, axis=-1)

    fails(check(logp_and_entropy), 9, "a very narrow policy, float32, entropy only",
          "where:    entropy[0] (row 0)", "actual:   [-inf, -inf, -inf]",
          "This case catches log(exp(log_std)) in the entropy")


def test_a_wrong_entropy_with_a_right_logp_says_so():
    right = answer_with()

    def logp_and_entropy(inputs, actions):
        logp, entropy = right(inputs, actions)
        return logp, entropy + 0.1 * np.abs(actions).sum(-1)  # depends on the action

    fails(check(logp_and_entropy), 1, "where:    entropy[0]", "logp is right, the entropy is "
          "not", "the same whatever the action and the mean")


@pytest.mark.parametrize("slip, case, actual, hint", [
    ("keepdims", 1, "[4, 1]", "This catches keepdims=True"),
    ("squeeze", 3, "[]", "This catches np.squeeze()"),
    ("axis 0", 1, "[1]", "This catches a sum over the rows (axis 0)"),
    ("no sum", 1, "[4, 1]", "This catches keepdims=True"),  # D = 1: the same shape
])
def test_a_result_of_the_wrong_shape_gets_a_hint_from_its_shape(slip, case, actual, hint):
    fails(check(answer_with(slip)), case, "where:    shape of logp", f"actual:   {actual}",
          hint)


def test_the_other_wrong_shapes_and_returns():
    right = answer_with()
    fails(check(lambda inputs, actions: (right(inputs, actions)[0].sum(),) * 2), 1,
          "actual:   []", "a sum or a mean over the whole batch")
    fails(check(lambda inputs, actions: right(inputs, actions)[0]), 1,
          "what logp_and_entropy returns", "Return a pair (logp, entropy)")
    fails(check(lambda inputs, actions: ("a", "b")), 1, "type of logp")
    # shapes the fixed cases' order never shows first
    assert _shape_hint((5, 3), 5, 3).startswith("This catches a missing sum over the D")
    assert "the log-std of one row only" in _shape_hint((1,), 5, 3)
    assert _shape_hint((2, 5), 5, 3) == "The result must have shape [N] = [5], one number per row."


# ------------------------------------------------------------------ the library is no answer
def test_the_librarys_diag_gaussian_is_no_answer():
    def logp_and_entropy(inputs, actions):
        return DiagGaussian.logp(inputs, actions), DiagGaussian.entropy(inputs)

    result = check(logp_and_entropy)
    fails(result, 1, "logp_and_entropy calls the library's DiagGaussian.logp (at ")
    # the trap is gone once the check is over
    x = make_inputs(2, 1, "unit", "float64", 0)
    assert DiagGaussian.logp(x["inputs"], x["actions"]).shape == (2,)


# ------------------------------------------------------------------ through the grader
def with_region(region: str, solution: bool = True) -> dict:
    """The exercise notebook with the code between the markers replaced by `region`."""
    nb = json.loads(((SOLUTIONS if solution else STUBS) / NOTEBOOK).read_text("utf-8"))
    cell = next(c for c in nb["cells"] if "student" in tags(c))
    text = source(cell)
    start = text.index(MARK_START) + len(MARK_START) + 1
    end = text.rindex("\n", 0, text.index(MARK_END)) + 1
    body = "".join("    " + line + "\n" for line in region.strip("\n").splitlines())
    cell["source"] = text[:start] + body + text[end:]
    return nb


def write(tmp_path: Path, who: str, nb: dict) -> Path:
    path = tmp_path / who / NOTEBOOK
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_the_grader_passes_the_solution_and_names_a_slip(tmp_path):
    assert load_answer(SOLUTIONS / NOTEBOOK)[0].name == "diag_gaussian"
    result = grade_notebook(SOLUTIONS / NOTEBOOK, seed=1, show=False)
    assert result.passed and result.message == "✓ diag_gaussian: all 12 cases pass"
    stub = grade_notebook(STUBS / NOTEBOOK, seed=1, show=False)
    assert not stub.passed and "still raises NotImplementedError" in stub.message
    mean = write(tmp_path, "alice", with_region('''
D = inputs.shape[-1] // 2
mean, log_std = inputs[:, :D], inputs[:, D:]
z = (actions - mean) * np.exp(-log_std)
return (np.mean(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1),
        np.mean(log_std + 0.5 + 0.5 * np.log(2 * np.pi), axis=-1))
'''))
    fails(grade_notebook(mean, seed=1, show=False), 3, "case 3 of 12 differs",
          "a mean over the D dimensions where a sum belongs")


def test_the_grader_refuses_the_library_however_it_is_reached(tmp_path):
    named = write(tmp_path, "bob", with_region(
        "from impala_lab.actor.distributions import DiagGaussian\n"
        "return DiagGaussian.logp(inputs, actions), DiagGaussian.entropy(inputs)\n"))
    result = grade_notebook(named, seed=1, show=False)
    fails(result, None, "calls the library's DiagGaussian (`from impala_lab.actor.distributions "
          f"import DiagGaussian`, code cell 7 of {NOTEBOOK}, line ")
    # an alias made in a cell of its own: the grader reads every cell the student wrote
    nb = with_region("return G.logp(inputs, actions), G.entropy(inputs)\n")
    nb["cells"].insert(3, {"cell_type": "code", "execution_count": None, "id": "alias",
                           "metadata": {}, "outputs": [], "source":
                           "from impala_lab.actor import distributions\n"
                           "G = distributions.DiagGaussian\n"})
    result = grade_notebook(write(tmp_path, "carol", nb), seed=1, show=False)
    fails(result, None, "logp_and_entropy calls the library's DiagGaussian "
          f"(`distributions.DiagGaussian`, code cell 3 of {NOTEBOOK}, line 2)")
