"""The grading child: ``python -m impala_lab.classroom.exercises._grade NOTEBOOK OUTDIR MEMORY_MB``.

Started by `impala_lab.classroom.exercises.notebook.grade_notebook`, one per hand-in. It limits its
own
address space, runs the notebook's cells and then the answer on every case of its exercise
(`impala_lab.classroom.exercises._spec.run_answer`: the library's implementation trapped, no
reference computed here), and writes to OUTDIR:

- ``progress``: what it is running (a code cell, a case), for a time-out's message;
- ``status``: ``memory`` after a `MemoryError`, ``error: ...`` when the notebook could not be
  run, ``done`` otherwise;
- ``answer.pkl``: the answer's label and its traces, which the grader compares with the
  reference.

It also notes a hand-in that changed the library's or the checkers' code (a cell that
replaces ``impala_lab.classroom.exercises.check_*``, or the function the check compares with).
"""

from __future__ import annotations

import os
import pickle
import resource
import sys
import types
from pathlib import Path
from typing import Any


def _write(out: Path, name: str, text: str | bytes) -> None:
    tmp = out / f".{name}"
    data = text.encode("utf-8") if isinstance(text, str) else text
    tmp.write_bytes(data)
    os.replace(tmp, out / name)


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


def main(argv: list[str]) -> int:
    path, out, memory_mb = argv[0], Path(argv[1]), int(argv[2])
    limit = memory_mb * 2**20
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError) as exc:  # a platform that refuses it: the time limit stays
        print(f"no memory limit: {exc}", file=sys.stderr)
    name = Path(path).name
    try:
        from impala_lab.classroom.exercises._spec import run_answer
        from impala_lab.classroom.exercises.notebook import (
            NotebookError,
            answer_label,
            exercise_of,
            load_answer,
            read_notebook,
            spec_of,
        )

        # Taken before any cell runs: what a cell replaces later is not what grades it.
        spec = spec_of(exercise_of(path, read_notebook(path)))
        # The light reference modules are watched too (those of V-trace load TensorFlow: a
        # cell that changes them is caught by the reference, computed in the grader).

        before = _snapshot()
        progress = lambda text: _write(out, "progress", text)  # noqa: E731
        try:
            ex, answer = load_answer(
                path, on_cell=lambda n: progress(f"code cell {n} of {name}"))
        except NotebookError as exc:
            if isinstance(exc.__cause__, MemoryError):
                raise exc.__cause__ from None
            _write(out, "status", f"error: {exc}")
            return 0
        cases = spec.cases()
        report = run_answer(spec, answer, on_case=lambda n: progress(
            f"case {n} of {len(cases)} of the check of {name}"))
        changed = _changed(before, _snapshot())
        if changed and report.flagged is None:
            report.flagged = (f"changes the grader's own code ({', '.join(changed[:3])}): the "
                              f"answer must leave impala_lab as it is")
        data: dict[str, Any] = {"label": answer_label(ex, answer),
                                "report": {"flagged": report.flagged,
                                           "traces": report.traces}}
        _write(out, "answer.pkl", pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        _write(out, "status", "done")
    except MemoryError:
        _write(out, "status", "memory")
    except Exception as exc:  # the grader's own failure, or a hand-in that broke it
        _write(out, "status", f"error: the grading process failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
