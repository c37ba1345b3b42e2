"""`DriverLoop`: one turn of the driver loop (RLlib's ``AsyncSamplesOptimizer._step``).

The turn, in `DriverLoop.step`::

    for (worker, batch) in replay.mix(completed_samples(timeout)):
        append batch to batch_buffer; once it holds >= train_batch_size env steps:
            put_on_learner_queue(concat_samples(batch_buffer)); empty the buffer
        if worker is None: continue                  # a replayed batch: no answer
        record_sample(batch)                          # episodes, policy lag
        if num_sent >= broadcast_interval and learner.take_weights_updated():
            broadcast()                               # publish fresh weights
        num_sent += 1
        send_weights_and_request(worker)              # its weights, one more request
    learner.drain_trained(): the env steps the learner trained on since the last turn

The loop takes the learner's weights-updated flag (read and clear in one locked step) only
once the interval is reached, so a take never wastes an update. Unlike RLlib, which forgot the
published weights and the broadcast counter after every ``_step``, both persist across turns,
so broadcast_interval means what its name says.

The loop's state between turns is four public attributes (``batch_buffer``,
``batch_buffer_steps``, ``num_sent``, ``weights_ref``); all a turn does to the world goes
through five public methods, which Exercise 4's stand-in
(`impala_lab.classroom.exercises.driver_step.StepDriver`) overrides.

Policy lag is a dial (the IMPALA paper's appendix E): a new batch more than ``max_policy_lag``
updates behind is dropped where it arrives (its worker is still answered), and
``extra_policy_lag`` = K publishes only weights at least K updates older than the learner's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from impala_lab.batch import SampleBatch, concat_samples, policy_lag
from impala_lab.driver.actors import Actors
from impala_lab.driver.latest_frames import LatestFrames
from impala_lab.driver.replay_mixer import ReplayMixer
from impala_lab.driver.run_stats import RunStats
from impala_lab.errors import ImpalaError, WorkerError
from impala_lab.learner.port import LearnerPort


class DriverLoop:
    """The driver's loop: its state between turns and the calls a turn makes.

    Args:
      config: the run's `ImpalaConfig` (the run hands in a new one when a knob changes).
      replay: the `ReplayMixer`.
      learner: the `LearnerPort`, the loop's only way to the learner (None until it is built:
        `Impala` starts the workers first, with `start`).
      run_stats: the run's `RunStats` (counters and timers).
      actors: the `Actors` (task pool, supervisor, backend); None in a stand-in.
      frames: a `LatestFrames` (the dashboard's frame strip) shown every new batch, or None.

    Attributes:
      batch_buffer: the batches (new and replayed) waiting to become a train batch.
      batch_buffer_steps: their env steps (``batch.count`` each; the dashboard shows it).
      num_sent: new batches answered since the last broadcast.
      weights_ref: the published weights that ``send_weights_and_request`` sends.
      weights_history: ``(weights, version)`` read from the learner and not yet published,
        oldest first (only while ``extra_policy_lag`` > 0 holds broadcasts back).
      queue_blocked: True while the driver waits on the full learner queue.
    """

    def __init__(self, config: Any, replay: ReplayMixer | None, learner: LearnerPort | None,
                 run_stats: RunStats | None, *, actors: Actors | None = None,
                 frames: LatestFrames | None = None) -> None:
        self.config = config
        self.replay = replay
        self.learner = learner
        self.run_stats = run_stats
        self.actors = actors
        self.frames = frames
        self.batch_buffer: list[SampleBatch] = []
        self.batch_buffer_steps = 0
        self.num_sent = 0
        self.weights_ref: Any = None
        self.weights_history: deque[tuple[Any, int]] = deque()
        self.queue_blocked = False
        # id(batch) -> the learner's version its lag was checked against at arrival
        self.arrival_versions: dict[int, int] = {}

    def step(self, timeout: float) -> tuple[int, int]:
        """One turn of the loop (see the module docstring), waiting up to ``timeout`` seconds
        for the first finished sample. Returns (env steps of the new batches, env steps the
        learner reported trained)."""
        sample_timesteps = 0
        c = self.config
        for worker, batch in self.replay.mix(self.completed_samples(timeout)):
            self.batch_buffer.append(batch)
            self.batch_buffer_steps += batch.count
            if self.batch_buffer_steps >= c.train_batch_size:
                with self.run_stats.concat_timer:
                    train_batch = concat_samples(self.batch_buffer)
                self.batch_buffer = []
                self.batch_buffer_steps = 0
                self.put_on_learner_queue(train_batch)

            if worker is None:  # a replayed batch: no weights, no new request
                continue
            sample_timesteps += batch.count
            self.record_sample(batch)
            # Pull new weights once updated, to avoid excessive correlation between actors.
            if self.num_sent >= c.broadcast_interval and self.learner.take_weights_updated():
                self.broadcast()
            self.num_sent += 1
            self.send_weights_and_request(worker)

        return sample_timesteps, self.learner.drain_trained()

    # ------------------------------------------------------------------ the calls a turn makes
    def completed_samples(self, timeout: float) -> Iterator[tuple[Any, SampleBatch]]:
        """The finished samples, ``(worker, batch)``, in completion order (the task pool).

        A failed worker is replaced (`replace_failed`) and the others' samples follow. A
        batch more than ``max_policy_lag`` updates behind is dropped here (`drop_for_lag`).
        Every new batch, dropped or not, is shown to ``frames``.
        """
        blocking = True
        self.arrival_versions.clear()
        # The run's env steps before this turn, and those of its new batches so far.
        steps_before, arrived = self.run_stats.num_steps_sampled, 0
        while True:
            try:
                for worker, batch in self.actors.completed(blocking, timeout):
                    arrived += batch.count
                    self.show_frames(worker, batch, steps_before + arrived)
                    version = self.learner.weights_version
                    self.arrival_versions[id(batch)] = version
                    if self.lag_of(batch, version) > self.config.max_policy_lag:
                        self.drop_for_lag(worker, batch)
                    else:
                        yield worker, batch
                return
            except WorkerError as err:
                self.replace_failed(err)
                blocking = False

    def show_frames(self, worker: Any, batch: SampleBatch, env_steps: int) -> None:
        """Let ``frames`` take a new batch's last frames (``env_steps``: the run's, with it)."""
        if self.frames is None or self.frames.kind is None:
            return
        lowest = self.actors.lowest_live_index(default=worker.index)
        self.frames.observe(worker.index, batch, lowest_live_index=lowest, env_steps=env_steps)

    def lag_of(self, batch: SampleBatch, version: int) -> int:
        """Learner updates between the oldest column's weights and the learner's ``version``."""
        return int(policy_lag(version, batch.policy_versions).max())

    def drop_for_lag(self, worker: Any, batch: SampleBatch) -> None:
        """A new batch too far behind: its env steps, episodes and lag are counted, it goes
        neither to replay nor to the learner, and its worker is answered as for any batch."""
        self.run_stats.count_step(batch.count, 0)
        self.run_stats.num_samples_dropped_for_lag += batch.count
        self.record_sample(batch)
        if (self.num_sent >= self.config.broadcast_interval
                and self.learner.take_weights_updated()):
            self.broadcast()
        self.num_sent += 1
        self.send_weights_and_request(worker)

    def put_on_learner_queue(self, train_batch: SampleBatch) -> None:
        """Put a train batch on the learner's bounded queue: back-pressure, but never a hang
        (a dead or unstarted learner raises)."""
        start = time.perf_counter()
        while not self.learner.put_batch(train_batch, timeout=0.5):
            self.queue_blocked = True  # no sample is handed out meanwhile: no stall
            self.learner.raise_if_failed()
            if not self.learner.is_alive():
                raise ImpalaError(
                    f"the learner queue is full ({self.config.learner_queue_size} batches) "
                    "and the learner thread is not running; with start_learner=False call "
                    "impala.learner.step() to consume batches")
        self.run_stats.num_train_batches += 1
        self.run_stats.queue_wait_meter.add(time.perf_counter() - start)
        self.queue_blocked = False

    def record_sample(self, batch: SampleBatch) -> None:
        """Count a new batch's episodes and its policy lag behind the learner's version at
        its arrival (a lag read later, after a wait on the full queue, could pass
        ``max_policy_lag``)."""
        version = self.arrival_versions.pop(id(batch), None)
        if version is None:
            version = self.learner.weights_version
        self.run_stats.record_sample(batch, version)

    def broadcast(self) -> None:
        """Publish the learner's current weights once (a new reference every worker reads)
        and reset `num_sent`; with ``extra_policy_lag`` > 0, older ones (`held_back_weights`).
        """
        with self.run_stats.broadcast_timer:
            self._publish(*self.learner.get_weights())

    def _publish(self, weights: Any, version: int) -> None:
        """Publish ``(weights, version)`` or what `held_back_weights` picks; reset `num_sent`."""
        chosen = self.held_back_weights(weights, version)
        if chosen is not None:
            self.weights_ref = self.actors.put_weights(*chosen)
            self.run_stats.num_broadcasts += 1
        self.num_sent = 0

    def held_back_weights(self, weights: Any, version: int) -> tuple[Any, int] | None:
        """The ``(weights, version)`` to publish now, or None to keep the published ones:
        the newest read so far whose version is at most the learner's ``version`` minus K."""
        lag = self.config.extra_policy_lag
        if lag == 0 and not self.weights_history:
            return weights, version
        self.weights_history.append((weights, version))
        chosen = None
        while self.weights_history and self.weights_history[0][1] <= version - lag:
            chosen = self.weights_history.popleft()
        if chosen is None and self.weights_ref is None:  # the first broadcast: the oldest
            chosen = self.weights_history.popleft()
        return chosen

    def send_weights_and_request(self, worker: Any, initial: bool = False) -> None:
        """Send ``worker`` the published weights and ask it for another sample (``initial``:
        a new worker, which gets ``max_sample_requests_in_flight_per_worker`` requests)."""
        if not initial:  # called once per sample the worker returned
            self.actors.sample_returned(worker)
        worker.set_weights(self.weights_ref)
        self.run_stats.num_weight_syncs += 1
        n = self.config.max_sample_requests_in_flight_per_worker if initial else 1
        self.actors.request_samples(worker, n)

    # ------------------------------------------------------------------ outside a turn
    def start(self, weights: list, version: int = 0) -> None:
        """Start the workers, publish the run's first weights (numpy arrays, the learner's
        start; ``version`` 0 or a checkpoint's) and send each its first requests. `Impala` calls
        it before the learner is built, so the workers sample while TensorFlow loads."""
        workers = self.actors.start()
        with self.run_stats.broadcast_timer:
            self._publish(weights, version)
        for worker in workers:
            self.send_weights_and_request(worker, initial=True)

    def replace_failed(self, err: WorkerError) -> None:
        """Replace the worker that failed with ``err`` (or raise: see `WorkerSupervisor`)."""
        self.send_weights_and_request(self.actors.replace(err), initial=True)
