"""What every exercise checker shares: seeded cases, the pass line, the first difference.

A checker (a `Spec`) runs the student's answer on every seeded case first, with the library's
implementation of what it writes trapped (`forbid`), and keeps what it did as a trace; the
reference's traces are computed after it, or by the grader in another process, so nothing
the answer can reach holds an expected value. `judge` then compares them case by case and
stops at the first case that differs. Its message names the case (short inputs), what
differs, the expected and the actual value, and a hint. An answer that still raises
``NotImplementedError`` gets a message that points at the markers to fill in; one whose code
between the markers calls the library's implementation, or reads the checker's frames, is
flagged before it runs (`flag_region`).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import os
import pickle
import re
import sys
import textwrap
import threading
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MARK_START = "# ---- YOUR CODE STARTS HERE ----"
MARK_END = "# ---- YOUR CODE ENDS HERE ----"
PASS_MARK = "✓"
FAIL_MARK = "✗"

_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)  # impala_lab/
_LIB_DIRS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
# Filenames `impala_lab.exercises.notebook` compiles notebook cells under.
_CELL_FILENAME = re.compile(r"^<(?P<nb>[^,>]+), code cell (?P<n>\d+)>$")


def fast_mode() -> bool:
    """True when ``IMPALA_LAB_FAST=1``: notebooks shorten their training (CI sets it)."""
    return os.environ.get("IMPALA_LAB_FAST") == "1"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one checker call.

    Attributes:
      exercise: the exercise's name, e.g. ``"minibatch_get"``.
      passed: True when every case matched the reference.
      message: the text the checker printed: the pass line, or the first case that differs.
      num_cases: cases in the check.
      failed_case: 1-based number of the first case that differs; None when passed or when
        the answer is still the stub.
      not_implemented: True when the answer still raises ``NotImplementedError``.
      flagged: what the answer did that no answer may do (call the library's implementation
        of the function it writes, read the checker's frames), or None.
    """

    exercise: str
    passed: bool
    message: str
    num_cases: int
    failed_case: int | None = None
    not_implemented: bool = False
    flagged: str | None = None

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:  # short: the message itself was printed already
        return f"CheckResult(exercise={self.exercise!r}, passed={self.passed})"


@dataclass
class Case:
    """One seeded case.

    Attributes:
      description: the inputs in a few words (shown when the case fails).
      hint: what this case exercises, i.e. what to look at when it is the first to fail.
      params: whatever the checker's ``run_case`` needs.
    """

    description: str
    hint: str
    params: dict[str, Any] = field(default_factory=dict)


class Mismatch(Exception):
    """The answer differs from the reference in one case.

    Args:
      what: where in the case it differs, e.g. ``"call 4 of get()"`` or ``"vs[2, 1]"``.
      expected: the reference's value.
      actual: the answer's value.
      hint: what to fix; the case's own hint is added after it.
    """

    def __init__(self, what: str, expected: Any, actual: Any, hint: str = "") -> None:
        super().__init__(what, expected, actual, hint)  # all four: it pickles
        self.what = what
        self.expected = expected
        self.actual = actual
        self.hint = hint


class AnswerRaised(Exception):
    """The answer raised an exception (kept with its traceback)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


class _Verbatim(str):
    """A value formatted as is (no repr)."""


def verbatim(text: str) -> Any:
    """Marks text that `Mismatch` shows as is, not as a repr."""
    return _Verbatim(text)


def call_answer(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls the student's code; any exception it raises becomes `AnswerRaised` (but a
    `MemoryError` stays one: the grader reports it as such)."""
    try:
        return fn(*args, **kwargs)
    except (Mismatch, AnswerRaised, MemoryError):
        raise
    except Exception as exc:
        raise AnswerRaised(exc) from exc


def _is_student_file(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return False
    if _CELL_FILENAME.match(filename) or filename.startswith("<"):
        return True
    real = os.path.realpath(filename)
    if real.startswith(_PACKAGE_DIR + os.sep):
        return False
    return not any(real.startswith(d + os.sep) for d in _LIB_DIRS)


def _cell_label(filename: str) -> str | None:
    """``cell [N]`` for code run in IPython (N = the cell's execution count), the cell of a
    notebook run by `impala_lab.exercises.notebook`, or None."""
    m = _CELL_FILENAME.match(filename)
    if m:
        return f"code cell {m['n']} of {m['nb']}"
    if "IPython" in sys.modules:
        try:
            from IPython import get_ipython

            shell = get_ipython()
            number = None if shell is None else shell.compile._filename_map.get(filename)
        except Exception:  # an IPython without the map: fall back to the file name
            number = None
        if number is not None:
            return f"cell [{number}]"
    return None


def locate(exc: BaseException) -> str:
    """Where in the student's code `exc` was raised: ``cell [N], line L: `code```."""
    frames = traceback.extract_tb(exc.__traceback__)
    student = [f for f in frames if _is_student_file(f.filename)]
    if not student:
        return ""
    frame = student[-1]
    cell = _cell_label(frame.filename)
    where = cell if cell is not None else frame.filename
    code = f": `{frame.line.strip()}`" if frame.line else ""
    return f"{where}, line {frame.lineno}{code}"


def _where_to_fill(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    student = [f for f in frames if _is_student_file(f.filename)]
    if not student:
        return "in the cell that defines it, run that cell,"
    cell = _cell_label(student[-1].filename)
    if cell is None:
        return f"in {student[-1].filename} (line {student[-1].lineno}),"
    return f"in {cell} (the cell that defines it), run that cell,"


def format_value(value: Any, limit: int = 600) -> str:
    """A short, readable rendering of a value (numpy arrays with 5 significant digits)."""
    if isinstance(value, _Verbatim):
        text = str(value)
    elif isinstance(value, np.ndarray):
        with np.printoptions(precision=5, suppress=True, threshold=60, edgeitems=3):
            text = np.array2string(value, separator=", ")
        text = f"{text} (shape {list(value.shape)}, {value.dtype})"
    elif isinstance(value, float | np.floating):
        text = f"{float(value):.7g}"
    else:
        text = repr(value)
    text = text.replace("\n", "\n            ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def not_implemented_message(exercise: str, answer_label: str, fill: str) -> str:
    """The message for an answer that is still the stub (`fill`: `_where_to_fill`'s text)."""
    return (f"{FAIL_MARK} {exercise}: {answer_label} still raises NotImplementedError: fill in "
            f"the code between the markers\n      {MARK_START}\n      {MARK_END}\n"
            f"  {fill} then run this check again.")


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
    return __import__("impala_lab.exercises._common", fromlist=["_"])._trapped(
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
        if len(start) == 1 and len(end) == 1 and start[0] < end[0]:
            region = textwrap.dedent("".join(lines[start[0] + 1:end[0]]))
            out.append((region, fn.__code__.co_filename, first + start[0] + 1))
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


@dataclass(frozen=True)
class Spec:
    """How one exercise is checked, split so that the answer and the reference can run in
    different processes (the grader) or one after the other (a notebook's check cell).

    Attributes:
      exercise: the exercise's name.
      cases: the seeded cases, simplest first.
      answer_trace: runs the answer on a case and returns what it did, picklable (`portable`
        values; a `Mismatch` or `Raised` where it went wrong, at the end of a step list).
        It may raise `AnswerRaised` or `Mismatch`.
      reference_trace: the reference's trace of a case (never sees the answer).
      compare: raises `Mismatch` (or the answer's `Raised`) at the first difference.
      references: the library functions the answer must not call (imported lazily, and only
        the ones whose modules are loaded already: a stub check must not import TensorFlow).
      forbidden: names the code between the markers must not use (see `flag_region`).
    """

    exercise: str
    cases: Callable[[], list[Case]]
    answer_trace: Callable[[Any, Case], Any]
    reference_trace: Callable[[Case], Any]
    compare: Callable[[Case, Any, Any], None]
    references: Callable[[], list[Any]]
    forbidden: dict[str, str]


@dataclass
class AnswerReport:
    """What the answer side found: a flag from the static look, and one trace per case (up
    to the first that raised)."""

    flagged: str | None
    traces: list[Any]


def run_answer(spec: Spec, answer: Any, *,
               on_case: Callable[[int], None] | None = None) -> AnswerReport:
    """Runs the answer on every case (with the references trapped); no reference runs.

    Args:
      spec: the exercise.
      answer: the student's function or class.
      on_case: called with a case's number before it runs (the grader's progress).
    """
    flagged = flag_region(answer, spec.forbidden)
    traces: list[Any] = []
    if flagged is None:
        with forbid(spec.references()):
            for number, case in enumerate(spec.cases(), start=1):
                if on_case is not None:
                    on_case(number)
                try:
                    trace = spec.answer_trace(answer, case)
                except AnswerRaised as raised:
                    trace = Raised.of(raised)
                except Mismatch as diff:
                    trace = diff
                traces.append(trace)
                if isinstance(trace, Raised) or (
                        isinstance(trace, list) and trace and isinstance(trace[-1], Raised)):
                    break
    return AnswerReport(flagged, traces)


def judge(spec: Spec, label: str, report: AnswerReport,
          reference: Callable[[Case], Any] | None = None, *, show: bool = True) -> CheckResult:
    """Compares the answer's traces with the reference's, case by case, and stops at the
    first difference; prints and returns the result.

    Args:
      spec: the exercise.
      label: how to call the answer in messages, e.g. ``"MyMinibatchBuffer.get"``.
      report: `run_answer`'s report.
      reference: computes a case's reference trace (default ``spec.reference_trace``); it is
        called only for cases the answer got through, so a stub never loads the reference.
      show: print the message.
    """
    reference = reference or spec.reference_trace
    exercise, cases = spec.exercise, spec.cases()
    n = len(cases)
    result = None
    if report.flagged is not None:
        result = CheckResult(
            exercise, False,
            f"{FAIL_MARK} {exercise}: {label} {report.flagged}\n"
            f"  hint:     the check compares your answer with the library's own code: write "
            f"it yourself, from the inputs it is given.", n, flagged=report.flagged)
    for number, case in enumerate(cases, start=1):
        if result is not None:
            break
        if number > len(report.traces):
            result = CheckResult(exercise, False, f"{FAIL_MARK} {exercise}: the answer's run "
                                 f"stopped before case {number}", n, number)
            break
        trace = report.traces[number - 1]
        try:
            if isinstance(trace, Raised | Mismatch):
                raise trace
            spec.compare(case, reference(case), trace)
        except Raised as exc:
            if exc.not_implemented:
                result = CheckResult(exercise, False,
                                     not_implemented_message(exercise, label, exc.fill), n,
                                     None, not_implemented=True)
            elif exc.reference:
                flag = f"calls the library's {exc.reference}" + (
                    f" (at {exc.where})" if exc.where else "")
                result = CheckResult(
                    exercise, False,
                    f"{FAIL_MARK} {exercise}: case {number} of {n}: {label} {flag}\n"
                    f"  hint:     the check compares your answer with that very function: "
                    f"write it yourself.", n, number, flagged=flag)
            else:
                lines = [f"{FAIL_MARK} {exercise}: case {number} of {n} raised an error in "
                         f"{label}",
                         f"  case:     {case.description}",
                         f"  error:    {exc.type_name}: {format_value(verbatim(exc.text))}"]
                if exc.where:
                    lines.append(f"  at:       {exc.where}")
                lines.append(f"  hint:     {case.hint}")
                result = CheckResult(exercise, False, "\n".join(lines), n, number)
        except Mismatch as diff:
            lines = [f"{FAIL_MARK} {exercise}: case {number} of {n} differs from the reference",
                     f"  case:     {case.description}",
                     f"  where:    {diff.what}",
                     f"  expected: {format_value(diff.expected)}",
                     f"  actual:   {format_value(diff.actual)}",
                     f"  hint:     {diff.hint or case.hint}"]
            if diff.hint:
                lines.append(f"  more:     {case.hint}")
            result = CheckResult(exercise, False, "\n".join(lines), n, number)
    if result is None:
        result = CheckResult(exercise, True, f"{PASS_MARK} {exercise}: all {n} cases pass", n)
    if show:
        print(result.message)
    return result


def run_check(spec: Spec, label: str, answer: Any, *, show: bool = True) -> CheckResult:
    """Checks an answer in this process: the answer runs first, on every case, with the
    library's implementation trapped; the reference runs after it, so nothing the answer
    could read holds the expected values."""
    return judge(spec, label, run_answer(spec, answer), show=show)


def loaded(module: str, *names: str) -> list[Any]:
    """The objects ``module.name`` (dotted names reach into classes), or [] when the module
    is not imported yet (then the answer has not reached it either, unless it imports it)."""
    mod = sys.modules.get(module)
    if mod is None:
        return []
    out = []
    for name in names:
        obj: Any = mod
        for part in name.split("."):
            obj = inspect.getattr_static(obj, part, None)
        if obj is not None:
            out.append(obj)
    return out


def first_difference(expected: np.ndarray, actual: np.ndarray, rtol: float,
                     atol: float) -> tuple[int, ...] | None:
    """Index of the first element where `actual` is not close to `expected` (or None)."""
    close = np.isclose(actual, expected, rtol=rtol, atol=atol) & np.isfinite(actual)
    if close.all():
        return None
    return tuple(int(i) for i in np.argwhere(~close)[0])


def as_array(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The answer's output as a float64 array of `shape`, or a `Mismatch` saying why not."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise Mismatch(f"type of {name}", verbatim(f"an array of shape {list(shape)}"),
                       verbatim(f"{type(value).__name__}: {format_value(value)}"),
                       f"return {name} as a numpy array (or a tensor) of shape "
                       f"{list(shape)}.") from None
    if arr.shape != shape:
        raise Mismatch(f"shape of {name}", verbatim(str(list(shape))),
                       verbatim(str(list(arr.shape))),
                       f"{name} must have shape {list(shape)} (time-major [T, B]).")
    return arr
