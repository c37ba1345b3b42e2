"""Start-up: the workers start before TensorFlow loads, except where a device check must come
first; ``stats()["startup"]`` says when the first sample and the first trained steps came."""

from __future__ import annotations

import time

import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.driver import build
from impala_lab.errors import ConfigError
from impala_lab.learner import vtrace_policy
from impala_lab.process_clock import process_start, seconds_since_process_start

SMALL = dict(env="CartPole-v1", backend="inline", num_workers=2, num_envs_per_worker=2,
             sample_batch_size=10, train_batch_size=40, seed=0)


class _Backend:
    def __init__(self):
        self.shut_down = 0

    def shutdown(self):
        self.shut_down += 1


def _spaces(config):
    return build.check_env(config)


def test_the_workers_start_before_the_policy_is_built(monkeypatch):
    events = []
    real = vtrace_policy.VTracePolicy

    def policy(*args, **kwargs):
        events.append("policy")
        return real(*args, **kwargs)

    monkeypatch.setattr(vtrace_policy, "VTracePolicy", policy)
    config = ImpalaConfig(**SMALL)
    build.build_learner(config, _Backend(), *_spaces(config),
                        start_workers=lambda: events.append("workers"))
    assert events == ["workers", "policy"]


def test_a_device_error_comes_before_any_worker_starts(monkeypatch):
    from impala_lab.learner import multi_gpu_learner

    def no_gpus(config):
        raise ConfigError("num_gpus=2 is invalid: TensorFlow sees 0 GPU(s)")

    monkeypatch.setattr(multi_gpu_learner, "configure_learner_devices", no_gpus)
    config = ImpalaConfig(**{**SMALL, "num_gpus": 2})
    started, backend = [], _Backend()
    with pytest.raises(ConfigError, match="num_gpus=2 is invalid"):
        build.build_learner(config, backend, *_spaces(config),
                            start_workers=lambda: started.append(1))
    assert started == [] and backend.shut_down == 1


def test_a_failed_worker_start_shuts_the_backend_down():
    config, backend = ImpalaConfig(**SMALL), _Backend()

    def fails():
        raise OSError("cannot fork")

    with pytest.raises(OSError, match="cannot fork"):
        build.build_learner(config, backend, *_spaces(config), start_workers=fails)
    assert backend.shut_down == 1


def test_startup_figures_count_from_the_process_start_and_come_in_order():
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        assert run.stats()["startup"] == {"first_sample_s": None, "first_train_s": None}
        assert len(run.workers) == 2  # started once, not again by the loop
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
