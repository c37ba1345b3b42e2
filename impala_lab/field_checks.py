"""Typed config fields: each field's kind, and checks whose errors name the field, the value
and the fix.

`ImpalaConfig` validates every field with these (and the CLI parses flags by `field_kinds`);
they know nothing of the config's meaning, only of types and ranges, so any dataclass of
documented fields can use them. Pure Python.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import typing
from typing import Any

from impala_lab.errors import ConfigError
from impala_lab.schedules import check_schedule, parse_schedule


def bad(name: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{name}={value!r} is invalid: {fix}")


def check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not (lo <= value <= hi) or math.isnan(value):
        span = f"in [{lo}, {hi}]" if math.isfinite(hi) else f">= {lo}"
        bad(name, value, f"it must be {span}")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.4)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        bad(name, value, f"choose one of {', '.join(map(repr, choices))}{hint}")


_SCALAR_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


@functools.cache
def field_kinds(cls: type) -> dict[str, str]:
    """Each field's kind, from its ``kind`` metadata or else its annotation: ``int``,
    ``float``, ``bool``, ``str``, and ``X | None`` as the kind of X plus ``?``."""
    hints = typing.get_type_hints(cls)
    kinds = {}
    for f in dataclasses.fields(cls):
        if "kind" in f.metadata:
            kinds[f.name] = f.metadata["kind"]
            continue
        hint, optional = hints[f.name], ""
        args = typing.get_args(hint)
        if type(None) in args:
            (hint,) = (a for a in args if a is not type(None))
            optional = "?"
        kinds[f.name] = _SCALAR_KINDS[hint] + optional
    return kinds


def check_type(name: str, kind: str, value: Any) -> None:
    """Raise `ConfigError` unless ``value`` is of ``kind`` (see `field_kinds`); the message
    names the field, the value, its type and what it must be."""
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if optional and value is None:
        return
    ok = True
    if base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        try:
            finite = ok and math.isfinite(float(value))
        except OverflowError:  # an int too large for a float
            finite = False
        if ok and not finite:
            bad(name, value, "it must be a finite number")
    elif base == "str":
        ok = isinstance(value, str)
    elif base == "model":
        ok = isinstance(value, tuple | list) and all(
            isinstance(h, numbers.Integral) and not isinstance(h, bool) for h in value)
    elif base == "env":
        ok = isinstance(value, str) or callable(value)
    elif base == "schedule":
        check_schedule(name, value)  # its own message: the points and what they must be
    elif base == "filters":
        ok = isinstance(value, tuple | list) and all(
            isinstance(f, tuple | list) and len(f) == 3 and all(
                isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in f)
            for f in value)
    if not ok:
        expected = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "str": "a string", "model": "a list of positive integers, e.g. [64, 64]",
                    "env": "a gymnasium env id or an env factory",
                    "filters": "a list of [filters, kernel, stride] triples, e.g. [[16, 3, 1]]",
                    }[base]
        if optional:
            expected += " or None"
        raise ConfigError(
            f"{name}={value!r} has type {type(value).__name__}: it must be {expected}")


def parse_text(name: str, kind: str, text: str) -> Any:
    """A command-line flag's text as a value of ``kind`` (see `field_kinds`); a text that is
    not one is a `ConfigError` naming the flag and what it must be."""
    base = kind.rstrip("?")
    if kind.endswith("?") and text.lower() in ("none", "null"):
        return None
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
        if base == "bool":
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if base == "model":
            return tuple(int(x) for x in text.replace(",", " ").split())
        if base == "schedule":  # 0:0.003,2e6:0: (env steps, value) per point
            return parse_schedule(text)
        if base == "filters":  # 16x3x1,32x3x1: (filters, kernel, stride) per layer
            layers = tuple(tuple(int(v) for v in layer.split("x"))
                           for layer in text.replace(",", " ").split())
            if not layers or any(len(layer) != 3 for layer in layers):
                raise ValueError(text)
            return layers
    except ValueError:
        expected = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "model": "hidden sizes such as 64,64",
                    "filters": "conv layers FILTERSxKERNELxSTRIDE such as 16x3x1,32x3x1",
                    "schedule": "points ENV_STEPS:VALUE such as 0:0.003,2e6:0"}[base]
        raise ConfigError(f"--{name.replace('_', '-')}={text!r} is invalid: it must be "
                          f"{expected}") from None
    return text
