"""The grading child: runs one hand-in's notebook and its answer on every case.

Started by `impala_lab.classroom.exercises.notebook.grade_notebook` (through
`impala_lab.classroom.exercises._sandbox`), one per hand-in, with the student build of
`impala_lab` first on its path: the implementations the exercise asks for are absent there, so
nothing here can compute an expected value. ``main(argv)`` takes::

    EXERCISE NOTEBOOK MEMORY_MB PROCESSES CPU_SECONDS SEED RESULT_FD

It sets its own limits before any student code runs (address space, CPU time, file size,
process count, no core files), runs the notebook's cells and then the answer
(`impala_lab.classroom.exercises._spec.run_answer`), and writes JSON lines to RESULT_FD:
``{"progress": ...}`` before each cell and case (for a time-out's message), then one of
``{"result": {"label", "flagged", "traces"}}`` (the traces as `_wire` data),
``{"memory": true}`` or ``{"error": ...}``. The grader computes the reference and the verdict;
nothing written here is trusted beyond being data.

It also notes a hand-in that changed the library's or the checkers' code (in the fallback
mode, where the real library is what a cell could reach).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import types
from pathlib import Path
from typing import IO, Any

FILE_BYTES = 64 * 2**20


def _snapshot() -> dict[str, int]:
    """The identity of every function, class and code object of the loaded impala_lab
    modules: a cell that swaps one of them shows up as a changed entry."""
    seen: dict[str, int] = {}
    for modname, module in list(sys.modules.items()):
        if not modname.startswith("impala_lab"):
            continue
        seen[modname] = id(module)
        for name, value in list(vars(module).items()):
            key = f"{modname}.{name}"
            if isinstance(value, types.FunctionType):
                seen[key] = id(value)
                seen[key + ".__code__"] = id(value.__code__)
            elif isinstance(value, type) and value.__module__ == modname:
                seen[key] = id(value)
                for attr, member in list(vars(value).items()):
                    member = getattr(member, "__func__", member)
                    if isinstance(member, types.FunctionType):
                        seen[f"{key}.{attr}"] = id(member)
                        seen[f"{key}.{attr}.__code__"] = id(member.__code__)
    return seen


def _changed(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(k for k, v in before.items() if after.get(k, v) != v)


def _reference_raised(traces: list[Any]) -> bool:
    """Whether a trace ends in the answer's call of a library function (its own message)."""
    from impala_lab.classroom.exercises._guard import Raised

    last = [t[-1] if isinstance(t, list) and t else t for t in traces]
    return any(isinstance(t, Raised) and t.reference for t in last)


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


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message, separators=(",", ":")) + "\n")
    out.flush()


def _run(exercise: str, path: str, seed: int, out: IO[str]) -> None:
    from impala_lab.classroom.exercises import EXERCISES, _guard
    from impala_lab.classroom.exercises._spec import all_cases, run_answer
    from impala_lab.classroom.exercises._wire import encode
    from impala_lab.classroom.exercises.notebook import (
        NotebookError,
        answer_label,
        load_answer,
        spec_of,
    )

    ex = EXERCISES[exercise]
    spec = spec_of(ex)  # taken before any cell runs: what a cell replaces later is not used
    cases = all_cases(spec, seed)
    name = Path(path).name
    before = _snapshot()
    progress = lambda text: _send(out, {"progress": text})  # noqa: E731
    try:
        _, answer = load_answer(path, exercise=ex,
                             on_cell=lambda n: progress(f"code cell {n} of {name}"))
    except NotebookError as exc:
        if isinstance(exc.__cause__, MemoryError):
            raise exc.__cause__ from None
        _send(out, {"error": str(exc)})
        return
    absent = _guard.ABSENT_CALLS
    absent.clear()  # the try-it cells may show the library's results: not the answer's doing
    report = run_answer(spec, answer, cases=cases, on_case=lambda n: progress(
        f"case {n} of {len(cases)} of the check of {name}"))
    changed = _changed(before, _snapshot())
    if changed and report.flagged is None:
        report.flagged = (f"changes the grader's own code ({', '.join(changed[:3])}): the "
                          f"answer must leave impala_lab as it is")
    if absent and report.flagged is None and not _reference_raised(report.traces):
        # a call the traces do not show, e.g. from a thread of its own
        report.flagged = (f"calls the library's {absent[0]}, which the grader's sandbox does "
                          f"not have")
    _send(out, {"result": {"label": answer_label(ex, answer), "flagged": report.flagged,
                           "traces": encode(report.traces)}})


def main(argv: list[str]) -> int:
    """Grades one hand-in (see the module docstring); always returns 0."""
    exercise, path, memory_mb, processes, cpu_s, seed, fd = argv[:7]
    _limit(int(memory_mb), int(processes), int(cpu_s))
    out = os.fdopen(int(fd), "w", encoding="utf-8")
    try:
        _run(exercise, path, int(seed), out)
    except MemoryError:
        _send(out, {"memory": True})
    except Exception as exc:  # the grader's own failure, or a hand-in that broke it
        _send(out, {"error": f"the grading process failed: {type(exc).__name__}: {exc}"})
    return 0
