"""``python -m impala_lab_grader export --nbgrader DIR`` writes source notebooks that nbgrader
turns into a student version and grades with the same checkers.

The structure of all five exports is checked here, with nbgrader's own metadata validator; the
round trip runs the real ``nbgrader generate_assignment`` and ``nbgrader autograde`` on
exercises 1 and 2 (no TensorFlow) in a temporary course directory, with a kernel of this very
interpreter, and grades a filled-in hand-in (full points) and an untouched one (zero).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from impala_lab_grader.__main__ import main as exercises_main
from impala_lab_grader.nbgrader_export import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    ExportError,
    autograder_cell_source,
    export_nbgrader,
    wrap_solution,
)

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "notebooks" / "solutions"
KERNEL = "impala-lab-tests"
STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]  # nbgrader's default code stub


def _src(cell: dict) -> str:
    """A cell's source, or a stream output's text, as one string."""
    src = cell["source"] if "source" in cell else cell["text"]
    return "".join(src) if isinstance(src, list) else src


def _nbgrader(cell: dict) -> dict:
    return cell["metadata"].get("nbgrader", {})


def _by_id(nb: dict, suffix: str) -> dict:
    (cell,) = [c for c in nb["cells"] if _nbgrader(c).get("grade_id", "").endswith(suffix)]
    return cell


def _indent_of(code: str, marker: str) -> str:
    """The indentation of the line holding `marker`."""
    line = next(ln for ln in code.split("\n") if ln.strip() == marker)
    return line[: len(line) - len(line.lstrip())]


def _region(code: str) -> list[str]:
    """The lines strictly between the exercise markers."""
    lines = code.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.strip() == MARK_START)
    end = next(i for i, ln in enumerate(lines) if ln.strip() == MARK_END)
    return lines[start + 1: end]


def test_export_writes_each_exercise_as_an_nbgrader_source_notebook(tmp_path, capsys):
    from nbgrader.nbgraderformat import MetadataValidator

    course = tmp_path / "course"
    assert exercises_main(["export", "--nbgrader", str(course), "--points", "5"]) == 0
    printed = capsys.readouterr().out.split()
    assert (course / "nbgrader_config.py").exists()
    assert str(course / "nbgrader_config.py") in printed
    for ex in EXERCISES.values():
        path = course / "source" / Path(ex.notebook).stem / ex.notebook
        assert str(path) in printed
        nb = json.loads(path.read_text(encoding="utf-8"))
        MetadataValidator().validate_nb(nbformat.from_dict(nb))  # nbgrader checks its metadata
        solution = json.loads((SOLUTIONS / ex.notebook).read_text(encoding="utf-8"))
        assert nb["metadata"]["impala_lab"]["exercise"] == ex.name
        assert nb["metadata"]["kernelspec"] == solution["metadata"]["kernelspec"]
        assert len(nb["cells"]) == len(solution["cells"])
        ids = [_nbgrader(c)["grade_id"] for c in nb["cells"] if _nbgrader(c)]
        assert len(ids) == len(set(ids))
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None
            meta = _nbgrader(cell)
            assert not meta or meta["schema_version"] == 3
            if cell["cell_type"] == "markdown":
                assert meta["locked"] and not meta["solution"] and not meta["grade"]

        # The answer cell: the solution's code, wrapped between the markers, nothing else.
        answer = _by_id(nb, "_answer")
        assert _nbgrader(answer) == {"grade": False, "grade_id": f"{ex.name}_answer",
                                     "locked": False, "schema_version": 3, "solution": True,
                                     "task": False}
        assert "student" in answer["metadata"]["tags"]
        (original,) = [c for c in solution["cells"] if "student" in c["metadata"].get("tags", [])]
        region = _region(_src(answer))
        assert region[0].strip() == BEGIN_SOLUTION and region[-1].strip() == END_SOLUTION
        assert region[0] == _indent_of(_src(answer), MARK_START) + BEGIN_SOLUTION
        assert region[-1] == _indent_of(_src(answer), MARK_END) + END_SOLUTION
        unwrapped = "\n".join(ln for ln in _src(answer).split("\n")
                              if ln.strip() not in (BEGIN_SOLUTION, END_SOLUTION))
        assert unwrapped == _src(original)

        # The test cell: graded, locked, the exercise's own checker, raising when it fails.
        check = _by_id(nb, "_check")
        assert _nbgrader(check) == {"grade": True, "grade_id": f"{ex.name}_check",
                                    "locked": True, "points": 5, "schema_version": 3,
                                    "solution": False, "task": False}
        assert "check" in check["metadata"]["tags"]
        code = _src(check)
        (original,) = [c for c in solution["cells"] if "check" in c["metadata"].get("tags", [])]
        assert _src(original).rstrip() + "\nassert result.passed, result.message" in code
        assert f"from impala_lab.classroom.exercises import {ex.checker}\n" in code
        assert f"result = {ex.checker}({ex.answer})\n" in code
        # Cells a student runs to try the answer stay editable; the set-up before it is not.
        cells = nb["cells"]
        first_code = next(c for c in cells if c["cell_type"] == "code")
        assert first_code is answer or _nbgrader(first_code)["locked"]
        between = cells[cells.index(answer) + 1: cells.index(check)]
        assert all(not _nbgrader(c) for c in between if c["cell_type"] == "code")


def test_export_refuses_to_overwrite_and_one_assignment_holds_all(tmp_path, capsys):
    course = tmp_path / "course"
    export_nbgrader(course, names=["replay_mix"])
    config = course / "nbgrader_config.py"
    config.write_text("c = get_config()  # the instructor's own\n")
    with pytest.raises(FileExistsError, match=r"ex2_replay_mixer\.ipynb"):
        export_nbgrader(course, names=["replay_mix"])
    assert exercises_main(["export", "--nbgrader", str(course), "--exercise",
                           "replay_mix"]) == 1
    assert "--force" in capsys.readouterr().out
    written = export_nbgrader(course, names=["replay_mix"], force=True)
    assert written == [course / "source" / "ex2_replay_mixer" / "ex2_replay_mixer.ipynb"]
    assert config.read_text() == "c = get_config()  # the instructor's own\n"  # never replaced

    written = export_nbgrader(course, assignment="week1")
    assert sorted(p.name for p in written) == sorted(e.notebook for e in EXERCISES.values())
    assert {p.parent for p in written} == {course / "source" / "week1"}
    with pytest.raises(ExportError, match="no exercise"):
        export_nbgrader(course, names=["nope"])
    with pytest.raises(ExportError, match="assignment name"):
        export_nbgrader(course, assignment="../up")


def test_the_test_cell_needs_the_checkers_result():
    ex = EXERCISES["replay_mix"]
    assert autograder_cell_source(ex, "result = check_replay_mix(mix)\n").endswith(
        "result = check_replay_mix(mix)\nassert result.passed, result.message")
    with pytest.raises(ExportError, match="result = check_replay_mix"):
        autograder_cell_source(ex, "check_replay_mix(mix)")


def test_wrap_solution_needs_the_markers_in_order():
    body = f"def f():\n    {MARK_START}\n    return 1\n    {MARK_END}\n"
    assert wrap_solution(body) == (f"def f():\n    {MARK_START}\n    {BEGIN_SOLUTION}\n"
                                   f"    return 1\n    {END_SOLUTION}\n    {MARK_END}\n")
    for bad in ("def f():\n    return 1\n", f"{MARK_END}\n{MARK_START}\n",
                f"{MARK_START}\n{MARK_START}\n{MARK_END}\n"):
        with pytest.raises(ExportError, match="marker"):
            wrap_solution(bad)


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _fill_in(release: dict, region: list[str]) -> dict:
    """The student version with these lines between the markers: a hand-in."""
    nb = json.loads(json.dumps(release))
    answer = _by_id(nb, "_answer")
    lines = _src(answer).split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.strip() == MARK_START)
    end = next(i for i, ln in enumerate(lines) if ln.strip() == MARK_END)
    answer["source"] = "\n".join([*lines[: start + 1], *region, *lines[end:]])
    return nb


def _solution_region(solution: dict) -> list[str]:
    (cell,) = [c for c in solution["cells"] if "student" in c["metadata"].get("tags", [])]
    return _region(_src(cell))


@pytest.mark.slow
def test_generate_assignment_then_autograde_a_solution_and_a_stub(tmp_path, monkeypatch):
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    assignment = "week1"
    names = ["minibatch_get", "replay_mix"]
    export_nbgrader(course, names=names, assignment=assignment, points=2)

    # A kernel of this interpreter, and nothing from the machine's own Jupyter set-up.
    jupyter = tmp_path / "jupyter"
    (jupyter / "kernels" / KERNEL).mkdir(parents=True)
    (jupyter / "kernels" / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "impala_lab tests", "language": "python"}))
    with open(course / "nbgrader_config.py", "a") as fh:
        fh.write(f"c.Execute.kernel_name = {KERNEL!r}\nc.Execute.timeout = 120\n")
    bin_dir = str(Path(sys.executable).parent)  # nbgrader runs `alembic` from the PATH
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "JUPYTER_PATH": str(jupyter), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "IMPALA_LAB_FAST": "1", "MPLBACKEND": "Agg", "TF_CPP_MIN_LOG_LEVEL": "2"}
    nbgrader = [sys.executable, "-m", "nbgrader"]

    _run([*nbgrader, "generate_assignment", assignment], course, env)
    for name in names:
        ex = EXERCISES[name]
        release = json.loads((course / "release" / assignment / ex.notebook).read_text())
        solution = json.loads((SOLUTIONS / ex.notebook).read_text())
        answer = _src(_by_id(release, "_answer"))
        indent = _indent_of(answer, MARK_START)
        assert _region(answer) == [indent + line for line in STUB]  # the solution is gone
        assert "BEGIN SOLUTION" not in json.dumps(release)
        assert _src(_by_id(release, "_check")) == _src(
            _by_id(json.loads((course / "source" / assignment / ex.notebook).read_text()),
                   "_check"))
        hand_ins = [("alice", _fill_in(release, _solution_region(solution))), ("bob", release)]
        if name == "minibatch_get":  # a one-line cheat: the library's own get()
            hand_ins.append(("carol", _fill_in(release, [indent + "return super().get()"])))
        for student, nb in hand_ins:
            folder = course / "submitted" / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            (folder / ex.notebook).write_text(json.dumps(nb))

    _run([*nbgrader, "autograde", assignment], course, env)
    monkeypatch.setenv("PATH", env["PATH"])  # the Gradebook, too, runs `alembic`
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for name in names:
            stem = Path(EXERCISES[name].notebook).stem
            for student, score in (("alice", 2), ("bob", 0)):
                graded = gb.find_submission_notebook(stem, assignment, student)
                assert (graded.score, graded.max_score) == (score, 2), (student, name)
        cheat = gb.find_submission_notebook(Path(EXERCISES["minibatch_get"].notebook).stem,
                                            assignment, "carol")
        assert (cheat.score, cheat.max_score) == (0, 2)

    # What the student sees for the stub: the checker's own message, then the failed assert.
    for name in names:
        ex = EXERCISES[name]
        graded = json.loads((course / "autograded" / "bob" / assignment / ex.notebook)
                            .read_text())
        outputs = _by_id(graded, "_check")["outputs"]
        text = "".join(_src(o) for o in outputs if o["output_type"] == "stream")
        assert f"✗ {name}: " in text and "still raises NotImplementedError" in text
        assert [o["ename"] for o in outputs if o["output_type"] == "error"] == ["AssertionError"]
        passed = json.loads((course / "autograded" / "alice" / assignment / ex.notebook)
                            .read_text())
        outputs = _by_id(passed, "_check")["outputs"]
        assert not [o for o in outputs if o["output_type"] == "error"]
        assert f"✓ {name}: all " in "".join(_src(o) for o in outputs
                                           if o["output_type"] == "stream")

    # The second opinion (docs/grading.md), run in the course folder as the guide says: the
    # markers and tags survive nbgrader, so the grader reads the hand-ins; none of them sees
    # source/ (the solutions) or another student's submitted/ (tests/test_grader_world.py).
    ex1 = EXERCISES["minibatch_get"].notebook
    second = subprocess.run([sys.executable, "-m", "impala_lab_grader",
                             *(f"submitted/{s}/{assignment}/{ex1}" for s in ("alice", "bob",
                                                                             "carol"))],
                            cwd=course, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "1 of 3 notebooks pass" in second.stdout, second.stdout
    alice, bob, carol = second.stdout.split("\n== ")[1:4]
    assert "✓ minibatch_get: all 9 cases pass" in alice, second.stdout
    assert "still raises NotImplementedError" in bob, second.stdout
    assert "MyMinibatchBuffer.get calls the library's MinibatchBuffer.get" in carol, carol
