"""The grader cannot be hung or fooled: each hand-in runs in a sandbox of its own with a
wall-time and a memory limit (a batch survives one that loops or allocates without end, and
nothing it started outlives it), and the one-line cheats (calling the library's
implementation of the function being written, the checker's own reference, reading the
checker's frames, replacing the checkers) fail with a message that says why, while honest
answers pass.

`no_static` switches the grader's static look off for the tests of what the sandbox itself
holds: an attack the static look would stop first must still fail where it runs."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf

import impala_lab.classroom.exercises as ex
from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from impala_lab.learner.minibatch_buffer import MinibatchBuffer
from impala_lab_grader.__main__ import main as cli_main
from impala_lab_grader.grade import grade_notebook
from impala_lab_grader.notebook import load_answer, source, tags
from impala_lab_grader.static import static_verdict
from tests.grader_helpers import (
    MODES,
    SOLUTIONS,
    STUBS,
    add_cell,
    flags,
    marked,
    notebook,
    with_region,
    write,
)


# ------------------------------------------------------------------ limits and the batch
@MODES
def test_a_batch_survives_a_hand_in_that_loops_and_one_that_allocates(
        tmp_path, capsys, mode, no_static):
    marker = f"impala-lab-test-{os.getpid()}-{mode}-loops"
    # ex2 without `f -= 1`: a cell that runs mix(...) with replay_proportion=1 never ends;
    # before it, a cell that starts a process of its own (in a session of its own), to show
    # that the grader leaves nothing behind.
    looping = notebook("replay_mix")
    cell = next(c for c in looping["cells"] if "student" in tags(c))
    cell["source"] = source(cell).replace("                f -= 1\n", "")
    assert "f -= 1" not in source(cell)
    add_cell(looping, "import collections, random, types\n"
                      "batch = types.SimpleNamespace(count=1)\n"
                      "for _ in mix(iter([('w0', batch)] * 3), collections.deque(maxlen=4), "
                      "1.0, 0, random.Random(0)):\n    pass\n")
    add_cell(looping, "import subprocess, sys\n"
                      "child = subprocess.Popen([sys.executable, '-c', "
                      f"'import time; time.sleep(600)', {marker!r}], start_new_session=True)\n",
             before_check=False)
    # Untouched pages: the address space runs out at once, whatever the machine's speed.
    hog = add_cell(notebook("vtrace_numpy"), "hog = []\nwhile True:\n"
                                             "    hog.append(np.empty(16 * 2**20))\n")
    batch = [str(SOLUTIONS / EXERCISES["minibatch_get"].notebook),
             write(tmp_path, "alice", "replay_mix", looping),
             write(tmp_path, "bob", "vtrace_numpy", hog),
             str(SOLUTIONS / EXERCISES["driver_step"].notebook),
             str(STUBS / EXERCISES["replay_mix"].notebook)]
    start = time.monotonic()
    assert cli_main([*batch, "--timeout", "10", "--memory", "1500", *flags(mode)]) == 1
    seconds = time.monotonic() - start
    out = capsys.readouterr().out
    assert "2 of 5 notebooks pass" in out, out
    assert out.startswith("sandbox: bubblewrap" if mode == "sandboxed" else
                          "sandbox: NONE (--unsandboxed)"), out
    assert out.count("✓ minibatch_get: all 9 cases pass") == 1
    assert out.count("✓ driver_step: all 7 cases pass") == 1
    assert "✗ replay_mix: mix still raises NotImplementedError" in out
    assert re.search(r"✗ ex2_replay_mixer.ipynb: stopped after 10 s \(the time limit\) while "
                     r"running code cell \d+ of ex2_replay_mixer.ipynb\n  hint:     an endless "
                     r"loop\? look at the replay loop `while rng.random\(\) < f:`: without "
                     r"`f -= 1`", out), out
    assert ("✗ ex3_vtrace_numpy.ipynb: ran out of memory (the limit is 1500 MB) while running "
            "code cell 5 of ex3_vtrace_numpy.ipynb\n  hint:     an endless loop that keeps "
            "growing a list?") in out, out
    assert seconds < 10 + 60, seconds
    assert marked(marker) == []  # the hand-in's process, in a session of its own, is gone


def test_a_hand_in_that_replaces_the_checkers_poisons_nothing(tmp_path, capsys, no_static):
    poison = add_cell(notebook("minibatch_get", solution=False),
                      "import impala_lab.classroom.exercises as _ex\n"
                      "from impala_lab.classroom.exercises._common import CheckResult\n"
                      "for _name in dir(_ex):\n"
                      "    if _name.startswith('check_'):\n"
                      "        setattr(_ex, _name, lambda *a, **k: CheckResult('x', True, "
                      "'✓', 1))\n")
    batch = [write(tmp_path, "mallory", "minibatch_get", poison),
             str(STUBS / EXERCISES["replay_mix"].notebook)]
    assert cli_main(batch) == 1
    out = capsys.readouterr().out
    assert "0 of 2 notebooks pass" in out
    assert "✗ replay_mix: mix still raises NotImplementedError" in out
    assert "✗ minibatch_get: MyMinibatchBuffer.get still raises NotImplementedError" in out


def test_a_hand_in_that_patches_the_reference_is_graded_against_the_real_one(tmp_path,
                                                                            no_static):
    # The answer replays nothing, and makes the library's mixer do the same: in the grading
    # process the reference would agree; the grader computes it where no hand-in ran.
    nb = add_cell(with_region(notebook("replay_mix"),
                              "for worker, batch in pairs:\n"
                              "    yield worker, batch\n"
                              "    store.append(batch)\n"),
                  "from impala_lab.driver.replay_mixer import ReplayMixer\n"
                  "ReplayMixer.mix = lambda self, pairs: iter(list(pairs))\n")
    result = grade_notebook(write(tmp_path, "eve", "replay_mix", nb), show=False)
    assert not result.passed
    assert "case 3 of 9 differs from the reference" in result.message, result.message


def test_the_static_look_reads_the_cells_the_student_wrote(tmp_path):
    nb = add_cell(notebook("replay_mix"), "from impala_lab.driver.replay_mixer import "
                                          "ReplayMixer\nReplayMixer.mix = print\n")
    result = grade_notebook(write(tmp_path, "eve", "replay_mix", nb), show=False)
    assert result.message.startswith(
        "✗ replay_mix: mix calls the library's ReplayMixer (`from impala_lab.driver."
        "replay_mixer import ReplayMixer`, code cell 5 of ex2_replay_mixer.ipynb, line 1)"), \
        result.message


# ------------------------------------------------------------------ cheats fail, with why
def test_super_get_is_no_answer(tmp_path):
    nb = with_region(notebook("minibatch_get"), "return super().get()\n")
    for result in (grade_notebook(write(tmp_path, "a", "minibatch_get", nb), show=False),
                   ex.check_minibatch_get(load_answer(tmp_path / "a" / EXERCISES[
                       "minibatch_get"].notebook)[1], show=False)):
        assert not result.passed and result.flagged
        assert re.search(r"✗ minibatch_get: case 1 of \d+: MyMinibatchBuffer.get calls the "
                         r"library's MinibatchBuffer.get \(at code cell 3 of "
                         r"ex1_minibatch_buffer_get.ipynb, line ", result.message), result.message
        assert "`return super().get()`" in result.message


def test_calling_replay_mixer_mix_is_flagged_in_the_region(tmp_path):
    nb = with_region(notebook("replay_mix"),
                     "mixer = ReplayMixer(replay_proportion, store.maxlen, replay_threshold, 1)\n"
                     "mixer._rng, mixer._store = rng, store\n"
                     "yield from mixer.mix(pairs)\n")
    result = grade_notebook(write(tmp_path, "a", "replay_mix", nb), show=False)
    assert not result.passed
    assert result.message.startswith(
        "✗ replay_mix: mix calls the library's ReplayMixer (`ReplayMixer`, code cell 3 of "
        "ex2_replay_mixer.ipynb, line "), result.message
    assert "write it yourself" in result.message


def test_calling_replay_mixer_mix_outside_the_markers_is_trapped():
    from impala_lab.driver.replay_mixer import ReplayMixer

    def mix(pairs, store, replay_proportion, replay_threshold, rng):
        mixer = ReplayMixer(replay_proportion, store.maxlen, replay_threshold, 1)
        mixer._rng, mixer._store = rng, store
        yield from mixer.mix(pairs)

    result = ex.check_replay_mix(mix, show=False)
    assert not result.passed and "mix calls the library's ReplayMixer.mix (at " in \
        result.message
    assert "yield from mixer.mix(pairs)" in result.message
    assert list(ReplayMixer(0.0, 0, 1, 1).mix([("w", 1)])) == [("w", 1)]  # restored


def test_reading_the_expected_values_from_the_stack_fails():
    def mix(pairs, store, replay_proportion, replay_threshold, rng):
        import sys

        frame = sys._getframe(1)
        while frame is not None:
            for value in frame.f_locals.values():
                if isinstance(value, list) and value and isinstance(value[0], tuple):
                    yield from value
                    return
            frame = frame.f_back

    result = ex.check_replay_mix(mix, show=False)  # nothing there to read: a wrong answer
    assert not result.passed and result.failed_case == 1, result.message
    # the grader flags the look itself, before the hand-in runs
    flagged = static_verdict(EXERCISES["replay_mix"], with_region(
        notebook("replay_mix"),
        "frame = sys._getframe(1)\nyield from frame.f_back.f_locals['expected']\n"),
        EXERCISES["replay_mix"].notebook)
    assert "reads the call stack (sys._getframe)" in flagged


def _in_region(body: str, signature: str = "mix(pairs, store, replay_proportion, "
               "replay_threshold, rng)"):
    """A function whose code between the markers is `body` (compiled from a cached source)."""
    import linecache

    lines = ["import sys", f"def {signature}:",
             f"    {MARK_START}", *("    " + ln for ln in body.strip().splitlines()),
             f"    {MARK_END}"]
    text = "\n".join(lines) + "\n"
    filename = f"<region test {len(linecache.cache)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(text, filename, "exec"), namespace)
    return namespace[signature.split("(")[0]]


def test_the_static_look_tells_a_variable_from_the_library_call():
    from impala_lab.classroom.exercises._static import flag_answer
    from impala_lab.classroom.exercises.driver_step import SPEC

    honest = _in_region("step = 0\nmix = driver.replay.mix\nreturn step, step\n",
                        "driver_step(driver, timeout)")
    assert flag_answer(honest, SPEC.forbidden, None) is None
    cheat = _in_region("step = 0\nreturn driver.step(timeout)\n", "driver_step(driver, timeout)")
    assert flag_answer(cheat, SPEC.forbidden, None).startswith(
        "calls the library's DriverLoop.step (`driver.step`, <region test")


def test_the_library_vtrace_is_no_answer(tmp_path):
    from impala_lab.learner import vtrace as lib

    def vtrace(*args, **kwargs):
        out = lib.from_importance_weights_numpy(*args, **kwargs)
        return out.vs, out.pg_advantages

    result = ex.check_vtrace_numpy(vtrace, show=False)
    assert not result.passed and (
        "vtrace calls the library's from_importance_weights_numpy (at ") in result.message
    nb = with_region(add_cell(notebook("vtrace_numpy"), "from impala_lab.learner.vtrace import "
                              "from_importance_weights_numpy\n", before_check=False),
                     "out = from_importance_weights_numpy(log_rhos, discounts, rewards, "
                     "values, bootstrap_value, clip_rho_threshold, clip_pg_rho_threshold)\n"
                     "return out.vs, out.pg_advantages\n")
    result = grade_notebook(write(tmp_path, "a", "vtrace_numpy", nb), show=False)
    assert not result.passed and ("vtrace calls the library's "
                                  "vtrace.from_importance_weights_numpy") in result.message


@pytest.mark.parametrize("call", ["DriverLoop.step(driver, timeout)", "driver.step(timeout)",
                                  "Impala.step(driver, timeout)"])
def test_the_library_driver_step_is_no_answer(call):
    from impala_lab.driver.driver_loop import DriverLoop
    from impala_lab.driver.impala import Impala

    namespace = {"DriverLoop": DriverLoop, "Impala": Impala}
    exec(f"def driver_step(driver, timeout):\n    return {call}\n", namespace)
    result = ex.check_driver_step(namespace["driver_step"], show=False)
    name = "Impala.step" if "Impala" in call else "DriverLoop.step"
    assert not result.passed and f"driver_step calls the library's {name}" in result.message
    assert "write it yourself" in result.message


def test_the_library_driver_step_in_the_region_is_flagged(tmp_path):
    nb = with_region(notebook("driver_step"),
                     "sample_timesteps, train_timesteps = driver.step(timeout)\n")
    result = grade_notebook(write(tmp_path, "a", "driver_step", nb), show=False)
    assert not result.passed
    assert "driver_step calls the library's DriverLoop.step (`driver.step`" in result.message


def test_the_checkers_own_reference_loss_is_no_answer():
    from impala_lab.classroom.exercises.vtrace_loss import _Reference

    def vtrace_loss(target_logits, values, bootstrap_value, batch, config):
        out = _Reference.loss({"target_logits": target_logits, "values": values,
                               "bootstrap_value": bootstrap_value}, batch, config)
        return out["total_loss"], out["policy_loss"], out["vf_loss"], out["entropy"]

    result = ex.check_vtrace_loss(vtrace_loss, show=False)
    assert not result.passed
    assert "vtrace_loss calls the library's _Reference.loss" in result.message


# ------------------------------------------------------------------ what is checked
@pytest.fixture(scope="module")
def solutions() -> dict[str, object]:
    return {name: load_answer(SOLUTIONS / EXERCISES[name].notebook)[1]
            for name in ("minibatch_get", "vtrace_loss")}


def test_a_loss_whose_targets_carry_a_gradient_fails(solutions):
    from impala_lab.learner import vtrace

    def vtrace_loss(target_logits, values, bootstrap_value, batch, config):
        total, pl, vf, ent = solutions["vtrace_loss"](target_logits, values, bootstrap_value,
                                                      batch, config)
        # The same numbers, but the value target moves with the values (no stop_gradient).
        vt = vtrace.from_logits(batch["behaviour_logits"], target_logits, batch["actions"],
                                config.gamma * (1 - batch["terminateds"]), batch["rewards"],
                                values, bootstrap_value)
        leak = tf.reduce_sum(values - tf.stop_gradient(values)) * 0 + 0.5 * tf.reduce_sum(
            tf.square(tf.stop_gradient(vt.vs) + values - tf.stop_gradient(values) - values))
        return total - config.vf_loss_coeff * vf + config.vf_loss_coeff * leak, pl, vf, ent

    result = ex.check_vtrace_loss(vtrace_loss, show=False)
    assert not result.passed and result.failed_case == 1, result.message
    assert "d total_loss / d values[" in result.message
    assert "the numbers are right, the gradient is not" in result.message
    assert "tf.stop_gradient" in result.message


def test_a_numpy_loss_fails_for_its_missing_gradient(solutions):
    def vtrace_loss(target_logits, values, bootstrap_value, batch, config):
        out = solutions["vtrace_loss"](np.asarray(target_logits), np.asarray(values),
                                       np.asarray(bootstrap_value), batch, config)
        return tuple(float(x) for x in out)

    result = ex.check_vtrace_loss(vtrace_loss, show=False)
    assert not result.passed and result.failed_case == 1, result.message
    assert "where:    the gradient of total_loss" in result.message
    assert "numpy results carry no gradient" in result.message


def test_minibatch_hint_names_the_ramp_when_released_shows_it():
    class LateRamp(MinibatchBuffer):
        def get(self):
            if self.ttl[self.idx] <= 0:
                self.buffers[self.idx] = self.inqueue.get()
                self.cur_max_ttl = min(self.cur_max_ttl + 1, self.num_sgd_iter)
                self.ttl[self.idx] = self.cur_max_ttl  # the ramp grows one item too early
            item = self.buffers[self.idx]
            self.ttl[self.idx] -= 1
            released = self.ttl[self.idx] <= 0
            if released:
                self.buffers[self.idx] = None
            self.idx = (self.idx + 1) % len(self.buffers)
            return item, released

    result = ex.check_minibatch_get(LateRamp, show=False)
    assert not result.passed and result.failed_case == 2, result.message
    assert "expected: returned ('item0', True)" in result.message
    assert "actual:   returned ('item0', False)" in result.message
    assert "hint:     Wrong ttl: this catches a missing or unbounded ramp" in result.message


def test_minibatch_internal_state_is_not_graded(solutions):
    class OwnCounters(solutions["minibatch_get"]):
        """The same answer that also keeps a ring state of its own names."""

        def get(self):
            out = super().get()
            self.ttl, self._ttl = list(self.ttl), None  # a copy: another object, same values
            self.extra = "anything"
            return out

    assert ex.check_minibatch_get(OwnCounters, show=False)


def test_the_library_lstm_is_no_answer(tmp_path):
    from impala_lab.actor import layers

    def lstm_unroll(xs, state_in, dones, kernel, recurrent_kernel, bias):
        return layers.lstm_sequence(xs, state_in, dones, kernel, recurrent_kernel, bias)

    result = ex.check_lstm_unroll(lstm_unroll, show=False)
    assert not result.passed and (
        "lstm_unroll calls the library's lstm_sequence (at ") in result.message
    nb = with_region(add_cell(notebook("lstm_unroll"), "from impala_lab.actor.layers import "
                              "lstm_step\n", before_check=False),
                     "state, hs = state_in, []\n"
                     "for t in range(len(xs)):\n"
                     "    state = lstm_step(xs[t], state, kernel, recurrent_kernel, bias)\n"
                     "    hs.append(state[:, 0])\n"
                     "    state[dones[t]] = 0.0\n"
                     "return np.stack(hs), state\n")
    result = grade_notebook(write(tmp_path, "a", "lstm_unroll", nb), show=False)
    assert not result.passed and ("lstm_unroll calls the library's "
                                  "layers.lstm_step") in result.message
