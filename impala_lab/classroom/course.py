"""The course as files a student can copy (`copy_course`): lecture notebooks, the notation
table, IMPALA in one file, the exercises and (when asked) their solutions.

A wheel carries ``notebooks/`` as ``impala_lab/classroom/notebooks/`` (``setup.py`` copies
them, with ``examples/impala_in_one_file.py``); a checkout reads them in place. A student's
wheel has no solutions (unless built with ``IMPALA_LAB_INSTRUCTOR_BUILD=1``): ``--solutions``
works from a clone or an instructor build. docs/course.md says more.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

# relative to the course's root; the solutions only when asked
LECTURES = "*.ipynb"
NOTES = "*.md"  # notation.md, which the notebooks link to
EXERCISES = "exercises/*.ipynb"
SOLUTIONS = "solutions/*.ipynb"
# IMPALA in one file: beside the notebooks in a wheel, in examples/ in a checkout
ONE_FILE = "impala_in_one_file.py"


class CourseExistsError(FileExistsError):
    """The destination already holds some of the course's files (`paths`, relative to it)."""

    def __init__(self, dest: Path, paths: list[Path]):
        self.dest = dest
        self.paths = paths
        shown = ", ".join(str(p) for p in paths[:3])
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        super().__init__(f"{dest} already holds {shown}{more}")


def course_root() -> Path:
    """Where the course's notebooks are: the wheel's, else the checkout's ``notebooks/``."""
    for root in (_PACKAGE / "notebooks", _PACKAGE.parents[1] / "notebooks"):
        if (root / "exercises").is_dir():
            return root
    raise FileNotFoundError(f"no course notebooks in {_PACKAGE / 'notebooks'} or "
                            f"{_PACKAGE.parents[1] / 'notebooks'}: this impala_lab was installed "
                            "without them; install it from a wheel or a clone")


class NoSolutionsError(FileNotFoundError):
    """This install of impala_lab is a student build: it carries no solutions."""


def source_of(rel: Path) -> Path:
    """Where the course's file ``rel`` (a path `course_files` returned) is in this install."""
    root = course_root()
    if rel == Path(ONE_FILE) and not (root / rel).is_file():
        return root.parent / "examples" / ONE_FILE  # a checkout
    return root / rel


def course_files(*, solutions: bool = False) -> list[Path]:
    """The course's files, relative to `course_root`: the lectures, the notation table and the
    one-file IMPALA, then the exercises (and the solutions).

    Raises:
      NoSolutionsError: `solutions` asked for, and this install carries none.
    """
    root = course_root()
    if solutions and not any((root / "solutions").glob("*.ipynb")):
        raise NoSolutionsError(
            "this impala_lab is a student build and carries no solutions; copy them from a "
            "clone of the repository (impala-lab notebooks DIR --solutions run there), or "
            "install an instructor build (IMPALA_LAB_INSTRUCTOR_BUILD=1 pip wheel .)")
    top = [p.relative_to(root) for pattern in (LECTURES, NOTES) for p in sorted(root.glob(pattern))]
    if not source_of(Path(ONE_FILE)).is_file():
        raise FileNotFoundError(f"{ONE_FILE} is missing from this install of impala_lab "
                                f"({root}): reinstall it from a wheel or a clone")
    patterns = (EXERCISES, SOLUTIONS) if solutions else (EXERCISES,)
    return top + [Path(ONE_FILE)] + [p.relative_to(root) for pattern in patterns
                                     for p in sorted(root.glob(pattern))]


def copy_course(dest: str | os.PathLike, *, solutions: bool = False,
                force: bool = False) -> list[Path]:
    """Copies the course (with ``solutions/`` if asked) into `dest` (created if missing;
    its other files are left alone); returns the copied paths.

    Raises:
      CourseExistsError: `dest` already holds some of the files and not `force` (overwrite
        them); nothing was copied.
      NoSolutionsError: `solutions` asked for, and this install carries none.
    """
    dest = Path(dest)
    files = course_files(solutions=solutions)
    if not force:
        existing = [f for f in files if (dest / f).exists()]
        if existing:
            raise CourseExistsError(dest, existing)
    copied = []
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_of(rel), target)
        copied.append(target)
    return copied
