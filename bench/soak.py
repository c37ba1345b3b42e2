"""``python -m bench.soak``: train for a long time and watch for leaks and unbounded growth.

    python -m bench.soak                     # 10 minutes (the reference run)
    python -m bench.soak --minutes 2         # shorter
    python -m bench.soak --seconds 30 --out /tmp/soak   # the short form CI runs

Trains the tuned CartPole-v1 config (``bench.pipeline.tuned_config``: process backend,
2 workers x 8 envs, learner thread) and every ``--interval`` seconds records: the RSS of the
driver, of each worker and their total; the learner queue, the replay store, the batch
buffer and the requests in flight against their configured bounds; the driver's thread count,
open file descriptors and live child processes. Then it stops the run and checks:

  rss growth        (mean RSS of the last 10% of the run - mean RSS of the 10% right after
                    warm-up) / the latter, for the total and for the driver: <= 10%
                    (warm-up: the first 20% of the run or 60 s, whichever is shorter)
  queues bounded    every sampled size within its bound
  threads, fds      no more threads at the end than right after warm-up; open file
                    descriptors at most 4 more (blocks and pipes come and go)
  no worker failure the run never restarted a worker
  after stop        no child process left (the interpreter's resource tracker aside) and
                    the thread count back to what it was before the run

Runs shorter than 2 minutes report the RSS growth but do not judge it (the first minutes
hold TensorFlow's first traces and the allocator's growth; the figure is noise there).

Writes ``soak.json`` (every sample, the figures and the checks) and ``soak.png``, prints a
table with PASS/FAIL per check and exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MPLBACKEND", "Agg")

from bench.pipeline import proc_status_kb, tuned_config
from impala_lab.stats import jsonable

HERE = Path(__file__).resolve().parent
RSS_GROWTH_LIMIT = 0.10
MIN_SECONDS_FOR_RSS_CHECK = 120.0
FD_SLACK = 4  # pipes and shared-memory blocks come and go by one or two between samples


# ---------------------------------------------------------------------- /proc readers
def rss_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` in MB (1e6 bytes); None if the process is gone."""
    kb = proc_status_kb(pid, "VmRSS")
    return None if kb is None else kb * 1024 / 1e6


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """``(pid, stat fields after the command)`` of every live (non-zombie) process: the fields
    are state, ppid, pgrp, session, ... as /proc/PID/stat lists them."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            yield int(entry), fields


def child_pids(pid: int) -> list[int]:
    """Live (non-zombie) child processes of ``pid``."""
    return [child for child, fields in live_processes() if int(fields[1]) == pid]


def resource_tracker_pids() -> set[int]:
    """This interpreter's resource trackers: one helper each for its lifetime, not a leak."""
    pids = set()
    for name in ("multiprocess.resource_tracker", "multiprocessing.resource_tracker"):
        module = sys.modules.get(name)
        pid = getattr(getattr(module, "_resource_tracker", None), "_pid", None)
        if pid is not None:
            pids.add(pid)
    return pids


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------------- the run
def sample(run: Any, snapshot: dict[str, Any], t: float) -> dict[str, Any]:
    """One row of the soak record, from the run's stats snapshot and /proc."""
    me = os.getpid()
    pipe = snapshot["pipeline"]
    workers = {str(pid): rss_mb(pid) for pid in run.backend.worker_pids()}
    driver = rss_mb(me) or 0.0
    worker_total = sum(v for v in workers.values() if v is not None)
    helpers = resource_tracker_pids()
    return {
        "t": round(t, 3),
        "driver_rss_mb": round(driver, 2),
        "worker_rss_mb": {k: round(v, 2) for k, v in workers.items() if v is not None},
        "workers_rss_mb": round(worker_total, 2),
        "total_rss_mb": round(driver + worker_total, 2),
        "learner_queue_len": pipe["learner_queue_len"],
        "replay_stored": pipe["replay_stored"],
        "batch_buffer_steps": pipe["batch_buffer_steps"],
        "max_in_flight": max(pipe["in_flight"].values(), default=0),
        "threads": threading.active_count(),
        "open_fds": open_fds(),
        "child_processes": len([p for p in child_pids(me) if p not in helpers]),
        "num_steps_sampled": snapshot["num_steps_sampled"],
        "num_steps_trained": snapshot["num_steps_trained"],
        "sample_throughput": snapshot["sample_throughput"],
        "episode_return_mean": snapshot["episode_return_mean"],
        "num_worker_failures": snapshot["num_worker_failures"],
    }


def soak(seconds: float, interval: float = 2.0, **overrides: Any) -> dict[str, Any]:
    """Train the tuned config for ``seconds``, sampling every ``interval`` s; stop the run.

    Returns:
      ``{"config", "seconds", "interval", "build_s", "samples", "threads_before",
      "threads_after_stop", "children_after_stop", "final"}``; sample times ``t`` count
      from the start of training (``build_s`` is the time to build the run before it).
    """
    from impala_lab import Impala

    config = tuned_config(**{"backend": "process", "num_workers": 2, **overrides})
    threads_before = threading.active_count()
    samples: list[dict[str, Any]] = []
    built = time.monotonic()
    run = Impala(config)
    start = time.monotonic()  # sample times count from the start of training
    try:
        def on_report(snapshot: dict[str, Any]) -> None:
            samples.append(sample(run, snapshot, time.monotonic() - start))

        final = run.train(max_seconds=seconds, report_interval=interval, on_report=on_report)
        samples.append(sample(run, final, time.monotonic() - start))
    finally:
        run.stop()
    helpers = resource_tracker_pids()
    deadline = time.monotonic() + 10.0
    while True:  # processes and threads end within seconds of stop()
        children = [p for p in child_pids(os.getpid()) if p not in helpers]
        threads = threading.active_count()
        if (not children and threads <= threads_before) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {"config": config.to_dict(), "seconds": seconds, "interval": interval,
            "build_s": round(start - built, 2), "samples": samples,
            "threads_before": threads_before,
            "threads_after_stop": threads, "children_after_stop": children,
            "final": {k: v for k, v in final.items() if k != "pipeline"}}


# ---------------------------------------------------------------------- the checks
def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def analyse(record: dict[str, Any]) -> dict[str, Any]:
    """The figures and PASS/FAIL checks of a `soak` record (see the module docstring)."""
    samples = record["samples"]
    cfg = record["config"]
    seconds = record["seconds"]
    warmup = min(0.2 * seconds, 60.0)
    window = 0.1 * seconds
    end = samples[-1]["t"] if samples else 0.0
    # Each window holds at least 3 samples: a stalled driver (the learner's first trace on a
    # loaded machine) can leave a short window empty.
    later = [s for s in samples if s["t"] >= warmup]
    after = [s for s in later if s["t"] <= warmup + window]
    after = after if len(after) >= 3 else later[:3]
    last = [s for s in samples if s["t"] >= end - window]
    last = last if len(last) >= 3 else samples[-3:]
    figures: dict[str, Any] = {"warmup_s": round(warmup, 1), "window_s": round(window, 1),
                               "num_samples": len(samples)}
    for key in ("total_rss_mb", "driver_rss_mb", "workers_rss_mb"):
        base, tail = _mean([s[key] for s in after]), _mean([s[key] for s in last])
        figures[key.replace("_mb", "_after_warmup_mb")] = round(base, 1)
        figures[key.replace("_mb", "_end_mb")] = round(tail, 1)
        figures[key.replace("_rss_mb", "_rss_growth")] = round((tail - base) / base, 4)
    bounds = {"learner_queue_len": cfg["learner_queue_size"],
              "max_in_flight": cfg["max_sample_requests_in_flight_per_worker"],
              "replay_stored": cfg["replay_buffer_num_slots"],
              "batch_buffer_steps": cfg["train_batch_size"] - 1}
    for key, bound in bounds.items():
        figures[f"{key}_max"] = max((s[key] for s in samples), default=0)
        figures[f"{key}_bound"] = bound
    for key in ("threads", "open_fds"):
        figures[f"{key}_after_warmup"] = max((s[key] for s in after), default=None)
        figures[f"{key}_end"] = samples[-1][key] if samples else None
    figures["num_steps_sampled"] = samples[-1]["num_steps_sampled"] if samples else 0
    figures["threads_before"] = record["threads_before"]
    figures["threads_after_stop"] = record["threads_after_stop"]
    figures["children_after_stop"] = len(record["children_after_stop"])

    judged = seconds >= MIN_SECONDS_FOR_RSS_CHECK
    checks = []

    def check(name: str, ok: bool, value: str, gated: bool = True) -> None:
        checks.append({"name": name, "value": value,
                       "status": ("PASS" if ok else "FAIL") if gated else "INFO"})

    for key in ("total_rss_growth", "driver_rss_growth"):
        g = figures[key]
        check(f"{key.replace('_', ' ')} <= {RSS_GROWTH_LIMIT:.0%}",
              bool(g <= RSS_GROWTH_LIMIT), f"{g:+.1%}", gated=judged and bool(after and last))
    for key, bound in bounds.items():
        check(f"{key} <= {bound}", figures[f"{key}_max"] <= bound,
              f"max {figures[f'{key}_max']}")
    for key, slack in (("threads", 0), ("open_fds", FD_SLACK)):
        a, b = figures[f"{key}_after_warmup"], figures[f"{key}_end"]
        check(f"{key} end <= after warm-up" + (f" + {slack}" if slack else ""),
              a is not None and b is not None and b <= a + slack, f"{a} -> {b}")
    failures = samples[-1]["num_worker_failures"] if samples else 0
    check("no worker failures", failures == 0, str(failures))
    check("no child process after stop", figures["children_after_stop"] == 0,
          str(record["children_after_stop"]))
    check("threads after stop <= before the run",
          record["threads_after_stop"] <= record["threads_before"],
          f"{record['threads_before']} -> {record['threads_after_stop']}")
    check("samples taken", len(samples) >= 3, str(len(samples)))
    return {"figures": figures, "checks": checks,
            "passed": all(c["status"] != "FAIL" for c in checks)}


def format_table(analysis: dict[str, Any]) -> str:
    rows = [(c["name"], c["value"], c["status"]) for c in analysis["checks"]]
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    lines = [f"{'check':<{width}}  {'value':>{value_width}}  result"]
    lines += [f"{n:<{width}}  {v:>{value_width}}  {s}" for n, v, s in rows]
    return "\n".join(lines)


def plot(record: dict[str, Any], analysis: dict[str, Any], path: Path) -> Path:
    """RSS over time, queue sizes against their bounds, threads / fds / child processes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = record["samples"]
    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    ax = axes[0]
    for key, label in (("total_rss_mb", "total"), ("driver_rss_mb", "driver"),
                       ("workers_rss_mb", "workers")):
        ax.plot(t, [s[key] for s in samples], label=label)
    ax.axvline(analysis["figures"]["warmup_s"], color="gray", ls=":", label="end of warm-up")
    ax.set_ylabel("RSS (MB)")
    ax.set_title(f"soak: {record['config']['env']}, {record['config']['num_workers']} process "
                 f"workers, {record['seconds']:.0f} s")
    ax.legend(loc="lower right")
    ax = axes[1]
    for key, bound_key in (("learner_queue_len", "learner_queue_size"),
                           ("max_in_flight", "max_sample_requests_in_flight_per_worker")):
        (line,) = ax.plot(t, [s[key] for s in samples], label=key)
        ax.axhline(record["config"][bound_key], color=line.get_color(), ls="--",
                   label=f"bound ({bound_key})")
    ax.set_ylabel("items")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    for key in ("threads", "open_fds", "child_processes"):
        ax.plot(t, [s[key] for s in samples], label=key)
    ax.set_xlabel("seconds")
    ax.set_ylabel("count")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak",
                                     description=__doc__.split("\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=None, help="run length (default 10)")
    length.add_argument("--seconds", type=float, default=None, help="run length in seconds")
    parser.add_argument("--interval", type=float, default=None,
                        help="seconds between samples (default: 2, or less for short runs)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "soak",
                        help="directory for soak.json and soak.png")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else 60.0 * (args.minutes or 10.0)
    if not seconds > 0:
        parser.error(f"the run length must be positive, got {seconds} s")
    interval = args.interval or min(2.0, max(0.5, seconds / 60))
    if not interval > 0:
        parser.error(f"--interval must be positive, got {interval}")
    record = soak(seconds, interval)
    analysis = analyse(record)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(jsonable({**record, **analysis}), indent=2))
    try:
        plot(record, analysis, args.out / "soak.png")
    except Exception as exc:  # a plot must never cost the numbers
        print(f"soak: could not draw soak.png: {exc}", file=sys.stderr)
    f = analysis["figures"]
    print(f"soak: {seconds:.0f} s, {f['num_steps_sampled']:,} env steps, "
          f"{f['num_samples']} samples; total RSS {f['total_rss_after_warmup_mb']} -> "
          f"{f['total_rss_end_mb']} MB, driver {f['driver_rss_after_warmup_mb']} -> "
          f"{f['driver_rss_end_mb']} MB")
    print(format_table(analysis))
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    return 0 if analysis["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
