"""Where rollout workers live: ``inline`` (the driver's process), ``process`` (spawned
processes, the default) or ``ray`` (Ray actors). `make_backend` imports the module of the one
``config.backend`` names on first use, so importing this package imports neither Ray nor TF.
"""

from __future__ import annotations

import importlib

from impala_lab.backends.base import Backend, WorkerHandle
from impala_lab.config import ImpalaConfig

__all__ = ["BACKENDS", "Backend", "WorkerHandle", "backend_class", "make_backend"]

# name -> "module:class"; the names are `impala_lab.config_checks.BACKENDS`, which validates them
BACKENDS = {
    "process": "impala_lab.backends.process:ProcessBackend",
    "inline": "impala_lab.backends.inline:InlineBackend",
    "ray": "impala_lab.backends.ray:RayBackend",
}

def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name`` (imports its module)."""
    if name not in BACKENDS:
        choices = ", ".join(repr(n) for n in BACKENDS)
        raise ValueError(f"backend={name!r} is invalid: choose one of {choices}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_backend(config: ImpalaConfig) -> Backend:
    """The backend named by ``config.backend``, for the env ``config.env``."""
    return backend_class(config.backend)(config)

