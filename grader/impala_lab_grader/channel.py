"""Traces as data: what the grading child sends the grader, and how the grader reads it back.

The child runs a student's code, so nothing it sends may run code in the grader: no pickle.
A trace is turned into JSON made of plain values and a few tagged objects (``{"$": "tuple",
...}``, arrays as dtype, shape and base64 bytes, the checkers' `Mismatch`, `Raised`,
`Opaque` and verbatim text); anything else travels as the text of its repr. `decode` accepts
exactly that and nothing more: an unknown tag, an object dtype, a shape that does not fit its
bytes, a nesting too deep or too many values is a `WireError`.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from impala_lab.classroom.exercises._common import Mismatch, _Verbatim
from impala_lab.classroom.exercises._guard import Opaque, Raised

MAX_DEPTH = 40
MAX_NODES = 200_000
MAX_TEXT = 4000  # characters kept of a repr or a message
_ARRAY_KINDS = "biufc"  # bool, ints, floats, complex: no object or string arrays


class WireError(ValueError):
    """A message from the grading child that is not a trace this module writes."""


def _text(value: Any) -> Opaque:
    try:
        text = repr(value)
    except Exception:
        text = f"<a {type(value).__name__}>"
    return Opaque(text[:MAX_TEXT])


def encode(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-ready data (see the module docstring)."""
    if depth > MAX_DEPTH:
        return {"$": "opaque", "text": "<nested too deep>"}
    if value is None or (isinstance(value, bool | int | float) and type(value) in (
            bool, int, float)):
        return value
    if type(value) is _Verbatim:
        return {"$": "verbatim", "text": str(value)[:MAX_TEXT]}
    if type(value) is str:
        return value[:MAX_TEXT * 4]
    if type(value) is list:
        return [encode(v, depth + 1) for v in value]
    if type(value) is tuple:
        return {"$": "tuple", "items": [encode(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {"$": "dict", "items": [[encode(k, depth + 1), encode(v, depth + 1)]
                                       for k, v in value.items()]}
    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in _ARRAY_KINDS:
        arr = np.asarray(value)  # a scalar stays 0-d; tobytes() is in C order
        return {"$": "array" if isinstance(value, np.ndarray) else "scalar",
                "dtype": arr.dtype.str, "shape": list(arr.shape),
                "data": base64.b64encode(arr.tobytes()).decode("ascii")}
    if type(value) is Mismatch:
        return {"$": "mismatch", "what": str(value.what)[:MAX_TEXT],
                "expected": encode(value.expected, depth + 1),
                "actual": encode(value.actual, depth + 1), "hint": str(value.hint)[:MAX_TEXT]}
    if type(value) is Raised:
        return {"$": "raised", "fields": [str(f)[:MAX_TEXT] for f in (
            value.type_name, value.text, value.where, value.fill, value.reference)]}
    if type(value) is Opaque:
        return {"$": "opaque", "text": str(value.text)[:MAX_TEXT]}
    return {"$": "opaque", "text": _text(value).text}


def dumps(value: Any) -> str:
    """One line of JSON for `value` (`encode`d)."""
    return json.dumps(encode(value), separators=(",", ":"))


class _Reader:
    """Rebuilds a trace from `encode`'s data, checking every node (see `decode`)."""

    def __init__(self) -> None:
        self.nodes = 0

    def read(self, data: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if depth > MAX_DEPTH + 2 or self.nodes > MAX_NODES:
            raise WireError("the trace is nested too deep or holds too many values")
        if data is None or type(data) in (bool, int, float, str):
            return data
        if type(data) is list:
            return [self.read(v, depth + 1) for v in data]
        if type(data) is not dict:
            raise WireError(f"a {type(data).__name__} is no trace value")
        return self._tagged(data, depth)

    def _str(self, data: dict, key: str) -> str:
        value = data.get(key)
        if type(value) is not str:
            raise WireError(f"{data.get('$')!r}: {key!r} is not text")
        return value

    def _tagged(self, data: dict, depth: int) -> Any:
        tag = data.get("$")
        if tag == "tuple":
            return tuple(self.read(self._list(data, "items"), depth + 1))
        if tag == "dict":
            pairs = self._list(data, "items")
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise WireError("a dict's items are not pairs")
            out = {}
            for key, value in pairs:
                key = self.read(key, depth + 1)
                try:
                    out[key] = self.read(value, depth + 1)
                except TypeError as exc:  # an unhashable key
                    raise WireError(f"a dict key cannot be {type(key).__name__}") from exc
            return out
        if tag in ("array", "scalar"):
            return _array(data, tag == "scalar")
        if tag == "verbatim":
            return _Verbatim(self._str(data, "text"))
        if tag == "opaque":
            return Opaque(self._str(data, "text"))
        if tag == "mismatch":
            return Mismatch(self._str(data, "what"), self.read(data.get("expected"), depth + 1),
                            self.read(data.get("actual"), depth + 1), self._str(data, "hint"))
        if tag == "raised":
            fields = self._list(data, "fields")
            if len(fields) != 5 or not all(type(f) is str for f in fields):
                raise WireError("a raised record needs five texts")
            return Raised(*fields)
        raise WireError(f"unknown tag {tag!r}")

    @staticmethod
    def _list(data: dict, key: str) -> list:
        value = data.get(key)
        if type(value) is not list:
            raise WireError(f"{data.get('$')!r}: {key!r} is not a list")
        return value


def _array(data: dict, scalar: bool) -> Any:
    try:
        dtype = np.dtype(str(data["dtype"]))
        shape = tuple(int(n) for n in data["shape"])
        raw = base64.b64decode(str(data["data"]), validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"an array that cannot be read: {exc}") from None
    if dtype.kind not in _ARRAY_KINDS or dtype.itemsize > 16 or len(shape) > 8 or any(
            not 0 <= n < 2**31 for n in shape):
        raise WireError(f"an array of dtype {dtype} or shape {list(shape)} is no trace value")
    size = 1
    for n in shape:  # in Python ints: no overflow
        size *= n
    if size * dtype.itemsize != len(raw):
        raise WireError("an array's bytes do not fit its shape")
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    return arr[()] if scalar else arr


def from_data(data: Any) -> Any:
    """The trace that `encode` turned into `data` (already parsed JSON), checked node by
    node (`WireError` where it is not one)."""
    return _Reader().read(data)


def decode(text: str | bytes) -> Any:
    """The trace `dumps` wrote, checked node by node.

    Raises:
      WireError: the text is not JSON, or not a trace (an unknown tag, a bad array, too deep
        or too many values).
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {str(exc)[:200]}") from None
    return _Reader().read(data)
