"""lr_schedule: the piecewise-linear rule, its validation (field, value, fix), the CLI's
text, and a run whose optimizer follows it over env steps sampled, across a checkpoint."""

from __future__ import annotations

import itertools
import math

import pytest

from impala_lab.config import ImpalaConfig
from impala_lab.config_checks import parse_text
from impala_lab.driver.impala import Impala
from impala_lab.driver.knob_control import LR_STEP
from impala_lab.errors import ConfigError
from impala_lab.schedules import check_schedule, scheduled_value

POINTS = ((0, 0.01), (1000, 0.002), (3000, 0.0))


@pytest.mark.parametrize(("t", "expected"), [
    (0, 0.01), (500, 0.006), (1000, 0.002), (2000, 0.001), (3000, 0.0), (10**9, 0.0)])
def test_the_value_is_linear_between_points_and_held_after_the_last(t, expected):
    assert scheduled_value(POINTS, t) == pytest.approx(expected, abs=1e-12)


def test_before_the_first_point_the_first_value_holds():
    assert scheduled_value(((100, 0.5), (200, 0.25)), 0) == 0.5
    assert scheduled_value(((7, 0.3),), 10**6) == 0.3  # one point: a constant


@pytest.mark.parametrize(("points", "why"), [
    ([], "give [(env_steps, value), ...]"),
    ([(0, 0.1), (0, 0.2)], "must increase strictly"),
    ([(100, 0.1), (50, 0.2)], "must increase strictly"),
    ([(0, -0.1)], "values >= 0"),
    ([(0, math.nan)], "values >= 0"),
    ([(-5, 0.1)], "env steps >= 0"),
    ([(0.5, 0.1)], "env steps >= 0"),
    ([(0, 0.1, 3)], "give [(env_steps, value), ...]"),
    ("0:0.1", "give [(env_steps, value), ...]"),
])
def test_bad_schedules_name_the_field_the_value_and_the_fix(points, why):
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(lr_schedule=points)
    text = str(info.value)
    # the config holds lists as tuples before it validates them
    shown = points if isinstance(points, str) else tuple(tuple(p) for p in points)
    assert text.startswith(f"lr_schedule={shown!r} is invalid")
    assert why in text and "--lr-schedule 0:0.003,2000000:0" in text


def test_the_config_keeps_tuples_and_round_trips_as_lists():
    cfg = ImpalaConfig(lr_schedule=[[0, 0.003], [2_000_000, 0]])
    assert cfg.lr_schedule == ((0, 0.003), (2_000_000, 0))
    assert cfg.to_dict()["lr_schedule"] == [[0, 0.003], [2_000_000, 0]]
    assert ImpalaConfig.from_dict(cfg.to_dict()) == cfg
    check_schedule("lr_schedule", cfg.lr_schedule)


def test_the_command_lines_text():
    assert parse_text("lr_schedule", "schedule?", "0:0.003,2e6:0") == ((0, 0.003),
                                                                       (2_000_000, 0.0))
    assert parse_text("lr_schedule", "schedule?", "none") is None
    with pytest.raises(ConfigError, match=r"--lr-schedule='0:0.003,1.5:0' is invalid: it "
                       r"must be points ENV_STEPS:VALUE"):
        parse_text("lr_schedule", "schedule?", "0:0.003,1.5:0")


INLINE = dict(backend="inline", num_workers=1, num_envs_per_worker=2, sample_batch_size=10,
              train_batch_size=20, model=(8,), seed=3)


def test_a_run_follows_the_schedule_over_env_steps_sampled(tmp_path):
    schedule = ((0, 0.01), (400, 0.001))
    with Impala(ImpalaConfig(lr_schedule=schedule, **INLINE), start_learner=False) as run:
        lrs = []
        while run.num_steps_sampled < 600:
            steps = run.num_steps_sampled  # the schedule reads it before the turn
            run.step()
            while run.learner.step(block_timeout=0.0):
                pass
            expected = scheduled_value(schedule, steps)
            stats = run.stats()
            lr = stats["cur_lr"]
            assert stats["knobs"]["lr"] == lr  # the dashboard's slider follows the schedule
            # assigned when it moved LR_STEP (relative) or reached the end; float32 variable
            assert lr == pytest.approx(expected, rel=2 * LR_STEP + 1e-6), steps
            lrs.append(lr)
        assert lrs[0] == pytest.approx(0.01, rel=1e-6)
        assert lrs[-1] == pytest.approx(0.001, rel=1e-6)
        assert all(b <= a for a, b in itertools.pairwise(lrs))  # annealed, never back up
        assert float(run.policy.optimizer.learning_rate.numpy()) == pytest.approx(0.001)
        with pytest.raises(ConfigError) as info:
            run.set_knobs(lr=0.05)
        assert "follows its lr_schedule [[0, 0.01], [400, 0.001]]" in str(info.value)
        assert "lr_schedule=None" in str(info.value)
        run.set_knobs(entropy_coeff=0.02)  # other knobs still move
        path = run.save(tmp_path / "ckpt")
    with Impala.restore(path, start_learner=False) as restored:
        restored.step()  # the schedule at the restored env steps, not lr's 0.0005
        assert restored.stats()["cur_lr"] == pytest.approx(0.001, rel=1e-6)
