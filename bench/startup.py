"""``python -m bench --only startup`` (or ``python -m bench.startup``): how soon a run works.

    python -m bench --only startup              # 5 rounds
    python -m bench.startup --rounds 9

Each round, in fresh processes and alternating which goes first:

- ``python -c "import tensorflow"``, timed around the subprocess: the floor that any run which
  trains a TensorFlow policy pays;
- ``impala-lab train --env CartPole-v1 --max-env-steps 50000`` (the tuned preset, process
  backend), whose ``stats()["startup"]`` says, from the process's start, when the first
  sample reached the driver (``first_sample_s``) and when the learner first reported trained
  steps (``first_train_s``).

Reported: the median of each over the rounds, and the ratio of the run's figures to the
TensorFlow import measured in the same rounds (the machine's speed cancels out of it). The
issue's targets, on a quiet machine: the first sample within 1 s and the first train step
within 2.5 s of the process's start. Results go to ``docs/results/startup.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
TARGETS = {"first_sample_s": 1.0, "first_train_s": 2.5}


def time_tensorflow_import() -> float:
    """Seconds for a fresh interpreter to import TensorFlow and exit."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, env=env,
                   capture_output=True)
    return time.perf_counter() - t0


def run_startup(max_env_steps: int = 50_000) -> dict[str, float]:
    """A short CLI run's ``startup`` figures (seconds from its process's start)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "impala_lab.cli.main", "train", "--env", "CartPole-v1",
             "--max-env-steps", str(max_env_steps), "--seed", "0", "--quiet", "--out", tmp],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"impala-lab train exited with {proc.returncode}:\n"
                               f"{proc.stderr[-2000:]}")
        startup = json.loads((Path(tmp) / "result.json").read_text())["final"]["startup"]
    if startup["first_sample_s"] is None or startup["first_train_s"] is None:
        raise RuntimeError(f"the run ended before it sampled and trained: {startup}")
    return startup


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Medians over the rounds, each figure's ratio to the TensorFlow import, the targets."""
    med = {k: round(statistics.median(r[k] for r in rounds), 3)
           for k in ("import_tensorflow_s", "first_sample_s", "first_train_s")}
    return {"n": len(rounds), "median": med,
            "ratio_to_import_tensorflow": {
                k: round(statistics.median(r[k] / r["import_tensorflow_s"] for r in rounds), 3)
                for k in TARGETS},
            "targets": {k: {"limit_s": v, "met": med[k] <= v} for k, v in TARGETS.items()}}


def markdown(summary: dict[str, Any]) -> str:
    m, r, t = summary["median"], summary["ratio_to_import_tensorflow"], summary["targets"]
    rows = [f"| figure (median of {summary['n']} rounds) | seconds | x `import tensorflow` "
            "| target |", "| --- | --- | --- | --- |",
            f"| `python -c \"import tensorflow\"` | {m['import_tensorflow_s']:.2f} | 1.00 | |"]
    for key, label in (("first_sample_s", "process start to the first sample"),
                       ("first_train_s", "process start to the first train step")):
        verdict = "met" if t[key]["met"] else "not met"
        rows.append(f"| {label} | {m[key]:.2f} | {r[key]:.2f} | <= {t[key]['limit_s']:g} s: "
                    f"{verdict} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both measurements")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}: it must be >= 1")
    rounds = []
    for i in range(args.rounds):
        first, second = (time_tensorflow_import, run_startup)[::1 if i % 2 == 0 else -1]
        a, b = first(), second()
        tf_s, startup = (a, b) if first is time_tensorflow_import else (b, a)
        rounds.append({"import_tensorflow_s": round(tf_s, 3), **startup})
        print(f"[bench.startup] round {i + 1}: import tensorflow {tf_s:.2f} s; first sample "
              f"{startup['first_sample_s']:.2f} s, first train step "
              f"{startup['first_train_s']:.2f} s", flush=True)
    summary = summarize(rounds)
    table = markdown(summary)
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(
        {"rounds": rounds, "summary": summary, "loadavg_at_end": list(os.getloadavg())},
        indent=1))
    (args.out / "startup.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
