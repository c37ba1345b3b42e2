"""IMPALA's driver (RLlib's AsyncSamplesOptimizer): the loop between actors and learner.

`impala.Impala` builds a run and trains it; each `driver_loop.DriverLoop.step` collects the
samples that are ready (`task_pool.SampleTaskPool`), mixes replays in
(`replay_mixer.ReplayMixer`), hands train batches to the learner and broadcasts new weights.
Beside the loop: the workers' supervisor, the run's stats and health, checkpoints and live knobs.
"""
