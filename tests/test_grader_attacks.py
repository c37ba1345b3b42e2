"""The grader against a determined class: each kind of hand-in that used to pass wrongly, run
code in the grader, or harm the batch is graded beside an honest one. The attack fails with
a message that says why; its neighbour keeps its correct grade; nothing it started is left.

Tests marked `isolated` need the bubblewrap sandbox (skipped, with the reason, where it cannot
be made; `make test` installs bubblewrap); the others run in both modes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from impala_lab.classroom.exercises import EXERCISES
from impala_lab.classroom.exercises.__main__ import main as cli_main
from impala_lab.classroom.exercises._common import Case
from impala_lab.classroom.exercises._sandbox import bwrap_problem
from impala_lab.classroom.exercises._spec import Spec, judge
from tests.test_grader import SOLUTIONS, add_cell, marked, notebook, with_region, write

ROOT = Path(__file__).resolve().parent.parent
NEIGHBOUR = str(SOLUTIONS / EXERCISES["minibatch_get"].notebook)
NEIGHBOUR_PASSES = "✓ minibatch_get: all 9 cases pass"
BOTH = pytest.mark.parametrize("sandbox", ["auto", "none"])
isolated = pytest.mark.skipif(bwrap_problem() != "", reason=f"no sandbox: {bwrap_problem()}")
pytestmark = pytest.mark.timeout(300)


def passes(out: str) -> int:
    """The pass lines of the neighbour in `out` (lines of their own, as the grader prints)."""
    return len(re.findall(rf"^{NEIGHBOUR_PASSES}$", out, re.M))


def grade(capsys, monkeypatch, paths: list[str], *args: str, sandbox: str = "auto"
          ) -> tuple[int, str, str]:
    """Runs the grader's CLI on `paths`: (exit status, the attack's section, all output)."""
    monkeypatch.setenv("IMPALA_LAB_SANDBOX", sandbox)
    rc = cli_main([*paths, "--timeout", "60", *args])
    out = capsys.readouterr().out
    first = out.split("== ")[1] if "== " in out else out
    return rc, first, out


def graded_beside(capsys, monkeypatch, attack: str, *args: str, sandbox: str = "auto") -> str:
    """Grades the attack, then the honest neighbour; returns the attack's section after
    checking that it failed and that the neighbour passed."""
    rc, first, out = grade(capsys, monkeypatch, [attack, NEIGHBOUR], *args, sandbox=sandbox)
    assert rc == 1 and "1 of 2 notebooks pass" in out, out
    assert passes(out) == 1, out
    assert not passes(first), out
    return first


def ex1_with(tmp_path: Path, code: str, name: str = "mallory") -> str:
    """Exercise 1's solution with a cell of `code` before its check cell."""
    return write(tmp_path, name, "minibatch_get", add_cell(notebook("minibatch_get"), code))


def ex3_region(tmp_path: Path, region: str, cell: str = "") -> str:
    nb = with_region(notebook("vtrace_numpy"), region)
    if cell:
        add_cell(nb, cell, before_check=False)
    return write(tmp_path, "mallory", "vtrace_numpy", nb)


ARGS = ("log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold, "
        "clip_pg_rho_threshold")


# ------------------------------------------------------------------ wrong passes
@isolated
def test_the_library_called_from_another_thread_fails(tmp_path, capsys, monkeypatch):
    attack = ex3_region(tmp_path, (
        "import threading\n"
        "from impala_lab.learner import vtrace as _lib\n"
        "box = []\n"
        "fn = getattr(_lib, 'from_importance_' + 'weights_numpy')\n"
        f"worker = threading.Thread(target=lambda: box.append(fn({ARGS})))\n"
        "worker.start()\nworker.join()\n"
        "return (box[0].vs, box[0].pg_advantages) if box else (values, values)\n"))
    first = graded_beside(capsys, monkeypatch, attack)
    assert ("vtrace calls the library's from_importance_weights_numpy, which the grader's "
            "sandbox does not have") in first, first


@isolated
def test_a_copy_of_the_librarys_code_fails(tmp_path, capsys, monkeypatch):
    attack = ex3_region(tmp_path, f"out = _copy({ARGS})\nreturn out.vs, out.pg_advantages\n",
                        "import types\nfrom impala_lab.learner import vtrace as _v\n"
                        "_f = getattr(_v, 'from_importance_' + 'weights_numpy')\n"
                        "_copy = types.FunctionType(_f.__code__, _f.__globals__)\n")
    first = graded_beside(capsys, monkeypatch, attack)
    assert re.search(r"case 1 of 10: vtrace calls the library's from_importance_weights_numpy",
                     first), first


@isolated
def test_the_guards_trap_table_and_switches_give_nothing(tmp_path, capsys, monkeypatch):
    table = with_region(notebook("minibatch_get"), (
        "from impala_lab.classroom.exercises import _guard\n"
        "for _thread, original in list(_guard._TRAPS.values()):\n"
        "    return original(self)\n"
        "return None\n"))
    first = graded_beside(capsys, monkeypatch, write(tmp_path, "a", "minibatch_get", table))
    assert "MyMinibatchBuffer.get calls the library's MinibatchBuffer.get" in first, first
    switched = add_cell(with_region(notebook("replay_mix"), (
        "m = _rm.__dict__['Replay' + 'Mixer'](replay_proportion, store.maxlen, "
        "replay_threshold, 1)\n"
        "m._rng, m._store = rng, store\n"
        "yield from getattr(m, 'm' + 'ix')(pairs)\n")),
        "import contextlib\n"
        "from impala_lab.classroom.exercises import _grade, _guard, _spec\n"
        "from impala_lab.driver import replay_mixer as _rm\n"
        "_spec.forbid = _guard.forbid = lambda fns: contextlib.nullcontext()\n"
        "_grade._changed = lambda before, after: []\n"
        "_guard.ABSENT_CALLS = []\n")
    first = graded_beside(capsys, monkeypatch, write(tmp_path, "b", "replay_mix", switched))
    assert "mix calls the library's ReplayMixer.mix" in first, first


@isolated
def test_a_fresh_copy_of_a_module_and_its_file_are_out_of_reach(tmp_path, capsys,
                                                                  monkeypatch):
    fresh = ex3_region(tmp_path, (
        "fn = getattr(fresh, 'from_importance_' + 'weights_numpy')\n"
        f"out = fn({ARGS})\nreturn out.vs, out.pg_advantages\n"),
        "import importlib.util\nimport impala_lab.learner.vtrace as _v\n"
        "_s = importlib.util.spec_from_file_location('fresh_vtrace', _v.__file__)\n"
        "fresh = importlib.util.module_from_spec(_s)\n_s.loader.exec_module(fresh)\n")
    first = graded_beside(capsys, monkeypatch, fresh)
    assert "vtrace calls the library's from_importance_weights_numpy" in first, first
    real = ROOT / "impala_lab" / "learner" / "vtrace.py"
    from_file = ex3_region(tmp_path, "return vtrace_numpy_copy(" + ARGS + ")\n",
                           f"_ns = {{}}\nexec(open({str(real)!r}).read(), _ns)\n")
    first = graded_beside(capsys, monkeypatch, from_file)
    assert f"FileNotFoundError: [Errno 2] No such file or directory: '{real}'" in first, first


@isolated
def test_the_solution_notebooks_are_not_there(tmp_path, capsys, monkeypatch):
    steal = ("import json\n"
             "_nb = json.load(open({where}))\n"
             "exec(next(''.join(c['source']) for c in _nb['cells'] "
             "if 'student' in c['metadata'].get('tags', [])))\n")
    packaged = add_cell(notebook("minibatch_get", solution=False), steal.format(
        where="__import__('impala_lab.classroom.course', fromlist=['_']).course_root() / "
              "'solutions' / 'ex1_minibatch_buffer_get.ipynb'"))
    first = graded_beside(capsys, monkeypatch, write(tmp_path, "a", "minibatch_get", packaged))
    assert "FileNotFoundError: no course notebooks in" in first, first
    checkout = add_cell(notebook("minibatch_get", solution=False),
                        steal.format(where=repr(NEIGHBOUR)))
    first = graded_beside(capsys, monkeypatch, write(tmp_path, "b", "minibatch_get", checkout))
    assert f"No such file or directory: '{NEIGHBOUR}'" in first, first


@BOTH
def test_a_lookup_table_of_the_fixed_cases_fails_on_the_drawn_ones(tmp_path, capsys,
                                                                     monkeypatch, sandbox):
    from impala_lab.classroom.exercises.vtrace_numpy import SPEC, make_inputs
    from impala_lab.learner.vtrace import from_importance_weights_numpy

    table = {}
    for case in SPEC.cases():
        p = case.params
        inputs = make_inputs(p["T"], p["B"], p["scale"], p["ends"], p["seed"])
        ref = from_importance_weights_numpy(**inputs, clip_rho_threshold=p["clip_rho"],
                                            clip_pg_rho_threshold=p["clip_pg"])
        key = hashlib.sha1(inputs["log_rhos"].tobytes()).hexdigest()
        table[key] = [np.asarray(ref.vs).tolist(), np.asarray(ref.pg_advantages).tolist()]
    attack = ex3_region(tmp_path, (
        "import hashlib\n"
        "key = hashlib.sha1(np.asarray(log_rhos).tobytes()).hexdigest()\n"
        "if key in TABLE:\n"
        "    return np.array(TABLE[key][0]), np.array(TABLE[key][1])\n"
        "return np.zeros_like(values), np.zeros_like(values)\n"),
        f"TABLE = {json.dumps(table)}\n")
    first = graded_beside(capsys, monkeypatch, attack, "--seed", "7", sandbox=sandbox)
    assert "✗ vtrace_numpy: case 9 of 10 differs from the reference" in first, first
    assert "[drawn at random: grading seed 7, draw 1]" in first, first


@BOTH
def test_a_forged_result_is_no_trace_and_runs_nothing(tmp_path, capsys, monkeypatch, sandbox):
    sentinel = tmp_path / "pwned"
    payload = (b"cos\nsystem\n(S'touch " + str(sentinel).encode() + b"'\ntR.")
    attack = ex1_with(tmp_path, (
        "import os, sys\n"
        "fd = int(sys.argv[-1])\n"
        f"os.write(fd, {payload!r} + b'\\n')\n"
        "os.write(fd, b'{\"verdict\": \"pass\"}\\n')\n"
        "os.write(fd, b'{\"result\": {\"label\": \"x\", \"flagged\": null, \"traces\": "
        "[{\"$\": \"pickle\", \"data\": \"Y29z\"}]}}\\n')\n"
        "os._exit(0)\n"))
    first = graded_beside(capsys, monkeypatch, attack, sandbox=sandbox)
    assert ("the grading process's result is not a trace (unknown tag 'pickle'): the hand-in "
            "must not write to the grader's pipe") in first, first
    assert not sentinel.exists()


@isolated
def test_reference_traces_cannot_be_computed_at_cell_time(tmp_path, capsys, monkeypatch):
    attack = add_cell(notebook("minibatch_get", solution=False), (
        "import json, os, sys\n"
        "from impala_lab.classroom.exercises._wire import encode\n"
        "from impala_lab.classroom.exercises.minibatch_get import SPEC\n"
        "traces = [SPEC.reference_trace(c) for c in SPEC.cases()]\n"
        "os.write(int(sys.argv[-1]), json.dumps({'result': {'label': 'x', 'flagged': None, "
        "'traces': encode(traces)}}).encode() + b'\\n')\n"
        "os._exit(0)\n"))
    first = graded_beside(capsys, monkeypatch, write(tmp_path, "a", "minibatch_get", attack))
    assert "MyMinibatchBuffer.get still raises NotImplementedError" in first, first


@BOTH
def test_a_notebook_of_another_exercise_is_refused(tmp_path, capsys, monkeypatch, sandbox):
    renamed = write(tmp_path, "a", "minibatch_get", notebook("replay_mix"))
    first = graded_beside(capsys, monkeypatch, renamed, sandbox=sandbox)
    assert ("its metadata says exercise 'replay_mix' but its file is 'minibatch_get''s "
            "notebook: hand in the exercise's own notebook") in first, first
    unlabelled = notebook("replay_mix")
    unlabelled["metadata"].pop("impala_lab")
    first = graded_beside(capsys, monkeypatch,
                          write(tmp_path, "b", "minibatch_get", unlabelled), sandbox=sandbox)
    assert ("it is 'minibatch_get''s notebook, but its check cell calls check_replay_mix"
            in first), first


# ------------------------------------------------------------------ harm to others and the batch
@isolated
def test_other_hand_ins_cannot_be_rewritten(tmp_path, capsys, monkeypatch):
    before = Path(NEIGHBOUR).read_bytes()
    attack = ex1_with(tmp_path, f"open({NEIGHBOUR!r}, 'w').write('{{}}')\n")
    first = graded_beside(capsys, monkeypatch, attack)
    assert "No such file or directory" in first, first
    assert Path(NEIGHBOUR).read_bytes() == before


@isolated
def test_a_process_in_a_session_of_its_own_harms_no_one(tmp_path, capsys, monkeypatch):
    marker = f"impala-lab-attack-{os.getpid()}-setsid"
    attack = ex1_with(tmp_path, (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; time.sleep(2); "
        f"os.kill(-1, signal.SIGKILL)', {marker!r}], start_new_session=True)\n"
        "raise SystemExit('left a killer behind')\n"))
    first = graded_beside(capsys, monkeypatch, attack)
    assert "ex1_minibatch_buffer_get.ipynb" in first
    assert marked(marker) == []


@isolated
def test_sigstop_or_sigkill_from_a_hand_in_stops_only_itself(tmp_path, capsys, monkeypatch):
    # the parent, everything it may signal (the grader is not there to see), then itself
    attack = ("import contextlib, os, signal\n"
              "for pid in (os.getppid(), -1, os.getpid()):\n"
              "    with contextlib.suppress(OSError):\n"
              "        os.kill(pid, signal.{})\n")
    stop = ex1_with(tmp_path, attack.format("SIGSTOP"), name="a")
    kill = ex1_with(tmp_path, attack.format("SIGKILL"), name="b")
    monkeypatch.setenv("IMPALA_LAB_SANDBOX", "auto")
    start = time.monotonic()
    assert cli_main([stop, kill, NEIGHBOUR, "--timeout", "10"]) == 1
    out = capsys.readouterr().out
    assert time.monotonic() - start < 10 + 60
    assert "1 of 3 notebooks pass" in out and passes(out) == 1, out
    assert "stopped after 10 s (the time limit)" in out, out
    assert "the grading process ended (" in out, out


@BOTH
def test_a_child_holding_the_output_delays_nothing(tmp_path, sandbox):
    marker = f"impala-lab-attack-{os.getpid()}-{sandbox}-stdout"
    attack = ex1_with(tmp_path, (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}], "
        "start_new_session=True)\n"))
    env = {**os.environ, "IMPALA_LAB_SANDBOX": sandbox,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "impala_lab.classroom.exercises", attack,
                           NEIGHBOUR], capture_output=True, text=True, timeout=240, env=env)
    assert time.monotonic() - start < 120
    assert done.returncode == 0 and passes(done.stdout) == 2, done.stdout
    assert marked(marker) == []


@BOTH
def test_an_honest_slip_fails_that_hand_in_only(tmp_path, capsys, monkeypatch, sandbox):
    attack = ex1_with(tmp_path, (
        "import numpy as np\n_Base = MyMinibatchBuffer\n\n\n"
        "class MyMinibatchBuffer(_Base):\n"
        "    def get(self):\n"
        "        return np.array(super().get(), dtype=object)\n"))
    first = graded_beside(capsys, monkeypatch, attack, sandbox=sandbox)
    assert "✗ minibatch_get: case 1 of 9 differs from the reference" in first, first
    assert "get() must return a pair (item, released)." in first, first


def test_the_judge_turns_any_error_into_that_hand_ins_failure():
    def compare(case, expected, actual):
        if actual != expected:  # an array here: ambiguous truth value
            raise AssertionError

    spec = Spec("demo", lambda: [Case("one", "a hint")], None, lambda case: (1, 2), compare,
                list, {})
    from impala_lab.classroom.exercises._spec import AnswerReport

    result = judge(spec, "f", AnswerReport(None, [np.array([1, 2])]), show=False)
    assert not result.passed and result.failed_case == 1
    assert "what f returned could not be compared with the reference (ValueError" in \
        result.message


@BOTH
def test_memory_counts_every_process_of_a_hand_in(tmp_path, capsys, monkeypatch, sandbox):
    attack = ex1_with(tmp_path, (
        "import os, time\nimport numpy as np\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        a = np.ones(400 * 2**20 // 8)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "time.sleep(60)\n"))
    first = graded_beside(capsys, monkeypatch, attack, "--memory", "1000", sandbox=sandbox)
    assert "ran out of memory (the limit is 1000 MB)" in first, first


@BOTH
def test_files_and_processes_are_limited(tmp_path, capsys, monkeypatch, sandbox):
    big = ex1_with(tmp_path, "open('big.bin', 'wb').write(b'x' * (100 * 2**20))\n", "a")
    first = graded_beside(capsys, monkeypatch, big, sandbox=sandbox)
    assert "OSError: [Errno 27] File too large" in first, first
    marker = f"impala-lab-attack-{os.getpid()}-{sandbox}-bomb"
    bomb = ex1_with(tmp_path, (
        "import os, sys, time\n"
        "sys.argv.append(" + repr(marker) + ")\n"
        "for _ in range(2000):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "time.sleep(30)\n"), "b")
    first = graded_beside(capsys, monkeypatch, bomb, sandbox=sandbox)
    assert re.search(r"started more than \d+ processes|Resource temporarily unavailable|"
                     r"ran out of memory", first), first


@BOTH
def test_what_the_grader_reads_is_capped(tmp_path, capsys, monkeypatch, sandbox):
    flood = ex1_with(tmp_path, (
        "import os, sys\n"
        "line = b'{\"progress\": \"' + b'x' * 1000 + b'\"}\\n'\n"
        "os.write(int(sys.argv[-1]), line * 20000)\n"))
    first = graded_beside(capsys, monkeypatch, flood, sandbox=sandbox)
    assert "sent more than 16 MiB of results" in first, first
    folder = tmp_path / "odd"
    folder.mkdir()
    fifo = folder / "fifo" / EXERCISES["minibatch_get"].notebook
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    link = folder / "link" / EXERCISES["minibatch_get"].notebook
    link.parent.mkdir()
    link.symlink_to(NEIGHBOUR)
    sparse = folder / "sparse" / EXERCISES["minibatch_get"].notebook
    sparse.parent.mkdir()
    with open(sparse, "wb") as fh:
        fh.truncate(2**30)
    rc, _, out = grade(capsys, monkeypatch, [str(fifo), str(link), str(sparse), NEIGHBOUR],
                       sandbox=sandbox)
    assert rc == 1 and "1 of 4 notebooks pass" in out, out
    assert "not a regular file" in out and "links are not followed" in out, out
    assert "1073741824 bytes; a notebook may have 32 MiB at most" in out, out


@isolated
def test_a_library_module_imported_while_the_answer_runs_fails(tmp_path, capsys, monkeypatch):
    late = ex3_region(tmp_path, (
        "import importlib\n"
        "m = importlib.import_module('impala_lab.learner.' + 'vtrace')\n"
        f"out = getattr(m, 'from_importance_' + 'weights_numpy')({ARGS})\n"
        "return out.vs, out.pg_advantages\n"))
    first = graded_beside(capsys, monkeypatch, late)
    assert "case 1 of 10: vtrace calls the library's from_importance_weights_numpy" in first, \
        first


def test_without_bwrap_the_grader_falls_back_and_says_why(tmp_path, capsys, monkeypatch):
    from impala_lab.classroom.exercises import _sandbox

    monkeypatch.setattr(_sandbox.shutil, "which", lambda name: None)
    _sandbox.bwrap_problem.cache_clear()
    try:
        rc, _, out = grade(capsys, monkeypatch, [NEIGHBOUR])
        assert rc == 0 and passes(out) == 1, out
        assert out.startswith("sandbox: fallback, hand-ins NOT isolated (bwrap is not "
                              "installed (Debian: apt-get install bubblewrap))"), out
        monkeypatch.setenv("IMPALA_LAB_SANDBOX", "bwrap")
        assert cli_main([NEIGHBOUR]) == 2
        assert "IMPALA_LAB_SANDBOX=bwrap, but bwrap is not installed" in capsys.readouterr().err
    finally:
        monkeypatch.undo()
        _sandbox.bwrap_problem.cache_clear()


@BOTH
def test_cpu_time_is_limited_per_process(tmp_path, capsys, monkeypatch, sandbox):
    from impala_lab.classroom.exercises import _sandbox

    # the limit is the wall time on every core (a backstop): made small here to see it act
    monkeypatch.setattr(_sandbox.Limits, "cpu_seconds", property(lambda self: 3))
    spin = ex1_with(tmp_path, "while True:\n    pass\n")
    first = graded_beside(capsys, monkeypatch, spin, sandbox=sandbox)
    assert "used more than 3 s of CPU time (the limit) while running code cell" in first, first


@BOTH
def test_forged_traces_of_empty_arrays_do_not_pass(tmp_path, capsys, monkeypatch, sandbox):
    # arrays of shape (0, 1, 1) would broadcast against any [T, B] to "all close"
    attack = ex3_region(tmp_path, "return values, values\n", (
        "import json, os, sys\nimport numpy as np\n"
        "from impala_lab.classroom.exercises._wire import encode\n"
        "empty = np.zeros((0, 1, 1))\n"
        "traces = [{'vs': empty, 'pg_advantages': empty} for _ in range(10)]\n"
        "os.write(int(sys.argv[-1]), json.dumps({'result': {'label': 'vtrace', 'flagged': None, "
        "'traces': encode(traces)}}).encode() + b'\\n')\n"
        "os._exit(0)\n"))
    first = graded_beside(capsys, monkeypatch, attack, sandbox=sandbox)
    assert "✗ vtrace_numpy: case 1 of 10 differs from the reference" in first, first
    assert "where:    the shape of the result" in first, first


@BOTH
def test_a_hand_in_cannot_print_a_pass_line_for_itself(tmp_path, capsys, monkeypatch, sandbox):
    attack = ex1_with(tmp_path, "raise ValueError('\\n✓ minibatch_get: all 9 cases pass\\n"
                                "\\x1b[2K== next')\n")
    first = graded_beside(capsys, monkeypatch, attack, sandbox=sandbox)
    assert "  | ✓ minibatch_get: all 9 cases pass" in first and "\x1b" not in first, first


def test_the_wire_carries_traces_and_nothing_else():
    from impala_lab.classroom.exercises._common import Mismatch, verbatim
    from impala_lab.classroom.exercises._guard import Opaque, Raised
    from impala_lab.classroom.exercises._wire import WireError, decode, dumps

    trace = [{"vs": np.arange(6.0).reshape(2, 3), ("w0", 1): (True, None, np.int64(3))},
             Mismatch("call 2", verbatim("x"), Opaque("<obj>"), "hint"),
             Raised("ValueError", "bad", "cell 3", "", "")]
    back = decode(dumps(trace))
    assert np.array_equal(back[0]["vs"], trace[0]["vs"]) and back[0]["vs"].dtype == np.float64
    assert back[0][("w0", 1)] == (True, None, 3) and isinstance(back[0][("w0", 1)][2], np.int64)
    assert (back[1].what, str(back[1].expected), back[1].actual) == ("call 2", "x", Opaque("<obj>"))
    assert (back[2].type_name, back[2].where) == ("ValueError", "cell 3")
    assert decode(dumps(object()))  # anything else travels as the text of its repr
    for bad, why in [('{"$": "pickle"}', "unknown tag"),
                     ('{"a": 1}', "unknown tag None"),
                     ('{"$": "array", "dtype": "|O", "shape": [1], "data": ""}', "no trace"),
                     ('{"$": "array", "dtype": "<f8", "shape": [4294967296, 4294967296], '
                      '"data": ""}', "no trace value"),
                     ('{"$": "array", "dtype": "<f8", "shape": [65536, 65536, 65536, 65536], '
                      '"data": ""}', "do not fit"),
                     ('{"$": "raised", "fields": ["a"]}', "five texts"),
                     ("[" * 100 + "]" * 100, "too deep")]:
        with pytest.raises(WireError, match=why):
            decode(bad)


def test_the_student_build_removes_what_the_library_has_now(tmp_path):
    from impala_lab.classroom.exercises import _student_build

    assert _student_build.missing() == []  # a renamed implementation would stay reachable
    text = _student_build.strip_functions(
        "class A:\n    def f(self):\n        '''doc'''\n        return 1\n\n    x = 2\n",
        ["A.f", "A.gone"])
    namespace: dict = {}
    exec(text, namespace)
    from impala_lab.classroom.exercises._guard import ABSENT_CALLS, ReferenceCalled

    with pytest.raises(ReferenceCalled, match=r"^A\.f$"):
        namespace["A"]().f()
    assert namespace["A"].x == 2 and ABSENT_CALLS.pop() == "A.f"
