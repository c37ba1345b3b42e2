"""The time-to-solve bench of ``python -m bench``: fresh CLI runs on seeds drawn at random.

    draw_seeds(n)                               n distinct seeds drawn at random
    time_to_solve(seed, max_seconds)            ``impala-lab train --stop-return 475``, timed
    summarize_solves(runs, max_seconds)         solve rate, median and worst, stayed solved

Each run is ``impala-lab train`` in its own process, so a figure counts the interpreter's
start, TensorFlow's import and the shutdown, as a user waits for them.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pipeline import ENV, REPO

SEED_RANGE = 10_000  # seeds are drawn from [0, SEED_RANGE): short enough to read and retype
STAY_FLOOR = 400.0  # "stays solved": the trailing mean never below this after the target
# A window after the target shorter than asked by more than one report interval (the CLI's
# default, 1 s) did not run to its end (the run's cap came first): it does not count as stayed.
WINDOW_SLACK_S = 1.0


def draw_seeds(n: int, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct seeds drawn at random (from the OS's entropy unless ``rng``), in the
    order drawn: a bench run checks seeds that no test and no earlier run chose."""
    rng = rng or random.SystemRandom()
    return rng.sample(range(SEED_RANGE), n)


def time_to_solve(seed: int, max_seconds: float = 150.0, stop_return: float = 475.0,
                  extra_args: tuple[str, ...] = (), *, train_after_target: float | None = None,
                  solve_limit_s: float | None = None) -> dict[str, Any]:
    """``impala-lab train --env CartPole-v1 --stop-return 475`` in a fresh process
    (``extra_args`` come last: ``("--env", ...)`` there trains another env).

    Wall seconds are measured around the subprocess (interpreter start, TensorFlow import and
    the shutdown after solving included); ``seconds_to_target`` and ``env_steps_to_target``
    come from its result.json (from the CLI's process start to the first check that met
    the target; `Impala.train` checks every 0.1 s). ``reached``: the run met the target
    before its cap; ``solved``: it did so within ``solve_limit_s`` seconds of its process
    start (any time if None). A run that never reached it reports None for the targets.

    With ``train_after_target`` the CLI keeps training that many seconds after the target
    (``--train-after-target``) and reports the lowest trailing mean over those reports
    (``return_min_after_target``) and how long it trained on (``seconds_after_target``).
    """
    after = () if train_after_target is None else ("--train-after-target",
                                                   str(train_after_target))
    with tempfile.TemporaryDirectory(prefix="bench-solve-") as tmp:
        cmd = [sys.executable, "-m", "impala_lab.cli.main", "train", "--env", ENV,
               "--stop-return", str(stop_return), *after, "--max-seconds", str(max_seconds),
               "--seed", str(seed), "--quiet", "--out", tmp, *extra_args]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=max_seconds + (train_after_target or 0) + 120)
        wall = time.perf_counter() - t0
        result_file = Path(tmp) / "result.json"
        if proc.returncode != 0 or not result_file.is_file():
            raise RuntimeError(f"time_to_solve(seed={seed}): impala-lab exited with "
                               f"{proc.returncode}:\n{proc.stderr[-2000:]}")
        result = json.loads(result_file.read_text())
    final = result.get("final", {})
    reached = bool(result["solved"])
    seconds = result["seconds_to_target"]
    return {"seed": seed, "reached": reached,
            "solved": reached and (solve_limit_s is None or seconds <= solve_limit_s),
            "wall_s": round(wall, 2),
            "seconds_to_target": seconds,
            "env_steps_to_target": result["env_steps_to_target"],
            "train_after_target": train_after_target,
            "return_min_after_target": result.get("return_min_after_target"),
            "seconds_after_target": result.get("seconds_after_target"),
            "stop_reason": result.get("stop_reason"),
            "final_return_mean": final.get("episode_return_mean"),
            "final_env_steps": final.get("num_steps_sampled"),
            "best_return_mean": result.get("best_return_mean")}


def _window_complete(r: dict[str, Any], after_s: float) -> bool:
    """A run trained on after its target for the whole window (and reported its low)."""
    secs = r.get("seconds_after_target")
    return (r.get("return_min_after_target") is not None and secs is not None
            and secs >= after_s - WINDOW_SLACK_S)


def summarize_solves(runs: list[dict[str, Any]], max_seconds: float, *,
                     solve_limit_s: float | None = None, after_s: float | None = None,
                     stay_floor: float = STAY_FLOOR) -> dict[str, Any]:
    """Solve rate, median and worst over seeds, and how many solved seeds stayed solved.

    A run ``solved`` if it reached the target within ``solve_limit_s`` of its process start
    (`time_to_solve` decides). For the seconds and env steps, a run that never reached the
    target counts as infinitely slow: a median over such seeds is None and fails its target,
    and so is the worst (``max_s``, ``max_env_steps``), so neither hides a failure; a run that
    reached it after the limit counts with its time (and fails the solve rate).

    "Stayed" (with ``after_s``, the seconds trained on after the target; not measured, None,
    without): a solved run's trailing mean never fell below ``stay_floor`` over the whole
    window; ``lowest_after_target`` is the lowest of those means over the solved runs (None if
    there are none, or if one has no complete window), so it meets ``>= stay_floor`` exactly
    when every solved run stayed.
    """
    runs = [{**r, "stayed": (None if after_s is None or not r["solved"] else
                             _window_complete(r, after_s)
                             and r["return_min_after_target"] >= stay_floor)} for r in runs]
    reached = [r.get("reached", r["solved"]) for r in runs]
    secs = [r["seconds_to_target"] if ok else math.inf for r, ok in zip(runs, reached)]
    steps = [r["env_steps_to_target"] if ok else math.inf for r, ok in zip(runs, reached)]
    solved = [r for r in runs if r["solved"]]
    complete = (after_s is not None and bool(solved)
                and all(_window_complete(r, after_s) for r in solved))

    def finite(x: float, digits: int | None = 2) -> float | int | None:
        if not math.isfinite(x):
            return None
        return round(x, digits) if digits is not None else int(x)

    return {"runs": runs, "seeds": [r["seed"] for r in runs], "num_runs": len(runs),
            "num_solved": len(solved), "num_reached": sum(reached),
            "solve_rate": round(len(solved) / len(runs), 4) if runs else None,
            "max_seconds": max_seconds, "solve_limit_s": solve_limit_s,
            "median_s": finite(statistics.median(secs)),
            "min_s": finite(min(secs)), "max_s": finite(max(secs)),
            "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 2),
            "median_env_steps": finite(statistics.median(steps), None),
            "min_env_steps": finite(min(steps), None),
            "max_env_steps": finite(max(steps), None),
            "after_s": after_s, "stay_floor": stay_floor,
            "num_stayed": sum(r["stayed"] is True for r in runs),
            "lowest_after_target": (round(min(r["return_min_after_target"] for r in solved), 2)
                                    if complete else None)}
