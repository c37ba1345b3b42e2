"""The course installs with pip: a built (student) wheel carries the notebooks, the exercises,
the notation table and IMPALA in one file but no solutions, and none of the instructors'
grader; installed into a fresh virtualenv outside the repository (the grader beside it, as an
instructor installs it), ``impala-lab notebooks DIR`` copies them (and refuses
``--solutions``), ``00_quickstart`` runs there in fast mode, the one-file IMPALA answers
``--help`` there and ``python -m impala_lab_grader`` grades a solution there, where a hand-in
sees neither the installed library nor the course's solutions.

The fresh virtualenv gets the wheel with ``--no-deps`` and reaches the dev environment's
site-packages for the dependencies through a ``.pth`` file (TensorFlow is not downloaded
again). A directory named by a ``.pth`` file is not a site directory, so the dev environment's
own ``.pth`` files (its editable finder for this checkout) stay inactive there: the
``impala_lab`` the fresh environment imports is the wheel's, and a test checks that.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest
from packaging.version import Version

from impala_lab.classroom.course import course_root
from impala_lab.cli.main import main
from tests.kernels import notebook_client

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# what a build needs from the working tree (copied, so no build/ or egg-info lands in it)
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "impala_lab",
                "notebooks", "examples")
KERNEL = "impala-lab-wheel"
SOLUTION = "solutions/ex1_minibatch_buffer_get.ipynb"
ONE_FILE = ROOT / "examples" / "impala_in_one_file.py"

pytestmark = pytest.mark.timeout(600)


def _course_paths(root: Path, solutions: bool = True) -> list[str]:
    """The course's files under ``root`` (a copy of the course, or the wheel's folder)."""
    patterns = ("*.ipynb", "*.md", "*.py", "exercises/*.ipynb") + (
        ("solutions/*.ipynb",) if solutions else ())
    return sorted(p.relative_to(root).as_posix() for pattern in patterns
                  for p in root.glob(pattern))


def _expected(solutions: bool = True) -> list[str]:
    """What a copy of the course holds: notebooks/ (without the solutions unless asked) and
    the one-file IMPALA from examples/."""
    return sorted([*_course_paths(NOTEBOOKS, solutions), ONE_FILE.name])


def _run(cmd: list[str | Path], cwd: Path, timeout: float = 120,
         **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "IMPALA_LAB_INSTRUCTOR_BUILD")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", IMPALA_LAB_FAST="1", **extra)
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _can_build_offline() -> bool:
    """This environment can build the wheel itself: setuptools, and wheel below setuptools 70.1
    (TensorFlow's dependencies bring both). Else pip fetches the build-system's requirements."""
    try:
        setuptools = Version(importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        return False
    return setuptools >= Version("70.1") or importlib.util.find_spec("wheel") is not None


def _build_wheel(tmp: Path, **env: str) -> Path:
    """A wheel built by pip from a copy of the working tree (`env`: variables for the build)."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    isolation = ["--no-build-isolation"] if _can_build_offline() else []
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                 "-w", tmp / "dist", src], cwd=tmp, timeout=300, **env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = (tmp / "dist").glob("impala_lab-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The student wheel (no solutions)."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv outside the repository with the wheel installed; returns its bin/."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    python = root / "bin" / "python"
    proc = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                 wheel], cwd=root.parent, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the dependencies come from the dev environment (added after the install, so that pip
    # never sees this checkout's editable impala_lab there)
    # the instructors' grader beside it, built from a copy of grader/ (nothing lands in it)
    grader = tmp_path_factory.mktemp("grader-src") / "grader"
    shutil.copytree(ROOT / "grader", grader, ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "build"))
    isolation = ["--no-build-isolation"] if _can_build_offline() else []
    dist = grader.parent / "dist"
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", dist,
                 grader], cwd=root.parent, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = dist.glob("impala_lab_grader-*.whl")
    proc = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                 built], cwd=root.parent, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=root.parent).stdout.strip()
    dev_dirs = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "impala_lab_dev_deps.pth").write_text("\n".join(dev_dirs) + "\n")
    return root / "bin"


@pytest.fixture(scope="module")
def course(venv, tmp_path_factory) -> Path:
    """``impala-lab notebooks my-course``, run with the fresh environment, and one solution
    copied from the checkout (the instructor's) to grade there."""
    where = tmp_path_factory.mktemp("student")
    proc = _run([venv / "impala-lab", "notebooks", "my-course"], cwd=where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("copied 17 lecture notebooks, 14 in exercises/, notation.md, impala_in_one_file.py "
            "to my-course/") in proc.stdout, proc.stdout
    (where / "my-course" / "solutions").mkdir()
    shutil.copyfile(NOTEBOOKS / SOLUTION, where / "my-course" / SOLUTION)
    return where / "my-course"


def test_the_wheel_carries_the_course_without_outputs(wheel):
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        prefix = "impala_lab/classroom/notebooks/"
        shipped = sorted(n[len(prefix):] for n in names if n.startswith(prefix))
        assert shipped == _expected(solutions=False)  # no solutions in it
        assert len(shipped) == 33 and "00_quickstart.ipynb" in shipped
        assert whl.read(prefix + ONE_FILE.name) == ONE_FILE.read_bytes()
        assert whl.read(prefix + "notation.md") == (NOTEBOOKS / "notation.md").read_bytes()
        assert "impala_lab/classroom/exercises/_spec.py" in names  # the checks a student runs
        assert not [n for n in names if n.startswith("impala_lab_grader") or n.endswith(
            ("_sandbox.py", "nbgrader_export.py", "_student_build.py"))]  # not the grader
        assert "impala_lab/data/collapse_cartpole_metrics.csv" in names  # notebook 06 reads it
        assert "impala_lab/data/breakout_policy.gif" in names  # notebook 11 shows it
        for name in (n for n in shipped if n.endswith(".ipynb")):
            nb = json.loads(whl.read(prefix + name))
            for cell in nb["cells"]:
                assert not cell.get("outputs") and cell.get("execution_count") is None, name


def test_an_instructor_build_carries_the_solutions(tmp_path):
    built = _build_wheel(tmp_path, IMPALA_LAB_INSTRUCTOR_BUILD="1")
    with zipfile.ZipFile(built) as whl:
        prefix = "impala_lab/classroom/notebooks/"
        shipped = sorted(n[len(prefix):] for n in whl.namelist() if n.startswith(prefix))
    assert shipped == _expected() and len(shipped) == 47


def test_the_fresh_environment_imports_the_wheel_not_the_checkout(venv):
    proc = _run([venv / "python", "-c", "import impala_lab, impala_lab.classroom.course as c; "
                 "print(impala_lab.__file__); print(c.course_root())"], cwd=venv.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, root = proc.stdout.splitlines()
    site = venv.parent / "lib"
    assert Path(module).is_relative_to(site) and not Path(module).is_relative_to(ROOT)
    assert Path(root) == Path(module).parent / "classroom" / "notebooks"


def test_notebooks_copies_lectures_and_exercises_and_refuses_to_overwrite(venv, tmp_path):
    proc = _run([venv / "impala-lab", "notebooks", "course"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    copied = _course_paths(tmp_path / "course")
    assert copied == _expected(solutions=False)
    assert "jupyter lab course" in proc.stdout

    stub = tmp_path / "course" / "exercises" / "ex1_minibatch_buffer_get.ipynb"
    stub.write_text("my answer")
    again = _run([venv / "impala-lab", "notebooks", "course"], cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.startswith("impala-lab: error: course already holds 00_quickstart.ipynb,")
    assert "nothing was copied (--force overwrites them)" in again.stderr
    assert stub.read_text() == "my answer"

    solutions = _run([venv / "impala-lab", "notebooks", "other", "--solutions"], cwd=tmp_path)
    assert solutions.returncode == 2
    assert "is a student build and carries no solutions" in solutions.stderr, solutions.stderr
    assert not (tmp_path / "other").exists()

    forced = _run([venv / "impala-lab", "notebooks", "course", "--force"], cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert _course_paths(tmp_path / "course") == _expected(solutions=False)
    assert stub.read_bytes() == (NOTEBOOKS / "exercises" / stub.name).read_bytes()


def test_the_grader_grades_the_copied_exercises_there(venv, course):
    proc = _run([venv / "python", "-m", "impala_lab_grader", SOLUTION,
                 "exercises/ex1_minibatch_buffer_get.ipynb"], cwd=course)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the stub fails, the solution passes
    assert re.search(r"^✓ minibatch_get: all \d+ cases pass$", proc.stdout, re.M), proc.stdout
    assert "still raises NotImplementedError" in proc.stdout
    assert "1 of 2 notebooks pass" in proc.stdout
    # a hand-in looks for the installed (not editable) library and the course's solutions
    installed = _run([venv / "python", "-c", "import impala_lab; print(impala_lab.__file__)"],
                     cwd=course).stdout.strip()
    probe = [str(Path(installed).parent / "learner" / "vtrace.py"), str(course / SOLUTION),
             str(course / "exercises")]
    nb = json.loads((course / SOLUTION).read_text())
    check = next(i for i, c in enumerate(nb["cells"]) if "check" in c["metadata"].get("tags", []))
    nb["cells"].insert(check, {
        "cell_type": "code", "execution_count": None, "id": "probe", "metadata": {},
        "outputs": [], "source": 'import os\nraise RuntimeError(f"SEEN {[p for p in '
                                 f'{probe!r} if os.path.exists(p)]}}")\n'})
    (course / "probe").mkdir()
    (course / "probe" / Path(SOLUTION).name).write_text(json.dumps(nb))
    probed = _run([venv / "python", "-m", "impala_lab_grader", f"probe/{Path(SOLUTION).name}"],
                  cwd=course)
    assert "RuntimeError: SEEN [] (at code cell" in probed.stdout, probed.stdout + probed.stderr


def test_the_one_file_impala_runs_there(venv, course):
    proc = _run([venv / "python", ONE_FILE.name, "--help"], cwd=course)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = " ".join(proc.stdout.split())
    assert "--stop-return STOP_RETURN" in text and "(default: 475.0)" in text, text
    assert (course / "notation.md").read_bytes() == (NOTEBOOKS / "notation.md").read_bytes()


@pytest.mark.slow
def test_quickstart_runs_in_fast_mode_there(venv, course, tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(venv / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "impala_lab from the wheel", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("IMPALA_LAB_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    nb = nbformat.read(course / "00_quickstart.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import impala_lab; print(impala_lab.__file__)"))
    client = notebook_client(nb, KERNEL, tmp_path / "sockets", course)
    client.execute()  # raises CellExecutionError (with the traceback) if a cell fails
    printed = "".join(out.get("text", "") for out in nb.cells[-1].outputs).strip()
    assert Path(printed).is_relative_to(venv.parent), printed


def test_a_checkout_copies_its_own_notebooks(tmp_path, capsys):
    # an editable install builds nothing: the course comes from notebooks/ in place
    assert course_root() == NOTEBOOKS
    assert main(["notebooks", str(tmp_path / "c"), "--solutions"]) == 0
    assert _course_paths(tmp_path / "c") == _expected()
    assert (tmp_path / "c" / ONE_FILE.name).read_bytes() == ONE_FILE.read_bytes()
    assert main(["notebooks", str(tmp_path / "c")]) == 2
    assert "already holds" in capsys.readouterr().err
