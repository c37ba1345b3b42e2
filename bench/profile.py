"""``python -m bench.profile``: where a training run spends its time, sampled by py-spy.

    python -m bench.profile                      # tuned CartPole-v1, 2 workers, 10 s
    python -m bench.profile --num-sgd-iter 4     # the learner-bound run of `bench` #2
    python -m bench.profile --seconds 20 --top 25

Starts the tuned 2-worker CartPole-v1 run (`bench.pipeline.tuned_config`) in a child
process, lets it warm up, then samples the driver (its main loop and the learner thread)
and every worker process with ``py-spy record`` for ``--seconds`` at ``--rate`` Hz, all at
once. For each process it prints the functions that hold the most samples:

  self        the function (and line) running when the sample was taken
  inclusive   the function anywhere on the stack (so a caller includes its callees)

as a percentage of that process's samples. Idle threads are not sampled (py-spy's default),
so a thread blocked in ``select`` or a lock shows only while the OS counts it as running.
The raw py-spy files (flamegraph input) go to ``bench/out/profile/``. py-spy samples from
outside the process, so the run is barely slowed; it needs the ptrace permission (root, or
``kernel.yama.ptrace_scope = 0``).

This is how the driver's hot paths were found: a Keras ``get_weights`` per broadcast
(1.8 ms, under the learner's lock), a shared-memory open per weight read in the workers,
and tf.function's dispatch in every learner step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Start-up frames every sample of a process holds: left out of the inclusive table.
_BOOTSTRAP = re.compile(r"^(<module>|_run_code|_run_module_as_main|_run_module_code|run_path|"
                        r"spawn_main|_main|main|_child|BaseProcess\.\w+|Thread\.\w+) \(")
_FRAME_FILE = re.compile(r" \((?:.*/site-packages/|" + re.escape(str(REPO)) + r"/)?(.*?)\)$")


def _child(seconds: float, num_sgd_iter: int, num_workers: int) -> None:
    """The profiled run: prints its pids as one JSON line, then trains for ``seconds``."""
    sys.path.insert(0, str(REPO))
    from bench.pipeline import tuned_config
    from impala_lab.driver.impala import Impala

    config = tuned_config(num_workers=num_workers, num_sgd_iter=num_sgd_iter)
    with Impala(config) as run:
        print(json.dumps({"driver": os.getpid(), "workers": run.backend.worker_pids()}),
              flush=True)
        t0, n0, m0 = time.perf_counter(), run.num_steps_sampled, run.num_steps_trained
        run.train(max_seconds=seconds)
        dt = time.perf_counter() - t0
        print(json.dumps({"env_steps_per_s": (run.num_steps_sampled - n0) / dt,
                          "trained_per_s": (run.num_steps_trained - m0) / dt}), flush=True)


def aggregate(raw: str, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares of one py-spy ``--format raw`` file's text.

    Each raw line is ``frame;frame;...;frame COUNT``, outermost frame first, a frame being
    ``function (path:line)`` (with ``--threads`` the first is ``thread (tid): name``).

    Returns:
      ``{"samples", "threads": {name: share}, "self": [(frame, share)],
      "inclusive": [(function (path), share)]}``, shares in [0, 1], largest first.
    """
    self_count: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        if frames[0].startswith("thread ("):
            threads[frames[0].split(": ", 1)[-1]] += n
            frames = frames[1:]
        frames = [_FRAME_FILE.sub(r" (\1)", f) for f in frames]
        if frames:
            self_count[frames[-1]] += n
        # A recursive function counts once per sample.
        for fn in {re.sub(r":\d+\)$", ")", f) for f in frames}:
            if not _BOOTSTRAP.match(fn):
                incl[fn] += n

    def shares(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in counter.most_common(top)] if total else []

    return {"samples": total, "threads": dict(shares(threads)), "self": shares(self_count),
            "inclusive": shares(incl)}


def _format(name: str, agg: dict[str, Any]) -> str:
    lines = [f"== {name}: {agg['samples']} samples"]
    if agg["threads"]:
        lines.append("   threads: " + ", ".join(f"{t} {s:.0%}" for t, s in agg["threads"].items()))
    for kind in ("self", "inclusive"):
        lines.append(f"   -- {kind}")
        lines += [f"   {share:6.1%}  {frame[:110]}" for frame, share in agg[kind]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="profiled seconds")
    parser.add_argument("--warmup", type=float, default=8.0,
                        help="seconds of training before profiling starts")
    parser.add_argument("--num-sgd-iter", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15, help="rows per table")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "profile")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.warmup + args.seconds + 2.0, args.num_sgd_iter, args.num_workers)
        return 0
    for name in ("seconds", "warmup", "rate", "top", "num_sgd_iter", "num_workers"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be positive")
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        parser.error("py-spy is not installed: pip install py-spy (it is in the dev extra)")

    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.profile", "--child", "--seconds", str(args.seconds),
         "--warmup", str(args.warmup), "--num-sgd-iter", str(args.num_sgd_iter),
         "--num-workers", str(args.num_workers)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        pids = json.loads(child.stdout.readline() or "null")
        if not pids:
            raise RuntimeError(f"the profiled run ended before starting (exit code "
                               f"{child.wait()}); see its output above")
        time.sleep(args.warmup)
        targets = {"driver": pids["driver"],
                   **{f"worker {i} (pid {p})": p for i, p in enumerate(pids["workers"])}}
        spies = {}
        for name, pid in targets.items():
            raw = args.out / f"{name.split(' (')[0].replace(' ', '_')}.txt"
            cmd = [py_spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds)),
                   "--rate", str(args.rate), "--format", "raw", "--output", str(raw),
                   "--nonblocking"] + (["--threads"] if name == "driver" else [])
            spies[name] = (raw, subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE, text=True))
        report: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)},
                                  "processes": {}}
        for name, (raw, spy) in spies.items():
            _, err = spy.communicate(timeout=args.seconds + 60)
            if spy.returncode != 0 or not raw.exists():
                raise RuntimeError(f"py-spy could not sample {name}: {err.strip()[-500:]}\n"
                                   "It needs the ptrace permission: run as root or set "
                                   "kernel.yama.ptrace_scope=0.")
            report["processes"][name] = aggregate(raw.read_text(), args.top)
        throughput = json.loads(child.stdout.readline() or "{}")
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.terminate()
            child.wait(timeout=30)
    report["throughput"] = throughput
    for name, agg in report["processes"].items():
        print(_format(name, agg), end="\n\n")
    if throughput:
        print(f"run: {throughput['env_steps_per_s']:,.0f} env steps/s sampled over the whole "
              f"run (profiled part included)")
    (args.out / "profile.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}/profile.json and the raw py-spy files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
