"""`Impala`: the driver (RLlib's ``AsyncSamplesOptimizer``): the loop, train, stats, checkpoints.

One ``step()`` is one turn of RLlib's loop (`impala_lab.driver.driver_loop.DriverLoop.step`),
timed and counted::

    for each finished sample request (task pool, completion order):
        for (worker, batch) in replay mixer(new batch, then replayed ones):
            append to the batch buffer; once it holds >= train_batch_size env steps,
            concatenate along B and put it on the learner's (bounded) inqueue
            if the batch is new (worker is not None):
                broadcast fresh weights if the learner updated them and this broadcast
                served >= broadcast_interval returns; send the current weights to the worker
                ask the worker for another sample
    count the env steps the learner reports trained since the last turn

`Impala` builds the parts and runs them: the `DriverLoop`, the `Actors` (backend, task pool,
`WorkerSupervisor`), the `RunStats` (``stats()``), the learner thread, the replay mixer and
the `Evaluator` (the learner's weights on envs of its own). ``train()`` repeats the turn
until a stop condition, ``start()`` in a background thread; ``save()``/``restore()`` keep a
run in a checkpoint (`impala_lab.driver.checkpoint`); `impala_lab.driver.lifetime` ends runs.
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
      start_learner: False keeps the learner thread unstarted, so ``impala.learner.step()``
        can be called by hand between driver steps (step-through notebooks).
      **overrides: config fields to change, e.g. ``Impala(num_workers=4)``.

    Attributes:
      config: the `ImpalaConfig` (a live knob change replaces it).
      loop: the `DriverLoop`: one turn of the loop, the batch buffer, the broadcasts.
      supervisor: the `WorkerSupervisor`: the workers, their failures and liveness.
      run_stats: the `RunStats`: counters, meters and timers behind ``stats()``.
      policy, learner, replay, backend: the `VTracePolicy`, the learner thread, the
        `ReplayMixer` and where the workers live.
      health: the `HealthMonitor`; history: the `StatsHistory` of ``record()`` snapshots;
      frames: the `LatestFrames` of one worker's env (``latest_frames()``);
      knob_changes: every live knob change, with its time and env step.
    """

    # ------------------------------------------------------------------ the loop
    def step(self, timeout: float = 0.1) -> tuple[int, int]:
        """One turn of the driver loop, timed and counted (RLlib's ``step``).

        Args:
          timeout: seconds to wait for the first finished sample; the driver blocks on the
            workers instead of spinning. The inline backend never waits.

        Returns:
          (env steps sampled, env steps trained) in this turn.
        """
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

    # ------------------------------------------------------------------ construction
    def __init__(self, config: ImpalaConfig | Mapping[str, Any] | None = None, *,
                 env_creator: Callable[[], Any] | None = None, start_learner: bool = True,
                 weights: tuple[list, int] | None = None, **overrides: Any) -> None:
        """Build the run and start it: env checks, workers, learner (see the class).

        Args:
          weights: ``(arrays, version)`` the run starts from (`restore` passes a
            checkpoint's); None: fresh weights from ``config.seed``, version 0.
        """
        self.config = as_config(config, env_creator, overrides)
        self._stopped = True  # until everything below is up
        self.observation_space, self.action_space = check_env(self.config)
        # Backend checks that can fail (an env factory that cannot travel) run before
        # TensorFlow loads and before any process starts.
        self.backend = make_backend(self.config)
        self.backend.prepare()
        self._build_parts()
        try:
            check_learner_devices(self.config)
            if weights is None:
                weights = (initial_weights(self.config, self.observation_space,
                                           self.action_space), 0)
            # The workers need only numpy weights: they sample while the learner is built.
            self.loop.start(*weights)
            self.policy, self.learner = make_learner(self.config, self.observation_space,
                                                     self.action_space)
            self.policy.set_weights(*weights)
        except BaseException:  # a Ctrl-C while TensorFlow loads must not leave workers up
            self.backend.shutdown()
            raise
        self._finalizer = weakref.finalize(self, cleanup, self.backend, self.learner)
        live_runs.add(self)
        self._connect_learner()
        self._init_controls()
        self._stopped = False
        if start_learner:
            try:
                self.learner.start()
            except BaseException:
                self.stop()
                raise

    def _build_parts(self) -> None:
        """The parts that need no learner: replay, stats, task pool, supervisor, the loop,
        the health monitor."""
        c = self.config
        self.replay = ReplayMixer(c.replay_proportion, c.replay_buffer_num_slots,
                                  c.train_batch_size, c.sample_batch_size, seed=c.seed)
        self.run_stats = RunStats()
        tasks = SampleTaskPool(wait_fn=self.backend.wait)
        self.supervisor = WorkerSupervisor(c, self.backend, tasks)
        self.frames = LatestFrames(self.observation_space)
        # Learning health: fed every learner step from the learner thread, judged in stats().
        self.health = HealthMonitor(int(getattr(self.action_space, "n", 0)),
                                    c.learner_queue_size, clock=run_clock(weakref.ref(self)))
        self.loop = DriverLoop(c, self.replay, None, self.run_stats,
                               actors=Actors(self.backend, tasks, self.supervisor),
                               frames=self.frames)

    def _connect_learner(self) -> None:
        """The parts that need the learner: the loop's port, health, history, evaluation."""
        c = self.config
        self.loop.learner = self.learner
        self.learner.on_train_step = self.health.observe_learner_step
        self.history = StatsHistory(maxlen=100_000)
        self.evaluator = Evaluator(c, self.observation_space, self.action_space,
                                   self.policy.get_weights, lambda: self.num_steps_sampled)

    def _init_controls(self) -> None:
        """Live knobs, train()'s state and background training (start/pause)."""
        self.knob_changes: list[dict[str, Any]] = []
        self._pending_knobs: dict[str, Any] = {}
        self._knob_lock = threading.Lock()
        self._training = False  # train() runs: liveness is judged
        self._background: threading.Thread | None = None  # start()'s thread
        # The thread that steps the run while others read stats() (see driving_thread()).
        self._driver: threading.Thread | None = None
        self._pause_requested = threading.Event()
        self.background_error: BaseException | None = None
        self._last_pipeline_view: dict[str, Any] = {}
        self.last_result: dict[str, Any] | None = None
        self.last_error: str | None = None  # the error that ended train(), as text

    # ------------------------------------------------------------------ stats
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
        """The last `impala_lab.envs.frames.FRAME_STRIP_LENGTH` observations of one
        env, as new batches brought them: column 0 of the live worker with the lowest index
        (replayed batches never count). Safe to call from any thread while the run trains.

        Returns:
          a `Frames` (``obs`` uint8 [K, H, W, C], ``env_steps`` [K], ``ends`` [K],
          ``worker_index``, ``column``; `impala_lab.envs.frames.strip_rgb` draws
          them), or None: no batch of that worker yet, or observations that are not images
          (`impala_lab.envs.frames.not_image_reason` says why).
        """
        return self.frames.latest()

    def _pipeline_view(self) -> dict[str, Any]:
        """Figures of every stage for the diagram. While another thread drives the run, other
        threads read the copy it leaves at the end of each step (no torn reads)."""
        if self._driver is not None and threading.get_ident() != self._driver.ident:
            return self._last_pipeline_view
        return pipeline_view(self.loop, len(self.workers))

    def record(self) -> dict[str, Any]:
        """Take a stats snapshot into ``history`` (a row of metrics.csv, see
        `impala_lab.driver.run_stats.history_row`) and return it."""
        snapshot = self.stats()
        self.history.append(history_row(snapshot))
        self.evaluator.on_report()  # every evaluation_interval reports (driver/evaluation.py)
        return snapshot

    # ------------------------------------------------------------------ train
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
          dashboard: show the live dashboard while training (needs a notebook; see
            `impala_lab.dashboard.train_with_dashboard`).
          tensorboard_dir: write each snapshot and the last stats there as TensorBoard
            summaries (see `impala_lab.dashboard.tensorboard`).

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
            elif stop_fn is not None and now >= next_check:
                # Between reports too: a run that stops on its return ends when it gets
                # there, not up to a report interval later.
                next_check = now + STOP_CHECK_INTERVAL_S
                if stop_fn(self.stats()):
                    reason = "stop condition"
            if max_env_steps is not None and self.num_steps_sampled >= max_env_steps:
                reason = "max_env_steps"
            if max_seconds is not None and now - start >= max_seconds:
                reason = "max_seconds"
        return reason

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint directory atomically: arrays (.npz, no pickle) and JSON only.

        The files go into a new directory beside ``path``, are fsynced, and the directory is
        swapped in with renames at the end (`impala_lab.driver.checkpoint.write_checkpoint`): a kill
        or a full disk at any moment leaves the previous checkpoint readable. During
        background training (``start()``) the weights, the optimizer state (its
        ``iterations`` too) and the policy version come from one and the same learner step
        (read under the policy's lock); the counters are the driver's at that moment
        (``num_steps_trained`` counts the learner steps the driver has been told about, so it
        may trail the weights by a step or two, never lead them).
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
        trains at 0.1: the optimizer's learning rate, the policy's ``lr`` and
        ``entropy_coeff`` variables follow the restored config). ``path`` missing while
        ``<path>.prev`` holds a checkpoint means a save was killed between its two renames:
        the previous checkpoint is read, with a warning. ``fallback_to_prev=True`` also
        reads ``<path>.prev`` when ``path`` itself cannot be read (see
        `impala_lab.driver.checkpoint.read_checkpoint`). ``start_learner=False`` keeps the
        learner thread unstarted, as for `Impala`.
        """
        root, state, weights, opt_state = checkpoint.read_checkpoint_at(
            path, fallback_to_prev=fallback_to_prev)
        start_learner = overrides.pop("start_learner", True)
        config = checkpoint.restored_config(root, state, overrides, env_creator)
        # The workers sample with the checkpoint's weights from their first request; the
        # learner starts once its optimizer state is in too.
        run = cls(config, start_learner=False, weights=(weights, state["policy_version"]),
                  **overrides)
        run.policy.set_optimizer_state(opt_state)
        # The optimizer state holds the learning rate it was saved with; the restored config
        # (the checkpoint's, or an override) is what trains from here on.
        run.policy.set_lr(config.lr)
        run.policy.set_entropy_coeff(config.entropy_coeff)
        run.run_stats.restore_counters(state["counters"])
        if not start_learner:
            return run
        try:
            run.learner.start()
        except BaseException:
            run.stop()
            raise
        return run

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
