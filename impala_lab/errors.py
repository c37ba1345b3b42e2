"""Exceptions shared by every stage of the pipeline.

A stage may run in another thread or process, so its error names the stage and carries the
original traceback as text: a student sees the env step or learner line that failed, not a
bare "worker died".
"""

from __future__ import annotations

from typing import Any


class ImpalaError(RuntimeError):
    """Base class of the errors the pipeline raises at run time."""


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field, the value and the fix."""


class StageError(ImpalaError):
    """An exception raised inside a pipeline stage (a worker, the learner, a loader thread):
    ``str(err)`` is ``"<stage> failed: <details>"``, then the original traceback if any.

    Attributes:
      stage: which stage raised, e.g. ``"learner thread"`` or ``"worker 1 (env CartPole-v1)"``.
      message, details: the first line of the stage's own message, and all of it.
      remote_traceback: the original traceback, formatted where the exception happened.
    """

    def __init__(self, stage: str, message: str, remote_traceback: str = "") -> None:
        self.stage = stage
        self.details = message
        self.message = (message.splitlines() or [""])[0]
        self.remote_traceback = remote_traceback
        text = f"{stage} failed: {message}"
        if remote_traceback:
            text += f"\n\n--- original traceback ({stage}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:  # keep the fields across a process boundary
        return (type(self), (self.stage, self.details, self.remote_traceback))


class WorkerError(StageError):
    """A rollout worker raised (its env, or the worker itself), or its process died; it
    names the ``worker_index`` and the ``env_id`` the worker was stepping."""

    def __init__(self, worker_index: int, env_id: str, message: str,
                 remote_traceback: str = "") -> None:
        self.worker_index = worker_index
        self.env_id = env_id
        super().__init__(f"worker {worker_index} (env {env_id})", message, remote_traceback)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker_index, self.env_id, self.details,
                             self.remote_traceback))


class ClusterLostError(ImpalaError):
    """The Ray cluster under the run went away (the driver's raylet or the head died): no
    worker can be replaced, so the run ends with its outputs written."""


class LearnerError(StageError):
    """The learner thread (or one of its loader threads) raised."""


class NonFiniteLossError(ImpalaError):
    """The loss became NaN or infinite; the message reports the batch's statistics."""
