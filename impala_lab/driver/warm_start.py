"""Warm start: the driver loop turns while the learner is built (while TensorFlow loads).

A run's first seconds go to importing TensorFlow and building the policy. The workers need
neither: they start with the learner's version-0 weights, computed in numpy
(`impala_lab.driver.build.initial_weights`), before TensorFlow loads. Here the driver takes
their samples meanwhile too, so the first sample reaches it about a second after the process
started instead of after TensorFlow's import:

    thread "impala-learner-build":  import TensorFlow, build the policy   -> start the learner
    the caller's thread:            loop.step(), loop.step(), ... until the queue is full, wait

The loop turns against a `PendingLearner`, a `impala_lab.learner.port.LearnerPort` that puts
train batches on the queue the learner will train from and answers "version 0, not updated,
nothing trained" until the learner exists. The loop stops turning once that queue is full
(the same back-pressure a running pipeline has) and waits for the build: the workers then
finish the requests they hold and idle, leaving the cores to the import. When the build is
done the thread starts the learner on that queue and the stand-in forwards every call to it;
the run then talks to the learner itself.

Used where it is safe and pays (`warm_start_applies`): workers in processes or on Ray (inline
workers would sample in the caller's thread, taking the interpreter from the import), the
learner thread started at once (``start_learner=True``; stepping a learner by hand needs an
empty queue), and the single learner (the multi-GPU learner sets up devices before any
process starts). A build that fails, or a Ctrl-C meanwhile, shuts the workers down and raises
in the caller's thread; the learner is then never started.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from impala_lab.driver.build import make_learner

__all__ = ["PendingLearner", "build_while_sampling", "warm_start_applies"]

# How long one wait of the caller's thread lasts (for a sample, or for the build).
TURN_TIMEOUT_S = 0.05


def warm_start_applies(config: Any, start_learner: bool) -> bool:
    """Whether `Impala` samples while it builds the learner (see the module docstring)."""
    return (start_learner and config.backend in ("process", "ray")
            and not config.uses_multi_gpu_learner)


class PendingLearner:
    """The learner as the driver sees it while the real one is built (a `LearnerPort`).

    Args:
      initial_weights: the version-0 weights the workers sample with (numpy arrays).
      queue_size: bound of ``inqueue`` (the config's learner_queue_size).

    Attributes:
      inqueue: the train batches; the learner, once built, trains from this same queue.
      learner: the built and started learner (None until then): every call goes to it.
      error: what the build raised (None if nothing).
      building: True until the build has ended (built, failed or cancelled).
      cancelled: set by the caller's thread when it gives up: the learner is never started.
    """

    def __init__(self, initial_weights: list, queue_size: int) -> None:
        self.inqueue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.learner: Any = None
        self.error: BaseException | None = None
        self.building = True
        self.cancelled = False
        self.lock = threading.Lock()  # cancelled vs. starting the learner
        self._initial_weights = initial_weights

    def put_batch(self, batch: Any, timeout: float) -> bool:
        try:
            self.inqueue.put(batch, timeout=timeout)
        except queue.Full:
            return False
        return True

    def drain_trained(self) -> int:
        return 0 if self.learner is None else self.learner.drain_trained()

    def take_weights_updated(self) -> bool:
        return False if self.learner is None else self.learner.take_weights_updated()

    @property
    def weights_version(self) -> int:
        return 0 if self.learner is None else self.learner.weights_version

    def get_weights(self) -> tuple[list, int]:
        return (self._initial_weights, 0) if self.learner is None else self.learner.get_weights()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.learner is not None:
            self.learner.raise_if_failed()

    def is_alive(self) -> bool:
        """True while the build runs (the queue will be consumed), then the learner's."""
        return self.building or (self.learner is not None and self.learner.is_alive())


def build_while_sampling(config: Any, loop: Any, spaces: tuple[Any, Any],
                         initial_weights: list, *, backend: Any,
                         count_step: Callable[[int, int], None],
                         on_train_step: Callable[[dict], None]) -> tuple[Any, Any]:
    """Build the policy and its learner in a thread while ``loop`` turns; return them, the
    learner started (training from the batches queued meanwhile).

    Args:
      config: the run's `ImpalaConfig`.
      loop: the run's `DriverLoop`, started (the workers hold their first requests).
      spaces: ``(observation_space, action_space)``.
      initial_weights: the version-0 weights the workers sample with; the policy gets them.
      backend: shut down if the build fails or the caller's thread is interrupted.
      count_step: counts each turn's ``(sampled, trained)`` env steps (the run's stats).
      on_train_step: the learner's per-step callback, set before it starts.
    """
    pending = PendingLearner(initial_weights, config.learner_queue_size)
    built: list[tuple[Any, Any]] = []

    def build() -> None:
        try:
            policy, learner = make_learner(config, *spaces, inqueue=pending.inqueue)
            policy.set_weights(initial_weights, version=0)
            learner.on_train_step = on_train_step
            with pending.lock:
                if not pending.cancelled:
                    learner.start()
                    pending.learner = learner
                    built.append((policy, learner))
        except BaseException as exc:  # raised in the caller's thread
            pending.error = exc
        finally:
            pending.building = False

    builder = threading.Thread(target=build, name="impala-learner-build", daemon=True)
    loop.learner = pending
    builder.start()
    try:
        while builder.is_alive():
            if pending.inqueue.full():
                builder.join(TURN_TIMEOUT_S)
            else:
                count_step(*loop.step(TURN_TIMEOUT_S))
        pending.raise_if_failed()
    except BaseException:
        with pending.lock:
            pending.cancelled = True
        if pending.learner is not None:
            pending.learner.stop()
        backend.shutdown()
        raise
    return built[0]
