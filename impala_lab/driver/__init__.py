"""IMPALA's driver (RLlib's AsyncSamplesOptimizer): the loop between actors and learner.

`impala.Impala` builds a run and trains it; each `driver_loop.DriverLoop.step` collects the
samples that are ready (`task_pool.SampleTaskPool`), mixes replays in
(`replay_mixer.ReplayMixer`), hands train batches to the learner and broadcasts new weights.
The loop reaches the learner only through its port (`impala_lab.learner.port.LearnerPort`) and
the workers only through `actors.Actors` (backend, task pool, supervisor). Beside the loop:
the workers' supervisor, the run's stats and health, checkpoints, live knobs and `lifetime`
(how runs end).
"""
