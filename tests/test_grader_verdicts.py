"""Every verdict is the grader's, from what it reads itself: the markers, the names and a
challenge's rule on every line the student wrote (a helper cell, a string run as code, a built
name, a metaclass, a second pair of markers all fail, and a harmless edit of a handed-out
cell does not), the exercise a notebook is (a challenge relabelled as its exercise is told),
the channel's frames (extras rejected, parsing bounded), and output an instructor can trust
(escaped names and texts, a summary that names each notebook's exercise). Without bubblewrap
the grader grades nothing, unless told --unsandboxed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from impala_lab_grader import sandbox, student_build, world
from impala_lab_grader.__main__ import main as cli_main
from impala_lab_grader.channel import (
    MAX_FRAMES,
    WireError,
    decode,
    dumps,
    escaped,
    frame,
    read_frames,
)
from impala_lab_grader.grade import grade_notebook
from impala_lab_grader.notebook import source, tags
from impala_lab_grader.static import static_verdict
from tests.grader_helpers import SOLUTIONS, STUBS, add_cell, bwrap_ok, notebook, with_region

ARGS = ("log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold, "
        "clip_pg_rho_threshold")


def verdict(name: str, nb: dict) -> str | None:
    return static_verdict(EXERCISES[name], nb, EXERCISES[name].notebook)


def edit_cell(nb: dict, index: int, old: str, new: str) -> dict:
    """The notebook with `old` replaced by `new` in its code cell number `index` (1-based)."""
    cell = [c for c in nb["cells"] if c["cell_type"] == "code"][index - 1]
    assert old in source(cell)
    cell["source"] = source(cell).replace(old, new)
    return nb


# ------------------------------------------------------------------ the static verdict
@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_solution_and_stub_is_clean(name):
    assert verdict(name, notebook(name)) is None
    assert verdict(name, notebook(name, solution=False)) is None


VTRACE_LOOP = ("def _step(acc, t):\n"
               "    return acc\n"
               "for t in range(3):\n"
               "    pass\n")
CHALLENGE_ATTACKS = {
    "a loop in a helper cell": (
        "vtrace_numpy_challenge", lambda nb: add_cell(nb, VTRACE_LOOP),
        "breaks the challenge's rule \"no Python loop\": a for loop (`for t in range(3):`, "
        "code cell 5 of ex3c_vtrace_numpy_challenge.ipynb, line 3)"),
    "a loop inside a string run as code": (
        "vtrace_numpy_challenge",
        lambda nb: add_cell(nb, "exec('for t in range(3):\\n    pass')\n"),
        "runs code from a string (`exec('for t in range(3):\\n    pass')`, code cell 5 of "
        "ex3c_vtrace_numpy_challenge.ipynb, line 1)\n  hint:     the check decides"),
    "a loop the iterator protocol drives": (
        "vtrace_numpy_challenge",
        lambda nb: add_cell(nb, "class Steps:\n    def __next__(self):\n        raise "
                                "StopIteration\n"),
        "an iterator's method (a loop drives it) (`def __next__(self):`, code cell 5"),
    "recursion across cells": (
        "diag_gaussian_challenge",
        lambda nb: add_cell(add_cell(nb, "def down(n):\n    return up(n - 1)\n"),
                            "def up(n):\n    return 0 if n <= 0 else down(n)\n"),
        "a function that calls itself (a loop too) (`def down(n):`, code cell 5"),
    "an if in a helper cell": (
        "lstm_unroll_challenge",
        lambda nb: add_cell(nb, "def reset(h, done):\n    if done:\n        return h * 0\n"
                                "    return h\n"),
        "breaks the challenge's rule \"no if\": an if statement (`if done:`, code cell 5 of "
        "ex6c_lstm_unroll_challenge.ipynb, line 2)"),
    "a match statement": (
        "lstm_unroll_challenge",
        lambda nb: with_region(nb, "match len(xs):\n    case _:\n        pass\n"
                                   "return np.zeros(1), np.zeros(1)\n"),
        "breaks the challenge's rule \"no if\": a match statement (a branch) (`match len(xs):`"),
    "a short-circuit branch": (
        "lstm_unroll_challenge",
        lambda nb: with_region(nb, "dones.any() and print(1)\nreturn xs, state_in\n"),
        "a short-circuit and/or (a branch) (`dones.any() and print(1)`"),
    "a metaclass that hides the base": (
        "minibatch_get_challenge",
        lambda nb: add_cell(edit_cell(nb, 3, "class MyMinibatchBuffer:",
                                      "class MyMinibatchBuffer(metaclass=Meta):"),
                            "class Meta(type):\n    pass\n", before_check=False),
        "breaks the challenge's rule \"no base class\": MyMinibatchBuffer's class statement "
        "has a base class, a keyword (a metaclass) or a decorator (`class MyMinibatchBuffer"
        "(metaclass=Meta):`"),
    "a class made by a call": (
        "minibatch_get_challenge",
        lambda nb: add_cell(nb, "MyMinibatchBuffer = type('R', (MyMinibatchBuffer,), {})\n"),
        "MyMinibatchBuffer is not a plain class statement"),
    "the library's V-trace under another name": (
        "vtrace_loss_challenge",
        lambda nb: add_cell(nb, "from impala_lab.learner.vtrace import from_logits as f\n"),
        "breaks the challenge's rule \"no library V-trace\": calls the library's V-trace "
        "(`from impala_lab.learner.vtrace import from_logits as f`, code cell 6"),
}
EXERCISE_ATTACKS = {
    "a built name": (
        "lstm_unroll",
        lambda nb: add_cell(nb, "import tensorflow as tf\nk = getattr(tf, 'ker' + 'as')\n"),
        "reaches a name built at run time (`getattr(tf, 'ker' + 'as')`, code cell 5 of "
        "ex6_lstm_unroll.ipynb, line 2)\n  hint:     the check decides from the code it "
        "reads"),
    "a literal getattr is read as the attribute": (
        "lstm_unroll",
        lambda nb: add_cell(nb, "import tensorflow as tf\ncell = getattr(tf, 'keras')\n"),
        "calls Keras's LSTM (`getattr(tf, 'keras')`, code cell 5"),
    "an import alias": (
        "lstm_unroll",
        lambda nb: add_cell(nb, "from impala_lab.actor.layers import lstm_step as step\n"),
        "calls the library's layers.lstm_step (`from impala_lab.actor.layers import lstm_step"),
    "a module loaded by hand": (
        "replay_mix",
        lambda nb: add_cell(nb, "m = importlib.import_module('impala_lab.driver.replay_mixer')"
                                "\n"),
        "loads or starts code by hand (`importlib`, code cell 5"),
    "a second pair of markers": (
        "minibatch_get",
        lambda nb: add_cell(nb, f"{MARK_START}\nx = 1\n{MARK_END}\n"),
        "needs exactly one pair of the exercise's markers, in the answer's cell: one line `"
        f"{MARK_START}`, then one line `{MARK_END}` (found 2 start and 2 end marker lines)"),
    "a marker line that is not the marker": (
        "minibatch_get",
        lambda nb: edit_cell(nb, 3, MARK_END, MARK_END + " (mine)"),
        "(a marker line is not the marker as handed out)"),
    "code that does not parse": (
        "replay_mix", lambda nb: add_cell(nb, "def (:\n"),
        "has code that is not Python in code cell 5 of ex2_replay_mixer.ipynb (line 1: "),
}


@pytest.mark.parametrize("attack", [*CHALLENGE_ATTACKS, *EXERCISE_ATTACKS])
def test_the_grader_decides_the_rules_on_every_line_the_student_wrote(attack):
    name, make, expected = {**CHALLENGE_ATTACKS, **EXERCISE_ATTACKS}[attack]
    flag = verdict(name, make(notebook(name)))
    assert flag is not None and expected in flag, flag


def test_a_harmless_edit_of_a_handed_out_cell_is_no_cheat():
    # the try-it cell keeps its call of the library, with other arguments
    nb = edit_cell(notebook("minibatch_get"), 4, "calls=10", "calls=12")
    assert verdict("minibatch_get", nb) is None
    # but a new use of it there is the student's
    nb = edit_cell(nb, 4, "calls=12", "calls=12, extra=MinibatchBuffer.get")
    assert "calls the library's MinibatchBuffer (`MinibatchBuffer`, code cell 4" in verdict(
        "minibatch_get", nb)


@pytest.mark.skipif(not bwrap_ok(), reason="no sandbox here")
def test_a_flag_is_the_hand_ins_verdict_before_anything_runs(tmp_path):
    nb = with_region(notebook("vtrace_numpy_challenge"),
                     "_ = [t for t in range(3)]\nraise RuntimeError('never runs')\n")
    path = tmp_path / EXERCISES["vtrace_numpy_challenge"].notebook
    path.write_text(json.dumps(nb))
    result = grade_notebook(path, show=False)
    assert result.message.startswith(
        "✗ vtrace_numpy_challenge: vtrace breaks the challenge's rule \"no Python loop\": a "
        "comprehension (a loop too) (`[t for t in range(3)]`, code cell 3 of "
        "ex3c_vtrace_numpy_challenge.ipynb, line "), result.message
    assert "never runs" not in result.message and result.flagged


# ------------------------------------------------------------------ which exercise
def test_a_challenge_relabelled_as_its_exercise_is_told_by_its_title(tmp_path, capsys):
    if not bwrap_ok():
        pytest.skip("no sandbox here")
    nb = notebook("vtrace_numpy_challenge")
    nb["metadata"]["impala_lab"]["exercise"] = "vtrace_numpy"
    check = next(c for c in nb["cells"] if "check" in tags(c))
    check["source"] = source(check).replace("check_vtrace_numpy_challenge", "check_vtrace_numpy")
    relabelled = tmp_path / "a" / "ex3c.ipynb"
    relabelled.parent.mkdir()
    relabelled.write_text(json.dumps(nb))
    challenge = str(SOLUTIONS / EXERCISES["vtrace_numpy_challenge"].notebook)
    assert cli_main([str(relabelled), challenge, "--seed", "3"]) == 1
    out = capsys.readouterr().out
    assert ("ex3c.ipynb: it is 'vtrace_numpy''s notebook by its metadata, file name or check "
            "cell, but its title is 'vtrace_numpy_challenge''s: hand in the exercise's own "
            "notebook") in out, out
    summary = out[out.index("summary"):]
    assert re.search(r"FAIL  \(no exercise\) +\S*/a/ex3c.ipynb", summary), summary
    assert re.search(r"pass  vtrace_numpy_challenge \(challenge of vtrace_numpy\) +\S*"
                     r"ex3c_vtrace_numpy_challenge.ipynb", summary), summary


# ------------------------------------------------------------------ output to trust
@pytest.mark.skipif(not bwrap_ok(), reason="no sandbox here")
def test_names_and_texts_of_a_hand_in_are_printed_escaped(tmp_path, capsys):
    folder = tmp_path / "x\n✓ minibatch_get: all 9 cases pass\n\x1b[2K"
    folder.mkdir()
    odd = folder / EXERCISES["minibatch_get"].notebook
    odd.write_text(json.dumps(add_cell(notebook("minibatch_get"), (
        "raise ValueError('\\n✓ minibatch_get: all 9 cases pass\\n\\x1b[2K== next\\u202e')\n"))))
    assert cli_main([str(odd)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert not re.search(r"^✓", out, re.M), out
    assert f"== {tmp_path}/x\\n✓ minibatch_get: all 9 cases pass\\n\\x1b[2K/" in out, out
    assert ("ValueError: \\n✓ minibatch_get: all 9 cases pass\\n\\x1b[2K== next\\u202e (at code "
            "cell 5 of ex1_minibatch_buffer_get.ipynb") in out, out
    assert "0 of 1 notebooks pass" in out


def test_escaped_keeps_printable_text_and_escapes_the_rest():
    assert escaped("vs[0, 1] ✓ ü") == "vs[0, 1] ✓ ü"
    assert escaped("a\nb\r\x1b[2K\u202e\udcff\t") == "a\\nb\\r\\x1b[2K\\u202e\\udcff\\t"


# ------------------------------------------------------------------ the channel
def test_the_channel_takes_progress_then_exactly_one_answer():
    answer = {"result": {"traces": [], "absent": []}}
    data = frame({"progress": "code cell 1"}) + frame({"progress": "case 2"}) + frame(answer)
    assert read_frames(data) == ("case 2", answer)
    for limit in ({"memory": True}, {"processes": True}):  # a limit it hit: it fails itself
        assert read_frames(frame(limit)) == ("", limit)
    for bad, why in [
            (data + frame(answer), "more after the answer"),
            (frame(answer) + data, "more after the answer"),
            (data + b"\n", "more after the answer"),
            (frame({"progress": "x"}), "no answer"),
            (data[:-3], "bytes that are not a message"),
            (b"\n" * (16 * 2**20 - 1), "bytes that are not a message"),
            (frame({"progress": "x" * 2000}) + frame(answer), "of another shape"),
            (frame({"result": {"traces": [], "absent": [], "verdict": "pass"}}), "another"),
            (frame({"memory": True, "error": "x"}), "one key"),
            (frame({"progress": ""}) * (MAX_FRAMES + 1) + frame(answer), "more than")]:
        with pytest.raises(WireError, match=why):
            read_frames(bad)
    with pytest.raises(WireError) as raised:
        read_frames(frame({"progress": "code cell 4\x1b"}) + b"junk!")
    assert raised.value.where == "code cell 4\\x1b"


def test_the_wire_carries_traces_and_nothing_else():
    from impala_lab.classroom.exercises._common import Mismatch, verbatim
    from impala_lab.classroom.exercises._guard import Opaque, Raised

    trace = [{"vs": np.arange(6.0).reshape(2, 3), ("w0", 1): (True, None, np.int64(3))},
             Mismatch("call 2", verbatim("x"), Opaque("<obj>"), "hint"),
             Raised("ValueError", "bad\n✓ pass", "cell 3", "", "")]
    back = decode(dumps(trace))
    assert np.array_equal(back[0]["vs"], trace[0]["vs"]) and back[0]["vs"].dtype == np.float64
    assert back[0][("w0", 1)] == (True, None, 3) and isinstance(back[0][("w0", 1)][2], np.int64)
    assert (back[1].what, str(back[1].expected), back[1].actual) == ("call 2", "x", Opaque("<obj>"))
    assert (back[2].type_name, back[2].text, back[2].where) == ("ValueError", "bad\\n✓ pass",
                                                               "cell 3")
    assert decode(dumps(object()))  # anything else travels as the text of its repr
    for bad, why in [('{"$": "pickle"}', "unknown tag"),
                     ('{"a": 1}', "unknown tag 'None'"),
                     ('{"$": "array", "dtype": "|O", "shape": [1], "data": ""}', "no trace"),
                     ('{"$": "array", "dtype": "<f8", "shape": [4294967296, 4294967296], '
                      '"data": ""}', "no trace value"),
                     ('{"$": "array", "dtype": "<f8", "shape": [65536, 65536, 65536, 65536], '
                      '"data": ""}', "do not fit"),
                     ('{"$": "raised", "fields": ["a"]}', "five texts"),
                     ("[" * 100 + "]" * 100, "too deep")]:
        with pytest.raises(WireError, match=why):
            decode(bad)


# ------------------------------------------------------------------ no sandbox, no grading
def test_without_bwrap_the_grader_grades_nothing_unless_told(monkeypatch, capsys):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.bwrap_problem.cache_clear()
    try:
        stub = str(STUBS / EXERCISES["replay_mix"].notebook)
        assert cli_main([stub]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (
            "error: no sandbox: bwrap is not installed; install bubblewrap (Debian, Ubuntu: "
            "sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap; in a clone: "
            "make grader-deps), or pass --unsandboxed to grade notebooks you trust without "
            "isolation\n")
        assert cli_main([stub, "--unsandboxed"]) == 1
        out = capsys.readouterr().out
        assert out.startswith("sandbox: NONE (--unsandboxed): hand-ins run as you"), out
        assert "✗ replay_mix: mix still raises NotImplementedError" in out
    finally:
        monkeypatch.undo()
        sandbox.bwrap_problem.cache_clear()


# ------------------------------------------------------------------ the student build
def test_the_student_build_removes_what_the_library_has_now():
    from impala_lab.classroom.exercises._guard import ReferenceCalled
    from impala_lab_grader.child import ABSENT

    assert student_build.missing() == []  # a renamed implementation would stay reachable
    text = student_build.strip_functions(
        "class A:\n    def f(self):\n        '''doc'''\n        return 1\n\n    x = 2\n",
        ["A.f", "A.gone"])
    namespace: dict = {}
    exec(text, namespace)
    with pytest.raises(ReferenceCalled, match=r"^A\.f$"):
        namespace["A"]().f()
    assert namespace["A"].x == 2 and ABSENT.pop() == "A.f"


def test_the_student_build_is_compiled_from_source_alone(tmp_path, monkeypatch):
    package = tmp_path / "impala_lab"
    (package / "learner" / "__pycache__").mkdir(parents=True)
    (package / "notebooks" / "solutions").mkdir(parents=True)
    (package / "notebooks" / "solutions" / "ex1.ipynb").write_text("{}")
    (package / "learner" / "minibatch_buffer.py").write_text(
        "class MinibatchBuffer:\n    def get(self):\n        return 'the reference'\n")
    # bytecode of the reference, as a run with python -O would have left it
    stale = package / "learner" / "__pycache__" / "minibatch_buffer.cpython-311.opt-1.pyc"
    stale.write_bytes(b"the reference's bytecode")
    monkeypatch.setattr(student_build, "PACKAGE_DIR", package)
    root = tmp_path / "build"
    root.mkdir()
    student_build._write_build("minibatch_get", root)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert [f for f in files if f.startswith("impala_lab/")] == [
        f"impala_lab/learner/__pycache__/minibatch_buffer.{sys.implementation.cache_tag}.pyc",
        "impala_lab/learner/minibatch_buffer.py"]
    assert "the reference" not in (root / "impala_lab/learner/minibatch_buffer.py").read_text()
    assert {f for f in files if f.startswith("impala_lab_grader/")} >= {
        "impala_lab_grader/child.py", "impala_lab_grader/channel.py"}
    assert not any(Path(f).name in ("grade.py", "static.py", "world.py") for f in files)


def test_a_huge_hand_in_is_read_in_bounded_time():
    # thousands of helper functions calling the next, and a long cell: linear work only
    chain = "".join(f"def f{i}(x):\n    return f{i + 1}(x)\n" for i in range(5000))
    nb = add_cell(notebook("vtrace_numpy_challenge"), chain + "def f5000(x):\n    return x\n")
    assert verdict("vtrace_numpy_challenge", nb) is None
    looped = add_cell(notebook("vtrace_numpy_challenge"),
                      chain + "def f5000(x):\n    return f0(x)\n")
    assert "a function that calls itself (a loop too) (`def f0(x):`, code cell 5" in verdict(
        "vtrace_numpy_challenge", looped)


def test_bad_limits_and_a_world_that_cannot_be_made_grade_nothing(monkeypatch, capsys):
    stub = str(STUBS / EXERCISES["replay_mix"].notebook)
    assert cli_main([stub, "--timeout", "0"]) == 2
    assert capsys.readouterr().err == "error: --timeout 0: give a positive number of seconds\n"
    assert cli_main([stub, "--memory", "-5"]) == 2
    assert capsys.readouterr().err == "error: --memory -5: give a positive number of MiB\n"

    def two_copies():
        raise world.WorldError("the student's world has two installed copies of 'google'")

    monkeypatch.setattr(world, "entries", two_copies)
    assert cli_main([stub]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "two installed copies of 'google'" in captured.err
