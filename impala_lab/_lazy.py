"""Lazy package attributes: a name is imported from its module on first use.

A package that exports heavy parts (ipywidgets, matplotlib, Ray) stays cheap to import:

    _LAZY = {"Dashboard": "impala_lab.dashboard.widgets"}
    __getattr__ = lazy_getattr(__name__, _LAZY)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports ``names[name]`` and returns its
    attribute `name`; other names raise the usual ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
