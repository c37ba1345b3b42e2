"""Check an exercise notebook file without Jupyter: for grading handed-in work, and for tests.

`load_answer` runs the notebook's code cells that come before its check cell (the cell tagged
``check``) in a fresh namespace, each compiled under the name ``<NOTEBOOK, code cell N>`` so
that a message can point at the cell, and returns the answer the exercise names.
`check_notebook` then calls the exercise's checker on it::

    python -m impala_lab.exercises hand-ins/alice/ex1_minibatch_buffer_get.ipynb

Lines starting with ``%`` or ``!`` (IPython magics and shell escapes) are skipped.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import impala_lab.exercises as exercises
from impala_lab.exercises._common import FAIL_MARK, CheckResult, locate

CHECK_TAG = "check"
STUDENT_TAG = "student"


class NotebookError(ValueError):
    """The file is not an exercise notebook, or one of its cells failed to run."""


def read_notebook(path: str | os.PathLike) -> dict[str, Any]:
    """The notebook's JSON (nbformat 4)."""
    try:
        with open(path, encoding="utf-8") as fh:
            nb = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise NotebookError(f"{path}: cannot read the notebook ({exc})") from None
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or "cells" not in nb:
        raise NotebookError(f"{path}: not a Jupyter notebook in nbformat 4")
    return nb


def source(cell: dict[str, Any]) -> str:
    """A cell's source as one string."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def tags(cell: dict[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def exercise_of(path: str | os.PathLike, nb: dict[str, Any]) -> exercises.Exercise:
    """The exercise a notebook belongs to: its metadata ``impala_lab.exercise``, else its
    file name."""
    name = nb.get("metadata", {}).get("impala_lab", {}).get("exercise")
    if name in exercises.EXERCISES:
        return exercises.EXERCISES[name]
    for ex in exercises.EXERCISES.values():
        if Path(path).name == ex.notebook:
            return ex
    known = ", ".join(e.notebook for e in exercises.EXERCISES.values())
    raise NotebookError(f"{path}: not an exercise notebook (no metadata impala_lab.exercise, "
                        f"and the file name is none of {known})")


def load_answer(path: str | os.PathLike, *,
                quiet: bool = True) -> tuple[exercises.Exercise, Any]:
    """Runs the code cells before the check cell; returns the exercise and the answer.

    Args:
      path: the notebook.
      quiet: swallow what the cells print (the try-it cells' output).

    Raises:
      NotebookError: not an exercise notebook, a cell raised, or the answer is missing.
    """
    nb = read_notebook(path)
    ex = exercise_of(path, nb)
    name = Path(path).name
    namespace: dict[str, Any] = {"__name__": "__exercise__"}
    number = 0
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        number += 1
        if CHECK_TAG in tags(cell):
            break
        lines = [ln for ln in source(cell).splitlines()
                 if not ln.lstrip().startswith(("%", "!"))]
        filename = f"<{name}, code cell {number}>"
        try:
            muted = contextlib.redirect_stdout(io.StringIO())
            with muted if quiet else contextlib.nullcontext():
                exec(compile("\n".join(lines) + "\n", filename, "exec"), namespace)
        except Exception as exc:
            where = locate(exc) or f"code cell {number} of {name}"
            raise NotebookError(f"{type(exc).__name__}: {exc} (at {where})") from exc
    if ex.answer not in namespace:
        raise NotebookError(f"{path}: the notebook defines no {ex.answer!r} before its check "
                            f"cell; the answer to {ex.title} must keep that name")
    return ex, namespace[ex.answer]


def check_notebook(path: str | os.PathLike, *, show: bool = True) -> CheckResult:
    """Loads the answer of an exercise notebook and runs its checker.

    A notebook that cannot be run gives a failed `CheckResult` that says why (not an
    exception), so that a batch of hand-ins can be graded in one go.
    """
    try:
        ex, answer = load_answer(path)
    except NotebookError as exc:
        nb_name = Path(path).name
        result = CheckResult(nb_name, False, f"{FAIL_MARK} {nb_name}: {exc}", 0)
        if show:
            print(result.message)
        return result
    checker = getattr(exercises, ex.checker)
    return checker(answer, show=show)
