"""Exceptions shared by every stage of the pipeline.

Each error says which stage raised it and carries the original traceback as text, because
the stage may have run in another thread or another process: a student should see the env
step or the learner line that failed, not a bare "worker died".
"""

from __future__ import annotations


class ImpalaError(RuntimeError):
    """Base class of the errors the pipeline raises at run time."""


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field, the value and the fix."""


class StageError(ImpalaError):
    """An exception raised inside a pipeline stage (a worker, the learner, a loader thread).

    Attributes:
      stage: which stage raised, e.g. ``"learner thread"`` or ``"worker 1 (env CartPole-v1)"``.
      remote_traceback: the original traceback, formatted where the exception happened.
    """

    def __init__(self, stage: str, message: str, remote_traceback: str = "") -> None:
        self.stage = stage
        self.remote_traceback = remote_traceback
        text = f"{stage} failed: {message}"
        if remote_traceback:
            text += f"\n\n--- original traceback ({stage}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        message = str(self).split(" failed: ", 1)[-1].split("\n\n--- original", 1)[0]
        return (type(self), (self.stage, message, self.remote_traceback))


class WorkerError(StageError):
    """A rollout worker raised (its env, or the worker itself), or its process died.

    Attributes:
      worker_index: the worker's index in the run.
      env_id: the env the worker was stepping.
    """

    def __init__(
        self, worker_index: int, env_id: str, message: str, remote_traceback: str = ""
    ) -> None:
        self.worker_index = worker_index
        self.env_id = env_id
        super().__init__(f"worker {worker_index} (env {env_id})", message, remote_traceback)

    def __reduce__(self):
        message = str(self).split(" failed: ", 1)[-1].split("\n\n--- original", 1)[0]
        return (type(self), (self.worker_index, self.env_id, message, self.remote_traceback))


class LearnerError(StageError):
    """The learner thread (or one of its loader threads) raised."""


class NonFiniteLossError(ImpalaError):
    """The loss became NaN or infinite; the message reports the batch's statistics."""
