"""impala_lab: IMPALA as Ray RLlib's AsyncSamplesOptimizer built it, for learning and experiments.

RLlib's AsyncSamplesOptimizer (``rllib/optimizers/async_samples_optimizer.py`` in Ray's
0.x releases, with its ``aso_*`` helpers) is what this package re-creates; where a docstring
says "RLlib's", it means that file and the IMPALA agent around it.

    from impala_lab import Impala, ImpalaConfig
    with Impala(ImpalaConfig(env="CartPole-v1")) as run:
        run.train(stop={"episode_return_mean": 195})

The folders are the diagram's boxes: ``actor/`` (envs stepped by a numpy policy),
``driver/`` (the loop between actors and learner), ``learner/`` (V-trace and the threads that
train), ``backends/`` (where workers live), ``envs/``, ``dashboard/``, ``classroom/`` and
``cli/``; the top holds the shared vocabulary (config, batch, errors, stats). Reading order,
following one batch through the pipeline:

1. `DriverLoop.step` (``driver/driver_loop.py``): one turn of the driver loop (collect samples,
   feed the learner, broadcast).
2. `RolloutWorker.sample` (``actor/rollout_worker.py``): an actor steps its envs with a numpy
   copy of the policy.
3. `LearnerThread.step` (``learner/learner_thread.py``): the learner takes a train batch from
   its queue and trains on it.
4. `VTracePolicy.loss_and_stats` (``learner/vtrace_policy.py``): the V-trace actor-critic loss.
5. `vtrace.from_importance_weights` (``learner/vtrace.py``): the targets and advantages.

Importing the package is cheap: TensorFlow is imported only by ``learner/`` and what
uses it, never by what actor processes import. Importing it sets
TensorFlow's logging up once, before TensorFlow loads (`impala_lab._quiet_tf`): no C++ start-up
lines and no retracing warnings; ``TF_CPP_MIN_LOG_LEVEL=0`` in the environment shows them.
Under the ``impala-lab`` command, the learner's TensorFlow import also leaves out the modules
Keras imports only when installed, matplotlib, pandas, scipy, h5py and a few smaller ones
(`impala_lab._lean_imports`: about 0.8 s sooner).
It registers the package's memory task with gymnasium, ``impala_lab/StatelessCartPole-v1``,
and, when MinAtar is installed, its games (``MinAtar/Breakout-v1`` ...; `impala_lab.envs.minatar`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


__getattr__ = lazy_getattr(__name__, _LAZY)
