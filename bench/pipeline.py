"""The pipeline benchmarks of ``python -m bench``: each returns a dict of plain numbers.

    sampling_ceiling(num_workers, seconds)      env steps/s of process workers, no learner
    end_to_end(num_workers, seconds)            env steps/s of the whole run, training
    sampling_side_by_side(num_workers, rounds)  the two above in alternating windows
    learner_ceiling(seconds)                    learn_on_batch samples/s on pre-made batches
    fed_learner(seconds, num_sgd_iter)          the learner's samples/s inside the pipeline
    learner_side_by_side(num_sgd_iter, rounds)  the two above in alternating windows
    draw_seeds(n)                               n distinct seeds drawn at random
    time_to_solve(seed, max_seconds)            ``impala-lab train --stop-return 475``, timed
    summarize_solves(runs, max_seconds)         solve rate, median and worst, stayed solved
    busy_processes(n)                           n spinning processes beside a block (load)
    machine_info()                              nproc, CPU model, python/TF versions

Every run uses ``ImpalaConfig.tuned("CartPole-v1")`` (what the CLI trains with) unless an
argument overrides a field. The ceilings take the same shapes as the pipeline: a worker
sample is [sample_batch_size, num_envs_per_worker], a train batch [sample_batch_size,
train_batch_columns].

A ratio of a pipeline figure to its ceiling says how much of what the parts can do the
driver delivers: the sampling ceiling against end to end shows what the learner thread and
the driver loop cost the actors (on 2 cores all three share the CPUs), the learner ceiling
against the fed learner shows what the actors and the driver cost the learner.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV = "CartPole-v1"
REPO = Path(__file__).resolve().parent.parent


def tuned_config(**overrides: Any) -> Any:
    """The tuned CartPole-v1 config (the CLI's defaults) with ``overrides``."""
    from impala_lab.config import ImpalaConfig

    return ImpalaConfig.tuned(ENV, **{"seed": 0, **overrides})


# ---------------------------------------------------------------------- memory
def json_from_child(code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Runs ``python -c code args...`` from the repository with ``env`` added to this
    process's environment; the JSON its last line of stdout prints (a failure raises
    ``CalledProcessError``). Timings taken apart from the bench's own process."""
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO,
                         env={**os.environ, **(env or {})}, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def proc_status_kb(pid: int, field: str) -> int | None:
    """A kB field of /proc/PID/status (e.g. ``VmRSS``); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class RssSampler:
    """Samples VmRSS of the driver and the workers every ``interval`` s in a thread.

    ``pids_fn`` returns the worker pids at each tick (workers may be replaced). The result
    holds the peak of the total (driver + workers, summed at one tick), the peak of each
    process (the larger of the sampled VmRSS and the kernel's VmHWM high-water mark), all in
    MB (1e6 bytes).
    """

    def __init__(self, pids_fn: Any, interval: float = 0.2) -> None:
        self._pids_fn = pids_fn
        self._interval = interval
        self._stop = threading.Event()
        self.peak_total_kb = 0
        self.peak_kb: dict[int, int] = {}
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)

    def _tick(self) -> None:
        pids = [os.getpid(), *self._pids_fn()]
        total = 0
        for pid in pids:
            rss = proc_status_kb(pid, "VmRSS") or 0
            hwm = proc_status_kb(pid, "VmHWM") or 0
            total += rss
            self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), rss, hwm)
        # A process's high-water mark may fall between ticks; the total then was at least it.
        self.peak_total_kb = max(self.peak_total_kb, total, *self.peak_kb.values())

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._tick()

    def __enter__(self) -> RssSampler:
        self._tick()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tick()  # the high-water marks at the end
        self._stop.set()
        self._thread.join(2.0)

    def result(self) -> dict[str, Any]:
        driver = os.getpid()
        workers = {p: kb for p, kb in self.peak_kb.items() if p != driver}
        return {"peak_total_mb": round(self.peak_total_kb * 1024 / 1e6, 1),
                "driver_peak_mb": round(self.peak_kb.get(driver, 0) * 1024 / 1e6, 1),
                "actor_peak_mb": round(max(workers.values(), default=0) * 1024 / 1e6, 1),
                "num_actors": len(workers)}


# ---------------------------------------------------------------------- 1. sampling
class _SamplingWorkers:
    """`sampling_ceiling`'s workers, kept alive so that windows can alternate with a run."""

    def __init__(self, num_workers: int, **overrides: Any) -> None:
        import gymnasium

        from impala_lab.actor.numpy_model import NumpyModel
        from impala_lab.backends import make_backend

        self.config = tuned_config(num_workers=num_workers, **overrides)
        env = gymnasium.make(self.config.env)
        weights = NumpyModel(env.observation_space, env.action_space,
                             self.config.model_spec).initial_weights(0)
        env.close()
        self.backend = make_backend(self.config)
        self.backend.prepare()
        try:
            self.workers = [self.backend.make_worker(i) for i in range(num_workers)]
            ref = self.backend.put_weights(weights, 0)
            for w in self.workers:
                w.set_weights(ref)
            for w in self.workers:  # started: the first sample of each is back
                w.sample().result()
        except BaseException:
            self.backend.shutdown()
            raise

    def window(self, seconds: float) -> tuple[int, float]:
        """(env steps, elapsed s) of about ``seconds`` of sampling as fast as the workers can;
        returns with no request in flight, so the workers are idle until the next window."""
        pending = {}
        for w in self.workers:
            for _ in range(self.config.max_sample_requests_in_flight_per_worker):
                pending[w.sample()] = w
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for fut in self.backend.wait(list(pending), timeout=1.0):
                worker = pending.pop(fut)
                steps += fut.result().count
                pending[worker.sample()] = worker
        elapsed = time.perf_counter() - t0
        for fut in pending:  # drain; the steps after the window are not counted
            fut.result()
        return steps, elapsed

    def close(self) -> None:
        self.backend.shutdown()


def sampling_ceiling(num_workers: int = 2, seconds: float = 10.0, **overrides: Any
                     ) -> dict[str, Any]:
    """Env steps/s of ``num_workers`` process workers sampling as fast as they can.

    The backend's handles are driven directly: one weights broadcast, then each worker
    keeps ``max_sample_requests_in_flight_per_worker`` requests queued and every finished
    sample is re-requested at once. Timing starts once every worker has returned its first
    sample (process start and env construction excluded).

    Returns:
      ``{"env_steps_per_s", "env_steps", "seconds", "num_workers", "envs_per_worker"}``.
    """
    bare = _SamplingWorkers(num_workers, **overrides)
    try:
        steps, elapsed = bare.window(seconds)
    finally:
        bare.close()
    return {"env_steps_per_s": round(steps / elapsed, 1), "env_steps": steps,
            "seconds": round(elapsed, 2), "num_workers": num_workers,
            "envs_per_worker": bare.config.num_envs_per_worker}


def _train_window(impala: Any, seconds: float) -> tuple[float, float, float, dict[str, Any]]:
    """(env steps/s sampled, samples/s trained, elapsed s, last stats) over ``seconds`` of
    ``Impala.train``."""
    t0, n0, m0 = time.perf_counter(), impala.num_steps_sampled, impala.num_steps_trained
    final = impala.train(max_seconds=seconds, report_interval=1.0)
    dt = time.perf_counter() - t0
    return ((impala.num_steps_sampled - n0) / dt, (impala.num_steps_trained - m0) / dt, dt,
            final)


def end_to_end(num_workers: int = 2, seconds: float = 15.0, warmup_s: float = 5.0,
               measure_memory: bool = False, **overrides: Any) -> dict[str, Any]:
    """Env steps/s (sampled and trained) of a whole tuned run, learner training.

    ``warmup_s`` of training first (worker start, the learner's first trace), then the
    counters' change over ``seconds`` of ``Impala.train``. With ``measure_memory`` the RSS of
    the driver and the workers is sampled throughout (`RssSampler`).

    Returns:
      ``{"env_steps_per_s", "trained_per_s", "train_throughput", "timing_breakdown",
      "episode_return_mean", "memory" (if measured), ...}``.
    """
    from impala_lab.driver.impala import Impala

    config = tuned_config(num_workers=num_workers, **overrides)
    impala = Impala(config)
    sampler = (RssSampler(impala.backend.worker_pids) if measure_memory else None)
    try:
        if sampler is not None:
            sampler.__enter__()
        impala.train(max_seconds=warmup_s, report_interval=1.0)
        sampled, trained, dt, final = _train_window(impala, seconds)
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
        impala.stop()
    timing = final["timing_breakdown"]
    grad_ms = timing.get("learner_grad_time_ms") or float("nan")
    out = {"env_steps_per_s": round(sampled, 1),
           "trained_per_s": round(trained, 1),
           "train_throughput": final["train_throughput"],
           # A train batch holds whole samples: [sample_batch_size, train_batch_columns].
           "learner_busy_samples_per_s": round(
               config.sample_batch_size * config.train_batch_columns / grad_ms * 1e3, 1),
           "seconds": round(dt, 2), "num_workers": num_workers,
           "num_sgd_iter": config.num_sgd_iter,
           "timing_breakdown": timing,
           "learner_queue_mean": final["learner_queue"].get("mean"),
           "episode_return_mean": final["episode_return_mean"]}
    if sampler is not None:
        out["memory"] = sampler.result()
    return out


# ---------------------------------------------------------------------- 2. learner
def _learn_loop(policy: Any, batches: list[Any], seconds: float) -> tuple[int, int, float]:
    """``learn_on_batch`` over ``batches`` in turn for ``seconds``: (steps, samples, elapsed)."""
    steps, samples, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = batches[steps % len(batches)]
        policy.learn_on_batch(batch)
        steps += 1
        samples += batch.count
    return steps, samples, time.perf_counter() - t0


def learner_ceiling(seconds: float = 8.0, warmup_steps: int = 5, **overrides: Any
                    ) -> dict[str, Any]:
    """``policy.learn_on_batch`` in a loop on pre-made train batches of the tuned shape.

    Returns:
      ``{"samples_per_s", "steps", "step_ms", "batch_shape"}``; a batch is
      [sample_batch_size, train_batch_columns], sampled once from CartPole before timing.
    """
    import gymnasium

    from bench.multi_gpu import make_batches
    from impala_lab.learner.vtrace_policy import VTracePolicy

    config = tuned_config(**overrides)
    env = gymnasium.make(config.env)
    policy = VTracePolicy(env.observation_space, env.action_space, config)
    env.close()
    batches = make_batches(config, 4, seed=0)
    for i in range(warmup_steps):  # the first call traces the step
        policy.learn_on_batch(batches[i % len(batches)])
    steps, samples, dt = _learn_loop(policy, batches, seconds)
    return {"samples_per_s": round(samples / dt, 1), "steps": steps,
            "step_ms": round(1e3 * dt / steps, 3),
            "batch_shape": list(batches[0].actions.shape)}


def fed_learner(seconds: float = 15.0, num_sgd_iter: int = 4, warmup_s: float = 5.0,
                **overrides: Any) -> dict[str, Any]:
    """The learner's trained samples/s inside a 2-worker pipeline with ``num_sgd_iter`` passes
    per batch (so that sampling is not the bottleneck): `end_to_end`'s figures."""
    return end_to_end(seconds=seconds, warmup_s=warmup_s, num_sgd_iter=num_sgd_iter,
                      **overrides)


# ---------------------------------------------------------------------- side by side
def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 1)


def sampling_side_by_side(num_workers: int = 2, rounds: int = 3, seconds: float = 5.0,
                          warmup_s: float = 5.0, measure_memory: bool = False
                          ) -> dict[str, Any]:
    """The sampling ceiling and the whole run, in alternating windows of one process tree.

    A tuned run (`end_to_end`'s) and `num_workers` bare sampling workers (`sampling_ceiling`'s)
    are both started; after ``warmup_s`` of training, ``rounds`` times: a ceiling window of
    ``seconds`` (the run idle), then a training window (the bare workers idle). Alternating
    keeps slow drifts of the machine (other jobs, the host) out of the ratio; the ratio is
    that of the medians.

    Returns:
      ``{"ceiling": {"env_steps_per_s", "rounds"}, "end_to_end": {"env_steps_per_s",
      "trained_per_s", "rounds", "timing_breakdown", ...}, "ratio", "round_ratios",
      "memory" (if measured)}``.
    """
    from impala_lab.driver.impala import Impala

    impala = Impala(tuned_config(num_workers=num_workers))
    bare = None
    sampler = RssSampler(impala.backend.worker_pids) if measure_memory else None
    try:
        if sampler is not None:
            sampler.__enter__()
        impala.train(max_seconds=warmup_s, report_interval=1.0)
        bare = _SamplingWorkers(num_workers)
        ceilings, sampled, trained, final = [], [], [], {}
        for _ in range(rounds):
            steps, elapsed = bare.window(seconds)
            ceilings.append(steps / elapsed)
            s, t, _, final = _train_window(impala, seconds)
            sampled.append(s)
            trained.append(t)
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
        impala.stop()
        if bare is not None:
            bare.close()
    out = {"ceiling": {"env_steps_per_s": _median(ceilings),
                       "rounds": [round(x, 1) for x in ceilings]},
           "end_to_end": {"env_steps_per_s": _median(sampled),
                          "trained_per_s": _median(trained),
                          "rounds": [round(x, 1) for x in sampled],
                          "timing_breakdown": final.get("timing_breakdown"),
                          "learner_queue_mean": final.get("learner_queue", {}).get("mean"),
                          "episode_return_mean": final.get("episode_return_mean")},
           "num_workers": num_workers, "seconds_per_window": seconds,
           "ratio": round(statistics.median(sampled) / statistics.median(ceilings), 4),
           "round_ratios": [round(e / c, 4) for e, c in zip(sampled, ceilings)]}
    if sampler is not None:
        out["memory"] = sampler.result()
    return out


def learner_side_by_side(num_sgd_iter: int = 4, rounds: int = 3, seconds: float = 4.0,
                         warmup_s: float = 5.0, idle_s: float = 0.5) -> dict[str, Any]:
    """The learner ceiling and the fed learner, in alternating windows of one process.

    A tuned 2-worker run with ``num_sgd_iter`` passes per batch (so the learner, not
    sampling, is the bottleneck), and a second `VTracePolicy` that `learner_ceiling` drives on
    pre-made batches. After ``warmup_s``, ``rounds`` times: a ceiling window (the run idle:
    ``idle_s`` first lets its learner finish the batches it holds), then a training window.

    Returns:
      ``{"ceiling": {"samples_per_s", "step_ms", "batch_shape", "rounds"}, "fed":
      {"trained_per_s", "rounds", ...}, "ratio", "round_ratios"}``.
    """
    import gymnasium

    from bench.multi_gpu import make_batches
    from impala_lab.driver.impala import Impala
    from impala_lab.learner.vtrace_policy import VTracePolicy

    config = tuned_config(num_sgd_iter=num_sgd_iter)
    impala = Impala(config)
    try:
        env = gymnasium.make(config.env)
        policy = VTracePolicy(env.observation_space, env.action_space, tuned_config())
        env.close()
        batches = make_batches(config, 4, seed=0)
        for b in batches:  # the first call traces the step
            policy.learn_on_batch(b)
        impala.train(max_seconds=warmup_s, report_interval=1.0)
        ceilings, step_ms, trained, final = [], [], [], {}
        for _ in range(rounds):
            time.sleep(idle_s)
            steps, samples, dt = _learn_loop(policy, batches, seconds)
            ceilings.append(samples / dt)
            step_ms.append(1e3 * dt / steps)
            _, t, _, final = _train_window(impala, seconds)
            trained.append(t)
    finally:
        impala.stop()
    grad_ms = (final.get("timing_breakdown") or {}).get("learner_grad_time_ms") or math.nan
    return {"ceiling": {"samples_per_s": _median(ceilings),
                        "step_ms": round(statistics.median(step_ms), 3),
                        "batch_shape": list(batches[0].actions.shape),
                        "rounds": [round(x, 1) for x in ceilings]},
            "fed": {"trained_per_s": _median(trained), "rounds": [round(x, 1) for x in trained],
                    "num_sgd_iter": num_sgd_iter,
                    "learner_busy_samples_per_s": round(
                        config.sample_batch_size * config.train_batch_columns / grad_ms * 1e3,
                        1),
                    "timing_breakdown": final.get("timing_breakdown"),
                    "learner_queue_mean": final.get("learner_queue", {}).get("mean")},
            "seconds_per_window": seconds,
            "ratio": round(statistics.median(trained) / statistics.median(ceilings), 4),
            "round_ratios": [round(f / c, 4) for f, c in zip(trained, ceilings)]}


# ---------------------------------------------------------------------- 3. time to solve
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


@contextlib.contextmanager
def busy_processes(n: int = 1) -> Iterator[list[int]]:
    """``n`` CPU-bound Python processes spinning beside whatever runs inside the block (a
    loaded machine); ended when it exits. Each also ends if its parent dies."""
    code = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
            "    for _ in range(1_000_000):\n        pass\n")
    procs = [subprocess.Popen([sys.executable, "-S", "-c", code], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ---------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory, load, python / TensorFlow / numpy / gymnasium versions."""
    import importlib.metadata as md

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    kb = _status_kb_meminfo()
    if kb:
        mem_gb = round(kb * 1024 / 1e9, 1)

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "cpu_model": cpu, "mem_gb": mem_gb, "loadavg_at_start": list(os.getloadavg()),
            "python": platform.python_version(), "platform": platform.platform(),
            "tensorflow": version("tensorflow-cpu") or version("tensorflow"),
            "keras": version("keras"), "numpy": version("numpy"),
            "gymnasium": version("gymnasium")}


def _status_kb_meminfo() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None
