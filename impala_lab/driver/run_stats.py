"""`RunStats`: the driver's counters, meters, timers and windows, and the ``stats()`` dict.

RLlib's AsyncSamplesOptimizer keys come first, then episodes, policy lag, liveness, the
pipeline, the live knobs and health (docs/training.md, "Logged metrics explained"). Policy lag
is measured when a new batch reaches the driver (``policy_lag``) and when the learner trains on
it (``policy_lag_at_training``, each pass and replay counting): the second, after the learner
queue and the minibatch ring, is the lag V-trace actually corrects.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from impala_lab.batch import SampleBatch, policy_lag
from impala_lab.driver.checkpoint import CHECKPOINT_COUNTERS
from impala_lab.health_flags import flag_codes
from impala_lab.knobs import LIVE_KNOBS
from impala_lab.stats import (
    ThroughputMeter,
    TimerStat,
    WindowStat,
    flatten,
    seconds_since_process_start,
)

#: New batches (and trained batches) whose lags ``stats()["policy_lag_distribution"]`` counts.
LAG_WINDOW = 1000


def lag_counts(lags: Any) -> dict[str, int]:
    """How many of ``lags`` (ints) have each value, keyed as JSON writes them: ``{"3": 10}``."""
    values, counts = np.unique(np.asarray(list(lags), dtype=np.int64), return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}


#: ``train()``'s ``stop``: ``{stats key: threshold}`` (any reached), a callable, or None.
StopCondition = Mapping[str, float] | Callable[[dict], bool] | None


def stop_function(stop: StopCondition) -> Callable[[dict], bool] | None:
    """``train()``'s ``stop`` as a callable on the stats (a dict: any value reached; its keys
    are flat, e.g. ``"policy_lag.mean"``)."""
    if not isinstance(stop, Mapping):
        return stop
    thresholds = dict(stop)

    def stop_fn(s: dict) -> bool:
        flat = flatten(s)
        return any(flat.get(k) is not None and flat[k] >= v for k, v in thresholds.items())

    return stop_fn


def _ms(timer: TimerStat) -> float:
    return round(1000.0 * timer.mean, 3)


class RunStats:
    """What the driver counts and times (RLlib's names where RLlib has them).

    Attributes:
      num_weight_syncs, num_broadcasts: weights sent to a worker / published.
      num_train_batches: train batches put on the learner queue.
      sample_meter, train_meter, queue_wait_meter: env steps sampled / trained, and seconds
        the driver waited on the full learner queue, per second.
      policy_lag: each new batch's mean lag (last 100); largest_policy_lag: the largest of any
        column so far; recent_policy_lags: each new batch's mean lag until `take_policy_lags`
        (TensorBoard's histogram); arrival_lags: the lag of the oldest column of each of the
        last `LAG_WINDOW` new batches, dropped ones too.
      num_samples_dropped_for_lag: env steps of new batches dropped past ``max_policy_lag``.
    """

    def __init__(self) -> None:
        self.num_steps_sampled = 0
        self.num_steps_trained = 0
        self.num_weight_syncs = 0
        self.num_broadcasts = 0
        self.num_train_batches = 0
        self.episodes_total = 0
        self.optimizer_step_timer = TimerStat()
        self.concat_timer = TimerStat()
        self.broadcast_timer = TimerStat()
        self.sample_meter = ThroughputMeter()
        self.train_meter = ThroughputMeter()
        self.queue_wait_meter = ThroughputMeter()
        self.episode_returns: deque[float] = deque(maxlen=100)
        self.episode_lengths: deque[int] = deque(maxlen=100)
        self.policy_lag = WindowStat("policy_lag", 100)
        self.largest_policy_lag = 0
        self.num_samples_dropped_for_lag = 0
        self.arrival_lags: deque[int] = deque(maxlen=LAG_WINDOW)
        self.recent_policy_lags: deque[float] = deque(maxlen=100_000)
        self._start_time = time.monotonic()
        self._elapsed_before_restore = 0.0
        # ``stats()["startup"]``
        self.first_sample_at: float | None = None
        self.first_trained_at: float | None = None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the run was built, plus those of the run it was restored from."""
        return self._elapsed_before_restore + time.monotonic() - self._start_time

    def count_step(self, sampled: int, trained: int) -> None:
        """Count one driver step's env steps sampled and trained."""
        self.sample_meter.add(sampled)
        self.train_meter.add(trained)
        if sampled and self.first_sample_at is None:
            self.first_sample_at = time.monotonic()
        if trained and self.first_trained_at is None:
            self.first_trained_at = time.monotonic()
        self.num_steps_sampled += sampled
        self.num_steps_trained += trained

    def record_sample(self, batch: SampleBatch, policy_version: int) -> None:
        """Count a new batch's finished episodes and its policy lag behind ``policy_version``."""
        self.episode_returns.extend(map(float, batch.episode_returns))
        self.episode_lengths.extend(map(int, batch.episode_lengths))
        self.episodes_total += len(batch.episode_returns)
        lag = policy_lag(policy_version, batch.policy_versions)
        mean_lag = float(lag.mean())
        self.policy_lag.push(mean_lag)
        self.recent_policy_lags.append(mean_lag)
        self.largest_policy_lag = max(self.largest_policy_lag, int(lag.max()))
        self.arrival_lags.append(int(lag.max()))

    def take_policy_lags(self) -> list[float]:
        """Each new batch's mean policy lag since the previous call, oldest first."""
        lags = self.recent_policy_lags
        return [lags.popleft() for _ in range(len(lags))]

    def checkpoint_counters(self) -> dict[str, Any]:
        """`CHECKPOINT_COUNTERS` by name, as a checkpoint stores them."""
        return {name: getattr(self, name) for name in CHECKPOINT_COUNTERS}

    def restore_counters(self, counters: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's counters (elapsed_s adds to this run's clock)."""
        for name in CHECKPOINT_COUNTERS[:-1]:
            setattr(self, name, counters[name])
        self._elapsed_before_restore = counters["elapsed_s"]

    def snapshot(self, *, config: Any, learner: Any, replay: Any, policy: Any, health: Any,
                 num_worker_failures: int, liveness: tuple[float, list[dict[str, Any]]],
                 judging_liveness: bool, pipeline: dict[str, Any],
                 last_error: str | None, evaluation: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
        """``Impala.stats()``: every figure of the run, from these counters and its parts.

        ``liveness``: seconds since the last sample reached the driver, and per-worker rows,
        judged only with ``judging_liveness`` (False while the driver waits on the full learner
        queue or is not training); ``pipeline``: `pipeline_view`'s dict; ``last_error``: what
        ended ``train()``; ``evaluation``: the latest `Evaluator` result (None: no key).
        """
        returns = list(self.episode_returns)
        return_mean = float(np.mean(returns)) if returns else math.nan
        seconds_since_sample, workers = liveness
        snapshot = {
            "sample_throughput": round(self.sample_meter.rate(), 3),
            "train_throughput": round(self.train_meter.rate(), 3),
            "num_steps_sampled": self.num_steps_sampled,
            "num_steps_trained": self.num_steps_trained,
            "num_weight_syncs": self.num_weight_syncs,
            "num_broadcasts": self.num_broadcasts,
            "num_steps_replayed": replay.num_replayed,
            "num_worker_failures": num_worker_failures,
            "time_total_s": round(self.elapsed_s, 3),
            "startup": {"first_sample_s": seconds_since_process_start(self.first_sample_at),
                        "first_train_s": seconds_since_process_start(self.first_trained_at)},
            "timing_breakdown": {
                "optimizer_step_time_ms": _ms(self.optimizer_step_timer),
                **{k: _ms(t) for k, t in learner.timers().items()},
                "batch_concat_time_ms": _ms(self.concat_timer),
                "broadcast_time_ms": _ms(self.broadcast_timer),
            },
            "learner_queue": learner.learner_queue_stat.stats(),
            "learner": dict(learner.last_train_metrics),
            "episode_return_mean": return_mean,
            "episode_len_mean": (float(np.mean(self.episode_lengths))
                                 if self.episode_lengths else math.nan),
            "episode_return_count": len(returns),
            "last_error": last_error,
            "episodes_total": self.episodes_total,
            **self._lag_figures(learner),
            "weights_version": policy.version,
            "seconds_since_sample": seconds_since_sample,
            "workers": workers,
            "pipeline": pipeline,
            "knobs": {k: getattr(config, k) for k in LIVE_KNOBS},
            # RLlib's name: the rate the optimizer uses now (lr_schedule's, or the lr knob)
            "cur_lr": float(policy.lr.numpy()) if hasattr(policy, "lr") else config.lr,
            "lr_schedule": (None if config.lr_schedule is None
                            else [list(p) for p in config.lr_schedule]),
            **({"evaluation": evaluation} if evaluation is not None else {}),
        }
        if config.lr_schedule is not None:  # the lr slider follows the schedule
            snapshot["knobs"]["lr"] = snapshot["cur_lr"]
        snapshot["health"] = self._judge_health(snapshot, health, learner, policy, config,
                                                judging_liveness)
        return snapshot

    def _lag_figures(self, learner: Any) -> dict[str, Any]:
        """The ``stats()`` keys of policy lag, at arrival and at training (a stand-in learner
        without them reads as no figures yet)."""
        lag = self.policy_lag.stats()
        train_lag_stat = getattr(learner, "train_lag_stat", None)
        train_lag = train_lag_stat.stats() if train_lag_stat is not None else {"count": 0}
        return {
            "policy_lag": {"mean": lag["mean"] if lag["count"] else math.nan,
                           "max": self.largest_policy_lag},
            "policy_lag_at_training": {
                "mean": train_lag["mean"] if train_lag["count"] else math.nan,
                "max": getattr(learner, "max_train_lag", 0)},
            "num_samples_dropped_for_lag": self.num_samples_dropped_for_lag,
            "policy_lag_distribution": {
                "at_arrival": lag_counts(self.arrival_lags),
                "at_training": lag_counts(getattr(learner, "recent_train_lags", ()))},
        }

    def _judge_health(self, snapshot: dict[str, Any], health: Any, learner: Any, policy: Any,
                      config: Any, judging_liveness: bool) -> dict[str, Any]:
        """``stats()["health"]``: the monitor's verdict on the figures of ``snapshot``."""
        return health.check(
            episode_return_mean=snapshot["episode_return_mean"],
            episode_return_count=snapshot["episode_return_count"],
            learner_queue=snapshot["learner_queue"],
            learner_wait_ms=1000.0 * learner.data_wait_timer().mean,
            learner_grad_ms=1000.0 * learner.grad_timer.mean,
            driver_blocked_fraction=self.queue_wait_meter.rate(),
            policy_lag=snapshot["policy_lag"]["mean"],
            num_updates_skipped=getattr(policy, "num_updates_skipped", 0),
            seconds_since_sample=(snapshot["seconds_since_sample"] if judging_liveness
                                  else math.nan),
            stalled_workers=[w for w in snapshot["workers"] if w["stalled"]],
            sample_timeout_s=config.sample_timeout_s)


def pipeline_view(loop: Any, num_workers: int) -> dict[str, Any]:
    """``stats()["pipeline"]``: every stage's figures that the diagram draws."""
    config, learner = loop.config, loop.learner
    mb = learner.minibatch_buffer
    in_flight = loop.actors.in_flight_counts()
    view = {
        "backend": config.backend,
        "num_workers": num_workers,
        "in_flight": {str(getattr(w, "index", w)): n for w, n in in_flight.items()},
        "max_in_flight": config.max_sample_requests_in_flight_per_worker,
        "replay_stored": loop.replay.num_stored,
        "replay_capacity": loop.replay.capacity,
        "batch_buffer_steps": loop.batch_buffer_steps,
        "train_batch_size": config.train_batch_size,
        "learner_queue_len": learner.inqueue.qsize(),
        "learner_queue_size": config.learner_queue_size,
        "minibatch_slots": [list(s) for s in mb.slots()],
        "num_sgd_iter": mb.num_sgd_iter,
        "broadcast_interval": config.broadcast_interval,
        "num_train_batches": loop.run_stats.num_train_batches,
    }
    devices = getattr(learner, "devices", None)
    if devices is not None:  # the MultiGPULearner: its devices and its data buffers' states
        view["learner_devices"] = list(devices)
        view["loader_buffers"] = learner.buffer_states()
    return view


def history_row(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """A ``stats()`` snapshot as one flat row of ``history`` and metrics.csv: ``health`` as
    ``health.status`` and ``health.flags`` (codes joined with ``;``), without ``pipeline``,
    ``workers`` and ``policy_lag_distribution``."""
    row = flatten({k: v for k, v in snapshot.items()
                   if k not in ("pipeline", "health", "workers", "policy_lag_distribution")})
    row.pop("learner_queue.count", None)
    health = snapshot.get("health") or {}
    row["health.status"] = health.get("status")
    row["health.flags"] = flag_codes(health)
    return row
