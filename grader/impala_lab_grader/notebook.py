"""Check an exercise notebook file without Jupyter: for grading handed-in work, and for tests.

`load_answer` runs the notebook's code cells that come before its check cell (the cell tagged
``check``) in a fresh namespace, each compiled under the name ``<NOTEBOOK, code cell N>`` so
that a message can point at the cell, and returns the answer the exercise names.
`check_notebook` then calls the exercise's checker on it, in this process.

`grade_notebook` is what the grader uses for handed-in work::

    python -m impala_lab.classroom.exercises hand-ins/*/ex1_minibatch_buffer_get.ipynb

It runs the notebook and the answer in a sandbox (`impala_lab.classroom.exercises._sandbox`:
bubblewrap where it can, a plain child process otherwise), against a student build of
impala_lab in which the exercise's implementations are absent
(`impala_lab.classroom.exercises._student_build`), with limits on time, memory, processes and
file size; the child (`impala_lab.classroom.exercises._grade`) sends the answer's traces back as
data (`impala_lab.classroom.exercises._wire`), and this process computes the reference and
compares: a hand-in cannot hang the batch, harm another hand-in, or reach the expected values.
The exercise comes from the notebook's metadata, file name and check cell together
(`exercise_of`); hand-in files are read without following links and with a size cap
(`read_bytes`).

Lines starting with ``%`` or ``!`` (IPython magics and shell escapes) are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import linecache
import os
import re
import secrets
import signal
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import impala_lab.classroom.exercises as exercises
from impala_lab.classroom.exercises import _sandbox
from impala_lab.classroom.exercises._common import FAIL_MARK, PASS_MARK, CheckResult, locate
from impala_lab.classroom.exercises._guard import ReferenceCalled
from impala_lab.classroom.exercises._spec import AnswerReport, all_cases, judge
from impala_lab.classroom.exercises._student_build import build_for
from impala_lab.classroom.exercises._wire import WireError, from_data

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MB = 2048
MAX_NOTEBOOK_BYTES = 32 * 2**20

CHECK_TAG = "check"
STUDENT_TAG = "student"


class NotebookError(ValueError):
    """The file is not an exercise notebook, or one of its cells failed to run."""


def read_bytes(path: str | os.PathLike, cap: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """A regular file's bytes, at most `cap` of them: a link, a FIFO, a device or a file
    larger than `cap` is refused (`NotebookError`), and nothing here blocks on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise NotebookError(f"{path}: cannot read the notebook ({exc.strerror or exc}; "
                            f"links are not followed)") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotebookError(f"{path}: not a regular file")
        if info.st_size > cap:
            raise NotebookError(f"{path}: {info.st_size} bytes; a notebook may have "
                                f"{cap // 2**20} MiB at most")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise NotebookError(f"{path}: more than {cap // 2**20} MiB")
    return data


def parse_notebook(data: bytes, path: str | os.PathLike) -> dict[str, Any]:
    """The notebook's JSON (nbformat 4) from its bytes."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotebookError(f"{path}: cannot read the notebook ({str(exc)[:200]})") from None
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(
            nb.get("cells"), list) or not all(isinstance(c, dict) for c in nb["cells"]):
        raise NotebookError(f"{path}: not a Jupyter notebook in nbformat 4")
    return nb


def read_notebook(path: str | os.PathLike) -> dict[str, Any]:
    """The notebook's JSON (nbformat 4), read as `read_bytes` reads."""
    return parse_notebook(read_bytes(path), path)


def source(cell: dict[str, Any]) -> str:
    """A cell's source as one string."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def tags(cell: dict[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _checkers_called(nb: dict[str, Any]) -> set[str]:
    """The exercises whose checker the notebook's check cell calls (any code cell, when
    none is tagged ``check``)."""
    cells = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    checks = [c for c in cells if CHECK_TAG in tags(c)] or cells
    text = "".join(source(c) for c in checks)
    return {e.name for e in exercises.EXERCISES.values()
            if re.search(rf"\b{e.checker}\b", text)}


def exercise_of(path: str | os.PathLike, nb: dict[str, Any]) -> exercises.Exercise:
    """The exercise a notebook belongs to, from its file and its content together: the
    metadata ``impala_lab.exercise``, the file name and the checker its check cell calls
    must not disagree (a file renamed by a student still counts, by its metadata).

    Raises:
      NotebookError: no exercise found, or two of them name different exercises.
    """
    meta = nb.get("metadata", {})
    name = meta.get("impala_lab", {}).get("exercise") if isinstance(meta, dict) and \
        isinstance(meta.get("impala_lab"), dict) else None
    by_file = next((e.name for e in exercises.EXERCISES.values()
                    if Path(path).name == e.notebook), None)
    if name is not None and name not in exercises.EXERCISES:
        raise NotebookError(f"{path}: its metadata names {str(name)[:60]!r}, which is no "
                            f"exercise")
    if name is not None and by_file is not None and name != by_file:
        raise NotebookError(f"{path}: its metadata says exercise {name!r} but its file is "
                            f"{by_file!r}'s notebook: hand in the exercise's own notebook")
    chosen = name or by_file
    if chosen is None:
        known = ", ".join(e.notebook for e in exercises.EXERCISES.values())
        raise NotebookError(f"{path}: not an exercise notebook (no metadata impala_lab."
                            f"exercise, and the file name is none of {known})")
    called = _checkers_called(nb)
    if called and chosen not in called:
        raise NotebookError(f"{path}: it is {chosen!r}'s notebook, but its check cell calls "
                            f"{', '.join(sorted(exercises.EXERCISES[c].checker for c in called))}"
                            f": hand in the exercise's own notebook")
    return exercises.EXERCISES[chosen]


def load_answer(path: str | os.PathLike, *, exercise: exercises.Exercise | None = None,
                quiet: bool = True,
                on_cell: Callable[[int], None] | None = None) -> tuple[exercises.Exercise, Any]:
    """Runs the code cells before the check cell; returns the exercise and the answer.

    Args:
      path: the notebook.
      exercise: the exercise it belongs to (default: `exercise_of` it).
      quiet: swallow what the cells print (the try-it cells' output).
      on_cell: called with a code cell's number before it runs (the grader's progress).

    Raises:
      NotebookError: not an exercise notebook, a cell raised, or the answer is missing.
    """
    nb = read_notebook(path)
    ex = exercise or exercise_of(path, nb)
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
        except ReferenceCalled:
            # A try-it cell that shows the library's result: the grader's student build has
            # no such result, so the rest of this cell is skipped (the answer is checked
            # against the reference in the grader's own process).
            continue
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
    """The exercise's `Spec`: ``SPEC`` of its checker module, which has the exercise's name
    (a challenge's: ``SPECS[name]`` of `impala_lab.classroom.exercises.challenges`)."""
    if ex.base:
        return importlib.import_module("impala_lab.classroom.exercises.challenges").SPECS[
            ex.name]
    return importlib.import_module(f"impala_lab.classroom.exercises.{ex.name}").SPEC


def fresh_seed() -> int:
    """A seed for the drawn cases of one grading (printed, so that it can be repeated)."""
    return secrets.randbelow(10**6)


def _fail(nb_name: str, message: str, show: bool) -> CheckResult:
    result = CheckResult(nb_name, False, f"{FAIL_MARK} {nb_name}: {message}", 0)
    if show:
        print(result.message)
    return result


def _private_copy(data: bytes, name: str, tmp: Path) -> Path:
    """The hand-in's bytes (as the grader read them) in a folder of their own, readable by
    the sandbox's user and by nobody's hand-in but this one."""
    folder = tmp / "handin"
    folder.mkdir()
    target = folder / (re.sub(r"[^\w.\-()]", "_", name)[:120] or "handin.ipynb")
    target.write_bytes(data)
    os.chmod(tmp, 0o755)
    os.chmod(folder, 0o755)
    os.chmod(target, 0o644)
    return target


_BOOT = ("import sys; sys.path[:] = [sys.argv[1]] + [p for p in sys.path if p not in ('', '.')]"
         "; from impala_lab.classroom.exercises._grade import main; sys.exit(main(sys.argv[2:]))")


def child_command(mode: str, ex: exercises.Exercise, handin: Path, limits: _sandbox.Limits,
                  seed: int) -> list[str]:
    """The grading child's command line (its last argument is the result pipe's fd, filled
    in by `_sandbox.run`)."""
    build = build_for(ex.name)
    args = [str(limits.memory_mb), str(limits.processes), str(limits.cpu_seconds), str(seed),
            "FD"]
    if mode == "bwrap":
        inside = f"{_sandbox.INSIDE_HANDIN}/{handin.name}"
        return [*_sandbox.bwrap_args(build, handin, limits), sys.executable, "-E", "-s", "-B",
                "-c", _BOOT, _sandbox.INSIDE_BUILD, ex.name, inside, *args]
    return [sys.executable, "-E", "-s", "-B", "-c", _BOOT, str(build), ex.name, str(handin),
            *args]


def grade_notebook(path: str | os.PathLike, *, timeout: float = DEFAULT_TIMEOUT_S,
                   memory_mb: int = DEFAULT_MEMORY_MB, seed: int | None = None,
                   show: bool = True) -> CheckResult:
    """Grades a hand-in in a sandbox (`impala_lab.classroom.exercises._sandbox`).

    The child (`impala_lab.classroom.exercises._grade`) runs the notebook's cells and the
    answer on every case, the fixed ones and a few drawn from `seed`, against a student build
    of `impala_lab` without the exercise's implementations, and sends the answer's traces as
    data; this process computes the reference and compares. Nothing the hand-in started
    outlives its grading.

    Args:
      path: the notebook.
      timeout: seconds the child may run (the notebook's cells and the answer together).
      memory_mb: memory the hand-in may use, in MiB: each process's address space, and the
        resident memory of all its processes together.
      seed: the seed of the drawn cases (default: a fresh one).
      show: print the message.

    Returns:
      The `CheckResult`: the comparison's, or a failure that says why the hand-in could not
      be graded (a time-out or a memory error with a hint at the likely culprit, a cell that
      raised, a process that died, a result that is not a trace).
    """
    nb_name = Path(path).name
    try:
        data = read_bytes(path)
        ex = exercise_of(path, parse_notebook(data, path))
        mode, _ = _sandbox.choose_mode()
    except (NotebookError, RuntimeError) as exc:
        return _fail(nb_name, str(exc), show)
    seed = fresh_seed() if seed is None else seed
    limits = _sandbox.Limits(timeout, memory_mb)
    try:
        with tempfile.TemporaryDirectory(prefix="impala_lab_grade_") as tmp:
            handin = _private_copy(data, nb_name, Path(tmp))
            outcome = _sandbox.run(child_command(mode, ex, handin, limits, seed), limits,
                                   cwd=tmp, env=_sandbox.child_env(),
                                   subreaper=mode != "bwrap")
        result = _verdict(ex, nb_name, outcome, limits, seed, show=False)
    except Exception as exc:  # the grader's own slip on this hand-in: the batch goes on
        result = _fail(nb_name, f"could not be graded: {type(exc).__name__}: {exc}", False)
    result = dataclasses.replace(result, message=clean(result.message))
    if show:
        print(result.message)
    return result


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_OWN_LINES = (PASS_MARK, FAIL_MARK, "==", "sandbox:", "seed:")


def clean(message: str) -> str:
    """A message that holds text from a hand-in (its label, an error it raised) as the
    grader prints it: no control characters (no escape sequences, no carriage returns), and
    no line after the first that reads like one of the grader's own (a pass line, a new
    hand-in's header), so that the output cannot be forged."""
    lines = _CONTROL.sub("?", message).split("\n")
    return "\n".join(lines[:1] + ["  | " + ln if ln.lstrip().startswith(_OWN_LINES) else ln
                                   for ln in lines[1:]])


def _messages(outcome: _sandbox.Outcome) -> tuple[str, dict[str, Any] | None]:
    """The last progress the child reported, and its final message (or None)."""
    where, final = "", None
    for line in outcome.lines or []:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(message, dict) or len(message) != 1:
            continue
        if isinstance(message.get("progress"), str):
            where = message["progress"][:300]
        elif final is None and ({"result", "memory", "error"} & message.keys()):
            final = message
    return where or "the notebook", final


def _verdict(ex: exercises.Exercise, nb_name: str, outcome: _sandbox.Outcome,
             limits: _sandbox.Limits, seed: int, show: bool) -> CheckResult:
    where, final = _messages(outcome)
    memory = (f"ran out of memory (the limit is {limits.memory_mb} MB) while running {where}"
              f"\n  hint:     an endless loop that keeps growing a list? look at {ex.culprit}.")
    if outcome.stopped == "time":
        return _fail(nb_name, f"stopped after {limits.timeout:g} s (the time limit) while "
                     f"running {where}\n  hint:     an endless loop? look at {ex.culprit}.",
                     show)
    if outcome.stopped == "memory" or (final is not None and "memory" in final):
        return _fail(nb_name, memory, show)
    if outcome.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return _fail(nb_name, f"used more than {limits.cpu_seconds} s of CPU time (the limit) "
                     f"while running {where}\n  hint:     an endless loop? look at "
                     f"{ex.culprit}.", show)
    if outcome.stopped == "processes":
        return _fail(nb_name, f"started more than {limits.processes} processes or threads "
                     f"while running {where}: a hand-in runs in one process", show)
    if outcome.lines is None:
        return _fail(nb_name, f"sent more than {_sandbox.RESULT_CAP // 2**20} MiB of results "
                     f"while running {where}", show)
    if final is not None and "error" in final:
        return _fail(nb_name, str(final["error"])[:3000], show)
    if final is None:
        rc = outcome.returncode
        how = (f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}")
        tail = outcome.log.strip()[-800:]
        return _fail(nb_name, f"the grading process ended ({how}) while running {where}, "
                     f"without a result; out of memory (the limit is {limits.memory_mb} MB)? "
                     f"look at {ex.culprit}." + (f"\n  its last output: {tail}" if tail else ""),
                     show)
    return _judge_result(ex, nb_name, final["result"], seed, show)


def _judge_result(ex: exercises.Exercise, nb_name: str, result: Any, seed: int,
                  show: bool) -> CheckResult:
    try:
        if not isinstance(result, dict) or set(result) != {"label", "flagged", "traces"}:
            raise WireError("the result needs exactly label, flagged and traces")
        label, flagged = result["label"], result["flagged"]
        traces = from_data(result["traces"])
        if not isinstance(label, str) or not (flagged is None or isinstance(flagged, str)) \
                or not isinstance(traces, list):
            raise WireError("label, flagged or traces of the wrong type")
    except (WireError, TypeError, ValueError) as exc:
        return _fail(nb_name, f"the grading process's result is not a trace ({exc}): the "
                     f"hand-in must not write to the grader's pipe", show)
    spec = spec_of(ex)
    return judge(spec, label[:200], AnswerReport(flagged and flagged[:2000], traces),
                 cases=all_cases(spec, seed), show=show)
