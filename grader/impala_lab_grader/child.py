"""The grading child: runs one hand-in's cells and then its answer on every case.

Started by `impala_lab_grader.grade` through `impala_lab_grader.sandbox`, one per hand-in,
with the student build of `impala_lab` first on its path: the implementations the exercise
asks for are absent there, so nothing here can compute an expected value. ``main(argv)``
takes::

    EXERCISE CELLS MEMORY_MB PROCESSES CPU_SECONDS SEED RESULT_FD

CELLS is a JSON file the grader wrote: the notebook's name and the code of the cells before
its check cell, exactly as the grader read and checked them; this process runs that code and
nothing else of the notebook. It sets its own limits before any of it runs (address space,
CPU time, file size, process count, no core files), runs the cells (`run_cells`), then the
answer on every case (`impala_lab.classroom.exercises._spec.answer_traces`), and writes frames
to RESULT_FD (`impala_lab_grader.channel`): progress before each cell and case, then the
answer's traces, or ``{"memory": true}``, ``{"processes": true}`` (a cell could not start a
process or thread), or the error of a cell. Nothing it writes decides a
verdict: the grader has checked the code before this started, and computes the reference and
the comparison in its own process.

This module runs inside the sandbox: it imports the standard library, numpy, the student
build and `impala_lab_grader.channel` only.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import json
import linecache
import os
import random
import resource
import sys
from collections.abc import Callable
from typing import Any

FILE_BYTES = 64 * 2**20

# The absent implementations something called (the student build's bodies note them here,
# from whatever thread), so that a failure can say why.
ABSENT: list[str] = []


def absent(name: str) -> Exception:
    """What a student build's stripped body raises: the library's `name`, which the sandbox
    does not have (noted in `ABSENT`)."""
    from impala_lab.classroom.exercises._guard import ReferenceCalled

    ABSENT.append(name)
    return ReferenceCalled(name)


class CellError(Exception):
    """A cell raised (the message says what, and where in the student's code)."""


def run_cells(cells: list[tuple[int, str]], name: str, *, quiet: bool = True,
              on_cell: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Runs the cells' code in a fresh namespace and returns it.

    Each cell is compiled under the name ``<NAME, code cell N>`` (registered with
    `linecache`, so that tracebacks and the checkers' messages show its line). A cell that
    reaches an implementation the student build does not have (a try-it cell that prints the
    library's result) stops there; the next cell runs.

    Args:
      cells: (code cell number, code) of each cell, in order.
      name: the notebook's file name.
      quiet: swallow what the cells print.
      on_cell: called with a cell's number before it runs (the grader's progress).

    Raises:
      CellError: a cell raised.
      MemoryError: a cell ran out of memory.
    """
    from impala_lab.classroom.exercises._common import locate
    from impala_lab.classroom.exercises._guard import ReferenceCalled

    namespace: dict[str, Any] = {"__name__": "__exercise__"}
    for number, text in cells:
        filename = f"<{name}, code cell {number}>"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        if on_cell is not None:
            on_cell(number)
        try:
            muted = contextlib.redirect_stdout(io.StringIO())
            with muted if quiet else contextlib.nullcontext():
                exec(compile(text, filename, "exec"), namespace)
        except ReferenceCalled:
            continue
        except MemoryError:
            raise
        except (Exception, SystemExit) as exc:  # a cell's exit() ends that cell, not the run
            where = locate(exc) or f"code cell {number} of {name}"
            raise CellError(f"{type(exc).__name__}: {exc} (at {where})") from exc
    return namespace


def spec_of(exercise: Any) -> Any:
    """The exercise's `Spec`: ``SPEC`` of its checker module, which has the exercise's name
    (a challenge's: ``SPECS[name]`` of `impala_lab.classroom.exercises.challenges`)."""
    if exercise.base:
        return importlib.import_module("impala_lab.classroom.exercises.challenges").SPECS[
            exercise.name]
    return importlib.import_module(f"impala_lab.classroom.exercises.{exercise.name}").SPEC


DRAWN = 2  # fresh cases per grading


def all_cases(spec: Any, seed: int) -> list[Any]:
    """The spec's fixed cases, then `DRAWN` cases drawn from `seed`."""
    cases = spec.cases()
    rng = random.Random(f"{spec.exercise}:{seed}")
    for k in range(DRAWN if spec.draw is not None else 0):
        case = spec.draw(rng)
        case.description += f" [drawn at random: grading seed {seed}, draw {k + 1}]"
        cases.append(case)
    return cases


def _limit(memory_mb: int, processes: int, cpu_s: int) -> None:
    # CPU: SIGXCPU at the limit (its message), SIGKILL five seconds of CPU later
    for what, soft, hard in ((resource.RLIMIT_AS, memory_mb * 2**20, memory_mb * 2**20),
                             (resource.RLIMIT_CPU, cpu_s, cpu_s + 5),
                             (resource.RLIMIT_FSIZE, FILE_BYTES, FILE_BYTES),
                             (resource.RLIMIT_CORE, 0, 0),
                             (resource.RLIMIT_NPROC, processes, processes)):
        try:
            resource.setrlimit(what, (soft, hard))
        except (ValueError, OSError) as exc:  # a platform that refuses one: the rest stay
            print(f"limit {what} not set: {exc}", file=sys.stderr)


def _out_of_tasks(exc: BaseException | None) -> bool:
    """Whether a process or a thread could not start: the task limit (RLIMIT_NPROC) hit."""
    return (isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN) or (
        isinstance(exc, RuntimeError) and "can't start new thread" in str(exc))


def _run(exercise: str, cells_path: str, seed: int, fd: int) -> None:
    from impala_lab.classroom.exercises import EXERCISES
    from impala_lab.classroom.exercises._spec import answer_traces
    from impala_lab_grader.channel import encode, send

    ex = EXERCISES[exercise]
    spec = spec_of(ex)  # taken before any cell runs: what a cell replaces later is not used
    cases = all_cases(spec, seed)
    with open(cells_path, encoding="utf-8") as fh:
        payload = json.load(fh)
    name, cells = payload["notebook"], [(int(n), str(t)) for n, t in payload["cells"]]
    try:
        namespace = run_cells(cells, name, on_cell=lambda n: send(
            fd, {"progress": f"code cell {n} of {name}"}))
    except CellError as exc:
        if _out_of_tasks(exc.__cause__):
            send(fd, {"processes": True})
        else:
            send(fd, {"error": str(exc)})
        return
    if ex.answer not in namespace:
        send(fd, {"error": f"the notebook defines no {ex.answer!r} before its check cell; "
                           f"the answer to {ex.title} must keep that name"})
        return
    ABSENT.clear()  # the try-it cells may show the library's results: not the answer's doing
    traces = answer_traces(spec, namespace[ex.answer], cases, on_case=lambda n: send(
        fd, {"progress": f"case {n} of {len(cases)} of the check of {name}"}))
    send(fd, {"result": {"traces": encode(traces), "absent": ABSENT[:5]}})


def main(argv: list[str]) -> None:
    """Grades one hand-in (see the module docstring), then ends this process at once: no
    thread or exit handler of the hand-in's runs after its answer was sent."""
    from impala_lab_grader.channel import send

    exercise, cells_path, memory_mb, processes, cpu_s, seed, fd = argv[:7]
    _limit(int(memory_mb), int(processes), int(cpu_s))
    try:
        _run(exercise, cells_path, int(seed), int(fd))
    except MemoryError:
        send(int(fd), {"memory": True})
    except Exception as exc:  # the grader's own failure, or a hand-in that broke it
        send(int(fd), {"error": f"the grading process failed: {type(exc).__name__}: {exc}"})
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
