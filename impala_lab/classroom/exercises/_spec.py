"""`Spec`: how one exercise is checked; `run_answer` runs an answer with the library trapped,
`judge` compares its traces with the reference's (here, or in another process)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from impala_lab.classroom.exercises._common import (
    FAIL_MARK,
    PASS_MARK,
    AnswerRaised,
    Case,
    CheckResult,
    Mismatch,
    format_value,
    not_implemented_message,
    verbatim,
)
from impala_lab.classroom.exercises._guard import Raised, forbid
from impala_lab.classroom.exercises._static import Rule, flag_answer


@dataclass(frozen=True)
class Spec:
    """How one exercise is checked, split so that the answer and the reference can run in
    different processes (the grader) or one after the other (a notebook).

    Attributes:
      exercise: the exercise's name.
      cases: the seeded cases, simplest first.
      answer_trace: runs the answer on a case and returns what it did, picklable (`portable`
        values; a `Mismatch` or `Raised` where it went wrong, at the end of a step list).
        It may raise `AnswerRaised` or `Mismatch`.
      reference_trace: the reference's trace of a case (never sees the answer).
      compare: raises `Mismatch` (or the answer's `Raised`) at the first difference.
      references: the library functions the answer must not call (of loaded modules only).
      forbidden: names the answer's code must not use (`_static`).
      draw: a fresh case drawn with the given `random.Random` (the grader's), or None.
      rule: a challenge's structural rule, or None.
    """

    exercise: str
    cases: Callable[[], list[Case]]
    answer_trace: Callable[[Any, Case], Any]
    reference_trace: Callable[[Case], Any]
    compare: Callable[[Case, Any, Any], None]
    references: Callable[[], list[Any]]
    forbidden: dict[str, str]
    draw: Callable[[random.Random], Case] | None = None
    rule: Rule | None = None


@dataclass
class AnswerReport:
    """The answer side's findings: a static flag, and a trace per case it got through."""

    flagged: str | None
    traces: list[Any]


def answer_traces(spec: Spec, answer: Any, cases: list[Case], *,
                  on_case: Callable[[int], None] | None = None) -> list[Any]:
    """One trace per case of the answer, references trapped, up to the first case that raised.
    `on_case`: called with a case's number before it runs (the grader's progress)."""
    traces: list[Any] = []
    with forbid(spec.references()):
        for number, case in enumerate(cases, start=1):
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
    return traces


def run_answer(spec: Spec, answer: Any, *, cases: list[Case] | None = None) -> AnswerReport:
    """The notebook's look: the code between the markers, then (if not flagged) traces."""
    flagged = flag_answer(answer, spec.forbidden, spec.rule)
    cases = spec.cases() if cases is None else cases
    return AnswerReport(flagged, [] if flagged else answer_traces(spec, answer, cases))


def _flagged(spec: Spec, label: str, flag: str, n: int) -> CheckResult:
    # A challenge's rule brings its own hint (the mistake it catches, and the way round it).
    hint = "" if "\n  hint:" in flag else (
        "\n  hint:     the check compares your answer with the library's own code: write it "
        "yourself, from the inputs it is given.")
    return CheckResult(spec.exercise, False, f"{FAIL_MARK} {spec.exercise}: {label} {flag}{hint}",
                       n, flagged=flag)


def _raised(spec: Spec, label: str, exc: Raised, case: Case, number: int,
            n: int) -> CheckResult:
    exercise = spec.exercise
    if exc.not_implemented:
        return CheckResult(exercise, False, not_implemented_message(exercise, label, exc.fill),
                           n, None, not_implemented=True)
    if exc.reference:
        flag = f"calls the library's {exc.reference}" + (
            f" (at {exc.where})" if exc.where else "")
        return CheckResult(exercise, False,
                           f"{FAIL_MARK} {exercise}: case {number} of {n}: {label} {flag}\n"
                           f"  hint:     the check compares your answer with that very "
                           f"function: write it yourself.", n, number, flagged=flag)
    lines = [f"{FAIL_MARK} {exercise}: case {number} of {n} raised an error in {label}",
             f"  case:     {case.description}",
             f"  error:    {exc.type_name}: {format_value(verbatim(exc.text))}"]
    if exc.where:
        lines.append(f"  at:       {exc.where}")
    lines.append(f"  hint:     {case.hint}")
    return CheckResult(exercise, False, "\n".join(lines), n, number)


def _differs(spec: Spec, diff: Mismatch, case: Case, number: int, n: int) -> CheckResult:
    lines = [f"{FAIL_MARK} {spec.exercise}: case {number} of {n} differs from the reference",
             f"  case:     {case.description}",
             f"  where:    {diff.what}",
             f"  expected: {format_value(diff.expected)}",
             f"  actual:   {format_value(diff.actual)}",
             f"  hint:     {diff.hint or case.hint}"]
    if diff.hint:
        lines.append(f"  more:     {case.hint}")
    return CheckResult(spec.exercise, False, "\n".join(lines), n, number)


def _judge_case(spec: Spec, label: str, case: Case, number: int, n: int,
                trace: Any) -> CheckResult | None:
    """The failure of one case, or None when it matches."""
    try:
        if isinstance(trace, Raised | Mismatch):
            raise trace
        spec.compare(case, spec.reference_trace(case), trace)
    except Raised as exc:
        return _raised(spec, label, exc, case, number, n)
    except Mismatch as diff:
        return _differs(spec, diff, case, number, n)
    except Exception as exc:  # a trace of a shape no honest answer gives: still its failure
        return CheckResult(spec.exercise, False,
                           f"{FAIL_MARK} {spec.exercise}: case {number} of {n}: what {label} "
                           f"returned could not be compared with the reference "
                           f"({type(exc).__name__}: {format_value(verbatim(str(exc)), 300)})\n"
                           f"  case:     {case.description}\n"
                           f"  hint:     {case.hint}", n, number)
    return None


def judge(spec: Spec, label: str, report: AnswerReport, *, cases: list[Case] | None = None,
          show: bool = True) -> CheckResult:
    """Compares the answer's traces with the reference's up to the first difference, prints
    (`show`) and returns the result; never raises. The reference runs only for the cases the
    answer got through (a stub never loads it). `label`: how messages call the answer;
    `cases`: those of the report's traces (default: the fixed ones)."""
    cases = cases or spec.cases()
    n = len(cases)
    result = None if report.flagged is None else _flagged(spec, label, report.flagged, n)
    for number, case in enumerate(cases, start=1):
        if result is not None:
            break
        if number > len(report.traces):
            result = CheckResult(spec.exercise, False, f"{FAIL_MARK} {spec.exercise}: the "
                                 f"answer's run stopped before case {number}", n, number)
        else:
            result = _judge_case(spec, label, case, number, n, report.traces[number - 1])
    if result is None:
        result = CheckResult(spec.exercise, True,
                             f"{PASS_MARK} {spec.exercise}: all {n} cases pass", n)
    if show:
        print(result.message)
    return result


def run_check(spec: Spec, answer: Any, *, label: str | None = None,
              show: bool = True) -> CheckResult:
    """Checks an answer in this process: the answer first, on every case, the library
    trapped; then the reference, so nothing the answer could read holds an expected value."""
    label = label or getattr(answer, "__name__", "the answer")
    return judge(spec, label, run_answer(spec, answer), show=show)
