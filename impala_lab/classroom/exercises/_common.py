"""What every exercise checker shares: cases, results, the first difference and its message."""

from __future__ import annotations

import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MARK_START = "# ---- YOUR CODE STARTS HERE ----"
MARK_END = "# ---- YOUR CODE ENDS HERE ----"
PASS_MARK = "✓"
FAIL_MARK = "✗"

_PACKAGE_DIR = str(Path(__file__).resolve().parents[2])  # impala_lab/
_LIB_DIRS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
# Filenames the grader (``impala_lab_grader``) compiles a hand-in's cells under.
_CELL_FILENAME = re.compile(r"^<(?P<nb>[^,>]+), code cell (?P<n>\d+)>$")


def fast_mode() -> bool:
    """True when ``IMPALA_LAB_FAST=1``: notebooks shorten their training (CI sets it)."""
    return os.environ.get("IMPALA_LAB_FAST") == "1"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one checker call (truthy when every case passed).

    Attributes:
      message: what the checker printed: the pass line, or the first case that differs.
      failed_case: 1-based number of the first case that differs (None: passed, a stub, or
        flagged before any case ran).
      not_implemented: the answer still raises ``NotImplementedError``.
      flagged: what the answer did that no answer may do (e.g. call the library's
        implementation of what it writes), or None.
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
    """One seeded case: its inputs in a few words, a hint, and its traces' parameters."""

    description: str
    hint: str
    params: dict[str, Any] = field(default_factory=dict)


class Mismatch(Exception):
    """The answer differs from the reference in one case: where (e.g. ``"vs[2, 1]"``), the
    two values, and what to fix (the case's own hint follows it)."""

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
    """Text that `Mismatch` shows as is, not as a repr."""


verbatim = _Verbatim


def call_answer(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls the student's code; what it raises (not a MemoryError) becomes `AnswerRaised`."""
    try:
        return fn(*args, **kwargs)
    except (Mismatch, AnswerRaised, MemoryError):
        raise
    except Exception as exc:
        raise AnswerRaised(exc) from exc


def _is_student_file(filename: str) -> bool:
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    real = os.path.realpath(filename)
    return not any(real.startswith(d + os.sep) for d in (_PACKAGE_DIR, *_LIB_DIRS))


def _cell_label(filename: str) -> str | None:
    """``cell [N]`` for code run in IPython, the cell of a notebook the grader runs, or None."""
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


def _student_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of `exc`'s traceback in the student's code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_student_file(f.filename)]
    return frames[-1] if frames else None


def locate(exc: BaseException) -> str:
    """Where in the student's code `exc` was raised: ``cell [N], line L: `code``` or ""."""
    frame = _student_frame(exc)
    if frame is None:
        return ""
    cell = _cell_label(frame.filename)
    code = f": `{frame.line.strip()}`" if frame.line else ""
    return f"{frame.filename if cell is None else cell}, line {frame.lineno}{code}"


def _where_to_fill(exc: BaseException) -> str:
    frame = _student_frame(exc)
    if frame is None:
        return "in the cell that defines it, run that cell,"
    cell = _cell_label(frame.filename)
    if cell is None:
        return f"in {frame.filename} (line {frame.lineno}),"
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


def loaded(module: str, *names: str) -> list[Any]:
    """The objects ``module.name`` (dotted into classes), if the module is imported."""
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


def same(a: Any, b: Any) -> bool:
    """``a == b`` as a plain bool, False where the comparison itself raises."""
    try:
        return bool(a == b)
    except Exception:
        return False


def first_difference(expected: np.ndarray, actual: np.ndarray, rtol: float,
                     atol: float) -> tuple[int, ...] | None:
    """Index of the first element where `actual` is not close to `expected` (or None).
    Raises `Mismatch` when the shapes differ (no broadcasting: an empty array is not close)."""
    expected = np.asarray(expected)
    try:
        actual = np.asarray(actual, dtype=np.float64)
    except (TypeError, ValueError):
        actual = None
    if actual is None or actual.shape != expected.shape:
        raise Mismatch("the shape of the result", verbatim(str(list(expected.shape))),
                       verbatim("not an array" if actual is None else str(list(actual.shape))),
                       "The result must have exactly the reference's shape.")
    close = np.isclose(actual, expected, rtol=rtol, atol=atol) & np.isfinite(actual)
    if close.all():
        return None
    return tuple(int(i) for i in np.argwhere(~close)[0])


def named_slip(slips: dict[str, str], variant: Callable[[str], dict[str, Any]], name: str,
               actual: np.ndarray) -> str:
    """The hint of the first of `slips` whose `name` (``variant(slip)[name]``) is the numbers
    `actual` has, or ""."""
    for slip, hint in slips.items():
        guess = variant(slip)[name]
        if np.shape(guess) == actual.shape and first_difference(guess, actual, 1e-4,
                                                                1e-4) is None:
            return hint
    return ""


def window(labels: list[str], i: int, back: int, ahead: int, end: str) -> str:
    """`labels` around the `i`-th, marked ``→`` (or `end`, marked, when `i` is past them)."""
    lo = max(0, i - back)
    items = [("→ " if k == i else "") + s for k, s in enumerate(labels[lo:i + ahead], lo)]
    if i >= len(labels):
        items.append(f"→ {end}")
    return ("... " if lo else "") + ", ".join(items) + (" ..." if i + ahead < len(labels) else "")


def as_array(value: Any, name: str, shape: tuple[int, ...],
             shape_hint: Callable[[tuple[int, ...]], str] | None = None) -> np.ndarray:
    """The answer's output as a float64 array of `shape`, or a `Mismatch` saying why not
    (`shape_hint`: the hint for an array of another shape)."""
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
                       shape_hint(arr.shape) if shape_hint else
                       f"{name} must have shape {list(shape)} (time-major [T, B]).")
    return arr
