"""TensorFlow imports quietly: no C++ start-up log lines, no retracing warnings.

`install` runs once, from the package's ``__init__``, before anything imports TensorFlow. It
sets TensorFlow's logging variables with ``os.environ.setdefault`` (a value the user set
wins) and puts a finder on ``sys.meta_path`` that wraps the first ``import tensorflow``.

Why a finder and not just ``TF_CPP_MIN_LOG_LEVEL``: TensorFlow 2.16+ writes its start-up lines
("WARNING: All log messages before absl::InitializeLog() ...", "I0000 ... oneDNN custom
operations are on ...", the CPU-feature note) from C++ before its log level is read, straight
to file descriptor 2, which a Jupyter kernel shows under every cell that first touches
TensorFlow. The wrapped import sends descriptor 2 to a temporary file and writes back every
line except those. ``TF_CPP_MIN_LOG_LEVEL=0`` turns all of this off: TensorFlow's logs are
then shown as TensorFlow writes them.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

#: Start-up lines of TensorFlow's C++ logging: glog-style info and warning lines, absl's
#: pre-initialisation notice, and the CPU-feature note's second line.
NOISE = re.compile(r"^(?:[IW]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before "
                   r"absl::InitializeLog|To enable the following instructions:)")


def quiet() -> bool:
    """Whether TensorFlow's noise is filtered (``TF_CPP_MIN_LOG_LEVEL`` is not 0)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0").strip() not in ("", "0")


class _RetracingFilter(logging.Filter):
    """Drops tf.function's retracing warnings (the compiled train step never retraces;
    the notebooks call V-trace on many shapes on purpose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` through the other finders and wraps its ``exec_module``."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the wrapped import below must not find us again
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module") or not quiet():
            return spec
        exec_module = loader.exec_module

        def quiet_exec_module(module: Any) -> None:
            with _filtered_fd2():
                exec_module(module)
            logging.getLogger("tensorflow").addFilter(_RetracingFilter())

        loader.exec_module = quiet_exec_module
        return spec


class _filtered_fd2:
    """Descriptor 2 goes to a temporary file; on exit the lines that are not `NOISE` go to
    ``sys.stderr``."""

    def __enter__(self) -> None:
        with_fd = hasattr(sys.stderr, "flush")
        if with_fd:
            sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)

    def __exit__(self, *exc: object) -> None:
        try:
            sys.stderr.flush()
        finally:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        self._file.seek(0)
        text = self._file.read().decode("utf-8", "replace")
        self._file.close()
        kept = [line for line in text.splitlines(keepends=True) if not NOISE.match(line)]
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def install() -> None:
    """Set TensorFlow's logging defaults and wrap its first import (see the module's
    docstring). Does nothing to the import when TensorFlow is already imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietImport())
