"""The pipeline benchmarks of ``python -m bench``: each returns a dict of plain numbers
(the time-to-solve bench is `bench.solves`, the machine's description `bench.machine`).

    sampling_ceiling(num_workers, seconds)      env steps/s of process workers, no learner
    end_to_end(num_workers, seconds)            env steps/s of the whole run, training
    sampling_side_by_side(num_workers, rounds)  the two above in alternating windows
    learner_ceiling(seconds)                    learn_on_batch samples/s on pre-made batches
    fed_learner(seconds, num_sgd_iter)          the learner's samples/s inside the pipeline
    learner_side_by_side(num_sgd_iter, rounds)  the two above in alternating windows

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

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
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
