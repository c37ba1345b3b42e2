"""What keeps an answer honest: the library's implementation trapped while it runs, its code
read for calls of it, and what it raised carried as a record between processes.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import pickle
import textwrap
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any

from impala_lab.classroom.exercises._common import (
    MARK_END,
    MARK_START,
    AnswerRaised,
    _cell_label,
    _where_to_fill,
    locate,
)


class Raised(Exception):
    """What the answer raised, as a record that survives a trip between processes.

    Attributes:
      type_name: the exception's type, e.g. ``"ValueError"``.
      text: its message.
      where: `locate`'s answer (the student's line), or "".
      fill: where to fill in the code (for a stub's message).
      reference: the library function the answer called (`ReferenceCalled`), or "".
    """

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


# Names of the absent implementations something called (the student build's stubs note them
# here, from whatever thread), so that the grading child can say why an answer failed.
ABSENT_CALLS: list[str] = []


def reference_absent(name: str) -> ReferenceCalled:
    """What a student build's stub raises: the library's `name`, which the grader's sandbox
    does not have (noted in `ABSENT_CALLS`)."""
    ABSENT_CALLS.append(name)
    return ReferenceCalled(name)


class Opaque:
    """An answer's value that cannot leave its process: kept as its repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def portable(value: Any) -> Any:
    """`value` itself when it pickles, else an `Opaque` of its repr (traces travel between
    the grading process and the grader)."""
    try:
        pickle.dumps(value)
        return value
    except Exception:
        try:
            return Opaque(repr(value))
        except Exception:
            return Opaque(f"<a {type(value).__name__}>")


# A trap put in place of a library function's code while the answer runs. It has no globals
# of its own (it runs with the library function's), so it hands over to `_trapped`, keyed by
# its own code object.
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
    """While the block runs, calling any of `functions` (the library's implementation of
    what the answer writes, the checker's own reference) from this thread raises
    `ReferenceCalled`: their code is swapped for a trap, so every way to them (an import,
    ``super()``, a bound method) is caught; other threads still get the library's code. The
    code is restored on the way out."""
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


# What no answer may do, whatever the exercise: read the checker's frames or objects.
_INTROSPECTION = {
    "_getframe": "reads the call stack (sys._getframe)",
    "currentframe": "reads the call stack (inspect.currentframe)",
    "getouterframes": "reads the call stack (inspect.getouterframes)",
    "inspect.stack": "reads the call stack (inspect.stack)",
    "inspect.trace": "reads the call stack (inspect.trace)",
    "f_back": "reads the call stack (frame.f_back)",
    "f_locals": "reads another frame's variables (f_locals)",
    "f_globals": "reads another frame's variables (f_globals)",
    "get_referrers": "searches the checker's objects (gc.get_referrers)",
    "get_objects": "searches the checker's objects (gc.get_objects)",
}


def _regions(answer: Any) -> list[tuple[str, str, int]]:
    """The code between the markers in the answer's source: (text, filename, first line)."""
    fns = []
    if isinstance(answer, type):
        for value in vars(answer).values():
            value = getattr(value, "__func__", value)
            value = getattr(value, "fget", value)
            if inspect.isfunction(value):
                fns.append(value)
    elif inspect.isfunction(answer):
        fns.append(answer)
    out = []
    for fn in fns:
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            continue
        # A marker comment less indented than the body falls outside the function's block:
        # read on in the file for it.
        whole = linecache.getlines(fn.__code__.co_filename)
        if whole and not any(ln.strip() == MARK_END for ln in lines):
            lines = whole[first - 1:]
        start = [i for i, ln in enumerate(lines) if ln.strip() == MARK_START]
        end = [i for i, ln in enumerate(lines) if ln.strip() == MARK_END]
        if not start and whole:  # markers around the whole method (a challenge's class body)
            lines, first = whole, 1
            start = [i for i, ln in enumerate(lines) if ln.strip() == MARK_START]
            end = [i for i, ln in enumerate(lines) if ln.strip() == MARK_END]
        if len(start) == 1 and len(end) == 1 and start[0] < end[0]:
            region = textwrap.dedent("".join(lines[start[0] + 1:end[0]]))
            found = (region, fn.__code__.co_filename, first + start[0] + 1)
            if found not in out:
                out.append(found)
    return out


def flag_region(answer: Any, forbidden: dict[str, str]) -> str | None:
    """A static look at the code between the markers: the first use of a forbidden name.

    Args:
      answer: the student's function or class (its source is found as `inspect` finds it:
        a notebook cell, a file).
      forbidden: names (a name or an attribute; ``.name`` only an attribute, so that a
        variable of that name is no cheat; or a whole expression such as ``super().get``)
        mapped to what using them means, e.g. ``"the library's ReplayMixer.mix"``.

    Returns:
      ``"<what> (`<code>`, <where>)"`` for the first forbidden use, or None (also when the
      source or the markers cannot be found: the traps of `forbid` still apply).
    """
    rules = {**{k: f"calls {v}" for k, v in forbidden.items()}, **_INTROSPECTION}
    for text, filename, first in _regions(answer):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        hits = []
        for node in ast.walk(tree):
            keys = []
            if isinstance(node, ast.Name):
                keys = [node.id]
            elif isinstance(node, ast.Attribute):
                keys = [ast.unparse(node), "." + node.attr, node.attr]
            for key in keys:
                if key in rules:
                    hits.append((node.lineno, node.col_offset, rules[key], node))
                    break
        if hits:
            lineno, _, what, node = min(hits, key=lambda h: h[:2])
            cell = _cell_label(filename)
            where = cell if cell is not None else filename
            return (f"{what} (`{ast.unparse(node)}`, {where}, line {first + lineno - 1})")
    return None


def flag_syntax(answer: Any, kinds: dict[type, str]) -> tuple[str, str] | None:
    """The first statement or expression of one of `kinds` between the markers (a
    challenge's structural rule, e.g. no loop): ``(what, "`<code>`, <where>, line N")``, with
    ``what`` from `kinds` (``{ast.For: "a for loop", ...}``), or None."""
    for text, filename, first in _regions(answer):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        hits = [node for node in ast.walk(tree) if isinstance(node, tuple(kinds))]
        if hits:
            node = min(hits, key=lambda n: (n.lineno, n.col_offset))
            what = next(v for k, v in kinds.items() if isinstance(node, k))
            code = ast.unparse(node).splitlines()[0]
            code = code if len(code) <= 60 else code[:57] + "..."
            cell = _cell_label(filename)
            where = cell if cell is not None else filename
            return what, f"`{code}`, {where}, line {first + node.lineno - 1}"
    return None
