"""The grader against a determined class: each kind of hand-in that used to pass wrongly, harm
the batch or keep the grader busy is graded beside an honest one. The attack fails with a
message that says why; its neighbour keeps its correct grade; nothing it started is left.

Most attacks here are ones the grader's static look would stop before they run; `no_static`
switches it off, so that what the sandbox itself holds is tested (the static look has its
own tests, tests/test_grader_verdicts.py). Tests marked `isolated` need the bubblewrap
sandbox (skipped, with the reason, where it cannot be made; `make test` installs it); those
about processes and memory run --unsandboxed too (for notebooks you trust), and with the
cgroup this machine allows and without one (`cgroups`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from impala_lab.classroom.exercises import EXERCISES
from impala_lab.classroom.exercises._common import Case
from impala_lab.classroom.exercises._spec import AnswerReport, Spec, judge
from impala_lab_grader import grade, sandbox
from impala_lab_grader.__main__ import main as cli_main
from impala_lab_grader.cgroup import Cgroup
from tests.grader_helpers import (
    MODES,
    SOLUTIONS,
    add_cell,
    bwrap_ok,
    flags,
    marked,
    notebook,
    with_region,
    write,
)

ROOT = Path(__file__).resolve().parent.parent
NEIGHBOUR = str(SOLUTIONS / EXERCISES["minibatch_get"].notebook)
NEIGHBOUR_PASSES = "✓ minibatch_get: all 9 cases pass"
isolated = pytest.mark.skipif(not bwrap_ok(), reason=f"no sandbox: {sandbox.bwrap_problem()}")
pytestmark = pytest.mark.timeout(300)


# (mode, cgroups): the unsandboxed child with a cgroup adds nothing to the sandboxed one
MODES_AND_CGROUPS = pytest.mark.parametrize("mode, cgroups", [
    ("sandboxed", "cgroup"), ("sandboxed", "no cgroup"), ("unsandboxed", "no cgroup")],
    indirect=["cgroups"])


@pytest.fixture(params=["cgroup", "no cgroup"])
def cgroups(request, monkeypatch):
    """With the cgroup this machine allows, and as on a machine that allows none."""
    if request.param == "cgroup":
        grade.cgroup_support.cache_clear()
        if grade.cgroup_support():
            pytest.skip(f"no cgroup here: {grade.cgroup_support()}")
    else:
        monkeypatch.setattr(Cgroup, "make", classmethod(lambda cls, *a: (None, "none here")))
    grade.cgroup_support.cache_clear()
    yield request.param
    grade.cgroup_support.cache_clear()


def passes(out: str) -> int:
    """The pass lines of the neighbour in `out` (lines of their own, as the grader prints)."""
    return len(re.findall(rf"^{NEIGHBOUR_PASSES}$", out, re.M))


def sections(out: str) -> list[str]:
    """Each notebook's part of the output (after its ``== PATH`` header)."""
    return out.split("\n== ")[1:]


def graded_beside(capsys, attacks: list[str], *args: str) -> list[str]:
    """Grades the attacks, then the honest neighbour; returns the attacks' sections after
    checking that each failed and that the neighbour passed."""
    rc = cli_main([*attacks, NEIGHBOUR, "--timeout", "60", *args])
    out = capsys.readouterr().out
    assert rc == 1 and f"1 of {len(attacks) + 1} notebooks pass" in out, out
    assert passes(out) == 1, out
    parts = sections(out)
    assert passes(parts[-1]) == 1 and not any(passes(p) for p in parts[:-1]), out
    return parts[:-1]


def ex1_with(tmp_path: Path, code: str, name: str = "mallory") -> str:
    """Exercise 1's solution with a cell of `code` before its check cell."""
    return write(tmp_path, name, "minibatch_get", add_cell(notebook("minibatch_get"), code))


def ex3_region(tmp_path: Path, region: str, cell: str = "", name: str = "mallory") -> str:
    nb = with_region(notebook("vtrace_numpy"), region)
    if cell:
        add_cell(nb, cell, before_check=False)
    return write(tmp_path, name, "vtrace_numpy", nb)


ARGS = ("log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold, "
        "clip_pg_rho_threshold")


# ------------------------------------------------------------------ the references are absent
@isolated
def test_the_library_reached_by_any_road_is_absent(tmp_path, capsys, no_static):
    thread = ex3_region(tmp_path, (
        "import threading\n"
        "from impala_lab.learner import vtrace as _lib\n"
        "box = []\n"
        "fn = getattr(_lib, 'from_importance_' + 'weights_numpy')\n"
        f"worker = threading.Thread(target=lambda: box.append(fn({ARGS})))\n"
        "worker.start()\nworker.join()\n"
        "return (box[0].vs, box[0].pg_advantages) if box else (values, values)\n"), name="a")
    copy = ex3_region(tmp_path, f"out = _copy({ARGS})\nreturn out.vs, out.pg_advantages\n",
                      "import types\nfrom impala_lab.learner import vtrace as _v\n"
                      "_f = getattr(_v, 'from_importance_' + 'weights_numpy')\n"
                      "_copy = types.FunctionType(_f.__code__, _f.__globals__)\n", name="b")
    fresh = ex3_region(tmp_path, (
        "fn = getattr(fresh, 'from_importance_' + 'weights_numpy')\n"
        f"out = fn({ARGS})\nreturn out.vs, out.pg_advantages\n"),
        "import importlib.util\nimport impala_lab.learner.vtrace as _v\n"
        "_s = importlib.util.spec_from_file_location('fresh_vtrace', _v.__file__)\n"
        "fresh = importlib.util.module_from_spec(_s)\n_s.loader.exec_module(fresh)\n", name="c")
    real = ROOT / "impala_lab" / "learner" / "vtrace.py"
    from_file = ex3_region(tmp_path, "return vtrace_numpy_copy(" + ARGS + ")\n",
                           f"_ns = {{}}\nexec(open({str(real)!r}).read(), _ns)\n", name="d")
    late = ex3_region(tmp_path, (
        "import importlib\n"
        "m = importlib.import_module('impala_lab.learner.' + 'vtrace')\n"
        f"out = getattr(m, 'from_importance_' + 'weights_numpy')({ARGS})\n"
        "return out.vs, out.pg_advantages\n"), name="e")
    a, b, c, d, e = graded_beside(capsys, [thread, copy, fresh, from_file, late])
    assert ("vtrace calls the library's from_importance_weights_numpy, which the grader's "
            "sandbox does not have") in a, a
    assert re.search(r"case 1 of 10: vtrace calls the library's from_importance_weights_numpy",
                     b), b
    assert "vtrace calls the library's from_importance_weights_numpy" in c, c
    assert f"FileNotFoundError: [Errno 2] No such file or directory: '{real}'" in d, d
    assert "case 1 of 10: vtrace calls the library's from_importance_weights_numpy" in e, e


@isolated
def test_the_guards_trap_table_and_switches_give_nothing(tmp_path, capsys, no_static):
    table = with_region(notebook("minibatch_get"), (
        "from impala_lab.classroom.exercises import _guard\n"
        "for _thread, original in list(_guard._TRAPS.values()):\n"
        "    return original(self)\n"
        "return None\n"))
    switched = add_cell(with_region(notebook("replay_mix"), (
        "m = _rm.__dict__['Replay' + 'Mixer'](replay_proportion, store.maxlen, "
        "replay_threshold, 1)\n"
        "m._rng, m._store = rng, store\n"
        "yield from getattr(m, 'm' + 'ix')(pairs)\n")),
        "import contextlib\n"
        "from impala_lab.classroom.exercises import _guard, _spec\n"
        "from impala_lab.driver import replay_mixer as _rm\n"
        "from impala_lab_grader import child\n"
        "_spec.forbid = _guard.forbid = lambda fns: contextlib.nullcontext()\n"
        "child.ABSENT = []\n")
    a, b = graded_beside(capsys, [write(tmp_path, "a", "minibatch_get", table),
                                  write(tmp_path, "b", "replay_mix", switched)])
    assert "MyMinibatchBuffer.get calls the library's MinibatchBuffer.get" in a, a
    assert "mix calls the library's ReplayMixer.mix" in b, b


@isolated
def test_a_lookup_table_of_the_fixed_cases_fails_on_the_drawn_ones(tmp_path, capsys):
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
    (first,) = graded_beside(capsys, [attack], "--seed", "7")
    assert "✗ vtrace_numpy: case 9 of 10 differs from the reference" in first, first
    assert "[drawn at random: grading seed 7, draw 1]" in first, first


# ------------------------------------------------------------------ the channel
@isolated
def test_what_a_hand_in_writes_on_the_channel_decides_nothing(tmp_path, capsys):
    sentinel = tmp_path / "pwned"
    pickled = (b"cos\nsystem\n(S'touch " + str(sentinel).encode() + b"'\ntR.")
    first_answer = ex1_with(tmp_path, (  # a whole, well-formed answer first: then the real one
        "import os, sys\n"
        "from impala_lab_grader.channel import frame\n"
        "os.write(int(sys.argv[-1]), frame({'result': {'traces': [], 'absent': []}}))\n"),
        name="a")
    forged = ex1_with(tmp_path, (  # the only answer, a forged one: its traces are judged
        "import os, sys\n"
        "from impala_lab_grader.channel import frame\n"
        "os.write(int(sys.argv[-1]), frame({'result': {'traces': [{'$': 'pickle', 'data': "
        "'Y29z'}], 'absent': []}}))\n"
        "os._exit(0)\n"), name="b")
    raw = ex1_with(tmp_path, (  # no frames at all: a pickle, then 15 MiB of newlines
        "import os, sys\n"
        f"os.write(int(sys.argv[-1]), {pickled!r} + b'\\n' * (15 * 2**20))\n"
        "os._exit(0)\n"), name="c")
    flood = ex1_with(tmp_path, (  # more than the cap: the rest is never read
        "import os, sys\n"
        "line = b'{\"progress\": \"' + b'x' * 1000 + b'\"}\\n'\n"
        "os.write(int(sys.argv[-1]), line * 20000)\n"), name="d")
    a, b, c, d = graded_beside(capsys, [first_answer, forged, raw, flood])
    assert ("the grading process's answer is not one framed answer (more after the answer (a "
            "second answer, or other bytes)): the hand-in must not write to the grader's "
            "channel") in a, a
    assert ("the grading process's result is not a trace (unknown tag 'pickle'): the hand-in "
            "must not write to the grader's pipe") in b, b
    assert "(bytes that are not a message of the grading process)" in c, c
    assert "sent more than 16 MiB of results" in d, d
    assert not sentinel.exists()


@isolated
def test_forged_traces_of_empty_arrays_do_not_pass(tmp_path, capsys):
    # arrays of shape (0, 1, 1) would broadcast against any [T, B] to "all close"
    attack = ex3_region(tmp_path, "return values, values\n", (
        "import os, sys\nimport numpy as np\n"
        "from impala_lab_grader.channel import encode, frame\n"
        "empty = np.zeros((0, 1, 1))\n"
        "traces = [{'vs': empty, 'pg_advantages': empty} for _ in range(10)]\n"
        "os.write(int(sys.argv[-1]), frame({'result': {'traces': encode(traces), "
        "'absent': []}}))\n"
        "os._exit(0)\n"))
    (first,) = graded_beside(capsys, [attack])
    assert "✗ vtrace_numpy: case 1 of 10 differs from the reference" in first, first
    assert "where:    the shape of the result" in first, first


@isolated
def test_reference_traces_cannot_be_computed_at_cell_time(tmp_path, capsys):
    attack = add_cell(notebook("minibatch_get", solution=False), (
        "import os, sys\n"
        "from impala_lab_grader.channel import encode, frame\n"
        "from impala_lab.classroom.exercises.minibatch_get import SPEC\n"
        "traces = [SPEC.reference_trace(c) for c in SPEC.cases()]\n"
        "os.write(int(sys.argv[-1]), frame({'result': {'traces': encode(traces), "
        "'absent': []}}))\n"
        "os._exit(0)\n"))
    (first,) = graded_beside(capsys, [write(tmp_path, "a", "minibatch_get", attack)])
    assert "MyMinibatchBuffer.get still raises NotImplementedError" in first, first


# ------------------------------------------------------------------ harm to others and the batch
@isolated
def test_a_hand_in_harms_no_file_and_leaves_no_process(tmp_path, capsys, no_static):
    before = Path(NEIGHBOUR).read_bytes()
    marker = f"impala-lab-attack-{os.getpid()}-setsid"
    rewrite = ex1_with(tmp_path, f"open({NEIGHBOUR!r}, 'w').write('{{}}')\n", name="a")
    killer = ex1_with(tmp_path, (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; time.sleep(2); "
        f"os.kill(-1, signal.SIGKILL)', {marker!r}], start_new_session=True)\n"
        "raise SystemExit('left a killer behind')\n"), name="b")
    a, b = graded_beside(capsys, [rewrite, killer])
    assert "No such file or directory" in a, a
    assert "SystemExit: left a killer behind" in b, b
    assert Path(NEIGHBOUR).read_bytes() == before
    assert marked(marker) == []


@isolated
def test_sigstop_or_sigkill_from_a_hand_in_stops_only_itself(tmp_path, capsys):
    # the parent, everything it may signal (the grader is not there to see), then itself
    attack = ("import contextlib, os, signal\n"
              "for pid in (os.getppid(), -1, os.getpid()):\n"
              "    with contextlib.suppress(OSError):\n"
              "        os.kill(pid, signal.{})\n")
    stop = ex1_with(tmp_path, attack.format("SIGSTOP"), name="a")
    kill = ex1_with(tmp_path, attack.format("SIGKILL"), name="b")
    assert cli_main([stop, kill, NEIGHBOUR, "--timeout", "10"]) == 1
    out = capsys.readouterr().out
    assert "1 of 3 notebooks pass" in out and passes(out) == 1, out
    assert "stopped after 10 s (the time limit)" in out, out
    assert "the grading process ended (" in out, out


@MODES
def test_a_child_holding_the_output_leaves_nothing(tmp_path, mode):
    seed = 500000 + os.getpid() % 100000
    attack = ex1_with(tmp_path, ("import os, time\n"
                                 "if os.fork() == 0:\n"
                                 "    os.setsid()\n"
                                 "    time.sleep(600)\n"
                                 "    os._exit(0)\n"))
    done = subprocess.run([sys.executable, "-m", "impala_lab_grader", attack, NEIGHBOUR,
                           "--seed", str(seed), *flags(mode)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0 and passes(done.stdout) == 2, done.stdout + done.stderr
    assert marked(f"\0{seed}\0") == []


@isolated
def test_an_honest_slip_fails_that_hand_in_only(tmp_path, capsys):
    attack = ex1_with(tmp_path, (
        "import numpy as np\n_Base = MyMinibatchBuffer\n\n\n"
        "class MyMinibatchBuffer(_Base):\n"
        "    def get(self):\n"
        "        return np.array(super().get(), dtype=object)\n"))
    (first,) = graded_beside(capsys, [attack])
    assert "✗ minibatch_get: case 1 of 9 differs from the reference" in first, first
    assert "get() must return a pair (item, released)." in first, first


def test_the_judge_turns_any_error_into_that_hand_ins_failure():
    def compare(case, expected, actual):
        if actual != expected:  # an array here: ambiguous truth value
            raise AssertionError

    spec = Spec("demo", lambda: [Case("one", "a hint")], None, lambda case: (1, 2), compare,
                list, {})
    result = judge(spec, "f", AnswerReport(None, [np.array([1, 2])]), show=False)
    assert not result.passed and result.failed_case == 1
    assert "what f returned could not be compared with the reference (ValueError" in \
        result.message


# ------------------------------------------------------------------ resources
@MODES_AND_CGROUPS
def test_memory_counts_every_process_of_a_hand_in(tmp_path, capsys, mode, cgroups):
    if mode == "sandboxed" and not bwrap_ok():
        pytest.skip(f"no sandbox: {sandbox.bwrap_problem()}")
    attack = ex1_with(tmp_path, (
        "import os, time\nimport numpy as np\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        a = np.ones(400 * 2**20 // 8)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "time.sleep(60)\n"))
    (first,) = graded_beside(capsys, [attack], "--memory", "1000", *flags(mode))
    assert "ran out of memory (the limit is 1000 MB)" in first, first


@isolated
def test_shared_memory_files_and_memfds_are_bounded(tmp_path, capsys, cgroups):
    memfd = ex1_with(tmp_path, ("import os\n"
                                "fd = os.memfd_create('hog')\n"
                                "for _ in range(64):\n"
                                "    os.write(fd, b'x' * 2**25)\n"), name="a")
    # 200 MiB in /tmp, 56 MiB in /dev/shm and 64 MiB of an array: each under its own cap
    spread = ex1_with(tmp_path, ("import numpy as np\n"
                                 "for folder, files in (('/tmp', 25), ('/dev/shm', 7)):\n"
                                 "    for k in range(files):\n"
                                 "        with open(f'{folder}/hog{k}', 'wb') as fh:\n"
                                 "            fh.write(b'x' * 2**23)\n"
                                 "held = np.ones(2**23)\n"
                                 "raise SystemExit('held it all')\n"), name="b")
    shm = ex1_with(tmp_path, ("for k in range(16):\n"
                              "    with open(f'/dev/shm/hog{k}', 'wb') as fh:\n"
                              "        fh.write(b'x' * 2**23)\n"), name="c")
    a, b, c = graded_beside(capsys, [memfd, spread, shm], "--memory", "256")
    assert "PermissionError: [Errno 1] Operation not permitted" in a, a
    # the cgroup counts all of it; without one, /tmp and /dev/shm have caps of their own
    assert ("ran out of memory (the limit is 256 MB)" if cgroups == "cgroup" else
            "SystemExit: held it all") in b, b
    assert "OSError: [Errno 28] No space left on device" in c, c


@MODES_AND_CGROUPS
def test_a_fork_bomb_is_stopped_by_the_process_limit(tmp_path, capsys, mode, cgroups):
    if mode == "sandboxed" and not bwrap_ok():
        pytest.skip(f"no sandbox: {sandbox.bwrap_problem()}")
    big = ex1_with(tmp_path, "open('big.bin', 'wb').write(b'x' * (100 * 2**20))\n", "a")
    bomb = ex1_with(tmp_path, (
        "import os, time\n"
        "for _ in range(2000):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "time.sleep(30)\n"), "b")
    a, b = graded_beside(capsys, [big, bomb], *flags(mode))
    assert "OSError: [Errno 27] File too large" in a, a
    limit = sandbox.Limits(1, 1).processes
    assert f"started more than {limit} processes or threads (the limit) while running" in b, b


@isolated
def test_cpu_time_is_limited_per_process(tmp_path, capsys, monkeypatch):
    # the limit is the wall time on every core (a backstop): made small here to see it act
    monkeypatch.setattr(sandbox.Limits, "cpu_seconds", property(lambda self: 3))
    spin = ex1_with(tmp_path, "while True:\n    pass\n")
    (first,) = graded_beside(capsys, [spin])
    assert "used more than 3 s of CPU time (the limit) while running code cell" in first, first


@isolated
def test_what_the_grader_reads_is_a_regular_file_with_a_cap(tmp_path, capsys):
    folder = tmp_path / "odd"
    fifo = folder / "fifo" / EXERCISES["minibatch_get"].notebook
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    link = folder / "link" / EXERCISES["minibatch_get"].notebook
    link.parent.mkdir()
    link.symlink_to(NEIGHBOUR)
    sparse = folder / "sparse" / EXERCISES["minibatch_get"].notebook
    sparse.parent.mkdir()
    with open(sparse, "wb") as fh:
        fh.truncate(2**30)
    a, b, c = graded_beside(capsys, [str(fifo), str(link), str(sparse)])
    assert "not a regular file" in a and "links are not followed" in b, a + b
    assert "1073741824 bytes; a notebook may have 32 MiB at most" in c, c


def test_the_cgroup_reads_which_limit_the_kernel_enforced(tmp_path, monkeypatch):
    from impala_lab_grader import cgroup

    v2, mem, pids = tmp_path / "v2", tmp_path / "memory", tmp_path / "pids"
    for folder in (v2, mem, pids):
        folder.mkdir()
    group = Cgroup(2, [v2])
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 0\n")
    (v2 / "pids.events").write_text("max 0\n")
    assert group.hit() == ""  # reclaim at the limit is no kill
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    assert group.hit() == "memory"
    (v2 / "pids.events").write_text("max 3\n")
    assert group.hit() == "processes"  # a fork bomb is named by its processes
    group = Cgroup(1, [mem, pids])
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.hit() == "memory"
    assert group.wrap(["bwrap", "x"]) == [
        "/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; '
        'shift; exec "$@"', "sh", str(mem / "cgroup.procs"), str(pids / "cgroup.procs"), "--",
        "bwrap", "x"]
    # v2 where this process's cgroup delegates memory and pids, v1 where it does not
    (v2 / "grader.slice").mkdir()
    (v2 / "grader.slice" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    monkeypatch.setattr(cgroup, "_mounts", lambda: {"cgroup2": v2, "memory": mem, "pids": pids})
    monkeypatch.setattr(cgroup, "_own", lambda: {"": "grader.slice", "memory": "m", "pids": "p"})
    made, why = Cgroup.make("one", 2**30, 256)
    assert (made.version, made.dirs, why) == (2, [v2 / "grader.slice" / "one"], "")
    (v2 / "grader.slice" / "cgroup.subtree_control").write_text("cpu\n")
    (mem / "m").mkdir()
    (pids / "p").mkdir()
    made, why = Cgroup.make("two", 2**30, 256)
    assert (made.version, made.dirs) == (1, [mem / "m" / "two", pids / "p" / "two"])
    monkeypatch.setattr(cgroup, "_mounts", lambda: {"cgroup2": v2})
    assert Cgroup.make("three", 2**30, 256) == (
        None, "no cgroup controllers for memory and processes delegated to this process")
