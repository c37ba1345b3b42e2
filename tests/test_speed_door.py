"""The speed door: its measures change how fast the learner runs, never what it computes, and
``IMPALA_LAB_PLAIN=1`` turns them off."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_lab import speed
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.config import ImpalaConfig
from impala_lab.driver.build import make_learner
from impala_lab.learner.vtrace_policy import VTracePolicy
from impala_lab.model_spec import ModelSpec
from impala_lab.speed.compiled_policy import CompiledPolicy


@pytest.mark.parametrize("env, fields", [
    ("CartPole-v1", {}),
    ("Pendulum-v1", {"normalize_obs": True}),
    ("CartPole-v1", {"use_lstm": True, "lstm_cell_size": 8}),
])
def test_the_compiled_policy_trains_and_reads_weights_as_the_plain_one(env, fields):
    config = ImpalaConfig(env=env, seed=5, num_envs_per_worker=3, sample_batch_size=12,
                          **fields)
    probe = gym.make(env)
    spaces = (probe.observation_space, probe.action_space)
    probe.close()
    spec: ModelSpec = config.model_spec
    with RolloutWorker(env, num_envs=3, sample_batch_size=12, model_spec=spec, seed=2) as w:
        batches = [w.sample(), w.sample()]
    plain, compiled = VTracePolicy(*spaces, config), CompiledPolicy(*spaces, config)
    for batch in [*batches, batches[0]]:
        a, b = plain.learn_on_batch(batch), compiled.learn_on_batch(batch)
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    (wa, va), (wb, vb) = plain.get_weights(), compiled.get_weights()
    assert va == vb == 3
    assert [x.shape for x in wa] == [x.shape for x in wb]
    for x, y in zip(wa, wb, strict=True):
        assert y.dtype == x.dtype
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
    # one traced graph per input signature, reused for every later step
    assert len(compiled._graphs) == 1 and compiled.num_traces == 1


def test_plain_mode_builds_the_reading_paths_policy(monkeypatch):
    config = ImpalaConfig(seed=0)
    spaces = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
    monkeypatch.delenv("IMPALA_LAB_PLAIN", raising=False)
    assert speed.enabled() and type(make_learner(config, *spaces)[0]) is CompiledPolicy
    monkeypatch.setenv("IMPALA_LAB_PLAIN", "1")
    assert not speed.enabled() and type(make_learner(config, *spaces)[0]) is VTracePolicy


def test_the_command_freezes_the_collector_as_it_returns_unless_plain(monkeypatch, capsys):
    from impala_lab.cli.main import main
    from impala_lab.speed import lean_imports

    frozen = []
    monkeypatch.setattr(speed.gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(lean_imports, "enable", lambda: None)  # keep this process's imports
    monkeypatch.setattr("sys.argv", ["impala-lab", "config"])
    monkeypatch.delenv("IMPALA_LAB_PLAIN", raising=False)
    assert main() == 0 and frozen == [True]
    monkeypatch.setattr("sys.argv", ["impala-lab", "train", "--num-workers", "-1"])
    assert main() == 2 and frozen == [True, True]  # a refused command exits quickly too
    assert main(["config"]) == 0 and frozen == [True, True]  # a caller's own main(argv): never
    monkeypatch.setenv("IMPALA_LAB_PLAIN", "1")
    assert main() == 2 and frozen == [True, True]
    assert capsys.readouterr().err.count("num_workers=-1 is invalid") == 2
