"""Open in Colab (tools/colab_cell.py): the badge and the install cell, and what the cell does.

The install cell runs in a fresh virtualenv (no pip: a recording stub answers ``python -m pip``
there), where impala_lab is missing, where it is present, and where TensorFlow is preinstalled
as on Colab.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(p for p in NOTEBOOK_DIR.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

_spec = importlib.util.spec_from_file_location("colab_cell", ROOT / "tools" / "colab_cell.py")
colab_cell = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_cell)

# Every notebook: `python tools/colab_cell.py notebooks/*.ipynb notebooks/*/*.ipynb` keeps them so.
WITH_COLAB = NOTEBOOKS


def test_every_notebook_has_colab():
    missing = [p.name for p in NOTEBOOKS
               if not colab_cell.has_colab(json.loads(p.read_text("utf-8")))]
    assert len(NOTEBOOKS) >= 23 and not missing, missing


@pytest.mark.parametrize("path", WITH_COLAB, ids=[p.relative_to(NOTEBOOK_DIR).as_posix()
                                                  for p in WITH_COLAB])
def test_notebook_has_the_badge_and_the_install_cell(path):
    old, new = colab_cell.updated(path)
    assert new == old, "stale badge or install cell: run python tools/colab_cell.py on it"
    nb = json.loads(old)
    first = "".join(nb["cells"][0]["source"])
    rel = path.relative_to(ROOT).as_posix()
    assert first.lstrip().startswith("#"), "the first cell still starts with the title"
    if colab_cell.GITHUB_REPO:
        assert colab_cell.colab_url(rel.replace("/solutions/", "/exercises/")) in \
            first.splitlines()[2]
    else:  # no public repository: no badge, and the cell installs from a wheel
        assert colab_cell.BADGE_ID_TEXT not in old
        assert json.dumps(colab_cell.INSTALL_SOURCE) in "".join(
            next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code[0]["id"] == colab_cell.INSTALL_CELL_ID
    extras = "impala_lab[ray] @ " if path.name.startswith("09_") else "impala_lab @ "
    assert extras in "".join(code[0]["source"])


def _without_colab(nb: dict) -> dict:
    """The notebook as it was before the script ran: no install cell, no badge line."""
    nb["cells"] = [c for c in nb["cells"] if c.get("id") != colab_cell.INSTALL_CELL_ID]
    first_md = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    lines = "".join(first_md["source"]).split("\n")
    for i in reversed([i for i, line in enumerate(lines) if colab_cell.BADGE_ID_TEXT in line]):
        del lines[i: i + (2 if i + 1 < len(lines) and not lines[i + 1].strip() else 1)]
    first_md["source"] = "\n".join(lines).splitlines(keepends=True)
    return nb


def test_the_script_is_idempotent_and_keeps_cell_ids(tmp_path):
    for src in [NOTEBOOK_DIR / "09_scaling_out_with_ray.ipynb",
                NOTEBOOK_DIR / "exercises" / "ex1_minibatch_buffer_get.ipynb",
                NOTEBOOK_DIR / "00_quickstart.ipynb"]:
        path = tmp_path / src.name
        path.write_text(colab_cell.dumps(_without_colab(json.loads(src.read_text("utf-8")))),
                        "utf-8")
        before = json.loads(path.read_text("utf-8"))
        assert colab_cell.main([str(path)]) == 0
        once = path.read_text("utf-8")
        assert colab_cell.main([str(path)]) == 0
        assert path.read_text("utf-8") == once, "a second run changed the notebook"
        assert colab_cell.main(["--check", str(path)]) == 0
        after = json.loads(once)
        # the old cells keep their ids and order; the install cell is the first code cell
        ids = [c["id"] for c in after["cells"]]
        assert [i for i in ids if i != colab_cell.INSTALL_CELL_ID] == \
            [c["id"] for c in before["cells"] if c["id"] != colab_cell.INSTALL_CELL_ID]
        first_code = next(c for c in after["cells"] if c["cell_type"] == "code")
        assert first_code["id"] == colab_cell.INSTALL_CELL_ID
        assert colab_cell.has_colab(after) and not colab_cell.has_colab(before)
        # everything but the first markdown cell and the new cell is untouched
        rest = [c for c in after["cells"] if c["id"] != colab_cell.INSTALL_CELL_ID]
        assert rest[1:] == before["cells"][1:]
        assert "".join(rest[0]["source"]).count(colab_cell.BADGE_ID_TEXT) == (
            1 if colab_cell.GITHUB_REPO else 0)


def test_no_notebook_or_install_source_points_at_a_placeholder_repository():
    """Issue 29: every badge opened `your-org/impala_lab`, which is nobody's repository."""
    assert colab_cell.GITHUB_REPO is None or "your-org" not in colab_cell.GITHUB_REPO
    assert "your-org" not in colab_cell.INSTALL_SOURCE
    for path in NOTEBOOKS:
        assert "your-org" not in path.read_text("utf-8"), path.name
    if colab_cell.GITHUB_REPO is None:
        version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        assert f"impala_lab-{version}-py3-none-any.whl" == colab_cell.INSTALL_SOURCE


def test_a_new_repository_rewrites_the_badge_in_place(tmp_path, monkeypatch):
    path = tmp_path / "nb.ipynb"
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# Title\n", "\n", "Text"]},
        {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": None,
         "outputs": [], "source": ["import ray"]}]}
    path.write_text(json.dumps(nb))
    colab_cell.main([str(path)])
    monkeypatch.setattr(colab_cell, "GITHUB_REPO", "someone/else")
    assert colab_cell.main(["--check", str(path)]) == 1
    colab_cell.main([str(path)])
    out = json.loads(path.read_text())
    assert "".join(out["cells"][0]["source"]) == (
        "# Title\n\n" + colab_cell.badge_line("nb.ipynb") + "\n\nText")
    assert "someone/else" in colab_cell.badge_line("nb.ipynb")
    assert [c["id"] for c in out["cells"]] == ["t", colab_cell.INSTALL_CELL_ID, "c"]
    assert "impala_lab[ray] @ " in "".join(out["cells"][1]["source"])
    monkeypatch.setattr(colab_cell, "GITHUB_REPO", None)  # and back: the badge goes
    colab_cell.main([str(path)])
    out = json.loads(path.read_text())
    assert "".join(out["cells"][0]["source"]) == "# Title\n\nText"
    assert colab_cell.has_colab(out)


def test_a_solution_and_its_exercise_get_the_same_badge_and_cell(tmp_path, monkeypatch):
    monkeypatch.setattr(colab_cell, "GITHUB_REPO", "someone/else")
    course = tmp_path / "notebooks"  # the badge's path starts at a folder named notebooks
    for folder in ("exercises", "solutions"):
        (course / folder).mkdir(parents=True)
        src = NOTEBOOK_DIR / folder / "ex1_minibatch_buffer_get.ipynb"
        (course / folder / src.name).write_text(src.read_text("utf-8"), "utf-8")
    stub, sol = (course / f / "ex1_minibatch_buffer_get.ipynb" for f in ("exercises",
                                                                        "solutions"))
    assert colab_cell.rel_path(sol) == "notebooks/solutions/ex1_minibatch_buffer_get.ipynb"
    colab_cell.main([str(stub), str(sol)])
    a, b = json.loads(stub.read_text("utf-8")), json.loads(sol.read_text("utf-8"))
    assert a["cells"][:2] == b["cells"][:2]
    assert "notebooks/exercises/ex1_minibatch_buffer_get.ipynb)" in "".join(a["cells"][0]["source"])
    assert colab_cell.badge_line("notebooks/solutions/ex1_minibatch_buffer_get.ipynb") == \
        colab_cell.badge_line("notebooks/exercises/ex1_minibatch_buffer_get.ipynb")
    assert "notebooks/exercises/ex1_minibatch_buffer_get.ipynb)" in colab_cell.badge_line(
        "notebooks/exercises/ex1_minibatch_buffer_get.ipynb")


def test_the_cell_lists_pyprojects_requirements_without_tensorflow():
    deps, extras = colab_cell.requirements()
    assert "numpy>=1.26" in deps and "keras>=3.10" in deps
    assert not any(d.startswith("tensorflow") and "board" not in d for d in deps)
    assert not any(d.startswith("ml_dtypes") for d in deps)  # TensorFlow's, kept as installed
    code = colab_cell.install_cell_source(["ray"])
    for d in deps + extras["ray"]:
        assert json.dumps(d) in code
    compile(code, "<install cell>", "exec")


# ------------------------------------------------------------------ the cell in a fresh venv
PIP_STUB = """\
import json, os, sys
with open(os.environ["PIP_CALLS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> Path:
    """A new virtualenv without pip and without impala_lab."""
    env_dir = tmp_path_factory.mktemp("colab") / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    return env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"


def run_cell(python: Path, tmp_path: Path, code: str, *, present: tuple[str, ...] = ()):
    """Runs `code` in `python` with a recording pip and stand-ins for the `present` packages;
    returns the pip calls, each as its argument list."""
    stubs = tmp_path / "stubs"
    (stubs / "pip").mkdir(parents=True)
    (stubs / "pip" / "__init__.py").write_text("")
    (stubs / "pip" / "__main__.py").write_text(PIP_STUB)
    for name in present:
        (stubs / name).mkdir()
        (stubs / name / "__init__.py").write_text("")
    calls = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(stubs), PIP_CALLS=str(calls), PYTHONNOUSERSITE="1")
    proc = subprocess.run([str(python), "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_fresh_venv_is_fresh(fresh_python, tmp_path):
    out = subprocess.run([str(fresh_python), "-c", "import importlib.util as u; print("
                          "u.find_spec('impala_lab'), u.find_spec('pip'))"],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
                         cwd=tmp_path)
    assert out.stdout.split() == ["None", "None"]


def test_the_cell_installs_impala_lab_when_missing(fresh_python, tmp_path):
    code = colab_cell.install_cell_source(["ray"], source=str(ROOT))
    calls = run_cell(fresh_python, tmp_path, code)
    assert calls == [["install", "-q", f"impala_lab[ray] @ {ROOT.as_uri()}"]]


def test_the_cell_installs_from_a_url_as_given(fresh_python, tmp_path):
    url = "git+https://example.org/impala_lab@main"
    calls = run_cell(fresh_python, tmp_path, colab_cell.install_cell_source([], source=url))
    assert calls == [["install", "-q", f"impala_lab @ {url}"]]


def test_the_cell_says_what_to_do_when_its_wheel_is_not_there(fresh_python, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(fresh_python), "-c", colab_cell.install_cell_source([])],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("FileNotFoundError: impala_lab is not installed and ")
    assert "pip wheel --no-deps -w dist ." in last and "IMPALA_LAB_SOURCE" in last


def test_the_cell_keeps_a_preinstalled_tensorflow(fresh_python, tmp_path):
    wheel = tmp_path / "impala_lab-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")  # the cell looks for it; the recording pip never opens it
    code = colab_cell.install_cell_source([], source=str(wheel))
    calls = run_cell(fresh_python, tmp_path, code, present=("tensorflow",))
    deps, _ = colab_cell.requirements()
    assert calls == [["install", "-q", "--no-deps", f"impala_lab @ {wheel.as_uri()}"],
                     ["install", "-q", *deps]]


def test_the_cell_does_nothing_where_impala_lab_is_installed(fresh_python, tmp_path):
    calls = run_cell(fresh_python, tmp_path, colab_cell.install_cell_source(["ray"]),
                     present=("impala_lab",))
    assert calls == []


def test_the_notebooks_cell_is_a_no_op_here(monkeypatch):
    """Here (as in CI, and in a course copied out of a wheel) the cell runs no pip."""
    nb = json.loads(WITH_COLAB[0].read_text("utf-8"))
    cell = next(c for c in nb["cells"] if c["id"] == colab_cell.INSTALL_CELL_ID)
    calls = []
    monkeypatch.setattr(subprocess, "check_call", lambda *args, **kw: calls.append(args))
    namespace: dict = {}
    exec(compile("".join(cell["source"]), "<install cell>", "exec"), namespace)
    assert calls == []
    assert namespace["IMPALA_LAB_SOURCE"] == colab_cell.INSTALL_SOURCE


def fake_wheel(folder: Path) -> Path:
    """A wheel named impala_lab, with a `ray` extra and no requirements (pip installs it
    offline)."""
    import zipfile

    path = folder / "impala_lab-0.0.1-py3-none-any.whl"
    info = "impala_lab-0.0.1.dist-info"
    files = {"impala_lab/__init__.py": "FAKE = True\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: impala_lab\nVersion: 0.0.1\n"
                                 "Provides-Extra: ray\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return path


def test_the_cell_installs_a_local_wheel_with_real_pip(tmp_path):
    """The whole cell with the real pip in a fresh virtualenv: a wheel's path becomes a
    file:// requirement with the extras, and the second run finds impala_lab and does nothing."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    wheel = fake_wheel(tmp_path)
    code = colab_cell.install_cell_source(["ray"], source=str(wheel))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    check = "\nimport impala_lab\nprint(impala_lab.FAKE)\n"
    first = subprocess.run([str(python), "-c", code + check], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "True\n"
    wheel.unlink()  # a second pip run would now fail: there is nothing to install from
    second = subprocess.run([str(python), "-c", code + check], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout == "True\n", second.stderr
    assert second.stderr == ""
