"""What the grader's tests share: the exercise notebooks (stub and solution), ways to edit a
hand-in (replace the student's region, add a cell), where to write it, whether bubblewrap
works here (the sandboxed mode's condition), and the processes a hand-in left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from impala_lab_grader.notebook import source, tags
from impala_lab_grader.sandbox import bwrap_problem

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "notebooks" / "exercises"
SOLUTIONS = ROOT / "notebooks" / "solutions"


def notebook(name: str, solution: bool = True) -> dict:
    folder = SOLUTIONS if solution else STUBS
    return json.loads((folder / EXERCISES[name].notebook).read_text(encoding="utf-8"))


def with_region(nb: dict, region: str) -> dict:
    """The notebook with the code between the markers replaced by `region` (indented as the
    student cell's first line inside the markers)."""
    cell = next(c for c in nb["cells"] if "student" in tags(c))
    text = source(cell)
    start = text.index(MARK_START) + len(MARK_START) + 1
    end = text.rindex("\n", 0, text.index(MARK_END)) + 1
    indent = text[end:text.index(MARK_END)]
    body = "".join(indent + line + "\n" for line in region.strip("\n").splitlines())
    cell["source"] = text[:start] + body + text[end:]
    return nb


def add_cell(nb: dict, code: str, before_check: bool = True) -> dict:
    cells = nb["cells"]
    at = next(i for i, c in enumerate(cells) if "check" in tags(c)) if before_check else 1
    cells.insert(at, {"cell_type": "code", "execution_count": None, "id": f"x{len(cells)}",
                      "metadata": {}, "outputs": [], "source": code})
    return nb


def write(tmp_path: Path, folder: str, name: str, nb: dict) -> str:
    path = tmp_path / folder / EXERCISES[name].notebook
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")
    return str(path)


def bwrap_ok() -> bool:
    return bwrap_problem() == ""


# "sandboxed": bubblewrap; "unsandboxed": the --unsandboxed child of this interpreter
MODES = pytest.mark.parametrize("mode", [
    pytest.param("sandboxed", marks=pytest.mark.skipif(
        not bwrap_ok(), reason=f"no sandbox here: {bwrap_problem()}")), "unsandboxed"])


def flags(mode: str) -> list[str]:
    return ["--unsandboxed"] if mode == "unsandboxed" else []


def marked(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a hand-in's own processes)."""
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    out.append(int(name))
        except (OSError, ValueError):
            continue
    return out
