"""`Impala`: the driver (RLlib's ``AsyncSamplesOptimizer``): the loop, train, stats, checkpoints.

`Impala` builds the parts (`DriverLoop`, `Actors`, `RunStats`, the learner thread, the replay
mixer, the `Evaluator`) and runs them: ``step()`` is one turn of RLlib's loop, ``train()``
repeats it until a stop condition, ``start()`` in a background thread.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from impala_lab.backends import make_backend
from impala_lab.config import ImpalaConfig
from impala_lab.driver import checkpoint
from impala_lab.driver.actors import Actors
from impala_lab.driver.background import BackgroundTraining
from impala_lab.driver.build import (
    as_config,
    check_env,
    check_learner_devices,
    initial_weights,
    make_learner,
)
from impala_lab.driver.driver_loop import DriverLoop
from impala_lab.driver.evaluation import Evaluator
from impala_lab.driver.health import HealthMonitor
from impala_lab.driver.knob_control import KnobControl
from impala_lab.driver.latest_frames import LatestFrames
from impala_lab.driver.lifetime import cleanup, live_runs, run_clock, shutdown_all
from impala_lab.driver.replay_mixer import ReplayMixer
from impala_lab.driver.run_stats import (
    RunStats,
    StopCondition,
    history_row,
    pipeline_view,
    stop_function,
)
from impala_lab.driver.supervisor import WorkerSupervisor
from impala_lab.driver.task_pool import SampleTaskPool
from impala_lab.envs.frames import Frames
from impala_lab.errors import ImpalaError
from impala_lab.stats import StatsHistory

__all__ = ["Impala", "StopCondition", "shutdown_all"]

# How often train() checks its stop condition between reports (seconds).
STOP_CHECK_INTERVAL_S = 0.1


def _part(part: str, name: str) -> property:
    """A read-only attribute of the run that one of its parts keeps."""
    return property(lambda self: getattr(getattr(self, part), name),
                    doc=f"``{part}.{name}`` (also in ``stats()``).")


class Impala(KnobControl, BackgroundTraining):
    """The IMPALA driver: actors, task pool, replay mixer, batch buffer, learner, broadcasts.

    Args:
      config: an `ImpalaConfig`, a dict of its fields, or None for the defaults.
      env_creator: a zero-argument env factory (overrides ``config.env``).
      start_learner: False keeps the learner thread unstarted (``impala.learner.step()`` by
        hand, in step-through notebooks).
      weights: ``(arrays, version)`` the run starts from (`restore` passes a checkpoint's);
        None: fresh weights from ``config.seed``, version 0.
      **overrides: config fields to change, e.g. ``Impala(num_workers=4)``.

    Attributes:
      config: the `ImpalaConfig` (a live knob change replaces it).
      loop, supervisor, run_stats, policy, learner, replay, backend, health, frames: the
        run's parts (`DriverLoop`, `WorkerSupervisor`, `RunStats`, `VTracePolicy`, the learner
        thread, `ReplayMixer`, where the workers live, `HealthMonitor`, `LatestFrames`).
      history: the `StatsHistory` of ``record()`` snapshots.
      knob_changes: every live knob change, with its time and env step.
    """

    def step(self, timeout: float = 0.1) -> tuple[int, int]:
        """One turn of the driver loop, timed and counted (RLlib's ``step``), waiting up to
        ``timeout`` seconds for the first finished sample; returns (env steps sampled, env
        steps trained) in this turn."""
        self._check_running()
        driver = self._driver
        if driver is not None and threading.get_ident() != driver.ident:
            raise ImpalaError("this run is training in the background; call impala.pause() "
                              "before stepping it by hand")
        self._apply_pending_knobs()
        with self.run_stats.optimizer_step_timer:
            sampled, trained = self.loop.step(timeout)
        self.run_stats.count_step(sampled, trained)
        for err in self.supervisor.hung_workers():
            self.loop.replace_failed(err)
        if driver is not None:
            self._last_pipeline_view = self._pipeline_view()
        return sampled, trained

    def _check_running(self) -> None:
        if self._stopped:
            raise ImpalaError("this Impala run was stopped; create a new one (or restore a "
                              "checkpoint) to train again")
        self.learner.raise_if_failed()

    # Counters that the parts keep (RLlib's names; ``stats()`` has them all).
    num_steps_sampled = _part("run_stats", "num_steps_sampled")
    num_steps_trained = _part("run_stats", "num_steps_trained")
    num_weight_syncs = _part("run_stats", "num_weight_syncs")
    num_broadcasts = _part("run_stats", "num_broadcasts")
    num_train_batches = _part("run_stats", "num_train_batches")
    episodes_total = _part("run_stats", "episodes_total")
    elapsed_s = _part("run_stats", "elapsed_s")
    num_worker_failures = _part("supervisor", "num_worker_failures")
    workers = _part("supervisor", "workers")

    def __init__(self, config: ImpalaConfig | Mapping[str, Any] | None = None, *,
                 env_creator: Callable[[], Any] | None = None, start_learner: bool = True,
                 weights: tuple[list, int] | None = None, **overrides: Any) -> None:
        """Build the run and start it: env checks, workers, learner (see the class)."""
        self.config = as_config(config, env_creator, overrides)
        self._stopped = True  # until everything below is up
        self.observation_space, self.action_space = check_env(self.config)
        # prepare() refuses an env factory that cannot travel, before anything starts
        self.backend = make_backend(self.config)
        self.backend.prepare()
        self._build_parts()
        try:
            check_learner_devices(self.config)
            if weights is None:
                weights = (initial_weights(self.config, self.observation_space,
                                           self.action_space), 0)
            self.loop.start(*weights)  # the workers sample while the learner is built
            self.policy, self.learner = make_learner(self.config, self.observation_space,
                                                     self.action_space)
            self.policy.set_weights(*weights)
        except BaseException:  # a Ctrl-C while TensorFlow loads must not leave workers up
            self.backend.shutdown()
            raise
        self._finalizer = weakref.finalize(self, cleanup, self.backend, self.learner)
        live_runs.add(self)
        self.loop.learner = self.learner
        self.learner.on_train_step = self.health.observe_learner_step
        self.history = StatsHistory(maxlen=100_000)
        self.evaluator = Evaluator(self.config, self.observation_space, self.action_space,
                                   self.policy.get_weights, lambda: self.num_steps_sampled)
        self._init_controls()
        self._stopped = False
        if start_learner:
            self._start_learner()

    def _start_learner(self) -> None:
        try:
            self.learner.start()
        except BaseException:
            self.stop()
            raise

    def _build_parts(self) -> None:
        """The parts that need no learner."""
        c = self.config
        self.replay = ReplayMixer(c.replay_proportion, c.replay_buffer_num_slots,
                                  c.train_batch_size, c.sample_batch_size, seed=c.seed)
        self.run_stats = RunStats()
        tasks = SampleTaskPool(wait_fn=self.backend.wait)
        self.supervisor = WorkerSupervisor(c, self.backend, tasks)
        self.frames = LatestFrames(self.observation_space)
        self.health = HealthMonitor(int(getattr(self.action_space, "n", 0)),
                                    c.learner_queue_size, clock=run_clock(weakref.ref(self)))
        self.loop = DriverLoop(c, self.replay, None, self.run_stats,
                               actors=Actors(self.backend, tasks, self.supervisor),
                               frames=self.frames)

    def _init_controls(self) -> None:
        """Live knobs, train()'s state and background training (start/pause)."""
        self.knob_changes: list[dict[str, Any]] = []
        self._pending_knobs: dict[str, Any] = {}
        self._knob_lock = threading.Lock()
        self._training = False  # train() runs: liveness is judged
        self._background: threading.Thread | None = None  # start()'s thread
        self._driver: threading.Thread | None = None  # see driving_thread()
        self._pause_requested = threading.Event()
        self.background_error: BaseException | None = None
        self._last_pipeline_view: dict[str, Any] = {}
        self.last_result: dict[str, Any] | None = None
        self.last_error: str | None = None  # the error that ended train(), as text

    def stats(self) -> dict[str, Any]:
        """All figures of the run: RLlib's keys plus episodes, policy lag, liveness, the
        pipeline, the live knobs and learning health (see `RunStats.snapshot`)."""
        judging = self._training and not self.loop.queue_blocked
        return self.run_stats.snapshot(
            config=self.config, learner=self.learner, replay=self.replay, policy=self.policy,
            health=self.health, num_worker_failures=self.supervisor.num_worker_failures,
            liveness=self.supervisor.liveness(judging), judging_liveness=judging,
            pipeline=self._pipeline_view(), last_error=self.last_error,
            evaluation=self.evaluator.latest() if self.evaluator.enabled else None)

    def latest_frames(self) -> Frames | None:
        """The last K observations of env column 0 of the lowest live worker, from any thread.

        Returns:
          a `Frames` (``obs`` uint8 [K, H, W, C], ``env_steps`` [K], ``ends`` [K],
          ``worker_index``, ``column``), or None: no batch of that worker yet, or observations
          that are not images (`impala_lab.envs.frames.not_image_reason` says why).
        """
        return self.frames.latest()

    def _pipeline_view(self) -> dict[str, Any]:
        """Figures of every stage for the diagram; threads other than the driving one read
        the copy its last step left (no torn reads)."""
        if self._driver is not None and threading.get_ident() != self._driver.ident:
            return self._last_pipeline_view
        return pipeline_view(self.loop, len(self.workers))

    def record(self) -> dict[str, Any]:
        """Take a stats snapshot into ``history`` (as `history_row`) and return it."""
        snapshot = self.stats()
        self.history.append(history_row(snapshot))
        self.evaluator.on_report()
        return snapshot

    def train(self, stop: StopCondition = None, *, max_seconds: float | None = None,
              max_env_steps: int | None = None, report_interval: float = 1.0,
              on_report: Callable[[dict], None] | None = None,
              dashboard: bool = False,
              tensorboard_dir: str | os.PathLike | None = None) -> dict[str, Any]:
        """Step until a stop condition holds.

        Args:
          stop: a dict ``{stats key: threshold}`` (stop when any value reaches its
            threshold, e.g. ``{"episode_return_mean": 195}``) or a callable on the stats;
            checked on every report and every ``STOP_CHECK_INTERVAL_S`` between them.
          max_seconds: wall-clock limit of this call.
          max_env_steps: limit on env steps sampled in total.
          report_interval: seconds between snapshots into ``history`` (and ``on_report``).
          on_report: called with each snapshot (the CLI's progress line).
          dashboard: show the live dashboard while training (needs a notebook).
          tensorboard_dir: write each snapshot and the last stats there for TensorBoard.

        Returns:
          the last stats, with ``stop_reason``.
        """
        if tensorboard_dir is not None:
            from impala_lab.dashboard.tensorboard import train_with_tensorboard

            return train_with_tensorboard(self, tensorboard_dir, stop, max_seconds=max_seconds,
                                          max_env_steps=max_env_steps, dashboard=dashboard,
                                          report_interval=report_interval, on_report=on_report)
        if dashboard:
            from impala_lab.dashboard.train_with_dashboard import train_with_dashboard

            return train_with_dashboard(self, stop, max_seconds=max_seconds,
                                        max_env_steps=max_env_steps,
                                        report_interval=report_interval, on_report=on_report)
        stop_fn = stop_function(stop)
        start = time.monotonic()
        # Liveness figures count from here: a run built long ago has not been idle.
        self.supervisor.sampling_since = start
        self._training = True
        try:
            reason = self._train_until(start, stop_fn, max_seconds, max_env_steps,
                                       report_interval, on_report)
        except KeyboardInterrupt:  # an interrupted cell leaves no process behind
            self.record()
            self.stop()
            raise
        except Exception as exc:  # for metrics.csv and the dashboard too
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.record()
            raise
        finally:
            self._training = False
        final = self.record()
        final["stop_reason"] = reason
        return final

    def _train_until(self, start: float, stop_fn: Callable[[dict], bool] | None,
                     max_seconds: float | None, max_env_steps: int | None,
                     report_interval: float, on_report: Callable[[dict], None] | None) -> str:
        """train()'s loop: step, report, and return why it stopped."""
        next_report = start + report_interval
        next_check = start + STOP_CHECK_INTERVAL_S
        reason = None
        while reason is None:
            if self._pause_requested.is_set():
                return "paused"
            self.step()
            now = time.monotonic()
            if now >= next_report:
                next_report = now + report_interval
                snapshot = self.record()
                if on_report is not None:
                    on_report(snapshot)
                if stop_fn is not None and stop_fn(snapshot):
                    reason = "stop condition"
            elif stop_fn is not None and now >= next_check:  # between reports too
                next_check = now + STOP_CHECK_INTERVAL_S
                if stop_fn(self.stats()):
                    reason = "stop condition"
            if max_env_steps is not None and self.num_steps_sampled >= max_env_steps:
                reason = "max_env_steps"
            if max_seconds is not None and now - start >= max_seconds:
                reason = "max_seconds"
        return reason

    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint directory atomically (`impala_lab.driver.checkpoint`): arrays
        (.npz, no pickle) and JSON only; a kill or a full disk leaves the previous one readable.

        During ``start()`` the weights, optimizer state and policy version come from one
        learner step (read under the policy's lock); the counters are the driver's then
        (``num_steps_trained`` may trail the weights by a step or two, never lead them).
        """
        with self.policy.lock:  # no learner step can land between these reads
            weights, opt_state, version = self.policy.checkpoint_state_locked()
            counters = self.run_stats.checkpoint_counters()
        state = checkpoint.checkpoint_state(self.config.to_dict(), version, counters)
        return checkpoint.write_checkpoint(path, state, weights, opt_state)

    @classmethod
    def restore(cls, path: str | os.PathLike, *, env_creator: Callable[[], Any] | None = None,
                fallback_to_prev: bool = False, **overrides: Any) -> Impala:
        """A new run from a checkpoint: weights, optimizer slots, counters and config.

        Config fields in ``overrides`` replace the checkpoint's (``restore(path, lr=0.1)``
        trains at 0.1). ``<path>.prev`` is read when ``path`` is missing, or with
        ``fallback_to_prev=True`` when it cannot be read
        (`impala_lab.driver.checkpoint.read_checkpoint`). ``start_learner=False`` as for `Impala`.
        """
        root, state, weights, opt_state = checkpoint.read_checkpoint_at(
            path, fallback_to_prev=fallback_to_prev)
        start_learner = overrides.pop("start_learner", True)
        config = checkpoint.restored_config(root, state, overrides, env_creator)
        # The learner starts once its optimizer state is in too.
        run = cls(config, start_learner=False, weights=(weights, state["policy_version"]),
                  **overrides)
        run.policy.set_optimizer_state(opt_state)
        # The optimizer state holds the saved rate; the restored config's trains from here.
        run.policy.set_lr(config.lr)
        run.policy.set_entropy_coeff(config.entropy_coeff)
        run.run_stats.restore_counters(state["counters"])
        if start_learner:
            run._start_learner()
        return run

    def stop(self) -> None:
        """End the learner thread and every worker; safe to call more than once."""
        if getattr(self, "_stopped", True) and not hasattr(self, "_finalizer"):
            return
        background = getattr(self, "_background", None)
        if background is not None and background is not threading.current_thread():
            self._pause_requested.set()
            background.join(10.0)
        self._stopped = True
        if hasattr(self, "evaluator"):
            self.evaluator.close()
        if hasattr(self, "_finalizer"):
            self._finalizer()  # runs cleanup once
        live_runs.discard(self)

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
