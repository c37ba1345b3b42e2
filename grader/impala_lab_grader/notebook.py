"""A hand-in as the grader reads it: bytes with a cap, nbformat 4 JSON, the exercise it is, and
the code of the cells that run.

`read_bytes` refuses links, FIFOs and devices and reads a size cap at most; `exercise_of`
takes the exercise from the notebook's metadata, its file name, the checker its check cell
calls and its title together (they must not disagree); `code_cells` gives the code of the
cells before the check cell, normalised as it will run (IPython magics and shell escapes,
lines starting with ``%`` or ``!``, dropped). The grader checks that code (`impala_lab_grader.
static`) and its sandbox runs exactly it (`impala_lab_grader.child.run_cells`).

`load_answer` and `check_notebook` run a notebook's cells in this process: for tests and for
notebooks you trust (solutions), never for hand-ins.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import impala_lab.classroom.exercises as exercises
from impala_lab.classroom.exercises._common import FAIL_MARK, CheckResult
from impala_lab_grader.channel import escaped
from impala_lab_grader.child import CellError, run_cells

MAX_NOTEBOOK_BYTES = 32 * 2**20

CHECK_TAG = "check"
STUDENT_TAG = "student"
_TITLE = re.compile(r"^#\s*Exercise\s+(\d+c?)\s*·")


class NotebookError(ValueError):
    """The file is not an exercise notebook, or one of its cells failed to run."""


def shown(path: str | os.PathLike) -> str:
    """A path as the grader prints it (`escaped`: no line break or escape sequence)."""
    return escaped(os.fsdecode(path))


def read_bytes(path: str | os.PathLike, cap: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """A regular file's bytes, at most `cap` of them: a link, a FIFO, a device or a file
    larger than `cap` is refused (`NotebookError`), and nothing here blocks on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise NotebookError(f"{shown(path)}: cannot read the notebook ({exc.strerror or exc}; "
                            f"links are not followed)") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotebookError(f"{shown(path)}: not a regular file")
        if info.st_size > cap:
            raise NotebookError(f"{shown(path)}: {info.st_size} bytes; a notebook may have "
                                f"{cap // 2**20} MiB at most")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise NotebookError(f"{shown(path)}: more than {cap // 2**20} MiB")
    return data


def _well_formed(nb: Any) -> bool:
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(
            nb.get("cells"), list) or not isinstance(nb.get("metadata", {}), dict):
        return False
    for cell in nb["cells"]:
        src = cell.get("source", "") if isinstance(cell, dict) else None
        meta = cell.get("metadata", {}) if isinstance(cell, dict) else None
        if not (isinstance(src, str) or (isinstance(src, list) and all(
                isinstance(s, str) for s in src))) or not isinstance(meta, dict) \
                or not isinstance(meta.get("tags", []), list):
            return False
    return True


def parse_notebook(data: bytes, path: str | os.PathLike) -> dict[str, Any]:
    """The notebook's JSON (nbformat 4) from its bytes; cells with text sources only."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotebookError(f"{shown(path)}: cannot read the notebook "
                            f"({escaped(str(exc))[:200]})") from None
    if not _well_formed(nb):
        raise NotebookError(f"{shown(path)}: not a Jupyter notebook in nbformat 4")
    return nb


def read_notebook(path: str | os.PathLike) -> dict[str, Any]:
    """The notebook's JSON (nbformat 4), read as `read_bytes` reads."""
    return parse_notebook(read_bytes(path), path)


def source(cell: dict[str, Any]) -> str:
    """A cell's source as one string."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def tags(cell: dict[str, Any]) -> list[str]:
    return [t for t in cell.get("metadata", {}).get("tags", []) if isinstance(t, str)]


def normalised(text: str) -> str:
    """A cell's code as it runs: lines starting with ``%`` or ``!`` dropped."""
    return "\n".join(ln for ln in text.splitlines()
                     if not ln.lstrip().startswith(("%", "!"))) + "\n"


def _code(nb: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in nb["cells"] if c.get("cell_type") == "code"]


def _checkers_in(text: str) -> set[str]:
    return {e.name for e in exercises.EXERCISES.values()
            if re.search(rf"\b{e.checker}\b", text)}


def code_cells(nb: dict[str, Any]) -> list[tuple[int, str]]:
    """(code cell number, normalised code) of the cells that run before the check: the
    cells before the first one tagged ``check`` (without a tag, before the first cell that
    calls a checker; with neither, all of them)."""
    cells = _code(nb)
    stop = next((i for i, c in enumerate(cells) if CHECK_TAG in tags(c)), None)
    if stop is None:
        stop = next((i for i, c in enumerate(cells) if _checkers_in(source(c))), len(cells))
    return [(i + 1, normalised(source(c))) for i, c in enumerate(cells[:stop])]


def _checkers_called(nb: dict[str, Any]) -> set[str]:
    """The exercises whose checker the check cell calls (any code cell, when none is tagged
    ``check``)."""
    cells = _code(nb)
    checks = [c for c in cells if CHECK_TAG in tags(c)] or cells
    return _checkers_in("".join(source(c) for c in checks))


def _titled(nb: dict[str, Any]) -> exercises.Exercise | None:
    """The exercise the notebook's title names ("# Exercise 3c · ..."), or None."""
    first = next((c for c in nb["cells"] if c.get("cell_type") == "markdown"), None)
    m = _TITLE.match(source(first).lstrip()) if first is not None else None
    if m is None:
        return None
    return next((e for e in exercises.EXERCISES.values()
                 if e.notebook.startswith(f"ex{m[1]}_")), None)


def exercise_of(path: str | os.PathLike, nb: dict[str, Any]) -> exercises.Exercise:
    """The exercise a notebook belongs to, from its file and its content together: the
    metadata ``impala_lab.exercise``, the file name, the checker its check cell calls and
    the title of its first markdown cell (``# Exercise 3c · ...``) must not disagree (a file
    renamed by a student still counts, by its metadata; a challenge relabelled as its
    exercise is told by its title).

    Raises:
      NotebookError: no exercise found, or two of them name different exercises.
    """
    where = shown(path)
    meta = nb.get("metadata", {}).get("impala_lab")
    name = meta.get("exercise") if isinstance(meta, dict) else None
    by_file = next((e.name for e in exercises.EXERCISES.values()
                    if Path(path).name == e.notebook), None)
    if name is not None and name not in exercises.EXERCISES:
        raise NotebookError(f"{where}: its metadata names {escaped(str(name)[:60])!r}, which "
                            f"is no exercise")
    if name is not None and by_file is not None and name != by_file:
        raise NotebookError(f"{where}: its metadata says exercise {name!r} but its file is "
                            f"{by_file!r}'s notebook: hand in the exercise's own notebook")
    chosen = name or by_file
    if chosen is None:
        known = ", ".join(e.notebook for e in exercises.EXERCISES.values())
        raise NotebookError(f"{where}: not an exercise notebook (no metadata impala_lab."
                            f"exercise, and the file name is none of {known})")
    called = _checkers_called(nb)
    if called and chosen not in called:
        raise NotebookError(f"{where}: it is {chosen!r}'s notebook, but its check cell calls "
                            f"{', '.join(sorted(exercises.EXERCISES[c].checker for c in called))}"
                            f": hand in the exercise's own notebook")
    titled = _titled(nb)
    if titled is not None and titled.name != chosen:
        raise NotebookError(f"{where}: it is {chosen!r}'s notebook by its metadata, file name "
                            f"or check cell, but its title is {titled.name!r}'s: hand in the "
                            f"exercise's own notebook")
    return exercises.EXERCISES[chosen]


def load_answer(path: str | os.PathLike, *, exercise: exercises.Exercise | None = None,
                quiet: bool = True) -> tuple[exercises.Exercise, Any]:
    """Runs the code cells before the check cell in this process; returns the exercise and
    the answer (for tests and trusted notebooks: a hand-in is graded by `grade_notebook`).

    Raises:
      NotebookError: not an exercise notebook, a cell raised, or the answer is missing.
    """
    nb = read_notebook(path)
    ex = exercise or exercise_of(path, nb)
    try:
        namespace = run_cells(code_cells(nb), Path(path).name, quiet=quiet)
    except CellError as exc:
        raise NotebookError(str(exc)) from exc.__cause__
    if ex.answer not in namespace:
        raise NotebookError(f"{shown(path)}: the notebook defines no {ex.answer!r} before its "
                            f"check cell; the answer to {ex.title} must keep that name")
    return ex, namespace[ex.answer]


def check_notebook(path: str | os.PathLike, *, show: bool = True) -> CheckResult:
    """Loads the answer of a notebook in this process and runs its checker, as its check
    cell does. A notebook that cannot be run gives a failed `CheckResult` that says why."""
    try:
        ex, answer = load_answer(path)
    except NotebookError as exc:
        nb_name = shown(Path(path).name)
        result = CheckResult(nb_name, False, f"{FAIL_MARK} {nb_name}: {exc}", 0)
        if show:
            print(result.message)
        return result
    return getattr(exercises, ex.checker)(answer, show=show)
