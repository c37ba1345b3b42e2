"""The optional challenges: each is graded by its exercise's own cases, reference and comparison
(same case count, drawn cases in the grader), each structural rule fails an answer that breaks
it with a message that names the rule, the code and the fix, and a wrong answer that keeps the
rules gets a hint that names its mistake. (The stub and solution of each challenge notebook
are run by tests/test_exercises.py, which covers every entry of EXERCISES.)"""

from __future__ import annotations

import json
import linecache
from pathlib import Path

import numpy as np
import pytest

import impala_lab.classroom.exercises as ex
from impala_lab.classroom.exercises import EXERCISES, MARK_START
from impala_lab.classroom.exercises.challenges import SPECS
from impala_lab_grader.grade import grade_notebook
from impala_lab_grader.notebook import exercise_of, load_answer, read_notebook, source, tags

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "notebooks" / "exercises"
SOLUTIONS = ROOT / "notebooks" / "solutions"
CHALLENGES = [e for e in EXERCISES.values() if e.base]


def answer_from(code: str, name: str, filename: str = "<challenge test>"):
    """`name` from `code` compiled as a notebook cell is (its source findable by the guard)."""
    text = code.strip("\n") + "\n"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict = {"__name__": "__exercise__"}
    exec(compile(text, filename, "exec"), namespace)
    return namespace[name]


def solution(name: str):
    return load_answer(SOLUTIONS / EXERCISES[name].notebook)[1]


def fails(result, *parts: str) -> None:
    assert not result.passed, result.message
    for part in parts:
        assert part in result.message, f"{part!r} not in:\n{result.message}"


# ------------------------------------------------------------------ the registry
def test_every_exercise_has_one_challenge_with_the_same_cases():
    bases = [e for e in EXERCISES.values() if not e.base]
    assert sorted(c.base for c in CHALLENGES) == sorted(e.name for e in bases)
    for c in CHALLENGES:
        base, spec = EXERCISES[c.base], SPECS[c.name]
        assert c.name == f"{c.base}_challenge" and c.checker == f"{base.checker}_challenge"
        assert c.answer == base.answer
        assert c.notebook.startswith(base.notebook[:3] + "c_")
        assert getattr(ex, c.checker) is not None
        base_spec = __import__(f"impala_lab.classroom.exercises.{c.base}",
                               fromlist=["SPEC"]).SPEC
        assert spec.exercise == c.name
        assert [(k.description, k.params) for k in spec.cases()] == [
            (k.description, k.params) for k in base_spec.cases()]
        assert spec.draw is base_spec.draw
        assert spec.reference_trace is base_spec.reference_trace
        assert set(base_spec.forbidden) <= set(spec.forbidden)


def test_challenge_notebooks_are_told_apart_from_their_exercise():
    for c in CHALLENGES:
        for folder in (STUBS, SOLUTIONS):
            path = folder / c.notebook
            nb = read_notebook(path)
            assert exercise_of(path, nb) is c
            assert tags(nb["cells"][-1]) == ["check"]
            assert source(nb["cells"][0]).startswith(f"# Exercise {c.notebook[2]}c · ")
            assert "(challenge, optional)" in source(nb["cells"][0]).splitlines()[0]
        base = read_notebook(STUBS / EXERCISES[c.base].notebook)
        install = [x for x in base["cells"] if x.get("id") == "colab-install"]
        assert install and install[0] in read_notebook(STUBS / c.notebook)["cells"]
        # the base notebook points at its challenge
        assert c.notebook in source(base["cells"][-1])


# ------------------------------------------------------------------ 1c: no base class
RING_RIGHT = '''
class MyMinibatchBuffer:
    # ---- YOUR CODE STARTS HERE ----
    def __init__(self, inqueue, size, num_sgd_iter):
        self.q, self.n, self.slots, self.at, self.seen = inqueue, num_sgd_iter, [None] * size, 0, 0

    def get(self):
        if self.slots[self.at] is None:
            self.seen += 1
            self.slots[self.at] = [self.q.get(), PASSES]
        slot = self.slots[self.at]
        slot[1] -= 1
        if slot[1] == 0:
            self.slots[self.at] = None
        self.at = (self.at + 1) % len(self.slots)
        return slot[0], slot[1] == 0
    # ---- YOUR CODE ENDS HERE ----
'''


def test_ring_passes_with_a_state_of_its_own_design():
    answer = answer_from(RING_RIGHT.replace("PASSES", "min(self.seen, self.n)"),
                         "MyMinibatchBuffer", "<ring right>")
    assert ex.check_minibatch_get_challenge(answer, show=False).passed


def test_ring_without_the_ramp_gets_the_ttl_hint():
    answer = answer_from(RING_RIGHT.replace("PASSES", "self.n"), "MyMinibatchBuffer",
                         "<ring no ramp>")
    fails(ex.check_minibatch_get_challenge(answer, show=False), "case 2 of 7",
          "expected: returned ('item0', True); items taken from the queue=1",
          "released differs: this catches a wrong ttl")


def test_ring_that_subclasses_the_library_breaks_the_rule():
    answer = answer_from('''
from impala_lab.learner.minibatch_buffer import MinibatchBuffer

class MyMinibatchBuffer(MinibatchBuffer):
    # ---- YOUR CODE STARTS HERE ----
    def get(self):
        return "item0", True
    # ---- YOUR CODE ENDS HERE ----
''', "MyMinibatchBuffer", "<ring subclass>")
    result = ex.check_minibatch_get_challenge(answer, show=False)
    fails(result, "breaks the challenge's rule \"no base class\": MyMinibatchBuffer "
          "subclasses MinibatchBuffer", "hint:     this rule catches an answer that inherits")
    assert result.message.count("hint:") == 1 and result.failed_case is None


# ------------------------------------------------------------------ 3c: no loop
VTRACE_LOGS = '''
import numpy as np

def vtrace(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=1.0,
           clip_pg_rho_threshold=1.0):
    # ---- YOUR CODE STARTS HERE ----
    rhos = np.exp(log_rhos)
    rho_bar = rhos if clip_rho_threshold is None else np.minimum(clip_rho_threshold, rhos)
    nxt = np.concatenate([values[1:], bootstrap_value[None]])
    deltas = rho_bar * (rewards + discounts * nxt - values)
    logs = np.concatenate([np.zeros_like(values[:1]),
                           np.cumsum(np.log(discounts * np.minimum(1.0, rhos)), axis=0)])
    T = len(values)
    upper = (np.arange(T)[None, :] >= np.arange(T)[:, None])[:, :, None]
    products = np.where(upper, np.exp(logs[None, :-1] - logs[:-1, None]), 0.0)
    vs = values + np.einsum("stb,tb->sb", products, deltas)
    vs_next = np.concatenate([vs[1:], bootstrap_value[None]])
    pg = rhos if clip_pg_rho_threshold is None else np.minimum(clip_pg_rho_threshold, rhos)
    return vs, pg * (rewards + discounts * vs_next - values)
    # ---- YOUR CODE ENDS HERE ----
'''


def test_vtrace_with_logs_of_zero_discounts_gets_the_nan_hint():
    with np.errstate(divide="ignore", invalid="ignore"):
        result = ex.check_vtrace_numpy_challenge(answer_from(VTRACE_LOGS, "vtrace", "<logs>"),
                                                 show=False)
    fails(result, "case 4 of 8", "episode ends", "actual:   nan",
          "nan or inf: this catches log(0)")


def test_vtrace_with_a_loop_breaks_the_rule(tmp_path):
    result = ex.check_vtrace_numpy_challenge(solution("vtrace_numpy"), show=False)
    fails(result, "breaks the challenge's rule \"no Python loop\": a for loop (`for t in "
          "reversed(range(len(values))):`, code cell 3 of ex3_vtrace_numpy.ipynb, line ",
          "hint:     this rule catches the "
          "backward recursion written as a loop")
    # the same in a hand-in, through the grader's sandbox
    nb = read_notebook(SOLUTIONS / EXERCISES["vtrace_numpy_challenge"].notebook)
    cell = next(c for c in nb["cells"] if "student" in tags(c))
    cell["source"] = source(cell).replace(MARK_START + "\n",
                                          MARK_START + "\n    _ = [t for t in range(3)]\n")
    path = tmp_path / EXERCISES["vtrace_numpy_challenge"].notebook
    path.write_text(json.dumps(nb), encoding="utf-8")
    fails(grade_notebook(path, show=False), "no Python loop", "a comprehension")


# ------------------------------------------------------------------ 5c: no library V-trace
def test_vtrace_loss_with_the_library_vtrace_breaks_the_rule():
    fails(ex.check_vtrace_loss_challenge(solution("vtrace_loss"), show=False),
          "breaks the challenge's rule \"no library V-trace\": calls the library's V-trace "
          "(`vtrace.from_logits`, code cell 4 of ex5_vtrace_loss.ipynb, line ",
          "hint:     this rule catches handing V-trace to the library's vtrace module")


def test_vtrace_loss_challenge_without_truncation_bootstrap_gets_its_hint():
    right = solution("vtrace_loss_challenge")

    def vtrace_loss(target_logits, values, bootstrap_value, batch, config):
        batch = dict(batch, truncation_values=np.zeros_like(batch["truncation_values"]))
        return right(target_logits, values, bootstrap_value, batch, config)

    result = ex.check_vtrace_loss_challenge(vtrace_loss, show=False)
    fails(result, "case 4 of 8", "add gamma * truncation_values to the reward")
    # no hint of the challenge points at the library's V-trace it does without
    assert "from_logits" not in "".join(c.hint for c in SPECS[result.exercise].cases())


# ------------------------------------------------------------------ 6c: masks, no if
LSTM = '''
import numpy as np

def lstm_unroll(xs, state_in, dones, kernel, recurrent_kernel, bias):
    # ---- YOUR CODE STARTS HERE ----
    T, C = len(xs), recurrent_kernel.shape[0]
    h, c = state_in[:, 0], state_in[:, 1]
    hs = np.zeros((T, len(state_in), C), np.float32)
    for t in range(T):
        RESET_BEFORE
        z = xs[t] @ kernel + h @ recurrent_kernel + bias
        i, f, g, o = np.split(z, 4, axis=-1)
        c = c / (1 + np.exp(-f)) + np.tanh(g) / (1 + np.exp(-i))
        h = np.tanh(c) / (1 + np.exp(-o))
        hs[t] = h
        RESET_AFTER
    return hs, np.stack([h, c], axis=1)
    # ---- YOUR CODE ENDS HERE ----
'''
MASK = "h, c = h * ~dones[t, :, None], c * ~dones[t, :, None]"
BRANCH = "if dones[t].any():\n            h, c = h * ~dones[t, :, None], c * ~dones[t, :, None]"


def test_lstm_with_masks_passes_and_with_an_if_breaks_the_rule():
    good = LSTM.replace("RESET_BEFORE", "pass").replace("RESET_AFTER", MASK)
    assert ex.check_lstm_unroll_challenge(answer_from(good, "lstm_unroll", "<lstm>"),
                                          show=False).passed
    branchy = LSTM.replace("RESET_BEFORE", "pass").replace("RESET_AFTER", BRANCH)
    fails(ex.check_lstm_unroll_challenge(answer_from(branchy, "lstm_unroll", "<lstm if>"),
                                         show=False),
          "breaks the challenge's rule \"no if\": an if statement (`if dones[t].any():`, "
          "<lstm if>, line 15)", "hint:     this rule catches the reset written as a branch")


def test_lstm_reset_before_the_step_gets_its_hint():
    early = LSTM.replace("RESET_BEFORE", MASK).replace("RESET_AFTER", "pass")
    fails(ex.check_lstm_unroll_challenge(answer_from(early, "lstm_unroll", "<lstm early>"),
                                         show=False),
          "case 4 of 6", "the reset comes one step early")


# ------------------------------------------------------------------ 7c: the Gaussian, no loop
GAUSSIAN_BY_DIMENSION = '''
import numpy as np

def logp_and_entropy(inputs, actions):
    # ---- YOUR CODE STARTS HERE ----
    D = inputs.shape[-1] // 2
    logp, entropy = np.zeros(len(inputs)), np.zeros(len(inputs))
    for d in range(D):
        z = (actions[:, d] - inputs[:, d]) * np.exp(-inputs[:, D + d])
        logp += -0.5 * z**2 - inputs[:, D + d] - 0.5 * np.log(2 * np.pi)
        entropy += inputs[:, D + d] + 0.5 + 0.5 * np.log(2 * np.pi)
    return logp, entropy
    # ---- YOUR CODE ENDS HERE ----
'''


def test_gaussian_with_a_loop_passes_the_exercise_but_breaks_the_rule(tmp_path):
    looped = answer_from(GAUSSIAN_BY_DIMENSION, "logp_and_entropy", "<gaussian loop>")
    assert ex.check_diag_gaussian(looped, show=False).passed  # right: exercise 7 allows it
    result = ex.check_diag_gaussian_challenge(looped, show=False)
    fails(result, "breaks the challenge's rule \"no Python loop\": a for loop (`for d in "
          "range(D):`, <gaussian loop>, line 7)", "hint:     this rule catches a loop over "
          "the rows or over the D dimensions")
    assert result.message.count("hint:") == 1 and result.failed_case is None
    # the same in a hand-in, through the grader's sandbox
    nb = read_notebook(SOLUTIONS / EXERCISES["diag_gaussian_challenge"].notebook)
    cell = next(c for c in nb["cells"] if "student" in tags(c))
    cell["source"] = source(cell).replace(
        MARK_START + "\n", MARK_START + "\n    _ = [d for d in range(inputs.shape[-1])]\n")
    path = tmp_path / EXERCISES["diag_gaussian_challenge"].notebook
    path.write_text(json.dumps(nb), encoding="utf-8")
    fails(grade_notebook(path, show=False), "no Python loop", "a comprehension")


GAUSSIAN_MEAN = '''
import numpy as np

def logp_and_entropy(inputs, actions):
    # ---- YOUR CODE STARTS HERE ----
    mean, log_std = np.split(inputs, 2, axis=-1)
    z = (actions - mean) * np.exp(-log_std)
    return (np.mean(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1),
            np.mean(log_std + 0.5 + 0.5 * np.log(2 * np.pi), axis=-1))
    # ---- YOUR CODE ENDS HERE ----
'''


def test_gaussian_challenge_names_the_slip_as_the_exercise_does():
    mean = answer_from(GAUSSIAN_MEAN, "logp_and_entropy", "<gaussian mean>")
    fails(ex.check_diag_gaussian_challenge(mean, show=False), "case 3 of 10",
          "a mean over the D dimensions where a sum belongs")


# ------------------------------------------------------------------ 2c, 4c: less help only
def test_replay_and_driver_challenges_give_the_exercises_hints():
    def mix(pairs, store, replay_proportion, replay_threshold, rng):
        for worker, batch in pairs:
            yield worker, batch
            store.append(batch)
            if len(store) > replay_threshold and rng.random() < replay_proportion:
                yield None, rng.choice(store)

    fails(ex.check_replay_mix_challenge(mix, show=False), "case 3 of 7",
          "replay_mix_challenge")
    right = solution("driver_step_challenge")

    def driver_step(driver, timeout):
        driver.config.broadcast_interval = 0
        return right(driver, timeout)

    fails(ex.check_driver_step_challenge(driver_step, show=False), "No broadcast here")


@pytest.mark.parametrize("name", [c.name for c in CHALLENGES])
def test_a_base_solution_where_the_rule_allows_it_passes_the_challenge(name):
    # Same semantics: the exercise's own solution passes the challenge's check, unless it
    # breaks the challenge's rule (a loop, a base class, the library's vtrace).
    result = getattr(ex, EXERCISES[name].checker)(solution(EXERCISES[name].base), show=False)
    if name in ("minibatch_get_challenge", "vtrace_numpy_challenge", "vtrace_loss_challenge"):
        assert not result.passed and result.failed_case is None, result.message
    else:
        assert result.passed, result.message
