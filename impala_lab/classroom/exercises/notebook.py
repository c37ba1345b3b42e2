"""Check an exercise notebook file without Jupyter: for grading handed-in work, and for tests.

`load_answer` runs the notebook's code cells that come before its check cell (the cell tagged
``check``) in a fresh namespace, each compiled under the name ``<NOTEBOOK, code cell N>`` so
that a message can point at the cell, and returns the answer the exercise names.
`check_notebook` then calls the exercise's checker on it, in this process.

`grade_notebook` is what the grader uses for handed-in work::

    python -m impala_lab.classroom.exercises hand-ins/*/ex1_minibatch_buffer_get.ipynb

It runs the notebook and the answer in a child process of its own
(`impala_lab.classroom.exercises._grade`)
with a wall-time and a memory limit, in a process group that is killed afterwards, and
compares the answer's traces with the reference here, in the grader's process, where no
student code ran: a hand-in cannot hang the batch, poison the next hand-in, or reach the
expected values.

Lines starting with ``%`` or ``!`` (IPython magics and shell escapes) are skipped.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import linecache
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import impala_lab.classroom.exercises as exercises
from impala_lab.classroom.exercises._common import FAIL_MARK, CheckResult, locate
from impala_lab.classroom.exercises._spec import judge

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MB = 2048

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


def load_answer(path: str | os.PathLike, *, quiet: bool = True,
                on_cell: Callable[[int], None] | None = None) -> tuple[exercises.Exercise, Any]:
    """Runs the code cells before the check cell; returns the exercise and the answer.

    Args:
      path: the notebook.
      quiet: swallow what the cells print (the try-it cells' output).
      on_cell: called with a code cell's number before it runs (the grader's progress).

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
        text = "\n".join(lines) + "\n"
        # Registered so that tracebacks and `inspect` (the checkers' look at the code between
        # the markers) find the cell's source.
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        if on_cell is not None:
            on_cell(number)
        try:
            muted = contextlib.redirect_stdout(io.StringIO())
            with muted if quiet else contextlib.nullcontext():
                exec(compile(text, filename, "exec"), namespace)
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


def answer_label(ex: exercises.Exercise, answer: Any) -> str:
    """How the checker names the answer in its messages."""
    name = getattr(answer, "__name__", "the answer")
    return f"{name}.get" if ex.name == "minibatch_get" else name


def spec_of(ex: exercises.Exercise) -> Any:
    """The exercise's `Spec`: ``SPEC`` of its checker module, which has the exercise's name."""
    return importlib.import_module(f"impala_lab.classroom.exercises.{ex.name}").SPEC


class _TraceUnpickler(pickle.Unpickler):
    """Reads the child's traces: plain data, numpy arrays and the checkers' records only (a
    hand-in could write the file; nothing in it may run code here)."""

    ALLOWED = {
        ("builtins", n) for n in ("list", "tuple", "dict", "set", "frozenset", "str", "int",
                                  "float", "bool", "complex", "bytes", "bytearray")} | {
        (m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")
        for n in ("_reconstruct", "scalar")} | {
        (m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")} | {
        ("numpy", "ndarray"), ("numpy", "dtype")} | {
        ("impala_lab.classroom.exercises._common", n) for n in ("Mismatch", "_Verbatim")} | {
        ("impala_lab.classroom.exercises._guard", n) for n in ("Raised", "Opaque")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED and not (
                module == "numpy" and name.endswith("DType")) and not (
                module.startswith("numpy.dtypes")):
            raise pickle.UnpicklingError(f"{module}.{name} is not a trace's type")
        return super().find_class(module, name)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def grade_notebook(path: str | os.PathLike, *, timeout: float = DEFAULT_TIMEOUT_S,
                   memory_mb: int = DEFAULT_MEMORY_MB, show: bool = True) -> CheckResult:
    """Grades a hand-in in a child process with a wall-time and a memory limit.

    The child (`impala_lab.classroom.exercises._grade`) runs the notebook's cells and the answer on
    every case with the library's implementation trapped, and writes the answer's traces; this
    process computes the reference and compares. The child's whole process group is killed
    at the end, so nothing a hand-in started survives it.

    Args:
      path: the notebook.
      timeout: seconds the child may run (the notebook's cells and the answer together).
      memory_mb: the child's address-space limit (``RLIMIT_AS``), in MiB.
      show: print the message.

    Returns:
      The `CheckResult`: the checker's, or a failure that says why the hand-in could not be
      graded (a time-out or a memory error with a hint at the likely culprit, a cell that
      raised, a process that died).
    """
    nb_name = Path(path).name

    def fail(message: str) -> CheckResult:
        result = CheckResult(nb_name, False, f"{FAIL_MARK} {nb_name}: {message}", 0)
        if show:
            print(result.message)
        return result

    try:
        ex = exercise_of(path, read_notebook(path))
    except NotebookError as exc:
        return fail(str(exc))
    with tempfile.TemporaryDirectory(prefix="impala_lab_grade_") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "impala_lab.classroom.exercises._grade", os.fspath(path),
               os.fspath(out), str(int(memory_mb))]
        with open(out / "log", "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # the child, and whatever it started
                proc.wait()
        where = _read_text(out / "progress") or "the notebook"
        if timed_out:
            return fail(f"stopped after {timeout:g} s (the time limit) while running "
                        f"{where}\n  hint:     an endless loop? look at {ex.culprit}.")
        status = _read_text(out / "status")
        if status == "memory":
            return fail(f"ran out of memory (the limit is {memory_mb} MB) while running "
                        f"{where}\n  hint:     an endless loop that keeps growing a list? "
                        f"look at {ex.culprit}.")
        if status.startswith("error:"):
            return fail(status[len("error:"):].strip())
        try:
            with open(out / "answer.pkl", "rb") as fh:
                answer = _TraceUnpickler(fh).load()
            label, report = str(answer["label"])[:200], answer["report"]
        except Exception as exc:
            if isinstance(exc, pickle.UnpicklingError) and status == "done":
                return fail(f"the grading process's answer could not be read ({exc})")
            rc = proc.returncode
            how = (f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}")
            tail = _read_text(out / "log")[-800:]
            return fail(f"the grading process ended ({how}) while running {where}, without "
                        f"a result ({type(exc).__name__}); out of memory (the limit is "
                        f"{memory_mb} MB)? look at {ex.culprit}."
                        + (f"\n  its last output: {tail}" if tail else ""))
    from impala_lab.classroom.exercises._spec import AnswerReport

    return judge(spec_of(ex), label, AnswerReport(report["flagged"], report["traces"]),
                 show=show)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
