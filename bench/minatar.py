"""``python -m bench --only minatar`` (or ``python -m bench.minatar``): MinAtar from pixels.

Not part of the default ``make bench`` (the solve runs take up to 10 minutes per game).

    python -m bench --only minatar                  # one random seed per game
    python -m bench.minatar --seeds 3               # three per game
    python -m bench.minatar --skip-solve            # the timings alone (about a minute)
    python -m bench.minatar --games Breakout,Freeway

It measures, per game (Asterix, Breakout, Freeway, Seaquest and SpaceInvaders, the -v1 ids):

  forward    the env's own step (one env, random actions) against the actors' numpy forward
             per env step (`NumpyModel.logits` on B = 8 and 16 observations, divided by B),
             for the small CNN and the IMPALA network as the game's tuned preset builds them;
             both in one child process with the worker processes' environment (one BLAS
             thread, `ACTOR_THREAD_ENV`). Target: the small CNN's at most a third of the env
             step.
  learner    the learner's samples/s: `VTracePolicy.learn_on_batch` on pre-made train batches
             of the preset's size, for both networks.
  solve      ``impala-lab train --env MinAtar/<Game>-v1 --stop-return R --max-seconds 600
             --seed S`` (the tuned preset) in a fresh process, on seeds drawn at random per run
             and printed. Target: the trailing-100 mean reaches R, MinAtar's actor-critic
             figure at 5M frames (`GAMES`), within 10 minutes of the process's start on every
             seed. Reported:
             seconds and env steps to the target, and frames/s end to end (env steps sampled
             over the run's wall seconds, process start included).
  cpu        a tuned run of CPU_SECONDS with the small CNN: the cores its driver process
             (driver loop and learner) and each worker process used over the middle of the
             run (from /proc), which side is the bottleneck.
  impala     the same command with ``--conv-net impala`` for IMPALA_SECONDS (no target): the
             IMPALA network's frames/s end to end and the mean return it reached.

Results go to ``docs/results/minatar_results.json`` and ``docs/results/minatar_results.md`` (the
README's
MinAtar table); the CartPole results of ``python -m bench`` are left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MPLBACKEND", "Agg")

from bench import machine, pipeline, solves
from bench.soak import child_pids
from impala_lab.stats import jsonable

HERE = Path(__file__).resolve().parent
# What the bench measured lives beside the docs that quote it, not among the bench's code.
RESULTS = HERE.parent / "docs" / "results"
# The actor-critic figures of MinAtar's README (its learning_curves.gif, read off the plot):
# the higher of AC(0.8) and AC(0) at 5M frames, each curve the mean of 30 runs, with all 6
# actions (the -v1 ids here keep the game's own). Seaquest's is from MinAtar <= 1.0.10, whose
# oxygen bar flashed full a step before it ran out; the installed 1.0.15 has the fix.
GAMES = {"MinAtar/Asterix-v1": 20.0, "MinAtar/Breakout-v1": 17.5, "MinAtar/Freeway-v1": 47.0,
         "MinAtar/Seaquest-v1": 16.0, "MinAtar/SpaceInvaders-v1": 185.0}
MAX_SECONDS = 600.0  # 10 minutes from process start
IMPALA_SECONDS = 120.0  # the IMPALA network's end-to-end run
CPU_SECONDS = 60.0  # the run whose processes' CPU use is sampled
FORWARD_SHARE_TARGET = 1 / 3  # the small CNN's forward per env step, over the env step


def env_step_us(env_id: str, steps: int = 20_000, seed: int = 0) -> float:
    """Microseconds per step of one env under random actions (resets included)."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id, disable_env_checker=True).unwrapped
    env.reset(seed=seed)
    actions = np.random.default_rng(seed).integers(env.action_space.n, size=steps)
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, _, _ = env.step(a)
        if terminated:
            env.reset()
    return (time.perf_counter() - t0) / steps * 1e6


def forward_us_per_step(env_id: str, conv_net: str, batch: int) -> float:
    """Microseconds of the numpy policy forward (`NumpyModel.logits`) per env step at B."""
    import gymnasium as gym
    import numpy as np

    from impala_lab.cli.play import policy_model
    from impala_lab.config import ImpalaConfig

    config = ImpalaConfig.tuned(env_id, conv_net=conv_net)
    env = gym.make(env_id)
    model = policy_model(config, env.observation_space, env.action_space)
    model.set_weights(model.initial_weights(0))
    obs = np.random.default_rng(0).random((batch, *env.observation_space.shape)) < 0.2
    obs = obs.astype(np.uint8)  # as the batch holds them
    number = max(20, 20_000 // batch)
    best = min(timeit.repeat(lambda: model.logits(obs), number=number, repeat=5)) / number
    return best / batch * 1e6


def actor_timings(env_id: str) -> dict[str, float]:
    """`env_step_us` and `forward_us_per_step` (both networks, B = 8 and 16) measured side by
    side in a child process started as the workers are (one BLAS thread)."""
    from impala_lab.backends.process import ACTOR_THREAD_ENV

    code = ("import json, sys; from bench.minatar import env_step_us, forward_us_per_step; "
            "e = sys.argv[1]; t = {'env_step_us': env_step_us(e)}; "
            "t.update({f'forward_{n}_b{b}_us_per_step': forward_us_per_step(e, n, b) "
            "for n in ('cnn', 'impala') for b in (8, 16)}); print(json.dumps(t))")
    return pipeline.json_from_child(code, env_id,
                                    env={**ACTOR_THREAD_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker_pids(parent: int) -> list[int]:
    """The worker processes among ``parent``'s children (not multiprocess's tracker)."""
    pids = []
    for child in child_pids(parent):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            pids.append(child)
    return sorted(pids)


def actor_cpu_share(env_id: str, seconds: float = CPU_SECONDS) -> dict[str, Any]:
    """Cores used by the driver process (driver loop + learner) and by each worker process
    during a tuned run with the small CNN, sampled from 20 s after its start (TensorFlow
    imported, steps traced) to 10 s before its end."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "impala_lab.cli.main", "train", "--env", env_id, "--max-seconds",
             str(seconds), "--quiet", "--out", tmp], cwd=HERE.parent, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(20.0)
            pids = [proc.pid, *_worker_pids(proc.pid)]
            t0, before = time.perf_counter(), {p: _cpu_seconds(p) for p in pids}
            time.sleep(seconds - 30.0)
            elapsed, after = time.perf_counter() - t0, {p: _cpu_seconds(p) for p in pids}
        finally:
            _, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"actor_cpu_share({env_id}): impala-lab exited with "
                               f"{proc.returncode}:\n{err[-2000:]}")
    cores = {p: round((after[p] - before[p]) / elapsed, 2) for p in pids}
    return {"window_s": round(elapsed, 1), "driver_learner_cores": cores[proc.pid],
            "worker_cores": [cores[p] for p in pids[1:]]}


def learner_samples_per_s(env_id: str, conv_net: str, seconds: float = 8.0) -> dict[str, Any]:
    """The learner alone: learn_on_batch on pre-made batches of the preset's train size."""
    from bench.multi_gpu import make_batches
    from impala_lab.config import ImpalaConfig
    from impala_lab.driver.build import probe_spaces
    from impala_lab.learner.vtrace_policy import VTracePolicy

    config = ImpalaConfig.tuned(env_id, conv_net=conv_net, seed=0)
    [batch] = make_batches(config, 1, seed=0)
    policy = VTracePolicy(*probe_spaces(env_id), config)
    for _ in range(3):  # the first call traces the step
        policy.learn_on_batch(batch)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        policy.learn_on_batch(batch)
        steps += 1
    elapsed = time.perf_counter() - t0
    return {"train_batch_size": batch.count, "steps": steps,
            "samples_per_s": round(steps * batch.count / elapsed, 1),
            "ms_per_step": round(elapsed / steps * 1e3, 2)}


def solve_run(env_id: str, target: float, seed: int) -> dict[str, Any]:
    """One tuned run to ``target`` in a fresh process (`bench.solves.time_to_solve`)."""
    r = solves.time_to_solve(seed, MAX_SECONDS, target, ("--env", env_id),
                             solve_limit_s=MAX_SECONDS)
    return r


def impala_run(env_id: str, target: float, seed: int) -> dict[str, Any]:
    """The tuned preset with the IMPALA network for `IMPALA_SECONDS` (it stops early only if
    it reaches ``target``): its frames/s end to end and the return it reached."""
    r = solves.time_to_solve(seed, IMPALA_SECONDS, target,
                             ("--env", env_id, "--conv-net", "impala"))
    steps, secs = r["final_env_steps"], r.get("wall_s")
    r["frames_per_s"] = round(steps / secs, 1) if steps and secs else None
    return r


def run(seeds: int, skip_solve: bool, log: Any = print,
        games: dict[str, float] | None = None, solve_only: bool = False) -> dict[str, Any]:
    """Every measurement per game; ``solve_only`` keeps the solve runs alone (no timings,
    no CPU share, no IMPALA-network run), ``skip_solve`` drops them."""
    results: dict[str, Any] = {"machine": machine.machine_info(), "games": {}, "targets": []}
    for env_id, target in (games or GAMES).items():
        game: dict[str, Any] = {"stop_return": target}
        if not solve_only:
            _measure_costs(env_id, game, results, log)
        if not skip_solve:
            _solve_runs(env_id, target, seeds, game, results, log, impala=not solve_only)
        results["games"][env_id] = game
    return results


def _measure_costs(env_id: str, game: dict[str, Any], results: dict[str, Any],
                   log: Any) -> None:
    """The env step against the actors' forward, the cores a tuned run uses, and the
    learner's samples/s, into ``game``; the forward's target row into ``results``."""
    timings = actor_timings(env_id)
    step = timings["env_step_us"]
    game["env_step_us"] = round(step, 2)
    log(f"[minatar] {env_id}: env step {step:.1f} us", flush=True)
    for conv_net in ("cnn", "impala"):
        for batch in (8, 16):
            us = timings[f"forward_{conv_net}_b{batch}_us_per_step"]
            game[f"forward_{conv_net}_b{batch}_us_per_step"] = round(us, 2)
            log(f"[minatar]   {conv_net} forward, B={batch}: {us:.2f} us per env step "
                f"({us / step:.2f} of the env step)", flush=True)
        share = max(game[f"forward_cnn_b{b}_us_per_step"] for b in (8, 16)) / step
    results["targets"].append({"name": f"{env_id}: small CNN forward / env step "
                               "(worse of B=8, 16)", "value": round(share, 3),
                               "op": "<=", "limit": round(FORWARD_SHARE_TARGET, 3),
                               "ok": share <= FORWARD_SHARE_TARGET})
    game["cpu"] = actor_cpu_share(env_id)
    log(f"[minatar]   cores used in training (small CNN): driver + learner "
        f"{game['cpu']['driver_learner_cores']}, workers {game['cpu']['worker_cores']}",
        flush=True)
    for conv_net in ("cnn", "impala"):
        r = learner_samples_per_s(env_id, conv_net)
        game[f"learner_{conv_net}"] = r
        log(f"[minatar]   learner, {conv_net}: {r['samples_per_s']:,.0f} samples/s "
            f"({r['ms_per_step']} ms per batch of {r['train_batch_size']})", flush=True)


def _solve_runs(env_id: str, target: float, seeds: int, game: dict[str, Any],
                results: dict[str, Any], log: Any, impala: bool) -> None:
    """The tuned runs to ``target`` on seeds drawn at random (and, with ``impala``, one
    IMPALA-network run), into ``game``; their target row into ``results``."""
    drawn = solves.draw_seeds(seeds)
    log(f"[minatar]   solve: seeds drawn at random for this run: {drawn}", flush=True)
    runs = []
    for seed in drawn:
        r = solve_run(env_id, target, seed)
        steps, secs = r["final_env_steps"], r.get("wall_s")
        r["frames_per_s"] = round(steps / secs, 1) if steps and secs else None
        runs.append(r)
        log(f"[minatar]   seed {seed}: reached {target:g}: {r['solved']} "
            f"({r['seconds_to_target']} s, {r['env_steps_to_target']} env steps; "
            f"final mean {r['final_return_mean']}; {r['frames_per_s']} frames/s)",
            flush=True)
    game["solve"] = {"seeds": drawn, "runs": runs,
                     "num_solved": sum(r["solved"] for r in runs)}
    results["targets"].append({"name": f"{env_id}: seeds reaching {target:g} within "
                               f"{MAX_SECONDS:g} s", "value": game["solve"]["num_solved"],
                               "op": ">=", "limit": len(runs),
                               "ok": game["solve"]["num_solved"] == len(runs)})
    if not impala:
        return
    game["impala_run"] = impala_run(env_id, target, solves.draw_seeds(1)[0])
    r = game["impala_run"]
    log(f"[minatar]   IMPALA network, seed {r['seed']}, {IMPALA_SECONDS:g} s: "
        f"{r['frames_per_s']} frames/s, final mean {r['final_return_mean']}", flush=True)


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown tables: costs, solve runs, IMPALA-network runs (those that
    were measured)."""
    timed = {e: g for e, g in results["games"].items() if "env_step_us" in g}
    lines = ["| game | env step | small CNN fwd / step (B=8, 16) | IMPALA net fwd / step "
             "(B=8, 16) | learner samples/s (CNN, IMPALA) | cores in training: driver + "
             "learner, each worker |", "| --- | --- | --- | --- | --- | --- |"] if timed else []
    for env_id, g in timed.items():
        cpu = g.get("cpu")
        cores = (f"{cpu['driver_learner_cores']}; "
                 f"{', '.join(map(str, cpu['worker_cores']))}" if cpu else "")
        lines.append(
            f"| {env_id} | {g['env_step_us']} µs | {g['forward_cnn_b8_us_per_step']}, "
            f"{g['forward_cnn_b16_us_per_step']} µs | {g['forward_impala_b8_us_per_step']}, "
            f"{g['forward_impala_b16_us_per_step']} µs | "
            f"{g['learner_cnn']['samples_per_s']:,.0f}, "
            f"{g['learner_impala']['samples_per_s']:,.0f} | {cores} |")
    solved_games = [(e, g["solve"]) for e, g in results["games"].items() if "solve" in g]
    if solved_games:
        lines += ["", "| game | target | seed | reached | seconds to target | env steps to "
                  "target | final mean | frames/s end to end |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for env_id, s in solved_games:
            target = results["games"][env_id]["stop_return"]
            for r in s["runs"]:
                lines.append(f"| {env_id} | {target:g} | {r['seed']} | {r['solved']} | "
                             f"{r['seconds_to_target']} | {r['env_steps_to_target']} | "
                             f"{r['final_return_mean']} | {r['frames_per_s']} |")
    impala = [(e, g["impala_run"]) for e, g in results["games"].items() if "impala_run" in g]
    if impala:
        lines += ["", f"| game, IMPALA network ({IMPALA_SECONDS:g} s) | seed | env steps | "
                  "final mean | frames/s end to end |", "| --- | --- | --- | --- | --- |"]
        for env_id, r in impala:
            lines.append(f"| {env_id} | {r['seed']} | {r['final_env_steps']} | "
                         f"{r['final_return_mean']} | {r['frames_per_s']} |")
    return "\n".join(lines).strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.minatar",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1, metavar="N",
                        help="seeds per game for the solve runs, drawn at random (default 1)")
    parser.add_argument("--skip-solve", action="store_true", help="timings only")
    parser.add_argument("--solve-only", action="store_true",
                        help="the solve runs only: no timings, CPU share or IMPALA-network run")
    game_names = [g.split("/")[1].removesuffix("-v1") for g in GAMES]
    names = ", ".join(game_names)
    parser.add_argument("--games", default=",".join(game_names),
                        help=f"comma-separated games among {names} (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds={args.seeds}: it must be >= 1")
    wanted = [g.strip() for g in args.games.split(",") if g.strip()]
    games = {f"MinAtar/{g}-v1": GAMES[f"MinAtar/{g}-v1"] for g in wanted
             if f"MinAtar/{g}-v1" in GAMES}
    if len(games) != len(wanted) or not games:
        parser.error(f"--games={args.games!r}: choose among {names}")
    if args.skip_solve and args.solve_only:
        parser.error("--skip-solve and --solve-only together leave nothing to run")
    results = run(args.seeds, args.skip_solve, games=games, solve_only=args.solve_only)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "minatar_results.json").write_text(json.dumps(jsonable(results), indent=2))
    (args.out / "minatar_results.md").write_text(markdown(results) + "\n")
    print(markdown(results))
    for t in results["targets"]:
        print(f"{'PASS' if t['ok'] else 'FAIL'}  {t['name']}: {t['value']} {t['op']} {t['limit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
