"""`Impala`: the driver loop (RLlib's ``AsyncSamplesOptimizer``), train, stats, save/restore.

One ``step()`` is one turn of the seed's loop::

    for each finished sample request (task pool, completion order):
        for (worker, batch) in replay mixer(new batch, then replayed ones):
            append to the batch buffer; once it holds >= train_batch_size env steps,
            concatenate along B and put it on the learner's (bounded) inqueue
            if the batch is new (worker is not None):
                broadcast fresh weights if the learner updated them and this broadcast
                served >= broadcast_interval returns; send the current weights to the worker
                ask the worker for another sample
    count the env steps the learner reports on its outqueue

One deliberate difference from the seed: the seed forgot the weights and the broadcast counter
at the end of every ``_step`` call, so broadcast_interval only counted returns within one call.
Here both persist across calls, so broadcast_interval means what its name says.

Everything the dashboard, the CLI and the tests read comes from ``stats()``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import queue
import re
import secrets
import shutil
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from impala_lab.backends.base import WorkerHandle, make_backend, pid_exists
from impala_lab.batch import SampleBatch, concat_samples
from impala_lab.config import LIVE_KNOBS, ImpalaConfig, field_names
from impala_lab.errors import ConfigError, ImpalaError, WorkerError
from impala_lab.health import HealthMonitor, flag_codes, stalled_after_s
from impala_lab.replay import ReplayMixer
from impala_lab.stats import StatsHistory, ThroughputMeter, TimerStat, WindowStat, flatten
from impala_lab.task_pool import SampleTaskPool

CHECKPOINT_FORMAT = 1
CHECKPOINT_COUNTERS = ("num_steps_sampled", "num_steps_trained", "num_weight_syncs",
                       "episodes_total", "elapsed_s")
StopCondition = Mapping[str, float] | Callable[[dict], bool] | None

_live_runs: weakref.WeakSet[Impala] = weakref.WeakSet()
logger = logging.getLogger("impala_lab")

#: Restarts are bounded by the same failure coming back: the same error (its first line, up to
#: the numbers in it: pids, steps, seconds) from the same env this many times, or 2 x
#: num_workers if more, within `REPEATED_FAILURE_WINDOW_S` seconds ends the run with that error,
#: however many samples came between. (The failures-in-a-row limit resets on every returned
#: sample: an env that failed after each worker's first sample restarted 2,130 times in 6 s
#: inline, 58 worker processes in 20 s.) RLlib bounds restarts by their number alone
#: (``max_num_worker_restarts``, 1000).
MAX_REPEATED_WORKER_FAILURES = 20
REPEATED_FAILURE_WINDOW_S = 600.0
#: How often the driver asks which workers owe a sample longer than ``sample_timeout_s``
#: (at most; a quarter of ``sample_timeout_s`` if that is shorter).
LIVENESS_CHECK_PERIOD_S = 0.5
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def shutdown_all() -> None:
    """Stop every `Impala` run of this process (workers, learner thread, Ray)."""
    for run in list(_live_runs):
        run.stop()


atexit.register(shutdown_all)


def _cleanup(backend: Any, learner: Any) -> None:  # finalizer: must not hold the Impala object
    try:
        learner.stop(timeout=2.0)
    finally:
        backend.shutdown()


def _run_clock(ref: weakref.ref) -> Callable[[], float]:
    """The run's elapsed seconds, without holding the run (the learner outlives it in the
    finalizer, and the health monitor it feeds must not keep the run alive)."""
    def clock() -> float:
        run = ref()
        return run.elapsed_s if run is not None else math.nan

    return clock


def probe_spaces(env: Any) -> tuple[Any, Any]:
    """Make one env in the driver to read its spaces (before any worker starts)."""
    import gymnasium

    e = env() if callable(env) else gymnasium.make(env)
    try:
        return e.observation_space, e.action_space
    finally:
        e.close()


class Impala:
    """The IMPALA driver: actors, task pool, replay mixer, batch buffer, learner, broadcasts.

    Args:
      config: an `ImpalaConfig`, a dict of its fields, or None for the defaults.
      env_creator: a zero-argument env factory (overrides ``config.env``).
      start_learner: False keeps the learner thread unstarted, so ``impala.learner.step()``
        can be called by hand between driver steps (step-through notebooks).
      **overrides: config fields to change, e.g. ``Impala(num_workers=4)``.
    """

    def __init__(self, config: ImpalaConfig | Mapping[str, Any] | None = None, *,
                 env_creator: Callable[[], Any] | None = None, start_learner: bool = True,
                 **overrides: Any) -> None:
        if config is None:
            config = ImpalaConfig()
        elif isinstance(config, Mapping):
            config = ImpalaConfig.from_dict(config)
        elif not isinstance(config, ImpalaConfig):
            raise TypeError(f"config must be an ImpalaConfig or a dict, got "
                            f"{type(config).__name__}")
        if env_creator is not None:
            overrides["env"] = env_creator
        if overrides:
            config = config.replace(**overrides)
        self.config = config
        self._stopped = True  # until everything below is up
        from impala_lab.models import check_spaces

        # An env that cannot be made, or whose spaces the model cannot take, is a config
        # error (the CLI's exit code 2), raised before any process starts.
        try:
            self.observation_space, self.action_space = probe_spaces(config.env)
        except Exception as exc:
            raise ConfigError(f"env={config.env_id!r} is invalid: it could not be made "
                              f"({type(exc).__name__}: {exc})") from exc
        try:
            check_spaces(self.observation_space, self.action_space)
        except ValueError as exc:
            raise ConfigError(f"env={config.env_id!r} is invalid: its {exc}") from None
        # Validation counted one float per observation; now the env's real observation size
        # and action count are known (still before TensorFlow loads or any process starts).
        config.check_memory(self.observation_space, self.action_space)

        # Backend checks that can fail (an env factory that cannot travel) run before
        # TensorFlow loads and before any process starts.
        self.backend = make_backend(config, env_creator=None)
        self.backend.prepare()
        try:  # a Ctrl-C while TensorFlow loads must not leave a prepared backend (Ray) up
            from impala_lab.policy import VTracePolicy

            if config.uses_multi_gpu_learner:
                # Fake devices must be set up before TensorFlow initialises (building the
                # model does); a device error is a config error, raised before anything starts.
                from impala_lab.multi_gpu import configure_learner_devices

                configure_learner_devices(config)
            self.policy = VTracePolicy(self.observation_space, self.action_space, config)
            self.learner = self._make_learner()
        except BaseException:
            self.backend.shutdown()
            raise
        self.replay = ReplayMixer(config.replay_proportion, config.replay_buffer_num_slots,
                                  config.train_batch_size, config.sample_batch_size,
                                  seed=config.seed)
        self.sample_tasks: SampleTaskPool | None = None
        self.workers: list[WorkerHandle] = []
        self._finalizer = weakref.finalize(self, _cleanup, self.backend, self.learner)
        _live_runs.add(self)
        self._stopped = False

        # Counters and stats (the seed's names).
        self.num_steps_sampled = 0
        self.num_steps_trained = 0
        self.num_weight_syncs = 0
        self.num_broadcasts = 0
        self.num_worker_failures = 0
        self._failures_in_a_row = 0
        # (env, failure message with its numbers blanked) -> times it happened in the window
        self._repeated_failures: dict[tuple[str, str], deque[float]] = {}
        # Liveness: worker index -> [started, last sample reached the driver (None: none yet),
        # samples returned]; the last sample of any worker; train() restarts the clock.
        self._worker_clocks: dict[int, list] = {}
        self._last_sample_at: float | None = None
        self._sampling_since = time.monotonic()
        self._training = False
        self._queue_blocked = False  # the driver waits on the full learner queue
        self._next_liveness_check = 0.0
        self.num_train_batches = 0
        self._next_worker_index = config.num_workers
        self._optimizer_step_timer = TimerStat()
        self._concat_timer = TimerStat()
        self._broadcast_timer = TimerStat()
        self._sample_meter = ThroughputMeter()
        self._train_meter = ThroughputMeter()
        self._episode_returns: deque[float] = deque(maxlen=100)
        self._episode_lengths: deque[int] = deque(maxlen=100)
        self.episodes_total = 0
        self._policy_lag = WindowStat("policy_lag", 100)
        # Seconds the driver waited to put a batch on the full learner queue, per second.
        self._queue_wait_meter = ThroughputMeter()
        # Learning health: fed every learner step from the learner thread, judged in stats().
        self.health = HealthMonitor(int(getattr(self.action_space, "n", 0)),
                                    config.learner_queue_size, clock=_run_clock(weakref.ref(self)))
        self.learner.on_train_step = self.health.observe_learner_step
        self.history = StatsHistory(maxlen=100_000)
        self.knob_changes: list[dict[str, Any]] = []
        self._pending_knobs: dict[str, Any] = {}
        self._knob_lock = threading.Lock()
        self._start_time = time.monotonic()
        self._elapsed_before_restore = 0.0

        # Background training (start/pause): the thread, its error, the pause request.
        self._background: threading.Thread | None = None
        self._pause_requested = threading.Event()
        self.background_error: BaseException | None = None
        self._last_pipeline_view: dict[str, Any] = {}
        self.last_result: dict[str, Any] | None = None
        self.last_error: str | None = None  # the error that ended train(), as text

        self.batch_buffer: list[SampleBatch] = []
        self._batch_buffer_steps = 0
        self._weights_ref: Any = None
        self._num_sent = 0
        try:
            self._start_workers()
            if start_learner:
                self.learner.start()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ construction
    def _make_learner(self):
        c = self.config
        if c.uses_multi_gpu_learner:
            from impala_lab.multi_gpu import MultiGPULearner

            return MultiGPULearner(self.policy, c)
        from impala_lab.learner import LearnerThread

        return LearnerThread(self.policy, c.minibatch_buffer_size, c.num_sgd_iter,
                             c.learner_queue_size, c.learner_queue_timeout)

    def _start_workers(self) -> None:
        self.sample_tasks = SampleTaskPool(wait_fn=self.backend.wait)
        self.workers = [self.backend.make_worker(i) for i in range(self.config.num_workers)]
        for worker in self.workers:
            self._worker_clocks[worker.index] = [time.monotonic(), None, 0]
        self._broadcast(force=True)
        for worker in self.workers:
            self._send_weights_and_request(worker, initial=True)

    def _send_weights_and_request(self, worker: WorkerHandle, initial: bool = False) -> None:
        if not initial:  # called once per sample the worker returned: its liveness clock
            now = time.monotonic()
            self._last_sample_at = now
            clock = self._worker_clocks.get(worker.index)
            if clock is not None:
                clock[1] = now
                clock[2] += 1
        worker.set_weights(self._weights_ref)
        self.num_weight_syncs += 1
        n = self.config.max_sample_requests_in_flight_per_worker if initial else 1
        for _ in range(n):
            self.sample_tasks.add(worker, worker.sample())

    def _broadcast(self, force: bool = False) -> None:
        """Publish fresh weights once (a new reference every worker will read)."""
        with self._broadcast_timer:
            weights, version = self.policy.get_weights()
            self._weights_ref = self.backend.put_weights(weights, version)
        self.learner.weights_updated = False
        self._num_sent = 0
        self.num_broadcasts += 1

    # ------------------------------------------------------------------ the loop
    def step(self, timeout: float = 0.1) -> tuple[int, int]:
        """One turn of the driver loop (the seed's ``step``).

        Args:
          timeout: seconds to wait for the first finished sample; the driver blocks on the
            workers instead of spinning. The inline backend never waits.

        Returns:
          (env steps sampled, env steps trained) in this turn.
        """
        self._check_running()
        background = self._background
        if background is not None and threading.get_ident() != background.ident:
            raise ImpalaError("this run is training in the background; call impala.pause() "
                              "before stepping it by hand")
        self._apply_pending_knobs()
        with self._optimizer_step_timer:
            sampled, trained = self._step(timeout)
        self._sample_meter.add(sampled)
        self._train_meter.add(trained)
        self.num_steps_sampled += sampled
        self.num_steps_trained += trained
        self._check_sample_timeouts()
        if background is not None:
            self._last_pipeline_view = self._pipeline_view()
        return sampled, trained

    def _step(self, timeout: float) -> tuple[int, int]:
        sample_timesteps, train_timesteps = 0, 0
        c = self.config
        for worker, batch in self.replay.mix(self._completed_samples(timeout)):
            self.batch_buffer.append(batch)
            self._batch_buffer_steps += batch.count
            if self._batch_buffer_steps >= c.train_batch_size:
                with self._concat_timer:
                    train_batch = concat_samples(self.batch_buffer)
                self.batch_buffer = []
                self._batch_buffer_steps = 0
                self._put_on_learner_queue(train_batch)

            if worker is None:  # a replayed batch: no weights, no new request
                continue
            sample_timesteps += batch.count
            self._record_sample(batch)
            # Pull new weights once updated, to avoid excessive correlation between actors.
            if self.learner.weights_updated and self._num_sent >= c.broadcast_interval:
                self._broadcast()
            self._num_sent += 1
            self._send_weights_and_request(worker)

        while True:
            try:
                train_timesteps += self.learner.outqueue.get_nowait()
            except queue.Empty:
                break
        return sample_timesteps, train_timesteps

    def _completed_samples(self, timeout: float) -> Iterator[tuple[WorkerHandle, SampleBatch]]:
        """Finished samples in completion order; a failed worker is replaced or raised."""
        blocking = True
        while True:
            try:
                yield from self.sample_tasks.completed_prefetch(blocking_wait=blocking,
                                                                timeout=timeout)
                return
            except WorkerError as err:
                self._on_worker_failure(err)
                blocking = False

    def _on_worker_failure(self, err: WorkerError) -> None:
        self.num_worker_failures += 1
        self._failures_in_a_row += 1
        failed = [w for w in self.workers if w.index == err.worker_index]
        for worker in failed:
            self.workers.remove(worker)
            self.backend.stop_worker(worker)
            self._worker_clocks.pop(worker.index, None)
        self.sample_tasks.reset_workers(self.workers)
        if not self.config.restart_failed_workers:
            raise err
        limit = max(3, 2 * self.config.num_workers)
        if self._failures_in_a_row >= limit:
            # Replacements that fail before any sample arrives would restart forever.
            raise ImpalaError(
                f"workers failed {self._failures_in_a_row} times in a row without returning a "
                f"sample; the env keeps failing, so restarting is stopped. Last error:\n{err}"
            ) from err
        repeats = self._count_repeats(err)
        limit = max(MAX_REPEATED_WORKER_FAILURES, 2 * self.config.num_workers)
        if repeats >= limit:
            # Replacements that fail the same way after some samples would restart forever.
            raise ImpalaError(
                f"the same worker failure came back {repeats} times within "
                f"{REPEATED_FAILURE_WINDOW_S:g} s (env {err.env_id}), samples or not in "
                f"between: restarting does not fix it, so restarting is stopped. Last "
                f"error:\n{err}"
            ) from err
        # Said once per failure, so a recovered run shows what it recovered from.
        logger.warning("%s; replaced by worker %d (%d worker failures so far)",
                       str(err).split("\n", 1)[0], self._next_worker_index,
                       self.num_worker_failures)
        replacement = self.backend.make_worker(self._next_worker_index)
        self._next_worker_index += 1
        self.workers.append(replacement)
        self._worker_clocks[replacement.index] = [time.monotonic(), None, 0]
        self._send_weights_and_request(replacement, initial=True)

    def _count_repeats(self, err: WorkerError) -> int:
        """How often this failure (env, first line of the message with its numbers blanked)
        happened within the last `REPEATED_FAILURE_WINDOW_S` seconds, this one included."""
        message = str(err).split(" failed: ", 1)[-1].split("\n", 1)[0]
        times = self._repeated_failures.setdefault((err.env_id, _NUMBERS.sub("#", message)),
                                                   deque())
        now = time.monotonic()
        times.append(now)
        while now - times[0] > REPEATED_FAILURE_WINDOW_S:
            times.popleft()
        return len(times)

    def _check_sample_timeouts(self) -> None:
        """Ends every worker that owes a sample longer than ``sample_timeout_s`` (its env
        hangs): counted, logged and replaced as a worker that died, or raised with
        ``restart_failed_workers=False``. Inline workers sample inside ``sample()``, in the
        driver's thread, so they never owe one (a hung inline env hangs the driver)."""
        timeout = self.config.sample_timeout_s
        now = time.monotonic()
        if timeout is None or self.sample_tasks is None or now < self._next_liveness_check:
            return
        self._next_liveness_check = now + min(LIVENESS_CHECK_PERIOD_S, timeout / 4)
        owed = self.sample_tasks.owed_since()
        now = time.monotonic()
        for worker in list(self.workers):
            since = owed.get(worker)
            if since is None or now - since <= timeout:
                continue
            env_id = getattr(worker, "env_id", None) or self.config.env_id
            pid = getattr(worker, "pid", None)
            self._on_worker_failure(WorkerError(
                worker.index, env_id,
                f"it owed a sample for {now - since:.1f} s, longer than "
                f"sample_timeout_s={timeout:g}: its env may hang in step() or reset() (if it is "
                f"only that slow, raise sample_timeout_s); the worker"
                f"{f' (process {pid})' if pid is not None else ''} was ended"))

    def _put_on_learner_queue(self, train_batch: SampleBatch) -> None:
        """Put with back-pressure, but never hang: a dead or unstarted learner raises."""
        start = time.perf_counter()
        while True:
            try:
                self.learner.inqueue.put(train_batch, timeout=0.5)
                self.num_train_batches += 1
                self._queue_wait_meter.add(time.perf_counter() - start)
                self._queue_blocked = False
                return
            except queue.Full:
                self._queue_blocked = True  # no sample is handed out meanwhile: no stall
                self.learner.raise_if_failed()
                if not self.learner.is_alive():
                    raise ImpalaError(
                        f"the learner queue is full ({self.config.learner_queue_size} batches) "
                        "and the learner thread is not running; with start_learner=False call "
                        "impala.learner.step() to consume batches") from None

    def _record_sample(self, batch: SampleBatch) -> None:
        self._failures_in_a_row = 0
        for r in batch.episode_returns:
            self._episode_returns.append(float(r))
        for n in batch.episode_lengths:
            self._episode_lengths.append(int(n))
        self.episodes_total += len(batch.episode_returns)
        lag = self.policy.version - batch.policy_versions
        self._policy_lag.push(float(lag.mean()))
        self._max_lag = max(getattr(self, "_max_lag", 0), int(lag.max()))

    def _check_running(self) -> None:
        if self._stopped:
            raise ImpalaError("this Impala run was stopped; create a new one (or restore a "
                              "checkpoint) to train again")
        self.learner.raise_if_failed()

    # ------------------------------------------------------------------ live knobs
    def set_knobs(self, **knobs: Any) -> None:
        """Change knobs that are safe between steps; applied by the driver before its next step.

        Allowed: broadcast_interval, replay_proportion, num_sgd_iter, lr, entropy_coeff.
        """
        for name, value in knobs.items():
            if name not in LIVE_KNOBS:
                raise ConfigError(f"{name!r} cannot change during a run; live knobs are "
                                  f"{', '.join(LIVE_KNOBS)}")
            self.config.replace(**{name: value})  # validates the value (raises ConfigError)
        with self._knob_lock:
            self._pending_knobs.update(knobs)
        if self.learner.ident is None:  # nothing runs in the background: apply now
            self._apply_pending_knobs()

    def _apply_pending_knobs(self) -> None:
        with self._knob_lock:
            pending, self._pending_knobs = self._pending_knobs, {}
        if not pending:
            return
        self.config = self.config.replace(**pending)
        for name, value in pending.items():
            if name == "lr":
                self.policy.set_lr(value)
            elif name == "entropy_coeff":
                self.policy.set_entropy_coeff(value)
            elif name == "num_sgd_iter":
                self.learner.set_num_sgd_iter(value)
            elif name == "replay_proportion":
                self.replay.replay_proportion = value
            self.knob_changes.append({"time_s": self.elapsed_s,
                                      "num_steps_sampled": self.num_steps_sampled,
                                      "knob": name, "value": value})

    # ------------------------------------------------------------------ stats
    @property
    def elapsed_s(self) -> float:
        return self._elapsed_before_restore + time.monotonic() - self._start_time

    def stats(self) -> dict[str, Any]:
        """All figures of the run: the seed's keys plus episodes, policy lag and the pipeline."""
        def ms(timer: TimerStat) -> float:
            return round(1000.0 * timer.mean, 3)

        learner_timers = self.learner.timers()
        returns = list(self._episode_returns)
        return_mean = float(np.mean(returns)) if returns else math.nan
        lag = self._policy_lag.stats()
        lag_mean = lag["mean"] if lag["count"] else math.nan
        queue_stats = self.learner.learner_queue_size.stats()
        seconds_since_sample, workers = self._liveness()
        return {
            "sample_throughput": round(self._sample_meter.rate(), 3),
            "train_throughput": round(self._train_meter.rate(), 3),
            "num_steps_sampled": self.num_steps_sampled,
            "num_steps_trained": self.num_steps_trained,
            "num_weight_syncs": self.num_weight_syncs,
            "num_broadcasts": self.num_broadcasts,
            "num_steps_replayed": self.replay.num_replayed,
            "num_worker_failures": self.num_worker_failures,
            "time_total_s": round(self.elapsed_s, 3),
            "timing_breakdown": {
                "optimizer_step_time_ms": ms(self._optimizer_step_timer),
                **{k: ms(t) for k, t in learner_timers.items()},
                "batch_concat_time_ms": ms(self._concat_timer),
                "broadcast_time_ms": ms(self._broadcast_timer),
            },
            "learner_queue": queue_stats,
            "learner": dict(self.learner.stats),
            "episode_return_mean": return_mean,
            "episode_len_mean": (float(np.mean(self._episode_lengths))
                                 if self._episode_lengths else math.nan),
            "episode_return_count": len(returns),
            "last_error": self.last_error,
            "episodes_total": self.episodes_total,
            "policy_lag": {"mean": lag_mean,
                           "max": getattr(self, "_max_lag", 0)},
            "weights_version": self.policy.version,
            "seconds_since_sample": seconds_since_sample,
            "workers": workers,
            "pipeline": self._pipeline_view(),
            "knobs": {k: getattr(self.config, k) for k in LIVE_KNOBS},
            "health": self.health.check(
                episode_return_mean=return_mean,
                episode_return_count=len(returns),
                learner_queue=queue_stats,
                learner_wait_ms=1000.0 * self.learner.data_wait_timer().mean,
                learner_grad_ms=1000.0 * self.learner.grad_timer.mean,
                driver_blocked_fraction=self._queue_wait_meter.rate(),
                policy_lag=lag_mean,
                num_updates_skipped=getattr(self.policy, "num_updates_skipped", 0),
                # judged while train() runs (hand steps pause as long as the reader likes)
                # and the driver is not waiting on the full learner queue
                seconds_since_sample=(seconds_since_sample if self._judging_liveness
                                      else math.nan),
                stalled_workers=[w for w in workers if w["stalled"]],
                sample_timeout_s=self.config.sample_timeout_s),
        }

    def _liveness(self) -> tuple[float, list[dict[str, Any]]]:
        """Seconds since the last sample reached the driver, and per worker (by index): seconds
        since its last sample (or its start), samples returned, requests in flight, and
        ``stalled``: at least `impala_lab.health.stalled_after_s` (a quarter of
        ``sample_timeout_s``), judged while train() runs and the driver is not waiting on the
        full learner queue (then no sample is handed out, and no worker is to blame). Both
        count from train()'s start if that is later."""
        now = time.monotonic()
        since = self._sampling_since
        last = self._last_sample_at
        overall = now - (since if last is None else max(last, since))
        pool = self.sample_tasks
        in_flight = ({getattr(w, "index", w): n for w, n in pool.in_flight_counts().items()}
                     if pool is not None else {})
        limit = stalled_after_s(self.config.sample_timeout_s)
        workers = []
        for index, (started, last_sample, samples) in sorted(self._worker_clocks.items()):
            seconds = now - max(started if last_sample is None else last_sample, since)
            workers.append({"index": index, "seconds_since_sample": round(seconds, 2),
                            "samples": samples, "in_flight": in_flight.get(index, 0),
                            "stalled": self._judging_liveness and seconds >= limit})
        return round(overall, 2), workers

    @property
    def _judging_liveness(self) -> bool:
        return self._training and not self._queue_blocked

    def _pipeline_view(self) -> dict[str, Any]:
        """Figures of every stage for the diagram. While a background thread drives the run,
        other threads read the copy it leaves at the end of each step (no torn reads)."""
        if self._background is not None and threading.get_ident() != self._background.ident:
            return self._last_pipeline_view
        mb = self.learner.minibatch_buffer
        in_flight = self.sample_tasks.in_flight_counts() if self.sample_tasks else {}
        view = {
            "backend": self.config.backend,
            "num_workers": len(self.workers),
            "in_flight": {str(getattr(w, "index", w)): n for w, n in in_flight.items()},
            "max_in_flight": self.config.max_sample_requests_in_flight_per_worker,
            "replay_stored": self.replay.num_stored,
            "replay_capacity": self.replay.capacity,
            "batch_buffer_steps": self._batch_buffer_steps,
            "train_batch_size": self.config.train_batch_size,
            "learner_queue_len": self.learner.inqueue.qsize(),
            "learner_queue_size": self.config.learner_queue_size,
            "minibatch_slots": [list(s) for s in mb.slots()],
            "num_sgd_iter": mb.max_ttl,
            "broadcast_interval": self.config.broadcast_interval,
            "num_train_batches": self.num_train_batches,
        }
        devices = getattr(self.learner, "devices", None)
        if devices is not None:  # the MultiGPULearner: its devices and its data buffers' states
            view["learner_devices"] = list(devices)
            view["loader_buffers"] = self.learner.buffer_states()
        return view

    def record(self) -> dict[str, Any]:
        """Take a stats snapshot into ``history`` (a row of metrics.csv) and return it.

        ``health`` becomes two columns: ``health.status`` and ``health.flags`` (the active
        flags' codes joined with ``;``); ``pipeline`` and ``workers`` stay out of it.
        """
        snapshot = self.stats()
        row = flatten({k: v for k, v in snapshot.items()
                       if k not in ("pipeline", "health", "workers")})
        row.pop("learner_queue.count", None)
        health = snapshot.get("health") or {}
        row["health.status"] = health.get("status")
        row["health.flags"] = flag_codes(health)
        self.history.append(row)
        return snapshot

    # ------------------------------------------------------------------ train
    def train(self, stop: StopCondition = None, *, max_seconds: float | None = None,
              max_env_steps: int | None = None, report_interval: float = 1.0,
              on_report: Callable[[dict], None] | None = None,
              dashboard: bool = False) -> dict[str, Any]:
        """Step until a stop condition holds.

        Args:
          stop: a dict ``{stats key: threshold}`` (stop when any value reaches its
            threshold, e.g. ``{"episode_return_mean": 195}``) or a callable on the stats.
          max_seconds: wall-clock limit of this call.
          max_env_steps: limit on env steps sampled in total.
          report_interval: seconds between snapshots into ``history`` (and ``on_report``).
          on_report: called with each snapshot (the CLI's progress line).
          dashboard: show the live dashboard while training (needs a notebook).

        Returns:
          the last stats, with ``stop_reason``.
        """
        if dashboard:
            from impala_lab.dashboard import Dashboard

            board = Dashboard(self)
            board.show(blocking_train=True)  # the kernel takes no clicks until this returns
            # The dashboard's poller thread reads stats() while this thread steps: marking
            # this thread as the driver makes it read the pipeline view each step leaves.
            owner = self._background is None
            if owner:
                self._background = threading.current_thread()
            try:
                return self.train(stop, max_seconds=max_seconds, max_env_steps=max_env_steps,
                                  report_interval=report_interval,
                                  on_report=board.report_hook(on_report))
            finally:
                if owner:
                    self._background = None
                board.train_ended()
        if isinstance(stop, Mapping):
            thresholds = dict(stop)

            def stop_fn(s: dict) -> bool:
                flat = flatten(s)
                return any(flat.get(k) is not None and flat[k] >= v
                           for k, v in thresholds.items())
        else:
            stop_fn = stop
        start = time.monotonic()
        next_report = start + report_interval
        reason = None
        # Liveness figures count from here: a run built long ago has not been idle.
        self._sampling_since = start
        self._training = True
        try:
            while reason is None:
                if self._pause_requested.is_set():
                    reason = "paused"
                    break
                self.step()
                now = time.monotonic()
                if now >= next_report:
                    next_report = now + report_interval
                    snapshot = self.record()
                    if on_report is not None:
                        on_report(snapshot)
                    if stop_fn is not None and stop_fn(snapshot):
                        reason = "stop condition"
                if max_env_steps is not None and self.num_steps_sampled >= max_env_steps:
                    reason = "max_env_steps"
                if max_seconds is not None and now - start >= max_seconds:
                    reason = "max_seconds"
        except KeyboardInterrupt:
            # An interrupted cell must not leave processes behind: the run ends here.
            self.record()
            self.stop()
            raise
        except Exception as exc:
            # In the stats too (metrics.csv, the dashboard), not only in the traceback.
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.record()
            raise
        finally:
            self._training = False
        final = self.record()
        final["stop_reason"] = reason
        return final

    # ------------------------------------------------------------------ background training
    def start(self, stop: StopCondition = None, *, max_seconds: float | None = None,
              max_env_steps: int | None = None, report_interval: float = 1.0) -> None:
        """Train in a background thread: the notebook cell returns, the dashboard keeps moving.

        ``pause()`` ends the background training (the run stays usable), ``stop()`` ends the
        run. Arguments as in ``train()``; the result lands in ``last_result``.
        """
        self._check_running()
        if self.is_training:
            raise ImpalaError("this run is already training in the background")
        self._pause_requested.clear()
        self.background_error = None

        def loop() -> None:
            try:
                self.last_result = self.train(stop, max_seconds=max_seconds,
                                              max_env_steps=max_env_steps,
                                              report_interval=report_interval)
            except BaseException as exc:  # kept for pause()/wait(), shown by the dashboard
                self.background_error = exc

        self._background = threading.Thread(target=loop, name="impala-driver", daemon=True)
        self._background.start()

    @property
    def is_training(self) -> bool:
        """True while a background ``start()`` is running."""
        return self._background is not None and self._background.is_alive()

    def pause(self, timeout: float = 30.0) -> None:
        """End background training after the current step; raise its error, if any."""
        self._pause_requested.set()
        self.wait(timeout)

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until background training ends; raise its error, if any."""
        thread = self._background
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise ImpalaError(f"background training did not end within {timeout} s")
            self._background = None
        self._pause_requested.clear()
        if self.background_error is not None:
            error, self.background_error = self.background_error, None
            raise error
        return self.last_result

    # ------------------------------------------------------------------ lifetime
    def stop(self) -> None:
        """End the learner thread and every worker; safe to call more than once."""
        if getattr(self, "_stopped", True) and not hasattr(self, "_finalizer"):
            return
        background = getattr(self, "_background", None)
        if background is not None and background is not threading.current_thread():
            self._pause_requested.set()
            background.join(10.0)
        self._stopped = True
        if hasattr(self, "_finalizer"):
            self._finalizer()  # runs _cleanup once
        _live_runs.discard(self)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def __enter__(self) -> Impala:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        return (f"Impala(env={self.config.env_id!r}, backend={self.config.backend!r}, "
                f"workers={len(self.workers)}, {state}, env_steps={self.num_steps_sampled})")

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint directory atomically: arrays (.npz, no pickle) and JSON only.

        The files go into a new directory beside ``path``, are fsynced, and the directory is
        swapped in with renames at the end (`write_checkpoint`): a kill or a full disk at any
        moment leaves the previous checkpoint readable. During background training
        (``start()``) the weights, the optimizer state (its ``iterations`` too) and the
        policy version come from one and the same learner step (read under the policy's
        lock); the counters are the driver's at that moment (``num_steps_trained`` counts
        the learner steps the driver has been told about, so it may trail the weights by a
        step or two, never lead them).
        """
        with self.policy.lock:  # no learner step can land between these reads
            weights, opt_state, version = self.policy.checkpoint_state_locked()
            counters = {"num_steps_sampled": self.num_steps_sampled,
                        "num_steps_trained": self.num_steps_trained,
                        "num_weight_syncs": self.num_weight_syncs,
                        "episodes_total": self.episodes_total,
                        "elapsed_s": self.elapsed_s}
        state = {
            "format": CHECKPOINT_FORMAT,
            "config": self.config.to_dict(),
            "policy_version": version,
            "counters": counters,
        }
        return write_checkpoint(path, state, weights, opt_state)

    @classmethod
    def restore(cls, path: str | os.PathLike, *, env_creator: Callable[[], Any] | None = None,
                fallback_to_prev: bool = False, **overrides: Any) -> Impala:
        """A new run from a checkpoint: weights, optimizer slots, counters and config.

        Config fields in ``overrides`` replace the checkpoint's (``restore(path, lr=0.1)``
        trains at 0.1: the optimizer's learning rate, the policy's ``lr`` and
        ``entropy_coeff`` variables follow the restored config). ``path`` missing while
        ``<path>.prev`` holds a checkpoint means a save was killed between its two renames:
        the previous checkpoint is read, with a warning. ``fallback_to_prev=True`` also
        reads ``<path>.prev`` when ``path`` itself cannot be read (see `read_checkpoint`).
        """
        root, state, weights, opt_state = _read_checkpoint(path, fallback_to_prev)
        data = dict(state["config"])
        if env_creator is not None:
            data["env"] = env_creator
        known = field_names()
        fields = {k: overrides.pop(k) for k in list(overrides) if k in known}
        try:
            config = ImpalaConfig.from_dict({**data, **fields})
        except ConfigError as exc:
            what = "the checkpoint's config with the overrides" if fields else (
                "the checkpoint's config")
            raise ConfigError(f"{root / 'state.json'}: {what} is invalid: {exc}") from None
        run = cls(config, **overrides)
        run.policy.set_weights(weights, state["policy_version"])
        run.policy.set_optimizer_state(opt_state)
        # The optimizer state holds the learning rate it was saved with; the restored config
        # (the checkpoint's, or an override) is what trains from here on.
        run.policy.set_lr(config.lr)
        run.policy.set_entropy_coeff(config.entropy_coeff)
        counters = state["counters"]
        run.num_steps_sampled = counters["num_steps_sampled"]
        run.num_steps_trained = counters["num_steps_trained"]
        run.num_weight_syncs = counters["num_weight_syncs"]
        run.episodes_total = counters["episodes_total"]
        run._elapsed_before_restore = counters["elapsed_s"]
        run._broadcast(force=True)
        return run


# ---------------------------------------------------------------------- checkpoint files
#
# A checkpoint is a directory holding state.json, weights.npz and optimizer.npz. Writing one
# (`write_checkpoint`) never touches the previous checkpoint's files:
#
#   1. ``<path>.tmp-<pid>-<random>/`` is created beside ``path`` and the three files are
#      written into it, each fsynced, then the directory itself;
#   2. ``path`` (the previous checkpoint, complete) is renamed to ``<path>.prev``;
#   3. the new directory is renamed to ``path`` and the parent directory fsynced;
#   4. ``<path>.prev`` is removed: after a successful save only ``path`` is left.
#
# A kill before 2 leaves ``path`` as it was (and a stray ``.tmp-*`` directory, which the next
# save removes once its process is gone); a kill between 2 and 3 leaves only ``<path>.prev``,
# which `read_checkpoint` then reads (with a warning), and the next save puts its new
# checkpoint in place before removing it; a kill after 3 leaves the new checkpoint complete
# and ``<path>.prev`` beside it until the next save. A full disk fails step 1 (OSError), the
# partial directory is removed and ``path`` stays as it was.

_CHECKPOINT_FILES = ("state.json", "weights.npz", "optimizer.npz")
# Files the earlier in-place writer could leave inside a checkpoint directory.
_LEGACY_PARTIALS = ("state.json.tmp", "weights.npz.tmp", "optimizer.npz.tmp")
# Counters are exact in a float64 and in JSON below 2**53 (9e15 env steps: far beyond any run).
_COUNTER_LIMIT = 2**53
_ELAPSED_LIMIT_S = 1e10  # about 300 years
_save_lock = threading.Lock()  # one save at a time in this process (they share .prev names)


def prev_checkpoint_path(path: str | os.PathLike) -> Path:
    """Where the previous checkpoint waits while ``path`` is replaced: ``<path>.prev``."""
    path = Path(os.path.abspath(path))
    return path.with_name(path.name + ".prev")


def write_checkpoint(path: str | os.PathLike, state: Mapping[str, Any],
                     weights: list[np.ndarray], optimizer: list[np.ndarray]) -> Path:
    """Write a checkpoint to ``path`` atomically (see the comment above); returns ``path``.

    ``state`` is state.json without ``sha256`` (added here). Raises OSError (a full disk)
    with the previous checkpoint intact, and ValueError if ``path`` is a directory that
    holds anything but checkpoint files (it is never removed).
    """
    target = Path(os.path.abspath(path))
    prev = prev_checkpoint_path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _save_lock:
        for existing in (target, prev):
            _check_replaceable(existing)
        _remove_stale_partials(target)
        tmp = parent / f"{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            digests = {}
            for name, arrays in (("weights.npz", weights), ("optimizer.npz", optimizer)):
                with open(tmp / name, "wb") as fh:
                    np.savez(fh, *arrays)
                    _flush_and_sync(fh)
                digests[name] = _sha256(tmp / name)
            with open(tmp / "state.json", "w") as fh:
                fh.write(json.dumps({**state, "sha256": digests}, indent=2))
                _flush_and_sync(fh)
            _fsync_dir(tmp)
            if target.exists():
                # ``target`` got there by a rename of a complete directory: ``prev`` (from a
                # save killed after its swap) is not needed any more.
                if prev.exists():
                    shutil.rmtree(prev)
                os.rename(target, prev)
            os.rename(tmp, target)
            _fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if not target.exists() and prev.exists():
                with contextlib.suppress(OSError):
                    os.rename(prev, target)  # put the previous checkpoint back
            raise
        if prev.exists():
            shutil.rmtree(prev, ignore_errors=True)
            _fsync_dir(parent)
    return target


def _check_replaceable(path: Path) -> None:
    """A save replaces ``path`` (and removes ``<path>.prev``) only if it is a checkpoint."""
    if not path.exists():
        return
    if not path.is_dir():
        raise ValueError(f"{path}: exists and is not a checkpoint directory; save elsewhere")
    others = sorted(p.name for p in path.iterdir()
                    if p.name not in _CHECKPOINT_FILES + _LEGACY_PARTIALS)
    if others:
        raise ValueError(f"{path}: holds files that are not part of a checkpoint "
                         f"({', '.join(others[:5])}); a save replaces the whole directory, so "
                         f"save to a path of its own (e.g. {path / 'checkpoint'})")


def _remove_stale_partials(target: Path) -> None:
    """Remove ``<target>.tmp-<pid>-*`` directories whose saving process is gone."""
    pattern = re.compile(re.escape(target.name) + r"\.tmp-(\d+)-[0-9a-f]+")
    for entry in target.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and not pid_exists(int(match.group(1))) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _flush_and_sync(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # file systems that cannot sync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_checkpoint(path: str | os.PathLike, *, fallback_to_prev: bool = False
                    ) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    """Read and verify a checkpoint; a missing, truncated or tampered file is named.

    ``path`` missing while ``<path>.prev`` holds a checkpoint (a save killed between its two
    renames) reads ``<path>.prev``, with a warning. With ``fallback_to_prev=True`` a ``path``
    that cannot be read (a checksum mismatch, a missing file) falls back to ``<path>.prev``
    too, if there is one; by default its error is raised.
    """
    _, state, weights, opt_state = _read_checkpoint(path, fallback_to_prev)
    return state, weights, opt_state


def _read_checkpoint(path: str | os.PathLike, fallback_to_prev: bool
                     ) -> tuple[Path, dict, list[np.ndarray], list[np.ndarray]]:
    root = Path(path)
    prev = prev_checkpoint_path(root)
    if not root.exists() and (prev / "state.json").is_file():
        logger.warning("%s is missing and %s is there: a save was interrupted while it swapped "
                       "the new checkpoint in; reading the previous checkpoint", root, prev)
        return (prev, *_read_checkpoint_dir(prev))
    try:
        return (root, *_read_checkpoint_dir(root))
    except (OSError, ValueError) as exc:
        if not (fallback_to_prev and (prev / "state.json").is_file()):
            raise
        logger.warning("%s; reading the previous checkpoint %s (fallback_to_prev=True)",
                       exc, prev)
        return (prev, *_read_checkpoint_dir(prev))


def _read_checkpoint_dir(root: Path) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    state_file = root / "state.json"
    if not state_file.is_file():
        raise FileNotFoundError(f"{state_file}: no checkpoint here (state.json is missing)")
    try:
        state = json.loads(state_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{state_file}: not a valid checkpoint state ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{state_file}: unknown checkpoint format "
                         f"{state.get('format') if isinstance(state, dict) else state!r}")
    counters = state.get("counters")
    missing = [k for k, kind in (("config", dict), ("counters", dict), ("sha256", dict))
               if not isinstance(state.get(k), kind)]
    missing += [f"counters.{k}" for k in CHECKPOINT_COUNTERS
                if isinstance(counters, dict) and k not in counters]
    missing += [] if "policy_version" in state else ["policy_version"]
    if missing:
        raise ValueError(f"{state_file}: not a valid checkpoint state (missing or mistyped: "
                         f"{', '.join(missing)})")
    _check_counters(state_file, state)
    arrays = {}
    for name in ("weights.npz", "optimizer.npz"):
        file = root / name
        if not file.is_file():
            raise FileNotFoundError(f"{file}: checkpoint file is missing")
        expected = state.get("sha256", {}).get(name)
        if expected != _sha256(file):
            raise ValueError(f"{file}: checksum mismatch (the file is truncated or was "
                             "modified after the checkpoint was written)")
        try:
            with np.load(file, allow_pickle=False) as data:
                arrays[name] = [data[f"arr_{i}"] for i in range(len(data.files))]
        except Exception as exc:
            raise ValueError(f"{file}: cannot read the arrays ({exc})") from None
    return state, arrays["weights.npz"], arrays["optimizer.npz"]


def _check_counters(state_file: Path, state: dict) -> None:
    """Counters are integers in [0, 2**53) (elapsed_s: a finite number of seconds >= 0)."""
    values = {f"counters.{k}": v for k, v in state["counters"].items()
              if k in CHECKPOINT_COUNTERS}
    values["policy_version"] = state["policy_version"]
    for name, value in values.items():
        if name == "counters.elapsed_s":
            ok = (isinstance(value, int | float) and not isinstance(value, bool)
                  and 0 <= value < _ELAPSED_LIMIT_S)  # False for NaN and inf
            rule = f"a finite number of seconds in [0, {_ELAPSED_LIMIT_S:g})"
        else:
            ok = (isinstance(value, int) and not isinstance(value, bool)
                  and 0 <= value < _COUNTER_LIMIT)
            rule = "an integer in [0, 2**53)"
        if not ok:
            raise ValueError(f"{state_file}: {name}={value!r} is invalid: it must be {rule} "
                             "(the file was damaged or edited)")
