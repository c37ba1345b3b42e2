"""A stand-in for a training run (no TensorFlow): writes a metrics.csv whose return climbs
to ``level + seed % 10`` over 10 reports, and an evaluation column ``eval_gap`` above it.

    python tests/data/fake_seed_run.py --seed 3 --out DIR [--level 100] [--eval-gap 5]
    [--fail-seed 7]
"""

import argparse
import csv
import sys
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, required=True)
p.add_argument("--out", type=Path, required=True)
p.add_argument("--level", type=float, default=100.0)
p.add_argument("--eval-gap", type=float, default=5.0)
p.add_argument("--fail-seed", type=int, default=None)
args = p.parse_args()
if args.seed == args.fail_seed:
    print("fake run: this seed fails on purpose", file=sys.stderr)
    sys.exit(3)
final = args.level + args.seed % 10
args.out.mkdir(parents=True, exist_ok=True)
with open(args.out / "metrics.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["time_total_s", "episode_return_mean", "evaluation.episode_return_mean_greedy"])
    w.writerow([1.0, "nan", ""])
    for t in range(2, 11):
        ret = final * t / 10
        w.writerow([float(t), ret, ret + args.eval_gap])
