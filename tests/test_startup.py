"""Start-up: ``stats()["startup"]`` says when the first sample and the first trained steps came,
counted from the process's start."""

from __future__ import annotations

import time

import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.stats import process_start, seconds_since_process_start

SMALL = dict(env="CartPole-v1", backend="inline", num_workers=2, num_envs_per_worker=2,
             sample_batch_size=10, train_batch_size=40, seed=0)


def test_startup_figures_count_from_the_process_start_and_come_in_order():
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        assert run.stats()["startup"] == {"first_sample_s": None, "first_train_s": None}
        run.step()
        first_sample = run.stats()["startup"]["first_sample_s"]
        assert run.stats()["startup"]["first_train_s"] is None  # nothing trained yet
        run.learner.step()
        run.step()
        startup = run.stats()["startup"]
        uptime = time.monotonic() - process_start()
    assert 0 < first_sample == startup["first_sample_s"] <= startup["first_train_s"] <= uptime


def test_seconds_since_process_start():
    assert seconds_since_process_start(None) is None
    assert seconds_since_process_start(process_start() + 1.5) == pytest.approx(1.5, abs=1e-3)
