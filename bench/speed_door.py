"""``python -m bench.speed_door``: the speed door (`impala_lab.speed`) on and off, side by side.

    python -m bench.speed_door              # 10 pairs, seeds drawn at random
    python -m bench.speed_door --pairs 20

Each pair runs ``impala-lab train --env CartPole-v1 --stop-return 475`` twice on one seed drawn
at random for this run (printed), in fresh processes: once as shipped, once with
``IMPALA_LAB_PLAIN=1`` (the plain reading-path code), the order alternating from pair to pair so
that slow drifts of the machine touch both. Reported per figure (seconds from the process's
start to its first train step, to a trailing-100 mean of 475, and to its exit): the median of
each side and of the paired differences (plain minus door: what the door saves), with a
percentile bootstrap 95% interval of the median difference. Results go to
``docs/results/speed_door.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.seed_summary import median_difference

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
FIGURES = ("first_train_s", "seconds_to_target", "exit_s")
BOOTSTRAP = 5000


def run(plain: bool, seed: int, max_seconds: float = 60.0) -> dict[str, Any]:
    """One CLI run to 475: its start-up figure, its seconds to the target, its exit."""
    env = {**os.environ, "IMPALA_LAB_PLAIN": "1" if plain else "0", "MPLBACKEND": "Agg"}
    with tempfile.TemporaryDirectory(prefix="bench-speed-door-") as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "impala_lab.cli", "train", "--env", "CartPole-v1",
             "--stop-return", "475", "--max-seconds", str(max_seconds), "--seed", str(seed),
             "--quiet", "--out", f"{tmp}/run"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=max_seconds + 120)
        exit_s = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"impala-lab train exited with {proc.returncode}:\n"
                               f"{proc.stderr[-2000:]}")
        result = json.loads(Path(f"{tmp}/run/result.json").read_text())
    return {"plain": plain, "seed": seed, "exit_s": round(exit_s, 3),
            "first_train_s": result["final"]["startup"]["first_train_s"],
            "seconds_to_target": result["seconds_to_target"],
            "env_steps_to_target": result["env_steps_to_target"]}


def summarize(pairs: list[tuple[dict, dict]], rng: np.random.Generator) -> dict[str, Any]:
    """Per figure: each side's median, the median paired difference (plain - door) and its
    bootstrap 95% interval; pairs where either side missed the target are counted apart."""
    out: dict[str, Any] = {"pairs": len(pairs)}
    for figure in FIGURES:
        both = [(d[figure], p[figure]) for d, p in pairs
                if d[figure] is not None and p[figure] is not None]
        door, plain = (np.array(side, np.float64) for side in zip(*both, strict=True))
        saves, interval = median_difference(plain - door, rng, BOOTSTRAP)
        out[figure] = {"n": len(both), "door": float(np.median(door)),
                       "plain": float(np.median(plain)), "saves": saves, "interval": interval}
    return out


def markdown(summary: dict[str, Any]) -> str:
    rows = ["| figure (seconds from process start) | n | door | plain | door saves [95%] |",
            "| --- | ---: | ---: | ---: | --- |"]
    for figure in FIGURES:
        f = summary[figure]
        lo, hi = f["interval"]
        rows.append(f"| {figure} | {f['n']} | {f['door']:.2f} | {f['plain']:.2f} | "
                    f"{f['saves']:+.2f} [{lo:+.2f}, {hi:+.2f}] |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speed_door",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="seeds, one pair each")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error(f"--pairs={args.pairs}: it must be >= 2 for an interval")
    seeds = [random.SystemRandom().randrange(10_000) for _ in range(args.pairs)]
    print(f"[bench.speed_door] seeds drawn for this run: {seeds}", flush=True)
    pairs = []
    for i, seed in enumerate(seeds):
        order = (False, True) if i % 2 == 0 else (True, False)
        runs = {plain: run(plain, seed) for plain in order}
        pairs.append((runs[False], runs[True]))
        print(f"[bench.speed_door] seed {seed}: door {runs[False]}, plain {runs[True]}",
              flush=True)
    summary = summarize(pairs, np.random.default_rng(0))
    table = markdown(summary)
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed_door.json").write_text(json.dumps(
        {"seeds": seeds, "pairs": pairs, "summary": summary}, indent=1))
    (args.out / "speed_door.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
