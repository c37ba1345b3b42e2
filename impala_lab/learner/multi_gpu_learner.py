"""`MultiGPULearner`: the learner on several devices, fed by loader threads (RLlib's
``TFMultiGPULearner``).

The data's way through it::

    inqueue (train batches, from the driver)
       │  loader thread: split B into n equal column groups, copy group i onto device i
       v
    idle_buffers ──> DataBuffer [part 0 on device 0 | ... | part n-1 on device n-1]
       ^                  │
       │                  v
       │             ready_buffers ──> MinibatchBuffer (each buffer served up to
       │                                 num_sgd_iter times, ttl ramp 1, 2, ...)
       │                                         │
       └── released after its last pass ─────────┤
                                                 v
                 towers: on device i, grads_i = d loss(part i) / d weights
                 grad = grads_0 + ... + grads_{n-1}; clip; one optimizer step

At most ``num_data_loader_buffers`` train batches are staged on the devices (plus the one
being trained on). Devices are ``/gpu:i``; ``fake_gpus=True`` splits the CPU into
``num_gpus`` logical devices ``/cpu:i``, so the design runs on a laptop; ``num_gpus`` 0 uses
``/cpu:0``.

Explicit towers, not ``tf.distribute.MirroredStrategy``: one ``tf.function`` calls the
ordinary ``VTracePolicy.compute_gradients`` under ``tf.device(d)`` per device and
``apply_gradients`` once, so the policy is reused unchanged and the split, the all-reduce and
the staging stay visible.

Gradients are summed, not averaged as RLlib's towers did: the loss is a sum over T x B steps
and V-trace runs within a column, so the batch's gradient is the sum of the towers' and equals
the single-device one up to float32 rounding (the global-norm clip and RMSProp's epsilon would
see a mean's 1/num_gpus). ``total_loss``, ``policy_loss`` and ``vf_loss`` add up; per-step
means are averaged (``vf_explained_var`` only approximately).

A buffer's last pass returns it to the idle queue before its step (as RLlib), so a loader
stages the next batch while the towers run: a staged part is immutable tensors. One loader
thread by default keeps arrival order (oldest data first, low policy lag). A loader's
exception reaches the driver as a `LearnerError` whose stage is ``"loader thread N"``.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from impala_lab.batch import SampleBatch
from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError, LearnerError, NonFiniteLossError
from impala_lab.learner.learner_thread import LearnerThread
from impala_lab.learner.minibatch_buffer import MinibatchBuffer
from impala_lab.learner.vtrace_policy import batch_to_tensors, describe_nonfinite
from impala_lab.stats import TimerStat

# The loss statistics that are sums over the parts (the others are means).
SUM_STATS = ("total_loss", "policy_loss", "vf_loss")

BUFFER_STATES = ("idle", "loading", "ready", "in use")


# ---------------------------------------------------------------------- devices
def configure_learner_devices(config: ImpalaConfig) -> list[str]:
    """The learner's device names for ``config`` (``["/gpu:0", "/gpu:1"]``, fake
    ``["/cpu:0", "/cpu:1"]``, or ``["/cpu:0"]`` for num_gpus 0); sets up the fake ones.

    TensorFlow fixes its devices when it first runs anything, so call this before the policy
    is built (``Impala`` does); logical CPUs an earlier run made are reused.

    Raises:
      ConfigError: more real GPUs than TensorFlow sees (naming the devices it sees), or fake
        devices after TensorFlow was initialised with fewer logical CPUs.
    """
    n = config.num_learner_devices
    if config.num_gpus == 0:
        return ["/cpu:0"]
    if config.fake_gpus:
        _ensure_logical_cpus(n)
        return [f"/cpu:{i}" for i in range(n)]
    gpus = tf.config.list_physical_devices("GPU")
    if config.num_gpus > len(gpus):
        seen = ", ".join(d.name for d in tf.config.list_physical_devices())
        raise ConfigError(
            f"num_gpus={config.num_gpus} is invalid: TensorFlow sees {len(gpus)} GPU(s) "
            f"(devices it sees: {seen}); lower num_gpus to at most {len(gpus)}, or set "
            f"fake_gpus=True to split the CPU into {n} logical devices")
    return [f"/gpu:{i}" for i in range(n)]


def _ensure_logical_cpus(n: int) -> None:
    if n <= 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) >= n:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        return
    except RuntimeError:  # "Virtual devices cannot be modified after being initialized"
            have = len(tf.config.list_logical_devices("CPU"))
    if have < n:
        raise ConfigError(
            f"fake_gpus=True with num_gpus={n} needs {n} logical CPU devices, but TensorFlow "
            f"was already initialised in this process with {have}; create the Impala run "
            f"before any other TensorFlow use, or restart the kernel")


def combine_tower_stats(tower_stats: list[dict[str, tf.Tensor]]) -> dict[str, tf.Tensor]:
    """The whole batch's loss stats from the parts' (sums added, means averaged)."""
    n = float(len(tower_stats))
    return {key: tf.add_n([s[key] for s in tower_stats]) / (1.0 if key in SUM_STATS else n)
            for key in tower_stats[0]}


# ---------------------------------------------------------------------- data buffers
@dataclass(eq=False)
class DataBuffer:
    """One device-resident slot: a train batch, split by columns, staged part i on device i.

    Attributes:
      index: the slot's number (0 .. num_data_loader_buffers - 1).
      parts: per device, `batch_to_tensors`'s loss inputs on that device (obs
        [T, B/n, ...], actions etc. [T, B/n], behaviour_logits [T, B/n, A], bootstrap_obs
        [B/n, ...]); None while idle.
      batch: the host `SampleBatch` (its count, error reports); None while idle.
      state: one of `BUFFER_STATES`; num_loads: batches staged here so far; num_uses: passes
        served since the latest load.
    """

    index: int
    parts: tuple[dict[str, tf.Tensor], ...] | None = field(default=None, repr=False)
    batch: SampleBatch | None = field(default=None, repr=False)
    state: str = "idle"
    num_loads: int = 0
    num_uses: int = 0


# ---------------------------------------------------------------------- the learner
class MultiGPULearner(LearnerThread):
    """Learner thread that trains on several devices, fed by loader threads.

    Keeps `LearnerThread`'s contract (the `LearnerPort` calls, ``step(block_timeout)``,
    ``stop()``, the timers); its minibatch ring runs over the ready buffers, as RLlib's.

    Args:
      policy: the run's `VTracePolicy` (its model, optimizer and lock, as they are).
      config: the run's `ImpalaConfig` (num_gpus, fake_gpus, num_data_loader_buffers and
        the learner queue's and ring's sizes).
      num_loader_threads: threads staging batches onto the devices.

    Attributes:
      devices: the device names; buffers: every `DataBuffer`, moving between the
        idle_buffers and ready_buffers queues; loader_threads: started with the learner
        (or by the first ``step()`` when stepping by hand).
    """

    stage = "learner thread"

    def __init__(self, policy: Any, config: ImpalaConfig, num_loader_threads: int = 1) -> None:
        if type(num_loader_threads) is not int or num_loader_threads < 1:
            raise ValueError(f"num_loader_threads={num_loader_threads!r} is invalid: use an "
                             f"integer >= 1")
        self.devices = configure_learner_devices(config)
        super().__init__(policy, config.minibatch_buffer_size, config.num_sgd_iter,
                         config.learner_queue_size, config.learner_queue_timeout)
        self.config = config
        self.buffers = [DataBuffer(i) for i in range(config.num_data_loader_buffers)]
        self.idle_buffers: queue.Queue[DataBuffer] = queue.Queue()
        self.ready_buffers: queue.Queue[DataBuffer] = queue.Queue()
        for buf in self.buffers:
            self.idle_buffers.put(buf)
        self.minibatch_buffer = MinibatchBuffer(self.ready_buffers, config.minibatch_buffer_size,
                                                config.num_sgd_iter,
                                                timeout=config.learner_queue_timeout)
        self.loader_threads = [_LoaderThread(self, i, share_stats=(i == 0))
                               for i in range(num_loader_threads)]
        self._loader_error: LearnerError | None = None
        self._error_lock = threading.Lock()
        self._pending_wait = 0.0  # waited for a ready buffer in calls that got none
        self.num_traces = 0
        # As in VTracePolicy: no autograph; final_obs rows vary in number.
        relax = getattr(policy, "learner_bootstrap", False)
        self._train_step = tf.function(self._train_step_impl, autograph=False,
                                       reduce_retracing=relax)
        self._grads_fn = tf.function(self.tower_gradients, autograph=False,
                                     reduce_retracing=relax)

    # ------------------------------------------------------------------ staging
    def stage_batch(self, batch: SampleBatch) -> tuple[dict[str, tf.Tensor], ...]:
        """Split ``batch`` [T, B] into n parts [T, B/n], part i copied to device i (a
        ValueError if B does not split evenly)."""
        parts = batch.split_columns(len(self.devices))
        staged = []
        for device, part in zip(self.devices, parts, strict=True):
            arrays = batch_to_tensors(part, getattr(self.policy, "learner_bootstrap", False))
            with tf.device(device):
                # identity under the device scope copies the host array onto the device.
                staged.append({k: tf.identity(v) for k, v in arrays.items()})
        return tuple(staged)

    # ------------------------------------------------------------------ towers
    def tower_gradients(self, parts: tuple[dict[str, tf.Tensor], ...]
                        ) -> tuple[list[tf.Tensor], dict[str, tf.Tensor]]:
        """The whole batch's gradient (one tensor per trainable variable; the towers'
        summed) and loss stats, from `stage_batch`'s parts."""
        tower_grads, tower_stats = [], []
        for device, part in zip(self.devices, parts, strict=True):
            with tf.device(device):
                grads, stats = self.policy.compute_gradients(part)
            tower_grads.append(grads)
            tower_stats.append(stats)
        with tf.device(self.devices[0]):
            # sum over towers == n * (average of the towers' gradients): the full batch's.
            grads = [tf.add_n(list(gs)) for gs in zip(*tower_grads, strict=True)]
            stats = combine_tower_stats(tower_stats)
        return grads, stats

    def _train_step_impl(self, parts: tuple[dict[str, tf.Tensor], ...]) -> dict[str, tf.Tensor]:
        self.num_traces += 1  # Python side effect: runs once per trace
        grads, stats = self.tower_gradients(parts)
        with tf.device(self.devices[0]):
            # A non-finite update is not applied: the policy's tf.cond skips the optimizer.
            stats.update(self.policy.apply_gradients(grads, loss=stats["total_loss"]))
        return stats

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """The combined gradient of ``batch`` over the devices, without applying it (checks)."""
        grads, stats = self._grads_fn(self.stage_batch(batch))
        return [np.asarray(g) for g in grads], {k: float(v) for k, v in stats.items()}

    def learn_on_parts(self, parts: tuple[dict[str, tf.Tensor], ...],
                       batch: SampleBatch) -> dict[str, float]:
        """One optimizer step on staged parts (the towers); the stats as floats. Raises
        NonFiniteLossError as `VTracePolicy.learn_on_batch` (the update was not applied)."""
        policy = self.policy
        with policy.lock:
            policy.observe_new_batch(batch)
            out = self._train_step(parts)
            stats = {k: float(v) for k, v in out.items()}
            finite = policy.count_update(stats)
        stats["policy_version"] = policy.version
        if not finite:
            raise NonFiniteLossError(describe_nonfinite(stats, batch))
        return stats

    # ------------------------------------------------------------------ the step
    def start(self) -> None:
        self._start_loaders()
        super().start()

    def _start_loaders(self) -> None:
        for thread in self.loader_threads:
            if thread.ident is None and not self.stopped:
                thread.start()

    def step(self, block_timeout: float | None = None) -> bool:
        """One learner step on a ready buffer from the ring, as `LearnerThread.step`;
        raises a loader thread's `LearnerError` (stage "loader thread N")."""
        self._start_loaders()
        self._raise_loader_error()
        buf, released, waited = self._next_buffer(block_timeout)
        if buf is None:
            return False
        self.load_wait_timer.push(waited)
        parts, batch = buf.parts, buf.batch
        buf.num_uses += 1
        if released:  # back to the loaders before the step: see "Release before the step"
            buf.parts, buf.batch, buf.state = None, None, "idle"
            self.idle_buffers.put(buf)
        else:
            buf.state = "in use"
        self._record_train_lag(batch)
        with self.grad_timer:
            self.last_train_metrics = self.learn_on_parts(parts, batch)
        self._report_step(batch.count)
        return True

    def _next_buffer(self, block_timeout: float | None) -> tuple[DataBuffer | None, bool, float]:
        # Wait in slices of poll_interval so a loader's failure is noticed promptly.
        deadline = None if block_timeout is None else time.monotonic() + block_timeout
        start = time.perf_counter()
        while True:
            wait = self.poll_interval
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                buf, released = self.minibatch_buffer.get(block_timeout=wait)
            except queue.Empty:
                self._raise_loader_error()
                if self.stopped or (deadline is not None and time.monotonic() >= deadline):
                    self._pending_wait += time.perf_counter() - start
                    return None, False, 0.0
                continue
            waited = self._pending_wait + time.perf_counter() - start
            self._pending_wait = 0.0
            return buf, released, waited

    def data_wait_timer(self) -> TimerStat:
        """The learner's own wait for data: for a ready buffer (loader 0 waits on the inqueue)."""
        return self.load_wait_timer

    # ------------------------------------------------------------------ errors, lifetime
    def _loader_failed(self, error: LearnerError) -> None:
        with self._error_lock:
            if self._loader_error is None:
                self._loader_error = error
            if self.error is None:  # the driver's raise_if_failed() sees it at once
                self.error = error

    def _raise_loader_error(self) -> None:
        if self._loader_error is not None:
            raise self._loader_error

    def _wrap(self, exc: BaseException) -> BaseException:
        if isinstance(exc, LearnerError):  # a loader's error keeps its own stage
            return exc
        return super()._wrap(exc)

    def should_stop_loading(self) -> bool:
        return self.stopped or self.error is not None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the learner thread and its loader threads, and wait for them."""
        super().stop(timeout)
        for thread in self.loader_threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout)

    # ------------------------------------------------------------------ for the dashboard
    def buffer_states(self) -> list[str]:
        """Each data buffer's state, buffer 0 first: "idle", "loading", "ready" or "in use"."""
        return [buf.state for buf in self.buffers]


class _LoaderThread(threading.Thread):
    """Takes train batches from the learner's inqueue and stages each into an idle buffer."""

    def __init__(self, learner: MultiGPULearner, index: int, share_stats: bool) -> None:
        super().__init__(name=f"impala-loader-{index}", daemon=True)
        self.learner = learner
        self.index = index
        self.stage = f"loader thread {index}"
        # Loader 0 reports into the learner's timers (RLlib's share_stats).
        self.queue_timer = learner.queue_timer if share_stats else TimerStat()
        self.load_timer = learner.load_timer if share_stats else TimerStat()

    def run(self) -> None:
        try:
            while not self.learner.should_stop_loading():
                self.step()
        except BaseException as exc:  # kept for the driver: see MultiGPULearner.step()
            self.learner._loader_failed(LearnerError(
                self.stage, f"{type(exc).__name__}: {exc}", traceback.format_exc()))

    def _get(self, q: queue.Queue) -> Any:
        """The next item of ``q``, or None once the learner stops."""
        while not self.learner.should_stop_loading():
            try:
                return q.get(timeout=self.learner.poll_interval)
            except queue.Empty:
                continue
        return None

    def step(self) -> bool:
        """Stage one batch; False if the learner stopped first."""
        learner = self.learner
        start = time.perf_counter()
        batch = self._get(learner.inqueue)
        if batch is None:
            return False
        self.queue_timer.push(time.perf_counter() - start)
        buf = self._get(learner.idle_buffers)
        if buf is None:
            return False
        buf.state = "loading"
        with self.load_timer:
            buf.parts = learner.stage_batch(batch)
        buf.batch = batch
        buf.num_loads += 1
        buf.num_uses = 0
        buf.state = "ready"
        learner.ready_buffers.put(buf)
        return True
