"""The learner's first TensorFlow import without Keras's optional integrations.

Keras 3 imports matplotlib.pyplot (image galleries), pandas (DataFrame inputs to ``fit``),
and TensorFlow's legacy ``tf.keras`` code scipy and h5py (sparse inputs, HDF5 files), each
only when it is installed; they are, since impala_lab's dashboard and MinAtar need them. It
also imports IPython, PIL and psutil where installed. The learner uses none of them.

`lean_imports` makes those modules unimportable for the duration of the import
(``sys.modules[name] = None``, which Python answers with ``ImportError``; Keras and
TensorFlow catch it and leave the integration off) and removes the markers afterwards, so the
process can import any of them later as usual. Keras's integrations with them stay off in
that process. While the marks are there they hold for every thread.

It acts only where impala_lab owns the process (`enable`, called by the ``impala-lab``
command line) and only on the import that loads TensorFlow: in a notebook or a program of
your own, nothing is blocked. A module that was already imported is never touched.
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
