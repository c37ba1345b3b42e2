"""An answer while it runs: the library's implementation trapped (`forbid`), and what it raised
or returned kept as records that travel between processes."""

from __future__ import annotations

import contextlib
import pickle
import threading
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from impala_lab.classroom.exercises._common import AnswerRaised, _where_to_fill, locate


class Raised(Exception):
    """What the answer raised, as a record: type name, message, the student's line
    (`locate`), where to fill in (a stub's) and the library function it called (or "")."""

    def __init__(self, type_name: str, text: str, where: str = "", fill: str = "",
                 reference: str = "") -> None:
        super().__init__(type_name, text, where, fill, reference)
        self.type_name, self.text, self.where, self.fill = type_name, text, where, fill
        self.reference = reference

    @property
    def not_implemented(self) -> bool:
        return self.type_name == "NotImplementedError"

    @classmethod
    def of(cls, raised: AnswerRaised) -> Raised:
        exc = raised.exc
        ref = exc.name if isinstance(exc, ReferenceCalled) else ""
        return cls(type(exc).__name__, str(exc), locate(exc), _where_to_fill(exc), ref)


class ReferenceCalled(Exception):
    """The answer called the library function that the check compares it with."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class Opaque:
    """An answer's value that cannot leave its process: kept as its repr."""

    text: str

    def __repr__(self) -> str:
        return self.text


def portable(value: Any) -> Any:
    """`value` itself when it pickles, else an `Opaque` of its repr (taken once, here)."""
    try:
        pickle.dumps(value)
        return value
    except Exception:
        try:
            return Opaque(repr(value))
        except Exception:
            return Opaque(f"<a {type(value).__name__}>")


# The code a trapped function runs. It runs with the library function's globals, so it hands
# over to `_trapped`, keyed by its own code object.
def _trap(*args: Any, **kwargs: Any) -> Any:
    return __import__("impala_lab.classroom.exercises._guard", fromlist=["_"])._trapped(
        __import__("sys")._getframe(0).f_code, args, kwargs)


# trap code -> (the checking thread, the original function rebuilt from its saved code).
_TRAPS: dict[Any, tuple[int, Any]] = {}


def _trapped(trap_code: Any, args: tuple, kwargs: dict) -> Any:
    thread, original = _TRAPS[trap_code]
    if threading.get_ident() != thread:  # another thread (a live run) uses the library
        return original(*args, **kwargs)
    raise ReferenceCalled(trap_code.co_qualname)


@contextlib.contextmanager
def forbid(functions: Sequence[Any]) -> Iterator[None]:
    """While the block runs, calling any of `functions` from this thread raises
    `ReferenceCalled`: their code is swapped for a trap, so every way to them (an import,
    ``super()``, a bound method) is caught; other threads (a live run) get the library's
    code."""
    saved = []
    try:
        for fn in functions:
            fn = getattr(fn, "__func__", fn)
            code = getattr(fn, "__code__", None)
            if code is None or code.co_freevars or code in _TRAPS:
                continue
            original = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__)
            original.__kwdefaults__ = fn.__kwdefaults__
            trap = _trap.__code__.replace(co_name=code.co_name, co_qualname=code.co_qualname)
            _TRAPS[trap] = (threading.get_ident(), original)
            saved.append((fn, code, trap))
            fn.__code__ = trap
        yield
    finally:
        for fn, code, trap in saved:
            fn.__code__ = code
            _TRAPS.pop(trap, None)
