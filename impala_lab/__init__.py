"""impala_lab: IMPALA as Ray RLlib's AsyncSamplesOptimizer built it, for learning and experiments.

"RLlib's" in a docstring means Ray 0.x's ``rllib/optimizers/async_samples_optimizer.py`` (with
its ``aso_*`` helpers) and the IMPALA agent around it, which this package re-creates.

    from impala_lab import Impala, ImpalaConfig
    with Impala(ImpalaConfig(env="CartPole-v1")) as run:
        run.train(stop={"episode_return_mean": 195})

The folders are the diagram's boxes (``actor/``, ``driver/``, ``learner/``, ``backends/``,
``envs/``, ``dashboard/``, ``classroom/``, ``cli/``); the top holds the shared vocabulary.
docs/map.md gives the reading path, one batch's way through the pipeline.

Importing the package is cheap (TensorFlow is imported only by ``learner/`` and what uses it).
It sets TensorFlow's environment defaults before TensorFlow loads (a value you set first
wins): the Keras backend, and C++ logs at warnings and above; tf.function's retracing warnings
are filtered out (the notebooks call V-trace on many shapes on purpose). It registers
``impala_lab/StatelessCartPole-v1`` with gymnasium and, when MinAtar is installed, its games.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING, Any

from impala_lab.config import ImpalaConfig
from impala_lab.envs.minatar import register as _register_minatar
from impala_lab.envs.stateless_cartpole import register as _register_envs
from impala_lab.errors import (
    ConfigError,
    ImpalaError,
    LearnerError,
    NonFiniteLossError,
    StageError,
    WorkerError,
)
from impala_lab.model_spec import ModelSpec

__version__ = "0.1.0"

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
logging.getLogger("tensorflow").addFilter(
    lambda record: "triggered tf.function retracing" not in record.getMessage())
_register_envs()  # impala_lab/StatelessCartPole-v1, in every process that imports the package
_register_minatar()  # MinAtar/<Game>-v0/v1 when minatar is installed (importing it adds none)

_LAZY = {
    "Impala": "impala_lab.driver.impala",
    "shutdown_all": "impala_lab.driver.lifetime",  # light: no TensorFlow
    "SampleBatch": "impala_lab.batch",
    "concat_samples": "impala_lab.batch",
    "RolloutWorker": "impala_lab.actor.rollout_worker",
    "VTracePolicy": "impala_lab.learner.vtrace_policy",
    "LearnerThread": "impala_lab.learner.learner_thread",
    "MinibatchBuffer": "impala_lab.learner.minibatch_buffer",
    "ReplayMixer": "impala_lab.driver.replay_mixer",
    "SampleTaskPool": "impala_lab.driver.task_pool",
}

__all__ = ["ConfigError", "ImpalaConfig", "ImpalaError", "LearnerError", "ModelSpec",
           "NonFiniteLossError", "StageError", "WorkerError", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from impala_lab.driver.impala import Impala  # noqa: F401
    from impala_lab.driver.lifetime import shutdown_all  # noqa: F401


def __getattr__(name: str) -> Any:
    """A name of `_LAZY` is imported from its module on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
