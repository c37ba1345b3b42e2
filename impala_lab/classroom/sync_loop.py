"""`SyncLoop`: the synchronous batched A2C-style loop that IMPALA's table 1 compares against.

The same workers, model and learner as `Impala`, without the asynchrony::

    publish the weights to every worker
    repeat:
        every worker samples one [T, num_envs_per_worker] batch with those weights
        wait for all of them                        # the actors wait for the learner ...
        concatenate along B, learn_on_batch once    # ... and the learner for the slowest actor
        publish the new weights

Every batch is on-policy, but nothing overlaps (the paper's "batched A2C (sync traj.)");
``python -m bench.throughput`` compares its throughput with the asynchronous pipeline's.
"""

from __future__ import annotations

import time
from typing import Any

from impala_lab.backends import make_backend
from impala_lab.batch import concat_samples
from impala_lab.config import ImpalaConfig
from impala_lab.driver.build import as_config, check_env, check_learner_devices, make_learner


class SyncLoop:
    """Workers of ``config.backend`` (an `ImpalaConfig` or dict, with ``overrides``) and a
    `VTracePolicy`, stepped in lock step; the queue, replay and broadcast fields do not
    apply. Counts ``num_steps_sampled`` and ``num_updates``."""

    def __init__(self, config: ImpalaConfig | dict | None = None, **overrides: Any) -> None:
        self.config = as_config(config, None, overrides)
        observation_space, action_space = check_env(self.config)
        self.backend = make_backend(self.config)
        self.backend.prepare()
        try:
            check_learner_devices(self.config)
            self.policy, _ = make_learner(self.config, observation_space, action_space)
            self.workers = [self.backend.make_worker(i)
                            for i in range(self.config.num_workers)]
            self._publish()
        except BaseException:
            self.backend.shutdown()
            raise
        self.num_steps_sampled = 0
        self.num_updates = 0

    def _publish(self) -> None:
        ref = self.backend.put_weights(*self.policy.get_weights())
        for worker in self.workers:
            worker.set_weights(ref)

    def step(self) -> dict[str, float]:
        """One round: sample everywhere, train once on all of it, publish; the learner's stats."""
        futures = [worker.sample() for worker in self.workers]  # all sample at once
        batch = concat_samples([f.result() for f in futures])  # result() waits for its worker
        stats = self.policy.learn_on_batch(batch)
        self._publish()
        self.num_steps_sampled += batch.count
        self.num_updates += 1
        return stats

    def run(self, seconds: float) -> float:
        """Step for about ``seconds``; returns the env steps per second of that time."""
        start, before = time.perf_counter(), self.num_steps_sampled
        while time.perf_counter() - start < seconds:
            self.step()
        return (self.num_steps_sampled - before) / (time.perf_counter() - start)

    def stop(self) -> None:
        """End every worker; safe to call twice."""
        self.backend.shutdown()

    def __enter__(self) -> SyncLoop:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
