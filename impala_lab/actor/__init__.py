"""IMPALA's actor: gymnasium envs stepped by a numpy copy of the policy, in any process.

`rollout_worker.RolloutWorker` steps B envs for T steps and returns a `SampleBatch`;
`numpy_model` is the policy's forward pass in numpy (the learner's Keras network with the same
weights gives the same outputs); `env_checks` names an env that returns what a batch cannot
hold. Nothing here imports TensorFlow, the driver or the learner: an actor process stays small
and starts fast.
"""
