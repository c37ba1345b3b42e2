"""``python -m impala_lab_grader NOTEBOOK.ipynb ...``: grade handed-in exercise notebooks.

Each notebook is graded in a bubblewrap sandbox of its own (`impala_lab_grader.grade`), with
limits on wall time and memory (``--timeout``, ``--memory``) and cases drawn at random besides
the fixed ones (``--seed`` repeats a draw): a hand-in that loops or allocates without end
fails with a hint, and the batch goes on. It prints the sandbox and its limits, the seed,
each notebook's verdict under an ``== PATH`` header, then a summary that names each
notebook's exercise (a challenge says so); the exit status is 0 when every answer passes, 1
when one does not, 2 when nothing was graded. Without bubblewrap it grades nothing (exit 2,
with the line that installs it) unless ``--unsandboxed`` is given.

``--list`` prints the exercises. ``python -m impala_lab_grader export --nbgrader DIR`` writes
nbgrader source notebooks (`impala_lab_grader.nbgrader_export`).
"""

from __future__ import annotations

import argparse
import os
import sys

from impala_lab.classroom.exercises import EXERCISES, CheckResult
from impala_lab_grader import world
from impala_lab_grader.grade import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    cgroup_support,
    fresh_seed,
    grade_notebook,
)
from impala_lab_grader.notebook import shown
from impala_lab_grader.sandbox import (
    SHM_BYTES,
    TMP_BYTES,
    Limits,
    NoSandbox,
    require_bwrap,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m impala_lab_grader",
        description="Grade exercise notebooks against the reference on seeded cases, each in "
                    "a sandbox of its own (docs/grading.md).")
    parser.add_argument("notebooks", nargs="*", help="exercise notebooks (.ipynb) to grade")
    parser.add_argument("--list", action="store_true", help="list the exercises and exit")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="wall time one hand-in may run (default %(default)g)")
    parser.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, metavar="MB",
                        help="memory one hand-in may use, in MiB (default %(default)d)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the cases drawn at random (default: a fresh one, printed)")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="grade without bubblewrap: each hand-in runs as you and can read, "
                             "change and signal what you can (notebooks you trust only)")
    return parser


def _banner(args: argparse.Namespace) -> str:
    limits = Limits(args.timeout, args.memory)
    if args.unsandboxed:
        sandbox = ("sandbox: NONE (--unsandboxed): hand-ins run as you and can read, change "
                   "and signal what you can; grade only notebooks you trust")
    else:
        sandbox = ("sandbox: bubblewrap (each hand-in alone: a user of its own, its own PID "
                   "namespace, no network; only the interpreter, impala_lab's dependencies, "
                   "a student build of impala_lab and its own cells)")
    why = cgroup_support()
    if not why:
        where = ("a cgroup for the whole sandbox: memory (shared memory and files in /tmp "
                 "included) and tasks")
    else:
        where = (f"no cgroup here ({why}): each process's address space, a watchdog over "
                 f"the memory and tasks of all its processes" + (
                     f", memfds and System V shared memory refused, /tmp {TMP_BYTES >> 20} "
                     f"MiB and /dev/shm {SHM_BYTES >> 20} MiB" if not args.unsandboxed else ""))
    return (f"{sandbox}\nlimits: {args.timeout:g} s, {args.memory} MiB, {limits.processes} "
            f"processes and threads per hand-in; {where}")


def _summary(graded: list[tuple[str, CheckResult]]) -> str:
    lines = ["summary (verdict, exercise, notebook):"]
    for path, result in graded:
        ex = EXERCISES.get(result.exercise)
        what = ("(no exercise)" if ex is None else
                f"{ex.name} (challenge of {ex.base})" if ex.base else ex.name)
        lines.append(f"  {'pass' if result.passed else 'FAIL'}  {what:45} {shown(path)}")
    passed = sum(r.passed for _, r in graded)
    lines.append(f"{passed} of {len(graded)} notebooks pass")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:  # a subcommand; everything else names notebooks
        from impala_lab_grader.nbgrader_export import main as export_main

        return export_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.list or not args.notebooks:
        for ex in EXERCISES.values():
            print(f"{ex.name:23} {ex.notebook:35} answer: {ex.answer:18} ({ex.title})")
        return 0 if args.list else 2
    for flag, value, unit in (("--timeout", args.timeout, "seconds"),
                              ("--memory", args.memory, "MiB")):
        if value <= 0:
            print(f"error: {flag} {value:g}: give a positive number of {unit}", file=sys.stderr)
            return 2
    if not args.unsandboxed:
        try:
            world.entries(), world.site_target(), world.python()
            require_bwrap()
        except (world.WorldError, NoSandbox) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(_banner(args))
    seed = fresh_seed() if args.seed is None else args.seed
    print(f"seed: {seed} (--seed {seed} draws the same random cases again)", flush=True)
    hide = sorted({os.path.dirname(os.path.abspath(p)) for p in args.notebooks})
    graded = []
    for path in args.notebooks:
        print(f"== {shown(path)}", flush=True)
        graded.append((path, grade_notebook(path, timeout=args.timeout, memory_mb=args.memory,
                                            seed=seed, sandboxed=not args.unsandboxed,
                                            hide=hide)))
    print(_summary(graded))
    return 0 if all(r.passed for _, r in graded) else 1


if __name__ == "__main__":
    sys.exit(main())
