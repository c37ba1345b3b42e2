"""impala_lab: IMPALA as Ray RLlib's AsyncSamplesOptimizer built it, for learning and experiments.

RLlib's AsyncSamplesOptimizer (``rllib/optimizers/async_samples_optimizer.py`` in Ray's
0.x releases, with its ``aso_*`` helpers) is what this package re-creates; where a docstring
says "RLlib's", it means that file and the IMPALA agent around it.

    from impala_lab import Impala, ImpalaConfig
    with Impala(ImpalaConfig(env="CartPole-v1")) as run:
        run.train(stop={"episode_return_mean": 195})

Reading order, following one batch through the pipeline:

1. `DriverLoop.step` (``Impala.step`` calls it): one turn of the driver loop (collect samples,
   feed the learner, broadcast).
2. `RolloutWorker.sample`: an actor steps its envs with a numpy copy of the policy.
3. `LearnerThread.step`: the learner takes a train batch from its queue and trains on it.
4. `VTracePolicy.loss_and_stats`: the V-trace actor-critic loss of one batch.
5. `vtrace.from_importance_weights`: the V-trace targets and policy-gradient advantages.

Importing the package is cheap: TensorFlow is imported only by the learner-side modules
(`policy`, `vtrace`, `impala`), never by what actor processes import. Importing it sets
TensorFlow's logging up once, before TensorFlow loads (`impala_lab._quiet_tf`): no C++ start-up
lines and no retracing warnings; ``TF_CPP_MIN_LOG_LEVEL=0`` in the environment shows them.
It registers the package's memory task with gymnasium, ``impala_lab/StatelessCartPole-v1``,
and, when MinAtar is installed, its games (``MinAtar/Breakout-v1`` ...; `impala_lab.envs.minatar`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from impala_lab import _quiet_tf
from impala_lab._lazy import lazy_getattr
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

_quiet_tf.install()
_register_envs()  # impala_lab/StatelessCartPole-v1, in every process that imports the package
_register_minatar()  # MinAtar/<Game>-v0/v1 when minatar is installed (importing it adds none)

_LAZY = {
    "Impala": "impala_lab.driver.impala",
    "shutdown_all": "impala_lab.driver.impala",
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
    from impala_lab.driver.impala import Impala, shutdown_all  # noqa: F401


_lazy_getattr = lazy_getattr(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name == "shutdown_all":
        import sys

        module = sys.modules.get("impala_lab.driver.impala")
        if module is None:  # no run was ever created: nothing to end, and no TF import
            return lambda: None
        return module.shutdown_all
    return _lazy_getattr(name)
