"""What a backend provides: where rollout workers live and how the driver talks to them.

The driver uses only this interface, so the same loop runs with workers in its own process
(``inline``), in spawned processes (``process``) or as Ray actors (``ray``). A handle turns
each call into a message: ``sample()`` returns a future (`SampleFuture`), ``set_weights(ref)``
applies before the worker's next sample. ``put_weights`` publishes once per broadcast a
reference every worker can read (a shared-memory block, a Ray object ref, the arrays inline),
so weights move once per broadcast, not once per request.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import Any

from impala_lab.config import ImpalaConfig


class WorkerHandle(abc.ABC):
    """The driver's side of one rollout worker."""

    index: int

    @abc.abstractmethod
    def sample(self) -> Any:
        """Ask for one `SampleBatch`; returns a `SampleFuture`."""

    @abc.abstractmethod
    def set_weights(self, weights_ref: Any) -> None:
        """Queue new weights (from `Backend.put_weights`) before the worker's next sample."""

    @abc.abstractmethod
    def is_alive(self) -> bool:
        """False once the worker died or was stopped."""

    def describe(self) -> str:
        return f"worker {self.index}"


class Backend(abc.ABC):
    """Creates, feeds and ends rollout workers (`impala_lab.backends.make_backend` picks one
    by ``config.backend``)."""

    name: str = "?"

    def __init__(self, config: ImpalaConfig) -> None:
        self.config = config
        self.env = config.env  # a gymnasium env id or a zero-argument env factory

    def worker_kwargs(self, index: int) -> dict[str, Any]:
        """`impala_lab.actor.make_rollout_worker`'s arguments for worker ``index``."""
        c = self.config
        vector_env: Any = False
        if c.vector_env:  # CartPole's vector env, adapted to reset in the ending step
            from impala_lab.envs import vector

            vector_env = vector.make_vector_env
        return dict(env=self.env, num_envs=c.num_envs_per_worker,
                    sample_batch_size=c.sample_batch_size, model_spec=c.model_spec,
                    seed=c.seed, worker_index=index, clip_actions=c.clip_actions,
                    squash_actions=c.squash_actions, vector_env=vector_env)

    def prepare(self) -> None:
        """Checks that can fail before TensorFlow loads or any process starts (default: none)."""
        return None

    @abc.abstractmethod
    def make_worker(self, index: int) -> WorkerHandle:
        """Start worker ``index`` and return its handle."""

    @abc.abstractmethod
    def put_weights(self, weights: list, version: int) -> Any:
        """Publish weights once; the returned reference goes to `WorkerHandle.set_weights`."""

    @abc.abstractmethod
    def wait(self, futures: Sequence[Any], timeout: float | None) -> list:
        """The task pool's wait function: the done futures, blocking up to ``timeout``."""

    @abc.abstractmethod
    def stop_worker(self, handle: WorkerHandle) -> None:
        """End one worker (dead or alive) and release what it held."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """End every worker this backend started; safe to call twice."""

    def worker_pids(self) -> list[int]:
        """OS process ids of the workers (empty where they share the driver's process)."""
        return []


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid exists (ours and another user's count): a checkpoint
    temp folder or shared-memory block whose writer's pid is gone was left by a killed run."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):  # gone, or no such pid can exist
        return False
    except PermissionError:
        return True  # exists, another user's
    return True
