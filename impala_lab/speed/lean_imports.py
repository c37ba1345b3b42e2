"""The learner's first TensorFlow import without Keras's optional integrations.

Keras and TensorFlow import matplotlib, pandas, scipy, h5py, IPython, PIL and psutil where
installed (impala_lab's dashboard and MinAtar install them); the learner uses none.
`lean_imports` makes them unimportable during the import (``sys.modules[name] = None``: an
``ImportError`` Keras catches, leaving that integration off in the process) and removes the
marks afterwards. It acts only where `enable` was called (the ``impala-lab`` command), on the
import that loads TensorFlow, and never touches a module already imported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: What Keras and TensorFlow import only when installed, and the learner never uses.
OPTIONAL_MODULES = ("matplotlib", "pandas", "scipy", "h5py", "IPython", "PIL", "psutil")

_enabled = False


def enable() -> None:
    """Let `lean_imports` block (the command line calls this before it builds a run)."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    """Whether `enable` was called in this process."""
    return _enabled


@contextmanager
def lean_imports(names: tuple[str, ...] = OPTIONAL_MODULES) -> Iterator[list[str]]:
    """Inside, ``names`` that are not imported yet cannot be imported, if `enable` was called
    and neither TensorFlow nor Keras is loaded; yields the names blocked (empty otherwise)."""
    if not _enabled or "tensorflow" in sys.modules or "keras" in sys.modules:
        yield []
        return
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield blocked
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
