"""Warm start: the driver loop turns while the learner is built (while TensorFlow loads).

A run's first seconds go to importing TensorFlow and building the policy. The workers need
neither: they start with the learner's version-0 weights, computed in numpy
(`impala_lab.driver.build.initial_weights`), before TensorFlow loads. Here the driver takes
their samples meanwhile too, so the first sample reaches it about a second after the process
started instead of after TensorFlow's import:

    the caller's thread:              import TensorFlow, build the policy -> start the learner
    thread "impala-warm-start":       loop.step(), loop.step(), ... until the queue is full

The loop turns against a `PendingLearner`, a `impala_lab.learner.port.LearnerPort` that puts
train batches on the queue the learner will train from and answers "version 0, not updated,
nothing trained" until the learner exists. It stops turning once that queue is full (the
same back-pressure a running pipeline has): the workers then finish the requests they hold
and idle, leaving the cores to the import. Once the policy is built, the learner starts on
that queue, the stand-in forwards every call to it, and the sampling thread ends; the run
then talks to the learner itself.

Why the import stays in the caller's thread: it sends descriptor 2 to a file while it runs
(`impala_lab._quiet_tf`), and a Ctrl-C lands in the caller's thread. For the same reason a
worker that fails meanwhile is replaced only after the import (a process started during it
would inherit that file as its stderr): the sampling thread stops at the failure, and the
caller replaces the worker (or raises, with ``restart_failed_workers=False``) once the
learner is built.

Used where it is safe and pays (`warm_start_applies`): workers in processes or on Ray (inline
workers would sample in the importing process's other thread, taking the interpreter from
the import), the learner thread started at once (``start_learner=True``; stepping a learner
by hand needs an empty queue), and the single learner (the multi-GPU learner sets up devices
before any process starts). A build that fails, or a Ctrl-C meanwhile, shuts the workers
down and raises; the learner is then never started.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from impala_lab.driver.build import make_learner
from impala_lab.errors import WorkerError
from impala_lab.learner.port import put_within

__all__ = ["PendingLearner", "build_while_sampling", "warm_start_applies"]

# How long one wait of the sampling thread lasts (for a sample, or for room in the queue).
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
      building: True until the build has ended (then `is_alive` is the learner's).
    """

    def __init__(self, initial_weights: list, queue_size: int) -> None:
        self.inqueue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.learner: Any = None
        self.building = True
        self._initial_weights = initial_weights

    def put_batch(self, batch: Any, timeout: float) -> bool:
        return put_within(self.inqueue, batch, timeout)

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
        if self.learner is not None:
            self.learner.raise_if_failed()

    def is_alive(self) -> bool:
        """True while the build runs (the queue will be consumed), then the learner's."""
        return self.building or (self.learner is not None and self.learner.is_alive())


class _WorkerFailed(Exception):
    """Ends the sampling thread at a worker failure (the caller handles it after the build)."""

    def __init__(self, err: WorkerError) -> None:
        super().__init__(str(err))
        self.err = err


def build_while_sampling(config: Any, loop: Any, spaces: tuple[Any, Any],
                         initial_weights: list, *, backend: Any,
                         count_step: Callable[[int, int], None],
                         on_train_step: Callable[[dict], None]) -> tuple[Any, Any]:
    """Build the policy and its learner in this thread while a thread turns ``loop``; return
    them, the learner started (training from the batches queued meanwhile).

    Args:
      config: the run's `ImpalaConfig`.
      loop: the run's `DriverLoop`, started (the workers hold their first requests).
      spaces: ``(observation_space, action_space)``.
      initial_weights: the version-0 weights the workers sample with; the policy gets them.
      backend: shut down if the build fails or this thread is interrupted.
      count_step: counts each turn's ``(sampled, trained)`` env steps (the run's stats).
      on_train_step: the learner's per-step callback, set before it starts.
    """
    pending = PendingLearner(initial_weights, config.learner_queue_size)
    done = threading.Event()
    failures: list[BaseException] = []

    def defer(err: WorkerError) -> None:
        raise _WorkerFailed(err)

    def sample() -> None:
        try:
            while not done.is_set():
                if pending.inqueue.full():
                    done.wait(TURN_TIMEOUT_S)
                else:
                    count_step(*loop.step(TURN_TIMEOUT_S))
        except BaseException as exc:  # handled by the caller's thread after the build
            failures.append(exc)

    def start_learner() -> None:
        learner.on_train_step = on_train_step
        learner.start()  # drains the queue: a turn waiting to put a batch goes on
        pending.learner = learner

    loop.learner = pending
    loop.replace_failed = defer  # this instance only, until the build is over
    sampler = threading.Thread(target=sample, name="impala-warm-start", daemon=True)
    sampler.start()
    learner = None
    try:
        policy, learner = make_learner(config, *spaces, inqueue=pending.inqueue)
        policy.set_weights(initial_weights, version=0)
        if not failures:  # a sampling thread that failed already: no learner to stop after
            start_learner()
        done.set()
        sampler.join()
        del loop.replace_failed
        for exc in failures:
            if not isinstance(exc, _WorkerFailed):
                raise exc
            loop.replace_failed(exc.err)  # raises with restart_failed_workers=False
        if not learner.is_alive():
            start_learner()
    except BaseException:
        pending.building = False
        done.set()
        sampler.join()
        loop.__dict__.pop("replace_failed", None)
        if learner is not None and learner.is_alive():
            learner.stop()
        backend.shutdown()
        raise
    pending.building = False
    return policy, learner
