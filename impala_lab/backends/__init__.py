"""Where rollout workers live: ``inline`` (the driver's process), ``process`` (spawned
processes, the default) or ``ray`` (Ray actors).

`make_backend` picks one by ``config.backend``. The backends are imported lazily, on first
use of their name: importing this package imports neither Ray nor TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from impala_lab.backends.base import Backend, WorkerHandle, make_backend

__all__ = ["Backend", "WorkerHandle", "make_backend", "InlineBackend", "ProcessBackend",
           "RayBackend"]

_LAZY = {
    "InlineBackend": "impala_lab.backends.inline",
    "ProcessBackend": "impala_lab.backends.process",
    "RayBackend": "impala_lab.backends.ray",
}

if TYPE_CHECKING:  # pragma: no cover
    from impala_lab.backends.inline import InlineBackend
    from impala_lab.backends.process import ProcessBackend
    from impala_lab.backends.ray import RayBackend


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'impala_lab.backends' has no attribute {name!r}")
