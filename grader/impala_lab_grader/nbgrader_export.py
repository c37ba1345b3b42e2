"""nbgrader source notebooks built from the exercise solutions.

    python -m impala_lab_grader export --nbgrader COURSE_DIR

writes one nbgrader *source* notebook per exercise, where ``nbgrader generate_assignment``
looks for them::

    COURSE_DIR/source/ex1_minibatch_buffer_get/ex1_minibatch_buffer_get.ipynb
    ...
    COURSE_DIR/source/ex5_vtrace_loss/ex5_vtrace_loss.ipynb

(each exercise its own assignment; ``--assignment NAME`` puts them all in one), and a starter
``COURSE_DIR/nbgrader_config.py`` when there is none. Each notebook is the solution notebook
with the metadata nbgrader reads (``metadata.nbgrader``, schema 3):

- the student's cell is an *autograded answer* cell (``solution``), its code between the
  exercise markers wrapped in ``### BEGIN SOLUTION`` / ``### END SOLUTION``; the markers stay
  outside the region, so the student version still has them and
  ``python -m impala_lab_grader`` grades it like any hand-in;
- the check cell is an *autograder test* cell (``grade``, locked, worth ``points``): the
  notebook's own check cell, which calls the exercise's checker from
  `impala_lab.classroom.exercises`,
  then an assertion that raises ``AssertionError`` with the checker's message when the check
  fails;
- markdown, the set-up cells before the student's cell and the cells after the check are
  read-only (``locked``: nbgrader puts their source back before it grades); the try-it cells
  between the answer and the check stay editable.

Cell tags and the notebook's ``impala_lab`` metadata are kept. Only the standard library is
used (no nbformat), as in `impala_lab_grader.notebook`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import impala_lab.classroom.exercises as exercises
from impala_lab.classroom.course import NoSolutionsError, course_files, course_root
from impala_lab.classroom.exercises._common import MARK_END, MARK_START
from impala_lab_grader.notebook import (
    CHECK_TAG,
    STUDENT_TAG,
    read_notebook,
    source,
    tags,
)

SCHEMA_VERSION = 3
BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
CONFIG_NAME = "nbgrader_config.py"

# A starter config: nbgrader reads nbgrader_config.py from the directory it runs in.
CONFIG_TEXT = '''\
"""nbgrader settings for the impala_lab exercises (written by
`python -m impala_lab_grader export --nbgrader`; edit freely, it is not
overwritten)."""

c = get_config()  # noqa: F821 (nbgrader defines it)

c.CourseDirectory.course_id = "impala_lab"
# Per cell. Exercise 5 imports TensorFlow (several seconds), and exercise 4's last cell
# trains CartPole for a moment once the check passes.
c.Execute.timeout = 300
# The kernel that runs the notebooks must import impala_lab. By default it is the one the
# notebooks name ("python3"); name another one here if that is not this environment's:
# c.Execute.kernel_name = "python3"
'''


class ExportError(ValueError):
    """A solution notebook cannot be turned into an nbgrader source notebook."""


def _lines(text: str) -> list[str]:
    """Notebook JSON's multi-line form: every line but the last ends with a newline."""
    return text.splitlines(keepends=True)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def wrap_solution(code: str) -> str:
    """The student's cell with its code between the markers wrapped in nbgrader's solution
    delimiters, each at its marker's indentation.

    Raises:
      ExportError: the cell has not exactly one start and one end marker, in that order.
    """
    lines = code.split("\n")
    starts = [i for i, ln in enumerate(lines) if ln.strip() == MARK_START]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == MARK_END]
    if len(starts) != 1 or len(ends) != 1 or starts[0] > ends[0]:
        raise ExportError(f"the student's cell needs the exercise markers: one {MARK_START!r} "
                          f"line, then one {MARK_END!r} line")
    start, end = starts[0], ends[0]
    if any(BEGIN_SOLUTION in ln or END_SOLUTION in ln for ln in lines):
        raise ExportError("the student's cell already has nbgrader solution delimiters")
    return "\n".join([*lines[: start + 1], _indent(lines[start]) + BEGIN_SOLUTION,
                      *lines[start + 1: end], _indent(lines[end]) + END_SOLUTION,
                      *lines[end:]])


def autograder_cell_source(ex: exercises.Exercise, check: str) -> str:
    """The autograder test cell: the notebook's check cell `check`, as it is, then an
    assertion that raises with the checker's message unless every case passed.

    Raises:
      ExportError: `check` does not bind the checker's result to ``result``.
    """
    if not re.search(rf"^result = {ex.checker}\(", check, re.MULTILINE):
        raise ExportError(f"{ex.notebook}: the check cell must bind `result = "
                          f"{ex.checker}(...)`, the line the test cell asserts on")
    return ("# nbgrader grades this cell: it prints the check's verdict, and raises\n"
            "# AssertionError with it unless every case passes.\n"
            f"{check.rstrip()}\n"
            "assert result.passed, result.message")


def _nbgrader_meta(grade_id: str, *, solution: bool = False, grade: bool = False,
                   locked: bool = False, points: float | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"grade": grade, "grade_id": grade_id, "locked": locked,
                            "schema_version": SCHEMA_VERSION, "solution": solution,
                            "task": False}
    if grade:
        meta["points"] = points
    return meta


def source_notebook(ex: exercises.Exercise, solution: dict[str, Any], *,
                    points: float = 1) -> dict[str, Any]:
    """The nbgrader source notebook of exercise `ex`, from its solution notebook's JSON.

    Args:
      ex: the exercise.
      solution: the solution notebook (nbformat 4 JSON); not changed.
      points: what the test cell is worth.

    Raises:
      ExportError: the notebook has not one student cell (tagged ``student``) followed by
        one check cell (tagged ``check``).
    """
    if points <= 0:
        raise ExportError(f"points must be positive, got {points}")
    nb = copy.deepcopy(solution)
    cells = nb["cells"]
    student = [i for i, c in enumerate(cells) if STUDENT_TAG in tags(c)]
    check = [i for i, c in enumerate(cells) if CHECK_TAG in tags(c)]
    if len(student) != 1 or len(check) != 1 or student[0] > check[0]:
        raise ExportError(f"{ex.notebook}: needs one code cell tagged {STUDENT_TAG!r} and, "
                          f"after it, one tagged {CHECK_TAG!r}; found {len(student)} and "
                          f"{len(check)}")
    s, k = student[0], check[0]
    for i, cell in enumerate(cells):
        meta = cell.setdefault("metadata", {})
        meta.pop("nbgrader", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            meta.pop("execution", None)
        if i == s:
            cell["source"] = _lines(wrap_solution(source(cell)))
            meta["nbgrader"] = _nbgrader_meta(f"{ex.name}_answer", solution=True)
        elif i == k:
            cell["source"] = _lines(autograder_cell_source(ex, source(cell)))
            meta["nbgrader"] = _nbgrader_meta(f"{ex.name}_check", grade=True, locked=True,
                                              points=points)
        elif cell.get("cell_type") != "code" or i < s or i > k:
            meta["nbgrader"] = _nbgrader_meta(f"{ex.name}_cell_{i:02d}", locked=True)
    nb.setdefault("metadata", {}).setdefault("impala_lab", {})["exercise"] = ex.name
    return nb


def export_nbgrader(course_dir: str | os.PathLike, *,
                    names: Iterable[str] | None = None, assignment: str | None = None,
                    points: float = 1, force: bool = False) -> list[Path]:
    """Writes the nbgrader source notebooks (and a starter config) into `course_dir`.

    Args:
      course_dir: the nbgrader course directory (created if missing).
      names: the exercises (names from `EXERCISES`, e.g. ``"minibatch_get"``); all by default.
      assignment: put every notebook in this one assignment; by default each exercise is
        its own assignment, named after its notebook (``ex1_minibatch_buffer_get``).
      points: what each exercise's test cell is worth.
      force: overwrite source notebooks already there.

    Returns:
      The notebooks written, then ``nbgrader_config.py`` if it was written (an existing one
      is left alone).

    Raises:
      ExportError: an unknown exercise, a bad assignment name, or a solution notebook that
        cannot be exported.
      FileExistsError: a source notebook is already there and `force` is False; nothing
        was written.
    """
    chosen = list(exercises.EXERCISES) if names is None else list(names)
    unknown = [n for n in chosen if n not in exercises.EXERCISES]
    if unknown:
        raise ExportError(f"no exercise {unknown}; the exercises are "
                          f"{', '.join(exercises.EXERCISES)}")
    if assignment is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", assignment):
        raise ExportError(f"assignment name {assignment!r}: use letters, digits, _ . - only")
    course = Path(course_dir)
    try:
        course_files(solutions=True)
    except NoSolutionsError as exc:  # a student's wheel: the export needs the solutions
        raise ExportError(str(exc)) from None
    solutions = course_root() / "solutions"
    planned: list[tuple[Path, dict[str, Any]]] = []
    for name in chosen:
        ex = exercises.EXERCISES[name]
        nb = source_notebook(ex, read_notebook(solutions / ex.notebook), points=points)
        folder = assignment or Path(ex.notebook).stem
        planned.append((course / "source" / folder / ex.notebook, nb))
    existing = [str(p) for p, _ in planned if p.exists()]
    if existing and not force:
        raise FileExistsError(f"already there (--force overwrites): {', '.join(existing)}")
    written = []
    for path, nb in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    config = course / CONFIG_NAME
    if not config.exists():
        config.write_text(CONFIG_TEXT, encoding="utf-8")
        written.append(config)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m impala_lab_grader export --nbgrader DIR``; exit status 0, 1 on
    error."""
    parser = argparse.ArgumentParser(
        prog="python -m impala_lab_grader export",
        description="Write nbgrader source notebooks (solution regions, autograder test "
                    "cells that call the same checkers) built from the exercise solutions.")
    parser.add_argument("--nbgrader", required=True, type=Path, metavar="DIR",
                        help="the nbgrader course directory; notebooks go to DIR/source/")
    parser.add_argument("--assignment", metavar="NAME",
                        help="one assignment with every exercise (default: one per exercise)")
    parser.add_argument("--exercise", action="append", dest="names", metavar="NAME",
                        choices=list(exercises.EXERCISES),
                        help="export only this exercise (repeat for more; default: all)")
    parser.add_argument("--points", type=float, default=1,
                        help="points of each exercise's test cell (default 1)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite source notebooks already there")
    args = parser.parse_args(argv)
    try:
        written = export_nbgrader(args.nbgrader, names=args.names, assignment=args.assignment,
                                  points=args.points, force=args.force)
    except (ExportError, FileExistsError) as exc:
        print(f"error: {exc}")
        return 1
    for path in written:
        print(path)
    return 0
