"""The runs of ``python -m bench.seeds``: one process per seed and setting, ``jobs`` at once.

Each run writes its own folder. Run again over the same folders (after a kill, say), a train
run that was killed with the same command is resumed from its checkpoint (``--resume``), and
any other earlier run in its folder is replaced (``--overwrite``), so a run's metrics are
never another run's. A signal to the command (`halt`) ends the runs in flight with SIGTERM,
so each writes its outputs, and starts no other; so does a ``--metric`` that is not a column
of the first finished run's metrics.csv.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRAIN_MODULE = "impala_lab.cli.main"  # what a ``train ...`` setting runs (tests swap it)
_children: set[subprocess.Popen] = set()  # the runs in flight, for a signal to end
ending: list[int] = []  # the signal that is ending the command, once one came
_lock = threading.Lock()


def fail(message: str) -> None:
    """A bad argument: one line, exit code 2."""
    print(f"bench.seeds: error: {message}", file=sys.stderr)
    raise SystemExit(2)


@dataclass
class Run:
    """One seed of one setting: its command, where it writes, and what came back."""

    setting: str
    seed: int
    argv: list[str]
    out: Path
    returncode: int | None = None
    seconds: float = math.nan
    error: str = ""
    curves: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)  # metrics.csv's header
    how: str = "new"  # new, resumed or restarted (an earlier run was in its folder)


def command_for(template: str, seed: int, out: Path) -> list[str]:
    """The argv of one run: ``train ...`` becomes the impala-lab CLI with ``--seed``,
    ``--out`` and ``--quiet`` appended; another command fills ``{seed}`` and ``{out}``."""
    tokens = shlex.split(template)
    if tokens[:1] == ["impala-lab"]:
        tokens = tokens[1:]
    if tokens[:1] == ["train"]:
        return [sys.executable, "-m", TRAIN_MODULE, *tokens,
                "--seed", str(seed), "--out", str(out), "--quiet"]
    if "{seed}" not in template or "{out}" not in template:
        fail(f"the command {template!r} is not an impala-lab train command, so it must hold "
             "{seed} and {out} (where it writes metrics.csv)")
    return [t.format(seed=seed, out=out) for t in tokens]


def plan_runs(settings: dict[str, str], seeds: list[int], out: Path) -> list[Run]:
    """Every setting on every seed; the settings' order rotates from seed to seed, so no
    setting always runs first (or always beside the same neighbour)."""
    names = list(settings)
    runs = []
    for i, seed in enumerate(seeds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            run_out = out / name / f"seed_{seed}"
            runs.append(Run(name, seed, command_for(settings[name], seed, run_out), run_out))
    return runs


def read_curves(path: Path, x_key: str, metrics: list[str]
                ) -> tuple[dict[str, tuple[list[float], list[float]]], list[str]]:
    """Each metric's (x, y) from a metrics.csv (a missing or empty cell is NaN), and its
    header."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = list(reader.fieldnames or [])

    def num(row: dict, key: str) -> float:
        try:
            return float(row.get(key) or "nan")
        except ValueError:
            return math.nan

    xs = [num(r, x_key) for r in rows]
    return {m: (xs, [num(r, m) for r in rows]) for m in metrics}, columns


def continue_or_replace(run: Run) -> None:
    """An earlier run in a train run's folder: resumed if it was killed (``result.json``
    "running", a checkpoint) with this very command, else replaced (``--overwrite``)."""
    if run.argv[1:3] != ["-m", TRAIN_MODULE] or not run.out.is_dir():
        return
    names = {p.name for p in run.out.iterdir()} - {".lock"}
    if not names:
        return
    def read(name: str) -> dict:
        try:
            return json.loads((run.out / name).read_text())
        except (OSError, ValueError):
            return {}
    killed = (read("result.json").get("stop_reason") == "running"
              and read("run.json").get("argv") == run.argv[3:]
              and any((run.out / c / "state.json").is_file()
                      for c in ("checkpoint", "checkpoint.prev")))
    if killed:
        run.argv, run.how = [*run.argv[:3], "train", "--resume", str(run.out), "--quiet"], \
            "resumed"
    else:
        run.argv, run.how = [*run.argv, "--overwrite"], "restarted"


def execute(run: Run, x_key: str, metrics: list[str], timeout: float | None) -> Run:
    """Run one seed in a fresh process (resuming or replacing an earlier one in its folder),
    then read its curves."""
    run.out.mkdir(parents=True, exist_ok=True)
    fresh = list(run.argv)
    continue_or_replace(run)
    started = time.monotonic()
    code, stderr = _run_child(run.argv, timeout)
    if code == 2 and run.how == "resumed":  # the resume refused (nothing left): start again
        run.argv, run.how = [*fresh, "--overwrite"], "restarted"
        code, stderr = _run_child(run.argv, timeout)
    run.returncode = code
    if code is None:
        run.error = f"timed out after {timeout} s"
    elif ending:
        run.error = (f"ended by signal {ending[0]}" if isinstance(ending[0], int)
                     else "not finished: bench.seeds stopped")
    elif code != 0:
        lines = stderr.strip().splitlines()
        run.error = f"exit code {code}" + (f": {lines[-1]}" if lines else "")
    run.seconds = round(time.monotonic() - started, 2)
    metrics_csv = run.out / "metrics.csv"
    if metrics_csv.exists():
        run.curves, run.columns = read_curves(metrics_csv, x_key, metrics)
    elif not run.error:
        run.error = f"no {metrics_csv}"
    return run


def _run_child(argv: list[str], timeout: float | None) -> tuple[int | None, str]:
    """The exit code (None: timed out, then ended) and stderr of one run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "TF_CPP_MIN_LOG_LEVEL": "3"}
    with _lock:
        if ending:
            return -1, ""
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        _children.add(proc)
    try:
        try:
            _, stderr = proc.communicate(timeout=timeout)
            return proc.returncode, stderr
        except subprocess.TimeoutExpired:
            _end(proc)
            return None, ""
    finally:
        with _lock:
            _children.discard(proc)


def _end(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM (the run writes its outputs), then SIGKILL after ``grace_s``."""
    proc.terminate()
    try:
        proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def on_signal(signum: int, frame: Any) -> None:
    halt(signum)


def halt(why: int | str) -> None:
    """End every run in flight (each writes its outputs), and start no other: ``why`` is the
    signal that ends the command, or the bad argument found."""
    with _lock:
        if not ending:
            ending.append(why)
        for proc in _children:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)


def _close_columns(name: str, columns: list[str]) -> str:
    close = difflib.get_close_matches(name, columns, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def run_all(runs: list[Run], jobs: int, x_key: str, metrics: list[str],
            timeout: float | None, log: Any = None) -> list[Run]:
    """Run ``jobs`` at a time, printing a line as each ends (to ``log``, or stdout)."""
    done = 0
    log = log or sys.stdout

    def one(run: Run) -> Run:
        nonlocal done
        execute(run, x_key, metrics, timeout)
        unknown = [m for m in (x_key, *metrics) if run.columns and m not in run.columns]
        if unknown:  # a misspelt --metric or --x: the other runs would not tell more
            halt(f"{unknown[0]!r} is not a column of {run.out / 'metrics.csv'}"
                  + _close_columns(unknown[0], run.columns))
        done += 1
        status = "ok" if not run.error else f"FAILED: {run.error}"
        print(f"[{done}/{len(runs)}] {run.setting} seed {run.seed}: {run.seconds:.1f} s, "
              f"{status}", file=log, flush=True)
        return run

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, runs))


