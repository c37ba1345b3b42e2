"""Grading one hand-in: every verdict decided here, from the hand-in's code and its data.

`grade_notebook` reads the notebook (`impala_lab_grader.notebook`: capped, no links), finds its
exercise, and decides the static verdict itself (`impala_lab_grader.static`: the markers, the
names, the challenge's rule, on every line the student wrote). Only then does the hand-in
run: its cells, exactly as checked, in a sandbox of its own (`impala_lab_grader.sandbox`)
against a student build of impala_lab without the exercise's implementations
(`impala_lab_grader.student_build`), under limits on time, memory, tasks and file size, in a
cgroup where one can be made. The child sends the answer's traces as data on one framed
channel (`impala_lab_grader.channel`); this process computes the reference and compares. A
hand-in cannot hang the batch, harm another hand-in, reach the expected values, or write a
verdict; every text of it reaches the output escaped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from impala_lab.classroom.exercises import Exercise
from impala_lab.classroom.exercises._common import FAIL_MARK, CheckResult
from impala_lab.classroom.exercises._guard import Raised
from impala_lab.classroom.exercises._spec import AnswerReport, judge
from impala_lab_grader import world
from impala_lab_grader.cgroup import Cgroup
from impala_lab_grader.channel import (
    NO_ANSWER,
    RESULT_CAP,
    WireError,
    escaped,
    from_data,
    read_frames,
)
from impala_lab_grader.child import all_cases, spec_of
from impala_lab_grader.notebook import (
    NotebookError,
    code_cells,
    exercise_of,
    parse_notebook,
    read_bytes,
    shown,
)
from impala_lab_grader.sandbox import (
    INSIDE_BUILD,
    INSIDE_HANDIN,
    Limits,
    NoSandbox,
    Outcome,
    bwrap_args,
    child_env,
    require_bwrap,
    run,
    seccomp_fd,
)
from impala_lab_grader.static import static_verdict
from impala_lab_grader.student_build import build_for

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MB = 2048
TASK_BACKSTOP = 64  # RLIMIT_NPROC above the task limit: the watchdog or the cgroup names it
# Where to look first when a hand-in of an exercise runs out of time or memory (its hint).
CULPRITS = {
    "minibatch_get": ("get(): self.inqueue.get() waits for ever once get() asks for more items "
                      "than the queue holds; take a new item only when self.ttl[self.idx] <= 0"),
    "replay_mix": ("the replay loop `while rng.random() < f:`: without `f -= 1` after each "
                   "replay it never ends once replay_proportion >= 1 (and the try-it cell's list "
                   "grows until memory runs out)"),
    "vtrace_numpy": ("the loop over the time steps: it runs T times, backwards (for t in "
                     "reversed(range(T)))"),
    "driver_step": ("the loop over driver.replay.mix(driver.completed_samples(timeout)): it ends "
                    "when the finished samples do; a loop of your own around it never does"),
    "vtrace_loss": ("the loops in vtrace_loss (V-trace needs none: vtrace.from_logits does it)"),
    "lstm_unroll": ("the loop over the time steps: it runs T times (for t in range(T)), one cell "
                    "step each"),
    "diag_gaussian": ("any loop between the markers: logp_and_entropy needs none (split inputs "
                      "in two halves, work on [N, D] arrays, sum over axis=-1)"),
    "minibatch_get_challenge": ("get(): a queue get() waits for ever once get() asks for more "
                                "items than the queue holds; take a new item only when the slot "
                                "you serve is empty"),
    "replay_mix_challenge": ("the loop that draws the replays: it must use up replay_proportion "
                             "(one less left after each replay), or it never ends once "
                             "replay_proportion >= 1"),
    "vtrace_numpy_challenge": ("the [T, T] arrays: they are T x T x B numbers, built once"),
    "driver_step_challenge": ("the loop over "
                              "driver.replay.mix(driver.completed_samples(timeout)): it ends "
                              "when the finished samples do; a loop of your own around it never "
                              "does"),
    "vtrace_loss_challenge": ("the loop over the time steps of your V-trace: it runs T times, "
                              "backwards"),
    "lstm_unroll_challenge": ("the loop over the time steps: it runs T times, one cell step each"),
    "diag_gaussian_challenge": ("any loop between the markers: the rule forbids them, and numpy "
                                "needs none"),
}
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from impala_lab_grader.child import main; main(sys.argv[2:])")


def fresh_seed() -> int:
    """A seed for the drawn cases of one grading (printed, so that it can be repeated)."""
    return secrets.randbelow(10**6)


@cache
def cgroup_support() -> str:
    """"" where a cgroup can be made for each sandbox, else why not (tried once)."""
    group, why = Cgroup.make(f"impala_lab_grader_probe_{os.getpid()}", 2**30, 64)
    if group is not None:
        group.remove()
    return why


def safe_name(name: str) -> str:
    """A notebook's file name as the sandbox and the messages about its cells know it."""
    return re.sub(r"[^\w.\-()]", "_", name)[:120] or "handin.ipynb"


def _cells_folder(name: str, cells: list[tuple[int, str]], tmp: Path) -> Path:
    """The cells the child runs, in a folder of their own that only the sandbox's user and
    this process read."""
    folder = tmp / "handin"
    folder.mkdir()
    target = folder / "cells.json"
    target.write_text(json.dumps({"notebook": name, "cells": cells}), encoding="utf-8")
    for path, mode in ((tmp, 0o755), (folder, 0o755), (target, 0o644)):
        os.chmod(path, mode)
    return folder


def child_command(sandboxed: bool, ex: Exercise, cells: Path, limits: Limits, seed: int,
                  seccomp: int | None, hide: list[str]) -> list[str]:
    """The grading child's command line (its last argument is the result pipe's fd, filled
    in by `impala_lab_grader.sandbox.run`)."""
    build = build_for(ex.name)
    args = [str(limits.memory_mb), str(limits.processes + TASK_BACKSTOP),
            str(limits.cpu_seconds), str(seed), "FD"]
    if sandboxed:
        return [*bwrap_args(build, cells, hide, seccomp), world.python(), "-I", "-B", "-c",
                _BOOT, INSIDE_BUILD, ex.name, f"{INSIDE_HANDIN}/cells.json", *args]
    return [sys.executable, "-I", "-B", "-c", _BOOT, str(build), ex.name,
            str(cells / "cells.json"), *args]


def _fail(ex: Exercise | None, name: str, message: str) -> CheckResult:
    return CheckResult(ex.name if ex else "", False, f"{FAIL_MARK} {name}: {message}", 0)


def _label(ex: Exercise) -> str:
    """How the checkers name the answer (the notebook's check cell names it so too)."""
    return f"{ex.answer}.get" if ex.name == "minibatch_get" else ex.answer


def grade_notebook(path: str | os.PathLike, *, timeout: float = DEFAULT_TIMEOUT_S,
                   memory_mb: int = DEFAULT_MEMORY_MB, seed: int | None = None,
                   sandboxed: bool = True, hide: list[str] | None = None,
                   show: bool = True) -> CheckResult:
    """Grades a hand-in (see the module docstring).

    Args:
      path: the notebook.
      timeout: seconds its cells and its answer may run, together.
      memory_mb: memory the hand-in may use, in MiB: the whole sandbox (with a cgroup), or
        each process's address space and all its processes' memory together.
      seed: the seed of the drawn cases (default: a fresh one).
      sandboxed: run it in bubblewrap (`impala_lab_grader.sandbox.NoSandbox` when there is
        none: a failed result that says how to install it); False runs it unisolated.
      hide: more folders the sandbox hides where a bound folder holds them (the batch's).
      show: print the message.

    Returns:
      The `CheckResult` (its ``exercise`` the exercise's name, "" when the notebook is
      none): the comparison's, or a failure that says why.
    """
    name = shown(Path(path).name)
    ex = None
    try:
        data = read_bytes(path)
        nb = parse_notebook(data, path)
        ex = exercise_of(path, nb)
        if sandboxed:
            require_bwrap()
        result = _grade(ex, nb, safe_name(Path(path).name), timeout, memory_mb, seed,
                        sandboxed, hide or [])
    except (NotebookError, NoSandbox, world.WorldError) as exc:
        result = _fail(ex, name, str(exc))
    except Exception as exc:  # the grader's own slip on this hand-in: the batch goes on
        result = _fail(ex, name, f"could not be graded: {type(exc).__name__}: {exc}")
    message = "\n".join(escaped(line) for line in result.message.split("\n"))
    result = dataclasses.replace(result, message=message)
    if show:
        print(result.message, flush=True)
    return result


def _grade(ex: Exercise, nb: dict[str, Any], name: str, timeout: float, memory_mb: int,
           seed: int | None, sandboxed: bool, hide: list[str]) -> CheckResult:
    spec = spec_of(ex)
    seed = fresh_seed() if seed is None else seed
    cases = all_cases(spec, seed)
    flag = static_verdict(ex, nb, name)
    if flag is not None:
        return judge(spec, _label(ex), AnswerReport(flag, []), cases=cases, show=False)
    limits = Limits(timeout, memory_mb)
    with tempfile.TemporaryDirectory(prefix="impala_lab_grade_") as tmp:
        cells = _cells_folder(name, code_cells(nb), Path(tmp))
        group = None
        if not cgroup_support():
            group, _ = Cgroup.make(f"impala_lab_grader_{os.getpid()}_{Path(tmp).name}",
                                   memory_mb * 2**20, limits.processes)
        try:
            with seccomp_fd() as fd:
                cmd = child_command(sandboxed, ex, cells, limits, seed,
                                    fd if sandboxed else None, hide)
                outcome = run(cmd, limits, cwd=tmp, env=child_env(), subreaper=not sandboxed,
                              pass_fds=(fd,) if sandboxed and fd is not None else (),
                              cgroup=group)
        finally:
            if group is not None:
                group.kill()
                group.remove()
    return _verdict(ex, name, outcome, limits, cases)


def _verdict(ex: Exercise, name: str, outcome: Outcome, limits: Limits,
             cases: list[Any]) -> CheckResult:
    where, final, problem = "", None, ""
    if outcome.data is not None:
        try:
            where, final = read_frames(outcome.data)
        except WireError as exc:
            where, problem = exc.where, str(exc)
    where = where or "the notebook"
    culprit = f"look at {CULPRITS.get(ex.name, 'the loops in the code between the markers')}"
    if outcome.stopped == "time":
        return _fail(ex, name, f"stopped after {limits.timeout:g} s (the time limit) while "
                     f"running {where}\n  hint:     an endless loop? {culprit}.")
    if outcome.stopped == "processes" or final == {"processes": True}:
        return _fail(ex, name, f"started more than {limits.processes} processes or threads "
                     f"(the limit) while running {where}: a hand-in runs in one process")
    if outcome.stopped == "memory" or final == {"memory": True}:
        return _fail(ex, name, f"ran out of memory (the limit is {limits.memory_mb} MB) while "
                     f"running {where}\n  hint:     an endless loop that keeps growing a "
                     f"list? {culprit}.")
    if outcome.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return _fail(ex, name, f"used more than {limits.cpu_seconds} s of CPU time (the "
                     f"limit) while running {where}\n  hint:     an endless loop? {culprit}.")
    if outcome.data is None:
        return _fail(ex, name, f"sent more than {RESULT_CAP // 2**20} MiB of results while "
                     f"running {where}")
    if problem == NO_ANSWER:
        rc = outcome.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        tail = escaped(outcome.log.strip()[-800:])
        return _fail(ex, name, f"the grading process ended ({how}) while running {where}, "
                     f"without a result; out of memory (the limit is {limits.memory_mb} MB)? "
                     f"{culprit}." + (f"\n  its last output: {tail}" if tail else ""))
    if problem:
        return _fail(ex, name, f"the grading process's answer is not one framed answer "
                     f"({problem}): the hand-in must not write to the grader's channel")
    if "error" in final:
        return _fail(ex, name, escaped(final["error"])[:3000])
    return _judge_result(ex, name, final["result"], cases)


def _reference_raised(traces: list[Any]) -> bool:
    """Whether a trace ends in the answer's call of a library function (its own message)."""
    last = [t[-1] if isinstance(t, list) and t else t for t in traces]
    return any(isinstance(t, Raised) and t.reference for t in last)


def _judge_result(ex: Exercise, name: str, result: dict[str, Any],
                  cases: list[Any]) -> CheckResult:
    try:
        traces, absent = from_data(result["traces"]), from_data(result["absent"])
        if not isinstance(traces, list) or not isinstance(absent, list) or not all(
                isinstance(a, str) for a in absent):
            raise WireError("traces or absent calls of the wrong type")
    except WireError as exc:
        return _fail(ex, name, f"the grading process's result is not a trace ({exc}): the "
                     f"hand-in must not write to the grader's pipe")
    flagged = None
    if absent and not _reference_raised(traces):
        # a call the traces do not show, e.g. from a thread of its own
        flagged = (f"calls the library's {absent[0][:100]}, which the grader's sandbox does "
                   f"not have")
    return judge(spec_of(ex), _label(ex), AnswerReport(flagged, traces), cases=cases,
                 show=False)
