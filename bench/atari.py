"""``python -m bench.atari``: Atari from pixels (the atari extra), the tuned presets over an hour.

Not part of ``make bench``: one run is an hour. Timed parts hold the machine's bench lock
(``flock /tmp/impala_bench.lock python -m bench.atari ...``), one run per call, so the lock is
held at most about 65 minutes at a time.

    python -m bench.atari timings                          # the parts' costs (about 2 minutes)
    python -m bench.atari run --env ALE/Pong-v5 --seeds 1  # one 60-minute run, seed drawn
    python -m bench.atari report                           # the table and the curves

timings   in a child process with the worker processes' environment (one BLAS thread): the
          env's agent step (`impala_lab.envs.make_env`, random actions, resets included),
          the actors' numpy forward per frame (`NumpyModel.logits` over B = 8, 16, 32 frames)
          and the learner's train step per frame (`VTracePolicy.learn_on_batch` on a train
          batch of the preset's size) with 1 and 2 TensorFlow intra-op threads. Each as wall
          and CPU time: on a shared machine the CPU time is the part's own cost.
run       ``impala-lab train --env ENV --max-seconds 3600 --seed S`` (the tuned preset) in a
          fresh process, on seeds drawn at random and printed. Each run is appended to
          ``docs/results/atari_runs.jsonl`` as it ends: the trailing-100 return at 10, 20, 30
          and 60 minutes from the process's start, the minutes to +18 (Pong), agent steps
          and env frames (4 per agent step) per second end to end (over the process's wall
          time), the load average before and after, and the curve.
report    ``docs/results/atari_results.md`` and ``docs/results/atari_curves.png`` from the
          saved runs, with each env's summary over its seeds (the return at 60 minutes and
          the minutes to its target: solve rate, median, worst) and the IMPALA paper's
          scores (table C.1) beside them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MPLBACKEND", "Agg")

from bench import machine, pipeline, solves

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "docs" / "results"
RUNS_FILE = RESULTS / "atari_runs.jsonl"
FRAME_SKIP = 4  # env frames per agent step (`impala_lab.envs.atari`)
MINUTES = (10, 20, 30, 60)
TARGETS = {"ALE/Pong-v5": 18.0}
# The IMPALA paper's table C.1: scores after 200M env frames (50M agent steps), up to 30
# no-ops at the start, no sticky actions, an episode ended at each lost life in training.
PAPER = {"ALE/Pong-v5": {"IMPALA (shallow)": 20.40, "IMPALA (deep)": 20.98},
         "ALE/Breakout-v5": {"IMPALA (shallow)": 640.43, "IMPALA (deep)": 787.34}}
PAPER_FRAMES = 200e6


# ---------------------------------------------------------------------- timings
def env_step_us(env_id: str, steps: int = 3000, seed: int = 0) -> tuple[float, float]:
    """Microseconds per agent step of the preprocessed env under random actions: (wall,
    CPU). The CPU time is what the step costs; the wall time adds what other processes took."""
    import numpy as np

    from impala_lab.envs import make_env

    env = make_env(env_id, disable_env_checker=True)
    env.reset(seed=seed)
    actions = np.random.default_rng(seed).integers(env.action_space.n, size=steps)
    t0, c0 = time.perf_counter(), time.process_time()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return ((time.perf_counter() - t0) / steps * 1e6, (time.process_time() - c0) / steps * 1e6)


def forward_us_per_frame(env_id: str, batch: int) -> tuple[float, float]:
    """Microseconds of the actors' numpy forward (`NumpyModel.logits`) per frame at B: (the
    best wall time of 7 repeats, the CPU time over all of them)."""
    import numpy as np

    from impala_lab.cli.play import policy_model
    from impala_lab.config import ImpalaConfig
    from impala_lab.envs import make_env

    env = make_env(env_id)
    model = policy_model(ImpalaConfig.tuned(env_id), env.observation_space, env.action_space)
    model.set_weights(model.initial_weights(0))
    obs = np.random.default_rng(0).integers(0, 256, (batch, *env.observation_space.shape),
                                            dtype=np.uint8)
    number = max(3, 400 // batch)
    c0 = time.process_time()
    best = min(timeit.repeat(lambda: model.logits(obs), number=number, repeat=7)) / number
    cpu = (time.process_time() - c0) / (7 * number)
    return best / batch * 1e6, cpu / batch * 1e6


def actor_timings(env_id: str) -> dict[str, float]:
    """`env_step_us` and `forward_us_per_frame` in a child started as the workers are."""
    from impala_lab.backends.process import ACTOR_THREAD_ENV

    code = ("import json, sys; from bench.atari import env_step_us, forward_us_per_frame; "
            "e = sys.argv[1]; t = {'env_step_us': env_step_us(e)}; "
            "t.update({f'forward_b{b}_us_per_frame': forward_us_per_frame(e, b) "
            "for b in (8, 16, 32)}); print(json.dumps(t))")
    return pipeline.json_from_child(code, env_id,
                                    env={**ACTOR_THREAD_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"})


def learner_timings(env_id: str, threads: int, seconds: float = 10.0) -> dict[str, Any]:
    """The learner alone, in a child with ``threads`` TensorFlow intra-op threads:
    learn_on_batch on one train batch of the preset's size, sampled by a worker."""
    code = ("import json, sys; from bench.atari import _learner_child; "
            "print(json.dumps(_learner_child(sys.argv[1], int(sys.argv[2]), "
            "float(sys.argv[3]))))")
    return pipeline.json_from_child(code, env_id, str(threads), str(seconds),
                                    env={"TF_CPP_MIN_LOG_LEVEL": "3"})


def _learner_child(env_id: str, threads: int, seconds: float) -> dict[str, Any]:
    from bench.multi_gpu import make_batches
    from impala_lab.config import ImpalaConfig
    from impala_lab.driver.build import make_learner, probe_spaces

    config = ImpalaConfig.tuned(env_id, seed=0, tf_intra_op_threads=threads)
    [batch] = make_batches(config, 1, seed=0)
    policy, _ = make_learner(config, *probe_spaces(env_id))
    for _ in range(3):  # the first calls trace the step
        policy.learn_on_batch(batch)
    steps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        policy.learn_on_batch(batch)
        steps += 1
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"threads": threads, "train_batch_size": batch.count, "steps": steps,
            "ms_per_step": round(elapsed / steps * 1e3, 2),
            "cpu_ms_per_step": round(cpu / steps * 1e3, 2),
            "us_per_frame": round(elapsed / steps / batch.count * 1e6, 2),
            "cpu_us_per_frame": round(cpu / steps / batch.count * 1e6, 2)}


def timings(env_id: str, log: Any = print) -> dict[str, Any]:
    load_before = os.getloadavg()
    out: dict[str, Any] = {"env": env_id, "machine": machine.machine_info(),
                           **{k: [round(x, 1) for x in v]
                              for k, v in actor_timings(env_id).items()}}
    out["learner"] = [learner_timings(env_id, n) for n in (1, 2)]
    out["loadavg_before"], out["loadavg_after"] = load_before, os.getloadavg()
    log(json.dumps({k: v for k, v in out.items() if k != "machine"}))
    return out


# ---------------------------------------------------------------------- the hour runs
def read_curve(metrics: Path, offset_s: float) -> list[tuple[float, int, float]]:
    """(seconds from process start, agent steps, trailing-100 return) per report row."""
    rows = []
    with metrics.open() as f:
        for row in csv.DictReader(f):
            ret = row.get("episode_return_mean") or "nan"
            rows.append((round(float(row["time_total_s"]) + offset_s, 1),
                         int(float(row["num_steps_sampled"])), float(ret)))
    return rows


def at_minutes(curve: list[tuple[float, int, float]], minutes: float) -> float | None:
    """The trailing-100 return of the last report at or before ``minutes``."""
    before = [r for t, _, r in curve if t <= minutes * 60.0 and r == r]
    return round(before[-1], 2) if before else None


def at_steps(curve: list[tuple[float, int, float]], steps: int) -> float | None:
    """The trailing-100 return of the last report at or before ``steps`` agent steps (what
    a tuning run is judged by: it needs no bench lock)."""
    before = [r for _, s, r in curve if s <= steps and r == r]
    return round(before[-1], 2) if before else None


def minutes_to(curve: list[tuple[float, int, float]], target: float) -> float | None:
    hit = next((t for t, _, r in curve if r >= target), None)
    return None if hit is None else round(hit / 60.0, 1)


def one_run(env_id: str, seed: int, minutes: float, extra: tuple[str, ...] = (),
            gif_dir: Path | None = RESULTS) -> dict[str, Any]:
    """``impala-lab train --env ENV --max-seconds`` for ``minutes`` in a fresh process; the
    GIF of the trained policy goes to ``gif_dir`` (None: nowhere, as for tuning runs)."""
    load_before = os.getloadavg()
    commit = _commit()  # the code that trains, not what HEAD is when the hour ends
    with tempfile.TemporaryDirectory(prefix="bench-atari-") as tmp:
        cmd = [sys.executable, "-m", "impala_lab.cli.main", "train", "--env", env_id,
               "--max-seconds", str(minutes * 60.0), "--seed", str(seed), "--quiet",
               "--out", tmp, *extra]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=HERE.parent, env=env, capture_output=True, text=True,
                              timeout=minutes * 60.0 + 600)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{env_id} seed {seed}: impala-lab exited with "
                               f"{proc.returncode}:\n{proc.stderr[-2000:]}")
        result = json.loads((Path(tmp) / "result.json").read_text())
        rows = read_curve(Path(tmp) / "metrics.csv", 0.0)
        config = json.loads((Path(tmp) / "config.json").read_text())
        gif = Path(tmp) / "policy.gif"
        if gif_dir is not None and gif.is_file():
            name = f"atari_{env_id.split('/')[-1].split('-')[0].lower()}_{seed}.gif"
            (gif_dir / name).write_bytes(gif.read_bytes())
    steps = result["final"]["num_steps_sampled"]
    # The driver's clock starts after the interpreter and TensorFlow: shift the curve by
    # what the process's wall time adds, so that minutes count from the process's start.
    offset = max(0.0, wall - result["final"]["time_total_s"] - 1.0)
    curve = [(round(t + offset, 1), s, r) for t, s, r in rows]
    target = TARGETS.get(env_id)
    return {"env": env_id, "seed": seed, "minutes": minutes, "wall_s": round(wall, 1),
            "extra_args": list(extra), "config": config,
            "return_at_minutes": {m: at_minutes(curve, m) for m in MINUTES if m <= minutes},
            "return_at_agent_steps": {n: at_steps(curve, n) for n in range(500_000, 20_000_001,
                                                                          500_000)
                                      if n <= curve[-1][1]} if curve else {},
            "target": target, "minutes_to_target": minutes_to(curve, target)
            if target is not None else None,
            "final_return_mean": result["final"].get("episode_return_mean"),
            "best_return_mean": result.get("best_return_mean"),
            "agent_steps": steps, "agent_steps_per_s": round(steps / wall, 1),
            "env_frames_per_s": round(FRAME_SKIP * steps / wall, 1),
            "health": result.get("health"),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "commit": commit, "curve": curve[::max(1, len(curve) // 400)]}


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip()


def runs(env_id: str, seeds: int, minutes: float, extra: tuple[str, ...],
         path: Path = RUNS_FILE, log: Any = print) -> list[dict[str, Any]]:
    drawn = solves.draw_seeds(seeds)
    log(f"[atari] {env_id}: seeds drawn at random for this run: {drawn}", flush=True)
    done = []
    for seed in drawn:
        r = one_run(env_id, seed, minutes, extra, gif_dir=RESULTS if path == RUNS_FILE else None)
        RESULTS.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:  # saved as each run ends
            f.write(json.dumps(r) + "\n")
        log(f"[atari] {env_id} seed {seed}: {r['return_at_minutes']}, to target "
            f"{r['minutes_to_target']} min, {r['agent_steps_per_s']} agent steps/s", flush=True)
        done.append(r)
    return done


# ---------------------------------------------------------------------- the report
def load_runs(path: Path = RUNS_FILE) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def markdown(all_runs: list[dict[str, Any]]) -> str:
    lines = ["| env | seed | return at 10 / 20 / 30 / 60 min | minutes to +18 | agent steps "
             "| agent steps/s | env frames/s | load before, after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in all_runs:
        at = r["return_at_minutes"]
        returns = " / ".join("-" if at.get(str(m), at.get(m)) is None else
                             f"{at.get(str(m), at.get(m)):g}" for m in MINUTES)
        to = r["minutes_to_target"]
        lines.append(
            f"| {r['env']} | {r['seed']} | {returns} | "
            f"{'-' if r['target'] is None else ('not reached' if to is None else to)} | "
            f"{r['agent_steps'] / 1e6:.2f}M | {r['agent_steps_per_s']:,.0f} | "
            f"{r['env_frames_per_s']:,.0f} | {r['loadavg_before'][0]:.1f}, "
            f"{r['loadavg_after'][0]:.1f} |")
    lines += ["", *summary(all_runs)]
    lines += ["", "The IMPALA paper (table C.1, after 200M env frames):", "",
              "| env | " + " | ".join(next(iter(PAPER.values()))) + " |",
              "| --- | --- | --- |"]
    for env_id, scores in PAPER.items():
        lines.append(f"| {env_id} | " + " | ".join(f"{v:g}" for v in scores.values()) + " |")
    return "\n".join(lines)


def summary(all_runs: list[dict[str, Any]]) -> list[str]:
    """One line per env over its seeds: the return at 60 minutes (median, worst) and, where
    the env has a target, how many seeds reached it and the minutes to it (median, worst; a
    seed that never reached it counts as slower than every seed that did)."""
    lines = []
    for env_id in dict.fromkeys(r["env"] for r in all_runs):
        own = [r for r in all_runs if r["env"] == env_id]
        at_60 = [x for r in own if (x := r["return_at_minutes"].get("60")) is not None]
        text = f"- {env_id}, {len(own)} seed{'s' * (len(own) > 1)}:"
        if at_60:
            text += f" return at 60 min median {median(at_60):g}, worst {min(at_60):g}"
        target = own[0]["target"]
        if target is not None:
            minutes = [math.inf if r["minutes_to_target"] is None else r["minutes_to_target"]
                       for r in own]
            shown = [("not reached" if math.isinf(m) else f"{m:g}")
                     for m in (median(minutes), max(minutes))]
            text += (f"; {target:+g} reached on {sum(map(math.isfinite, minutes))}/{len(own)}, "
                     f"minutes to it median {shown[0]}, worst {shown[1]}")
        lines.append(text)
    return lines


def plot(all_runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env"] for r in all_runs))
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 3.6), squeeze=False)
    for ax, env_id in zip(axes[0], envs):
        top = -math.inf
        for r in (r for r in all_runs if r["env"] == env_id):
            t = [p[0] / 60.0 for p in r["curve"]]
            ax.plot(t, [p[2] for p in r["curve"]], label=f"seed {r['seed']}")
            top = max([top, *(p[2] for p in r["curve"] if p[2] == p[2])])
        paper = sorted(PAPER.get(env_id, {}).items(), key=lambda item: item[1])
        if paper and top > 0 and paper[0][1] > 3 * top:  # lines that far up flatten the curves
            ax.text(0.02, 0.97, "paper, 200M frames (off this scale): " + ", ".join(
                f"{name} {score:g}" for name, score in paper), transform=ax.transAxes,
                va="top", fontsize=7, color="grey")
            paper = []
        for i, (name, score) in enumerate(paper):  # the top label above its line, others below
            ax.axhline(score, ls=":", color="grey")
            ax.annotate(f"paper, {name}, 200M frames", (0, score), fontsize=7,
                        va="bottom" if i == len(paper) - 1 else "top", color="grey")
        if env_id in TARGETS:
            ax.axhline(TARGETS[env_id], ls="--", color="tab:red", lw=0.8)
        ax.set(title=env_id, xlabel="minutes from process start",
               ylabel="trailing-100 return")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(log: Any = print) -> None:
    all_runs = load_runs()
    (RESULTS / "atari_results.md").write_text(markdown(all_runs) + "\n")
    if all_runs:
        plot(all_runs, RESULTS / "atari_curves.png")
    log(markdown(all_runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.atari",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    t = sub.add_parser("timings", help="the parts' costs")
    t.add_argument("--env", default="ALE/Pong-v5")
    r = sub.add_parser("run", help="runs of the tuned preset on seeds drawn at random")
    r.add_argument("--env", default="ALE/Pong-v5")
    r.add_argument("--seeds", type=int, default=1)
    r.add_argument("--minutes", type=float, default=60.0)
    r.add_argument("--runs-file", type=Path, default=RUNS_FILE,
                   help="where each run is appended (tuning runs: docs/results/"
                   "atari_tuning.jsonl, kept out of the report)")
    r.add_argument("extra", nargs="*", help="more impala-lab train options, after --")
    sub.add_parser("report", help="the table and the curves from the saved runs")
    args = parser.parse_args(argv)
    if args.part == "timings":
        out = timings(args.env)
        RESULTS.mkdir(parents=True, exist_ok=True)
        with (RESULTS / "atari_timings.jsonl").open("a") as f:
            f.write(json.dumps(out) + "\n")
    elif args.part == "run":
        runs(args.env, args.seeds, args.minutes, tuple(args.extra), args.runs_file)
        if args.runs_file == RUNS_FILE:
            report()
    else:
        report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
