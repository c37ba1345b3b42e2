"""The wheel carries the course: notebooks/ becomes the package data
``impala_lab/classroom/notebooks/``: the lecture notebooks, the notation table
(``notebooks/notation.md``), the exercise stubs and ``examples/impala_in_one_file.py``, and
the solutions only in an instructor build (``IMPALA_LAB_INSTRUCTOR_BUILD=1 pip wheel .``). A
student's wheel has none, so no hand-in can read them from the installed package.

Everything else about the package is declared in pyproject.toml. The notebooks stay at the
repository's top level (``make lab``, the tests and the README use ``notebooks/``), so
build_py copies them into the built package, where `impala_lab.classroom.course` finds them. An
editable install builds nothing: `impala_lab.classroom.course` then reads ``notebooks/`` in place.
"""

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

NOTEBOOKS = Path(__file__).resolve().parent / "notebooks"
ONE_FILE = Path(__file__).resolve().parent / "examples" / "impala_in_one_file.py"
# lecture notebooks, the notation table and exercise stubs; the solutions only in an
# instructor build (an sdist carries all of them: MANIFEST.in)
INSTRUCTOR = os.environ.get("IMPALA_LAB_INSTRUCTOR_BUILD") == "1"
COURSE_GLOBS = ("*.ipynb", "*.md", "exercises/*.ipynb") + (
    ("solutions/*.ipynb",) if INSTRUCTOR else ())


class BuildPyWithCourse(build_py):
    """build_py, plus the course copied to ``<build_lib>/impala_lab/classroom/notebooks/``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # the editable finder maps impala_lab to the source tree
            return
        dest = Path(self.build_lib) / "impala_lab" / "classroom" / "notebooks"
        for pattern in COURSE_GLOBS:
            for notebook in sorted(NOTEBOOKS.glob(pattern)):
                target = dest / notebook.relative_to(NOTEBOOKS)
                self.mkpath(str(target.parent))
                self.copy_file(str(notebook), str(target))
        self.copy_file(str(ONE_FILE), str(dest / ONE_FILE.name))


setup(cmdclass={"build_py": BuildPyWithCourse})
