"""A hand-in's world is a student's: the interpreter, the student package's own dependencies and
a student build of impala_lab compiled from source, and nothing of the course.

The instructors' workflows run from any folder: here the grader runs (with ``python -O``) in
a course folder laid out as nbgrader lays it out (``source/`` written by the grader's own
export, ``submitted/STUDENT/...``, and the instructor's ``solutions/``), with ``PYTHONPATH``
set, and grades an honest hand-in beside an audit: a hand-in that looks for everything it must
not see (the course's files, the other hand-ins, the real library and its bytecode, ray and
the dev tools, modules of the working directory and of ``PYTHONPATH``) and reports what it
found. It finds nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import impala_lab
from impala_lab.classroom.exercises import EXERCISES
from impala_lab_grader import world
from tests.grader_helpers import SOLUTIONS, add_cell, bwrap_ok, notebook

ROOT = Path(__file__).resolve().parent.parent
EX1 = EXERCISES["minibatch_get"].notebook
MODULES = ("ray", "pytest", "nbgrader", "pip", "course_secret", "course_module",
           "impala_lab_grader.grade")
AUDIT = '''
import glob, json, os, sys
import impala_lab

found = {{"seen": [p for p in {paths!r} if os.path.exists(p)], "modules": []}}
{imports}
found["impala_lab"] = impala_lab.__file__
found["optimize"] = sys.flags.optimize
found["opt"] = glob.glob("/grader/lib/**/*.opt-*.pyc", recursive=True)
hits, controls = [], set()
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
    for name in dirs + files:
        path = os.path.join(top, name)
        mine = path.startswith("/grader/lib/")
        if path.endswith(("/numpy/__init__.py", "/learner/minibatch_buffer.py")):
            controls.add(path.startswith("/grader/lib/"))
        if name.endswith(".ipynb") or name in {bad!r} or (not mine and (
                name.startswith("impala_lab") or name == "minibatch_buffer.py")):
            hits.append(path)
found["hits"], found["controls"] = hits[:20], sorted(controls)
raise RuntimeError("AUDIT " + json.dumps(found) + " END")
'''


def audit_cell(paths: list[str]) -> str:
    imports = "\n".join(f"try:\n    import {m}\n    found['modules'].append({m!r})\n"
                        f"except ImportError:\n    pass" for m in MODULES)
    bad = ["rllib", "pytest", "_pytest", "nbgrader", "solutions", "submitted", "course_secret.py",
           "course_module.py", "vtrace_tf.py"]
    return AUDIT.format(paths=paths, imports=imports, bad=bad)


def reported(out: str) -> dict:
    start = out.index("AUDIT ") + len("AUDIT ")
    return json.loads(out[start:out.index(" END", start)])


@pytest.mark.skipif(not bwrap_ok(), reason="no sandbox here")
@pytest.mark.timeout(600)
def test_a_hand_in_sees_a_students_world_from_any_course_folder(tmp_path):
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(SOLUTIONS / EX1, course / "solutions" / EX1)
    (course / "course_module.py").write_text("ANSWER = 42\n")
    pylib = tmp_path / "pylib"
    pylib.mkdir()
    (pylib / "course_secret.py").write_text("ANSWER = 42\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pylib), str(course)])}
    grader = [sys.executable, "-O", "-m", "impala_lab_grader"]
    export = subprocess.run([*grader, "export", "--nbgrader", ".", "--exercise",
                             "minibatch_get"], cwd=course, env=env, capture_output=True,
                            text=True, timeout=120)
    assert export.returncode == 0, export.stdout + export.stderr
    exported = course / "source" / Path(EX1).stem / EX1
    assert exported.is_file()
    honest = course / "submitted" / "alice" / Path(EX1).stem / EX1
    audit = course / "submitted" / "mallory" / Path(EX1).stem / EX1
    for path in (honest, audit):
        path.parent.mkdir(parents=True)
    shutil.copy(SOLUTIONS / EX1, honest)
    base_site = site.getsitepackages([sys.base_prefix])[0]
    paths = [str(course), str(exported), str(honest), str(pylib), str(ROOT),
             str(ROOT / "notebooks" / "solutions"), str(Path(impala_lab.__file__).parent),
             sysconfig.get_paths()["purelib"], os.path.join(base_site, "pip"),
             "/usr/lib/python3/dist-packages/yaml", "solutions", "source", "submitted"]
    audit.write_text(json.dumps(add_cell(notebook("minibatch_get"), audit_cell(paths))))
    done = subprocess.run([*grader, f"submitted/mallory/{Path(EX1).stem}/{EX1}",
                           f"submitted/alice/{Path(EX1).stem}/{EX1}", "--timeout", "240"],
                          cwd=course, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 of 2 notebooks pass" in done.stdout, done.stdout
    found = reported(done.stdout)
    assert found["seen"] == [] and found["modules"] == [], found
    assert found["impala_lab"].startswith("/grader/lib/impala_lab/"), found
    assert found["optimize"] == 0 and found["opt"] == [], found
    assert found["hits"] == [], found
    assert found["controls"] == [False, True], found  # the walk saw the world and the build


def test_the_world_is_the_student_packages_requirements():
    names = {world._key(d.metadata["Name"]) for d in world.requirements()}
    assert {"numpy", "gymnasium", "keras"} <= names
    assert names & {"tensorflow", "tensorflow-cpu"}
    assert not names & {"impala-lab", "impala-lab-grader", "ray", "pytest", "nbgrader", "ruff",
                        "playwright", "mkdocs"}, names
    entries = world.entries()
    assert "numpy" in entries and "ray" not in entries and "impala_lab" not in entries
    assert not any(name.startswith("__editable__") for name in entries)


def test_every_folder_that_holds_code_or_the_course_is_hidden(tmp_path, monkeypatch):
    extra = tmp_path / "hand-ins"
    extra.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nowhere") + os.pathsep + str(extra))
    hidden = world.hidden([str(extra)])
    real = os.path.realpath
    assert real(tmp_path) in hidden and real(extra) in hidden
    assert str(Path(impala_lab.__file__).resolve().parent.parent) in hidden  # the checkout
    assert real(sysconfig.get_paths()["purelib"]) in hidden
    assert real(site.getsitepackages([sys.base_prefix])[0]) in hidden
    if os.path.isdir("/usr/lib/python3/dist-packages"):
        assert "/usr/lib/python3/dist-packages" in hidden
    stdlib = real(sysconfig.get_paths()["stdlib"])
    assert stdlib not in hidden and world.site_target() in hidden
