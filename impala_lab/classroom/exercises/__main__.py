"""``python -m impala_lab.classroom.exercises NOTEBOOK.ipynb ...``: check exercise notebooks.

Each notebook is graded in a sandbox of its own, with limits on wall time and memory
(``--timeout``, ``--memory``; `impala_lab.classroom.exercises.notebook.grade_notebook`) and on
the cases the grader draws at random besides the fixed ones (``--seed`` repeats a draw): a
hand-in that loops or allocates without end fails with a hint, and the batch goes on. Prints
the sandbox's mode, the seed and each notebook's result; the exit status is 0 when every
answer passes, else 1.
``--list`` prints the exercises. ``python -m impala_lab.classroom.exercises export --nbgrader DIR``
writes nbgrader source notebooks (`impala_lab.classroom.exercises.nbgrader_export`).
"""

from __future__ import annotations

import argparse
import sys

from impala_lab.classroom.exercises import EXERCISES
from impala_lab.classroom.exercises._sandbox import choose_mode
from impala_lab.classroom.exercises.notebook import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    fresh_seed,
    grade_notebook,
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:  # a subcommand; everything else names notebooks
        from impala_lab.classroom.exercises.nbgrader_export import main as export_main

        return export_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m impala_lab.classroom.exercises",
        description="Check exercise notebooks against the reference on seeded cases.")
    parser.add_argument("notebooks", nargs="*", help="exercise notebooks (.ipynb) to check")
    parser.add_argument("--list", action="store_true", help="list the exercises and exit")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="wall time one hand-in may run (default %(default)g)")
    parser.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, metavar="MB",
                        help="memory one hand-in may use, in MiB (default %(default)d)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the cases drawn at random (default: a fresh one, printed)")
    args = parser.parse_args(argv)
    if args.list or not args.notebooks:
        for ex in EXERCISES.values():
            print(f"{ex.name:23} {ex.notebook:35} answer: {ex.answer:18} ({ex.title})")
        return 0 if args.list else 2
    try:
        mode, why = choose_mode()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("sandbox: bwrap (each hand-in isolated: own user, PID namespace, no network, "
          "student build of impala_lab)" if mode == "bwrap" else
          f"sandbox: fallback, hand-ins NOT isolated ({why}); install bubblewrap to isolate")
    seed = fresh_seed() if args.seed is None else args.seed
    print(f"seed: {seed} (--seed {seed} draws the same random cases again)")
    failed = 0
    for path in args.notebooks:
        print(f"== {path}", flush=True)
        result = grade_notebook(path, timeout=args.timeout, memory_mb=args.memory, seed=seed)
        failed += not result.passed
    print(f"{len(args.notebooks) - failed} of {len(args.notebooks)} notebooks pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
