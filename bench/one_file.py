"""``python -m bench --only one_file`` (or ``python -m bench.one_file``): the one-file IMPALA
against the library on CartPole-v1.

Not part of the default ``make bench`` (ten training runs, a few minutes).

    python -m bench --only one_file                 # 5 seeds drawn at random
    python -m bench.one_file --seeds 10 --max-seconds 90

On each seed, drawn at random for this run and printed, it runs one after the other, in a
fresh process each (the order alternates from seed to seed, so that slow drifts of the
machine touch both):

  one_file  ``python examples/impala_in_one_file.py --env CartPole-v1 --stop-return 475
            --max-seconds M --seed S``, timed from outside: the seconds from its launch to the
            moment its ``solved: ...`` line reaches the bench, and the env steps that line
            and the progress lines print (`read_run`); with ``OPENBLAS_NUM_THREADS=1``, as
            the library's actor processes have it
  library   ``impala-lab train --env CartPole-v1 --stop-return 475 --max-seconds M --seed S``
            (the README's command: the tuned preset; `solves.time_to_solve`)

and reports for each its solve rate (a trailing-100 mean of 475 within M seconds of the
process start), the median and the worst seconds and env steps to 475; a seed that never got
there counts as infinitely slow (`solves.summarize_solves`), so no figure hides a miss.

The one-file version checks the target every 0.05 s, the library every 0.1 s
(``Impala.train`` checks its stop condition between reports too). Both count from the
process's start: the library's as its CLI reports it (``result.json``), the file's on the
bench's clock from the moment the bench launches it.

Results go to ``docs/results/one_file_results.json`` and ``docs/results/one_file_results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench import pipeline, solves
from impala_lab.stats import jsonable

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "docs" / "results"  # what the bench measured, beside the docs
ONE_FILE = pipeline.REPO / "examples" / "impala_in_one_file.py"
STOP_RETURN = 475.0
SEEDS = 5
MAX_SECONDS = 120.0
SIDES = ("one_file", "library")


# What the one-file run prints (examples/impala_in_one_file.py's `main`): a progress line
# every --log-interval seconds, and one line when it reaches the target.
PROGRESS = re.compile(r"^\s*[\d.]+ s\s+steps\s+([\d,]+)\s+updates\s+(\d+)\s+return\s+(\S+)")
SOLVED = re.compile(r"^solved: .* after [\d.]+ s, ([\d,]+) env steps, (\d+) updates")
# One BLAS thread per process, as the library's actor processes run (backends/process.py).
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def read_run(lines: Iterable[str], clock: Callable[[], float], launched: float) -> dict[str, Any]:
    """What a one-file run's stdout ``lines`` say, timed on ``clock``: the seconds from
    ``launched`` (the clock when the process was started) to the ``solved:`` line, and the env
    steps, updates and trailing mean return of the last line that gave them."""
    out: dict[str, Any] = {"solved": False, "seconds_to_target": None, "env_steps": None,
                           "updates": None, "return_mean": None}
    for line in lines:
        now = clock()
        if m := PROGRESS.match(line):
            out.update(env_steps=int(m[1].replace(",", "")), updates=int(m[2]),
                       return_mean=float(m[3]))
        elif m := SOLVED.match(line):
            out.update(solved=True, seconds_to_target=round(now - launched, 2),
                       env_steps=int(m[1].replace(",", "")), updates=int(m[2]))
    return out


def one_file_run(seed: int, max_s: float, stop_return: float = STOP_RETURN,
                 script: Path = ONE_FILE) -> dict[str, Any]:
    """One run of the one-file IMPALA in a fresh process, timed from outside; a dict with the
    keys of `solves.time_to_solve` that `solves.summarize_solves` reads."""
    cmd = [sys.executable, str(script), "--env", pipeline.ENV, "--stop-return",
           str(stop_return), "--max-seconds", str(max_s), "--seed", str(seed),
           "--log-interval", "5"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", **ONE_BLAS_THREAD}
    with tempfile.TemporaryFile("w+") as err:
        launched = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=pipeline.REPO, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        watchdog = threading.Timer(max_s + 120, proc.kill)  # a run that hangs is killed
        watchdog.start()
        try:
            r = read_run(proc.stdout, time.perf_counter, launched)
            code = proc.wait()
        finally:
            watchdog.cancel()
        wall = time.perf_counter() - launched
        err.seek(0)
        if code != 0:
            raise RuntimeError(f"one_file_run(seed={seed}) exited with {code}:\n"
                               f"{err.read()[-2000:]}")
    reached = bool(r["solved"])
    return {"seed": seed, "reached": reached, "solved": reached, "wall_s": round(wall, 2),
            "seconds_to_target": r["seconds_to_target"],
            "env_steps_to_target": r["env_steps"] if reached else None,
            "updates": r["updates"], "final_return_mean": r["return_mean"]}


def compare(seeds: list[int], max_s: float, log: Any = print,
            runners: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both sides on every seed, alternating which goes first; their summaries."""
    runners = runners or {
        "one_file": lambda seed: one_file_run(seed, max_s),
        "library": lambda seed: solves.time_to_solve(seed, max_s, STOP_RETURN,
                                                     solve_limit_s=max_s)}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for i, seed in enumerate(seeds):
        for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
            load = os.getloadavg()[0]
            r = {**runners[side](seed), "load_at_start": round(load, 2)}
            runs[side].append(r)
            got = (f"475 after {r['seconds_to_target']:.1f} s, "
                   f"{r['env_steps_to_target']:,} env steps" if r["solved"] else
                   f"no 475 within {max_s:g} s")
            log(f"  seed {seed} ({i + 1}/{len(seeds)}) {side:>8}: {got} (wall {r['wall_s']:.1f} s,"
                f" load {load:.2f})", flush=True)
    return {"seeds": seeds, "max_seconds": max_s, "stop_return": STOP_RETURN,
            "loadavg_at_end": list(os.getloadavg()),
            **{side: solves.summarize_solves(runs[side], max_s, solve_limit_s=max_s)
               for side in SIDES}}


def _sec(x: float | None) -> str:
    return "never (a seed missed)" if x is None else f"{x:.1f} s"


def markdown(r: dict[str, Any]) -> str:
    """The table of the docs page: one row per side, then every seed."""
    n = len(r["seeds"])
    lines = [f"CartPole-v1 to a trailing-100 mean of 475, {n} seeds drawn at random "
             f"({', '.join(map(str, r['seeds']))}), cap {r['max_seconds']:g} s, seconds from "
             "process start:", "",
             "| | solved | median s | worst s | median env steps |", "|---|---|---|---|---|"]
    for side, label in (("one_file", "examples/impala_in_one_file.py"),
                        ("library", "impala-lab train (tuned preset)")):
        s = r[side]
        steps = "—" if s["median_env_steps"] is None else f"{s['median_env_steps']:,}"
        lines.append(f"| {label} | {s['num_solved']}/{s['num_runs']} | "
                     f"{_sec(s['median_s'])} | {_sec(s['max_s'])} | {steps} |")
    lines += ["", "| seed | one file: s to 475 | library: s to 475 |", "|---|---|---|"]
    for a, b in zip(r["one_file"]["runs"], r["library"]["runs"]):
        cells = [f"{x['seconds_to_target']:.1f}" if x["solved"] else "—" for x in (a, b)]
        lines.append(f"| {a['seed']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.one_file",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=SEEDS, help="seeds drawn at random")
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS,
                        help="cap of each run, from its process start")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds={args.seeds}: it must be >= 1")
    seeds = solves.draw_seeds(args.seeds)
    print(f"one_file vs library, CartPole-v1 to 475, seeds drawn at random: {seeds} "
          f"(load {os.getloadavg()[0]:.2f})", flush=True)
    result = compare(seeds, args.max_seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "one_file_results.json").write_text(json.dumps(jsonable(result), indent=2))
    text = markdown(result)
    (args.out / "one_file_results.md").write_text(text + "\n")
    print("\n" + text)
    print(f"wrote {args.out / 'one_file_results.json'} and one_file_results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
