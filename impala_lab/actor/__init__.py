"""IMPALA's actor: gymnasium envs stepped by a numpy copy of the policy, in any process.

`rollout_worker.RolloutWorker` steps B envs for T steps and returns a `SampleBatch`;
`numpy_model` is the policy's forward pass in numpy; `env_checks` names an env that returns
what a batch cannot hold. Nothing here imports TensorFlow, the driver or the learner.
"""

from typing import Any


def make_rollout_worker(*, vector_env: bool | Any = False, **kwargs: Any) -> Any:
    """The rollout worker a backend builds: a `rollout_worker.RolloutWorker` over a list of
    envs, or with ``vector_env`` a `vector_rollout_worker.VectorRolloutWorker` over one
    gymnasium vector env (``vector_env`` may be its ``make_vector_env(env_id, num_envs)``);
    ``kwargs`` are `RolloutWorker`'s arguments."""
    if vector_env:
        from impala_lab.actor.vector_rollout_worker import VectorRolloutWorker

        maker = None if vector_env is True else vector_env
        return VectorRolloutWorker(make_vector_env=maker, **kwargs)
    from impala_lab.actor.rollout_worker import RolloutWorker

    return RolloutWorker(**kwargs)
