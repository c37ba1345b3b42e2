"""What the backend tests share: a small config, the model the workers act with, a wait for
futures through ``backend.wait`` (as the task pool waits), and the weights blocks in /dev/shm."""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.config import ImpalaConfig
from impala_lab.model_spec import ModelSpec
from tests.envs import FixedLengthEnv

HIDDENS = (8,)
T, B = 5, 2  # unroll length, envs per worker
ENV3 = functools.partial(FixedLengthEnv, length=3)  # obs[0] counts the steps of an episode


def config(env: Any = ENV3, backend: str = "process", num_workers: int = 2, num_envs: int = B,
           T: int = T, **kw: Any) -> ImpalaConfig:
    """A run of ``num_workers`` workers x ``num_envs`` envs, unroll ``T``, an 8-unit MLP."""
    return ImpalaConfig(env=env, backend=backend, num_workers=num_workers,
                        num_envs_per_worker=num_envs, sample_batch_size=T, model=HIDDENS,
                        seed=0, **kw)


def model_for(env_factory: Any) -> NumpyModel:
    """A numpy model for the spaces of ``env_factory()``'s env (as the workers build it)."""
    env = env_factory()
    return NumpyModel(env.observation_space, env.action_space, ModelSpec(HIDDENS))


def results(backend: Any, futures: list, timeout: float = 60.0) -> list:
    """Waits (through backend.wait, as the task pool does) until every future is done;
    returns their results in order (a failed one raises its `WorkerError`)."""
    deadline = time.monotonic() + timeout
    pending = list(futures)
    while pending:
        assert time.monotonic() < deadline, f"futures not done after {timeout} s: {pending}"
        for f in backend.wait(pending, 1.0):
            pending.remove(f)
    return [f.result() for f in futures]


def shm_names(prefix: str) -> set[str]:
    """The weights blocks in /dev/shm (and the owner's lock file, while one is there)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
