"""The classroom exercises: each solution passes its checker, each blank stub fails it with the
helpful message, the stub and the solution differ only between the markers, and the checkers
find and explain wrong answers (the first differing case, expected and actual, a hint).
Exercise 6's wrong answers (the masked LSTM unroll) are in test_exercises_lstm_unroll.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

import impala_lab.classroom.exercises as ex
from impala_lab.batch import concat_samples
from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from impala_lab.classroom.exercises.driver_step import make_step_driver
from impala_lab.learner.minibatch_buffer import MinibatchBuffer
from impala_lab.learner.port import LearnerPort
from impala_lab_grader.__main__ import main as cli_main
from impala_lab_grader.notebook import check_notebook, load_answer, source, tags
from tests.exercise_helpers import fails

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "notebooks" / "exercises"
SOLUTIONS = ROOT / "notebooks" / "solutions"
NAMES = list(EXERCISES)


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def student_cell_number(path: Path) -> int:
    """1-based index, among code cells, of the cell tagged `student`."""
    code = [c for c in read(path)["cells"] if c["cell_type"] == "code"]
    return next(i for i, c in enumerate(code, 1) if "student" in tags(c))


@pytest.fixture(scope="module")
def solutions() -> dict[str, object]:
    return {name: load_answer(SOLUTIONS / EXERCISES[name].notebook)[1] for name in NAMES}


# ------------------------------------------------------------------ the notebooks' shape
def test_every_exercise_has_a_stub_and_a_solution():
    assert len(EXERCISES) >= 5
    assert {"minibatch_get", "replay_mix", "vtrace_numpy", "driver_step",
            "vtrace_loss"} <= set(EXERCISES)
    for e in EXERCISES.values():
        assert (STUBS / e.notebook).is_file(), e.notebook
        assert (SOLUTIONS / e.notebook).is_file(), e.notebook
    assert sorted(p.name for p in STUBS.glob("*.ipynb")) == sorted(
        p.name for p in SOLUTIONS.glob("*.ipynb"))


@pytest.mark.parametrize("name", NAMES)
def test_stub_and_solution_differ_only_between_the_markers(name):
    e = EXERCISES[name]
    stub, sol = read(STUBS / e.notebook), read(SOLUTIONS / e.notebook)
    assert stub["metadata"]["impala_lab"]["exercise"] == name
    assert sol["metadata"] == stub["metadata"]
    assert len(stub["cells"]) == len(sol["cells"])
    student = [i for i, c in enumerate(stub["cells"]) if "student" in tags(c)]
    check = [i for i, c in enumerate(stub["cells"]) if "check" in tags(c)]
    assert len(student) == 1 and len(check) == 1 and student[0] < check[0]
    for i, (a, b) in enumerate(zip(stub["cells"], sol["cells"])):
        if i != student[0]:
            assert a == b, f"cell {i} differs outside the student cell"
    a, b = source(stub["cells"][student[0]]), source(sol["cells"][student[0]])
    for text in (a, b):
        assert text.count(MARK_START) == 1 and text.count(MARK_END) == 1
        assert text.index(MARK_START) < text.index(MARK_END)
    outside = lambda t: (t[:t.index(MARK_START)], t[t.index(MARK_END):])  # noqa: E731
    assert outside(a) == outside(b)
    inside = a[a.index(MARK_START) + len(MARK_START):a.index(MARK_END)]
    if e.name == "minibatch_get_challenge":  # the whole class body: a constructor that raises
        assert inside.strip().startswith("def __init__(") and inside.strip().count("\n") == 1
        inside = inside.strip().split("\n", 1)[1]
    assert inside.strip().startswith("raise NotImplementedError(")
    assert f"def {e.answer}" in a or f"class {e.answer}" in a
    check_src = source(stub["cells"][check[0]])
    assert f"{e.checker}({e.answer})" in check_src


# ------------------------------------------------------------------ solutions and stubs
@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_its_checker(name, solutions, capsys):
    checker = getattr(ex, EXERCISES[name].checker)
    result = checker(solutions[name])
    n = result.num_cases
    assert result.passed and bool(result) and n >= 5
    assert result.message == f"✓ {name}: all {n} cases pass"
    assert capsys.readouterr().out == result.message + "\n"


@pytest.mark.parametrize("name", NAMES)
def test_untouched_stub_fails_with_the_helpful_message(name, capsys):
    e = EXERCISES[name]
    result = check_notebook(STUBS / e.notebook)
    assert not result.passed and result.not_implemented and result.failed_case is None
    label = f"{e.answer}.get" if name == "minibatch_get" else e.answer
    cell = student_cell_number(STUBS / e.notebook)
    assert result.message == (
        f"✗ {name}: {label} still raises NotImplementedError: fill in the code between the "
        f"markers\n      {MARK_START}\n      {MARK_END}\n"
        f"  in code cell {cell} of {e.notebook} (the cell that defines it), run that cell, "
        f"then run this check again.")
    assert result.message in capsys.readouterr().out


def test_stub_checks_do_not_import_tensorflow():
    # The vtrace_loss stub notebooks import TensorFlow themselves (a first cell); its checker
    # would not: that is covered by calling the checker on a bare stub function.
    stubs = [str(STUBS / e.notebook) for e in EXERCISES.values()
             if (e.base or e.name) != "vtrace_loss"]
    code = (
        "import sys\n"
        "from impala_lab.classroom.exercises import check_vtrace_loss\n"
        "from impala_lab_grader.notebook import check_notebook\n"
        f"for nb in {stubs!r}:\n"
        "    assert check_notebook(nb, show=False).not_implemented\n"
        "def vtrace_loss(*args):\n"
        "    raise NotImplementedError\n"
        "assert check_vtrace_loss(vtrace_loss, show=False).not_implemented\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.splitlines()[-1] == "tensorflow imported: False"


def test_importing_the_package_does_not_import_tensorflow():
    code = "import sys, impala_lab.classroom.exercises; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------ wrong answers
def test_minibatch_without_the_ramp(solutions):
    class NoRamp(MinibatchBuffer):
        def get(self):
            if self.ttl[self.idx] <= 0:
                self.buffers[self.idx] = self.inqueue.get()
                self.ttl[self.idx] = self.num_sgd_iter
            item = self.buffers[self.idx]
            self.ttl[self.idx] -= 1
            released = self.ttl[self.idx] <= 0
            if released:
                self.buffers[self.idx] = None
            self.idx = (self.idx + 1) % len(self.buffers)
            return item, released

    fails(ex.check_minibatch_get(NoRamp, show=False), 2,
          "case 2 of 7 differs from the reference",
          "size=1, num_sgd_iter=3",
          "where:    call 1 of get()",
          "expected: returned ('item0', True); ttl=[0] idx=0 cur_max_ttl=2",
          "actual:   returned ('item0', False); ttl=[2] idx=0 cur_max_ttl=1",
          "hint:     Wrong ttl: this catches a missing or unbounded ramp")


def test_minibatch_that_never_moves_on(solutions):
    class Stuck(solutions["minibatch_get"]):
        def get(self):
            idx = self.idx
            out = super().get()
            self.idx = idx
            return out

    # With one pass per item a stuck index serves the same items: only (item, released) and
    # the queue are graded, so it shows with three passes.
    fails(ex.check_minibatch_get(Stuck, show=False), 4, "size=2, num_sgd_iter=3",
          "idx=1", "idx=0", "Move to the next slot on every call")


def test_minibatch_that_fetches_every_call(solutions):
    class Greedy(solutions["minibatch_get"]):
        def get(self):
            self.ttl[self.idx] = 0  # forgets the passes left: fetches on every call
            return super().get()

    fails(ex.check_minibatch_get(Greedy, show=False), 2, "where:    call 3 of get()",
          "expected: returned ('item1', True)", "items taken from the queue=2",
          "actual:   returned ('item2', False)", "items taken from the queue=3",
          "Take a new item from self.inqueue only when the current slot is empty")


def test_replay_that_draws_before_storing():
    def mix(pairs, store, replay_proportion, replay_threshold, rng):
        for worker, batch in pairs:
            yield worker, batch
            if len(store) > replay_threshold:
                f = replay_proportion
                while rng.random() < f:
                    f -= 1
                    yield None, rng.choice(store)
            store.append(batch)

    fails(ex.check_replay_mix(mix, show=False), 3, "replay_proportion=1.0",
          "where:    item 3 of what mix yields (14 items expected)",
          "expected: items 0..: (w0, b0), (w1, b1), (w2, b2), → (None, b0), (w0, b3)",
          "actual:   items 0..: (w0, b0), (w1, b1), (w2, b2), → (w0, b3), (None, b0)",
          "A replay is missing here. Store the new batch before drawing its replays")


def test_replay_with_one_draw_only():
    def mix(pairs, store, replay_proportion, replay_threshold, rng):
        for worker, batch in pairs:
            yield worker, batch
            store.append(batch)
            if len(store) > replay_threshold and rng.random() < replay_proportion:
                yield None, rng.choice(store)

    fails(ex.check_replay_mix(mix, show=False), 3, "A different batch was replayed")


def test_replay_that_keeps_its_own_store():
    def mix(pairs, store, replay_proportion, replay_threshold, rng):
        own = deque(maxlen=store.maxlen)
        for worker, batch in pairs:
            yield worker, batch
            own.append(batch)
            if len(own) > replay_threshold:
                f = replay_proportion
                while rng.random() < f:
                    f -= 1
                    yield None, rng.choice(own)

    fails(ex.check_replay_mix(mix, show=False), 2, "where:    the store after the last batch",
          "expected: ['b4', 'b5', 'b6', 'b7']", "actual:   []", "never a replayed one")


def test_vtrace_without_the_rho_clip(solutions):
    def vtrace(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=1.0,
               clip_pg_rho_threshold=1.0):
        return solutions["vtrace_numpy"](log_rhos, discounts, rewards, values, bootstrap_value,
                                         None, clip_pg_rho_threshold)

    fails(ex.check_vtrace_numpy(vtrace, show=False), 3, "off-policy, clipped: T=5, B=3",
          "where:    vs[0, 0] (time step t=0, column b=0); whole vs [T=5, B=3] below",
          "(shape [5, 3], float64)", "rho_t = min(clip_rho_threshold, exp(log_rho_t))")


def test_vtrace_with_wrong_pg_advantages(solutions):
    def vtrace(*args, **kwargs):
        vs, pg = solutions["vtrace_numpy"](*args, **kwargs)
        return vs, pg + 0.5

    fails(ex.check_vtrace_numpy(vtrace, show=False), 1, "pg_advantages[0, 0]",
          "vs is right, pg_advantages is not: this catches V(x_{s+1})")


def test_vtrace_that_raises_is_located_in_the_answer():
    def vtrace(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=1.0,
               clip_pg_rho_threshold=1.0):
        return np.minimum(clip_rho_threshold, log_rhos) @ np.ones(7), None

    result = ex.check_vtrace_numpy(vtrace, show=False)
    fails(result, 1, "case 1 of 8 raised an error in vtrace", "error:    ValueError",
          "matmul", "hint:     This case catches a wrong one-step target")
    line = vtrace.__code__.co_firstlineno + 2
    assert f"at:       {__file__}, line {line}: `return np.minimum(" in result.message


def test_vtrace_with_the_wrong_shape():
    def vtrace(log_rhos, *args, **kwargs):
        return log_rhos.T, log_rhos

    fails(ex.check_vtrace_numpy(vtrace, show=False), 1, "where:    shape of vs",
          "expected: [1, 2]", "actual:   [2, 1]", "time-major [T, B]")


def test_driver_step_that_always_broadcasts(solutions):
    def driver_step(driver, timeout):
        driver.config.broadcast_interval = 0
        return solutions["driver_step"](driver, timeout)

    fails(ex.check_driver_step(driver_step, show=False), 3, "broadcast_interval = 3",
          "expected: put([b12, b10]), record(b10), → send(worker1, v3)",
          "actual:   put([b12, b10]), record(b10), → broadcast(v4), send(worker1, v4)",
          "No broadcast here")


def test_driver_step_that_forgets_to_record(solutions):
    def driver_step(driver, timeout):
        driver.record_sample = lambda batch: None
        return solutions["driver_step"](driver, timeout)

    fails(ex.check_driver_step(driver_step, show=False), 1, "step 1, call 1",
          "expected: → record(b2), send(worker1, v0), put([b2, b0])",
          "Call driver.record_sample(batch) for each new batch")


def test_driver_step_that_counts_replays_as_sampled():
    def driver_step(driver, timeout):
        sampled = trained = 0
        for worker, batch in driver.replay.mix(driver.completed_samples(timeout)):
            driver.batch_buffer.append(batch)
            driver.batch_buffer_steps += batch.count
            if driver.batch_buffer_steps >= driver.config.train_batch_size:
                driver.put_on_learner_queue(concat_samples(driver.batch_buffer))
                driver.batch_buffer, driver.batch_buffer_steps = [], 0
            sampled += batch.count
            if worker is None:
                continue
            driver.record_sample(batch)
            if (driver.num_sent >= driver.config.broadcast_interval
                    and driver.learner.take_weights_updated()):
                driver.broadcast()
            driver.num_sent += 1
            driver.send_weights_and_request(worker)
        trained += driver.learner.drain_trained()
        return sampled, trained

    result = ex.check_driver_step(driver_step, show=False)
    fails(result, 4, "replay_proportion = 1.0", ": what driver_step returns",
          "Return (sample_timesteps, train_timesteps)")
    assert re.search(r"expected: \((\d+), \d+\)\n  actual:   \((\d+), \d+\)", result.message)


def test_driver_step_without_the_buffer_count(solutions):
    def driver_step(driver, timeout):
        out = solutions["driver_step"](driver, timeout)
        driver.batch_buffer_steps = 0
        return out

    fails(ex.check_driver_step(driver_step, show=False), 1,
          "where:    step 4: the driver's state after the step",
          "expected: {'batch_buffer': ['b9'], 'batch_buffer_steps': 2, 'num_sent': 1}",
          "actual:   {'batch_buffer': ['b9'], 'batch_buffer_steps': 0, 'num_sent': 1}",
          "driver.batch_buffer_steps (their env steps")


def test_driver_step_that_does_nothing():
    fails(ex.check_driver_step(lambda driver, timeout: (0, 0), show=False), 1,
          "where:    step 1: the calls the driver makes",
          "expected: → record(b2), send(worker1, v0), put([b2, b0])",
          "actual:   no calls at all",
          "Loop over driver.replay.mix(driver.completed_samples(timeout))")


def test_step_driver_log_matches_the_library():
    from impala_lab.driver.driver_loop import DriverLoop

    driver = make_step_driver(widths=(1, 2), train_batch_size=6, seed=0)
    assert DriverLoop.step(driver, 0.0) == (12, 0)
    assert driver.events == ["record(b2)", "send(worker1, v0)", "put([b2, b0])", "record(b0)",
                             "send(worker0, v0)", "record(b3)", "send(worker1, v0)",
                             "put([b3, b1])", "record(b1)", "send(worker0, v0)"]
    assert driver.learner.inqueue.qsize() == 2 and driver.run_stats.num_weight_syncs == 2 + 4


def test_vtrace_loss_without_truncation_bootstrap(solutions):
    def vtrace_loss(target_logits, values, bootstrap_value, batch, config):
        batch = dict(batch, truncation_values=np.zeros_like(batch["truncation_values"]))
        return solutions["vtrace_loss"](target_logits, values, bootstrap_value, batch, config)

    fails(ex.check_vtrace_loss(vtrace_loss, show=False), 4, "truncations: T=6, B=3",
          "where:    policy_loss", "add gamma * truncation_values to the reward")


def test_vtrace_loss_with_a_mean_entropy(solutions):
    def vtrace_loss(target_logits, values, bootstrap_value, batch, config):
        total, pl, vf, ent = solutions["vtrace_loss"](target_logits, values, bootstrap_value,
                                                      batch, config)
        return total, pl, vf, ent / values.size

    fails(ex.check_vtrace_loss(vtrace_loss, show=False), 1, "where:    entropy",
          "a sum, not a mean")


def test_vtrace_loss_that_returns_a_scalar():
    fails(ex.check_vtrace_loss(lambda *args: 1.0, show=False), 1,
          "what vtrace_loss returns", "Return a tuple of four scalars")


# ------------------------------------------------------------------ grading and the CLI
def test_cli_grades_notebooks(capsys):
    sols = [str(SOLUTIONS / e.notebook) for e in EXERCISES.values()
            if e.name in ("minibatch_get", "replay_mix")]
    assert cli_main(sols) == 0
    assert "2 of 2 notebooks pass" in capsys.readouterr().out
    assert cli_main([*sols, str(STUBS / EXERCISES["replay_mix"].notebook)]) == 1
    out = capsys.readouterr().out
    assert "still raises NotImplementedError" in out and "2 of 3 notebooks pass" in out
    assert cli_main(["--list"]) == 0
    assert "ex4_driver_step.ipynb" in capsys.readouterr().out


def test_a_notebook_whose_cell_raises_is_reported(tmp_path):
    nb = read(SOLUTIONS / EXERCISES["minibatch_get"].notebook)
    cell = next(c for c in nb["cells"] if "student" in tags(c))
    cell["source"] = source(cell) + "\nundefined_name + 1\n"
    path = tmp_path / "hand-in.ipynb"
    path.write_text(json.dumps(nb))
    result = check_notebook(path, show=False)
    assert not result.passed
    cell_no = student_cell_number(path)
    assert result.message.startswith("✗ hand-in.ipynb: NameError: name 'undefined_name' is not "
                                     f"defined (at code cell {cell_no} of hand-in.ipynb, line ")


def test_a_notebook_that_renamed_the_answer_is_reported(tmp_path):
    nb = read(SOLUTIONS / EXERCISES["replay_mix"].notebook)
    for cell in nb["cells"]:
        if "student" in tags(cell):
            cell["source"] = source(cell).replace("def mix(", "def my_mix(")
    path = tmp_path / "ex2_replay_mixer.ipynb"
    path.write_text(json.dumps(nb))
    result = check_notebook(path, show=False)  # the try-it cell calls mix(): a NameError
    assert result.message.startswith("✗ ex2_replay_mixer.ipynb: NameError: name 'mix' is not "
                                     "defined (at code cell 4 of ex2_replay_mixer.ipynb, line ")
    nb["cells"] = [c for c in nb["cells"] if "mix(pairs" not in source(c)]  # drop the try-it
    path.write_text(json.dumps(nb))
    result = check_notebook(path, show=False)
    assert not result.passed and result.message == (
        f"✗ ex2_replay_mixer.ipynb: {path}: the notebook defines no 'mix' before its check "
        "cell; the answer to ReplayMixer.mix must keep that name")


def test_a_notebook_that_is_no_exercise_is_reported(tmp_path):
    path = tmp_path / "other.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                "cells": []}))
    result = check_notebook(path, show=False)
    assert not result.passed and "not an exercise notebook" in result.message


def test_check_result_reads_as_a_bool(solutions):
    good = ex.check_minibatch_get(solutions["minibatch_get"], show=False)
    assert good and repr(good) == "CheckResult(exercise='minibatch_get', passed=True)"
    assert str(good) == "✓ minibatch_get: all 7 cases pass"
    # The library's own class is no answer: its get() is the reference.
    bad = ex.check_minibatch_get(MinibatchBuffer, show=False)
    assert not bad and "calls the library's MinibatchBuffer.get" in bad.message


def test_fast_mode(monkeypatch):
    monkeypatch.setenv("IMPALA_LAB_FAST", "1")
    assert ex.fast_mode() is True
    monkeypatch.setenv("IMPALA_LAB_FAST", "0")
    assert ex.fast_mode() is False
    monkeypatch.delenv("IMPALA_LAB_FAST")
    assert ex.fast_mode() is False


def test_driver_exercise_learner_hands_each_update_over_once():
    # The scripted learner is a LearnerPort: the flag and the trained steps are taken once.
    driver = make_step_driver()
    assert isinstance(driver.learner, LearnerPort)
    driver.step(0.0)
    assert driver.learner.inqueue.qsize() == 2  # four [2, 1] samples: two train batches
    assert not driver.learner.take_weights_updated() and driver.learner.drain_trained() == 0
    driver.learner.train(1)
    assert driver.learner.take_weights_updated() and not driver.learner.take_weights_updated()
    assert driver.learner.drain_trained() == 4 and driver.learner.drain_trained() == 0
    assert driver.learner.weights_version == 1

