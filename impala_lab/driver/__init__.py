"""IMPALA's driver (RLlib's AsyncSamplesOptimizer): the loop between actors and learner.

`impala.Impala` builds a run and trains it; each `driver_loop.DriverLoop.step` collects the
ready samples (`task_pool.SampleTaskPool`), mixes replays in (`replay_mixer.ReplayMixer`),
hands train batches to the learner (only through `impala_lab.learner.port.LearnerPort`) and
broadcasts new weights to the workers (only through `actors.Actors`).
"""
