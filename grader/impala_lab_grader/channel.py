"""The one channel from the grading child to the grader: framed messages of data, read with
bounds.

The child runs a student's code, so nothing it sends may run code in the grader, decide a
verdict, or keep the grader busy. It writes frames, each ``MAGIC``, a 4-byte big-endian length
and that many bytes of JSON holding one object with one key: any number of small
``{"progress": text}`` frames, then exactly one final frame, ``{"result": {"traces": ...,
"absent": [...]}}``, ``{"memory": true}``, ``{"processes": true}`` or ``{"error": text}``, and
nothing after it. A
hand-in that writes to the channel itself (a forged answer first, a second answer, a flood,
half a frame) breaks that shape, and `read_frames` rejects the whole answer: it never picks
one answer among several. The grader reads at most `RESULT_CAP` bytes and `MAX_FRAMES`
frames; the answer's traces are `decode`d node by node with a bound on their size.

A trace is JSON made of plain values and a few tagged objects (``{"$": "tuple", ...}``, arrays
as dtype, shape and base64 bytes, the checkers' `Mismatch`, `Raised`, `Opaque` and verbatim
text); anything else travels as the text of its repr. `decode` accepts exactly that and
nothing more, and every text it reads comes back `escaped`: a hand-in's strings reach the
grader's output with no control character, no line break and no escape sequence.

The child imports this module too (inside the sandbox): it needs the standard library, numpy
and the student package only.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from typing import Any

import numpy as np

from impala_lab.classroom.exercises._common import Mismatch, _Verbatim
from impala_lab.classroom.exercises._guard import Opaque, Raised

MAGIC = b"ILG1"
HEADER = struct.Struct(">4sI")
RESULT_CAP = 16 * 2**20  # bytes the grader reads at most
MAX_FRAMES = 10_000  # progress frames: one per cell and case
MAX_PROGRESS = 1024  # bytes of one progress frame
NO_ANSWER = "no answer"
MAX_DEPTH = 40
MAX_NODES = 200_000
MAX_TEXT = 4000  # characters kept of a repr or a message
_ARRAY_KINDS = "biufc"  # bool, ints, floats, complex: no object or string arrays


class WireError(ValueError):
    """What the grading child sent is not the channel's shape, or not a trace."""


def escaped(text: str) -> str:
    """`text` with every character that is not printable (control characters, line breaks,
    escape sequences, bidirectional overrides, undecodable bytes of a file name) written as
    its Python escape, e.g. ``\\n``, ``\\x1b``, ``\\u202e``."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def frame(message: dict[str, Any]) -> bytes:
    """One frame of `message` (the child's side)."""
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(MAGIC, len(body)) + body


def send(fd: int, message: dict[str, Any]) -> None:
    """Writes one frame to `fd` in one piece (the child's side)."""
    data = frame(message)
    while data:
        data = data[os.write(fd, data):]


def read_frames(data: bytes) -> tuple[str, dict[str, Any]]:
    """The last progress text and the final message in `data` (the grader's side).

    Raises:
      WireError: `data` is not progress frames and then exactly one final frame: a frame
        that is cut short or too long, no final frame, a second one, bytes after it, more
        than `MAX_FRAMES` frames, or a message of another shape. The progress read so far
        is on the error (``where``), for a time-out's message.
    """
    where, at, count = "", 0, 0
    try:
        while at < len(data):
            count += 1
            if count > MAX_FRAMES:
                raise WireError(f"more than {MAX_FRAMES} messages")
            if len(data) - at < HEADER.size:
                raise WireError("a message cut short")
            magic, size = HEADER.unpack_from(data, at)
            at += HEADER.size
            if magic != MAGIC or size > len(data) - at:
                raise WireError("bytes that are not a message of the grading process")
            message = _message(data[at:at + size])
            at += size
            if "progress" in message:
                where = escaped(message["progress"])[:300]
                continue
            if at != len(data):
                raise WireError("more after the answer (a second answer, or other bytes)")
            return where, message
        raise WireError(NO_ANSWER)
    except WireError as exc:
        exc.where = where
        raise


def _message(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"a message that is not JSON ({str(exc)[:100]})") from None
    if not isinstance(message, dict) or len(message) != 1:
        raise WireError("a message that is not one key and its value")
    key, value = next(iter(message.items()))
    if key == "progress" and isinstance(value, str) and len(body) <= MAX_PROGRESS:
        return message
    if (key == "error" and isinstance(value, str)) or (
            key in ("memory", "processes") and value is True):  # it can only fail itself so
        return message
    if key == "result" and isinstance(value, dict) and set(value) == {"traces", "absent"}:
        return message
    raise WireError(f"a message of another shape ({escaped(key[:40])!r})")


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
        if type(data) is str:
            return escaped(data)
        if data is None or type(data) in (bool, int, float):
            return data
        if type(data) is list:
            return [self.read(v, depth + 1) for v in data]
        if type(data) is not dict:
            raise WireError(f"a {type(data).__name__} is no trace value")
        return self._tagged(data, depth)

    def _str(self, data: dict, key: str) -> str:
        value = data.get(key)
        if type(value) is not str:
            raise WireError(f"{escaped(str(data.get('$')))!r}: {key!r} is not text")
        return escaped(value)

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
            return Raised(*(escaped(f) for f in fields))
        raise WireError(f"unknown tag {escaped(str(tag))[:40]!r}")

    @staticmethod
    def _list(data: dict, key: str) -> list:
        value = data.get(key)
        if type(value) is not list:
            raise WireError(f"{escaped(str(data.get('$')))[:40]!r}: {key!r} is not a list")
        return value


def _array(data: dict, scalar: bool) -> Any:
    try:
        dtype = np.dtype(str(data["dtype"]))
        shape = tuple(int(n) for n in data["shape"])
        raw = base64.b64decode(str(data["data"]), validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"an array that cannot be read: {escaped(str(exc))[:200]}") from None
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
        raise WireError(f"not JSON: {escaped(str(exc))[:200]}") from None
    return _Reader().read(data)
