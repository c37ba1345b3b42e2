"""The off-policy study's bookkeeping (grid, seeds, cache, summaries) and the synchronous loop
it compares the pipeline with."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from impala_lab.classroom.offpolicy_study import (
    StudySettings,
    _runs,
    cell,
    run_mean,
    run_study,
    study_config,
    study_seeds,
    sweep_markdown,
    table2,
    table2_markdown,
)


def _record(correction, replay, lag, seed, curve, solved=None):
    return {"correction": correction, "replay": replay, "lag": lag, "seed": seed,
            "curve": curve, "final_return": curve[-1][1], "solved_at_env_steps": solved}


def test_run_mean_is_the_area_under_the_curve_per_env_step():
    # trapezoids: (10 + 30) / 2 * 100 + (30 + 30) / 2 * 300 = 2000 + 9000 over 400 steps
    assert run_mean({"curve": [[100, 10.0], [200, 30.0], [500, 30.0]]}) == pytest.approx(27.5)
    assert run_mean({"curve": [[100, 7.0]]}) == 7.0


def test_a_cell_gives_median_worst_best_peak_and_solves():
    runs = [_record("vtrace", 0.0, 32, s, curve, solved)
            for s, curve, solved in ((1, [[0, 10.0], [100, 500.0], [200, 9.0]], 100),
                                     (2, [[0, 10.0], [200, 200.0]], None),
                                     (3, [[0, 10.0], [200, 100.0]], None))]
    x = cell(runs)
    assert (x["median"], x["worst"], x["best"], x["peak"], x["solved"], x["n"]) == (
        100.0, 9.0, 200.0, 200.0, 1, 3)
    # run means: (255 * 100 + 254.5 * 100) / 200 = 254.75, 105, 55
    assert x["run_mean"] == pytest.approx(105.0)


def test_the_grid_has_every_cell_and_the_sweep_only_adds_what_is_missing():
    settings = StudySettings(num_seeds=3, lags=(0, 32), sweep_seeds=2, extra_policy_lag=32)
    runs = _runs(settings, [11, 22, 33])
    table = [r for r in runs if r["lag"] == 32]
    assert len(table) == 4 * 2 * 3
    assert len(runs) == len(table) + 4 * 2  # lag 0, two seeds; lag 32 is in the table already
    assert {(r["lag"], r["seed"]) for r in runs if r["lag"] == 0} == {(0, 11), (0, 22)}
    config = study_config(settings, "is1", 1.0, 32, 5)
    assert (config.off_policy_correction, config.vtrace, config.replay_proportion,
            config.extra_policy_lag, config.seed, config.backend) == ("is1", False, 1.0, 32, 5,
                                                                      "inline")
    assert config.max_policy_lag > 32


def test_seeds_are_drawn_once_per_study_directory_and_kept(tmp_path):
    settings = StudySettings(num_seeds=4)
    seeds = study_seeds(settings, tmp_path)
    assert len(seeds) == 4 and len(set(seeds)) == 4
    assert study_seeds(settings, tmp_path) == seeds
    other = study_seeds(StudySettings(num_seeds=4, env_steps=1000), tmp_path)
    assert other != seeds  # other settings: a new draw


def test_a_study_reads_finished_runs_from_its_directory_and_summarises_them(tmp_path):
    settings = StudySettings(num_seeds=2, lags=(0, 32), sweep_seeds=1)
    seeds = study_seeds(settings, tmp_path)
    finals = {"none": 9.0, "epsilon": 20.0, "is1": 150.0, "vtrace": 200.0}
    for run in _runs(settings, seeds):
        final = finals[run["correction"]] + 100 * run["replay"] + run["lag"]
        record = {**_record(run["correction"], run["replay"], run["lag"], run["seed"],
                            [[0, 20.0], [settings.env_steps, final]]), "seconds": 1.0,
                  "policy_lag_at_training": 0.0}
        name = f"{run['correction']}_replay{run['replay']:g}_lag{run['lag']}_seed{run['seed']}"
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    results = run_study(settings, tmp_path, progress=None)  # nothing left to train
    assert len(results["runs"]) == 16 + 4 and results["seeds"] == seeds
    t = table2(results)
    assert t["vtrace"][1.0]["median"] == 200 + 100 + 32
    assert t["none"][0.0]["median"] == 9 + 32
    text = table2_markdown(results)
    assert "| V-trace | **232** [232, 232]" in text and "**332** [332, 332]" in text
    assert "| No-correction | 41 [41, 41] · run mean 30 · peak 41 · 475 reached 0/2" in text
    sweep_text = sweep_markdown(results)
    assert "| V-trace | 110 (final 200) | 126 (final 232) |" in sweep_text


def test_the_synchronous_loop_trains_on_policy_once_per_round():
    from impala_lab.classroom.sync_loop import SyncLoop
    from impala_lab.config import ImpalaConfig

    config = ImpalaConfig(backend="inline", num_workers=2, num_envs_per_worker=2,
                          sample_batch_size=5, seed=0)
    seen = []
    with SyncLoop(config) as loop:
        learn = loop.policy.learn_on_batch

        def spy(batch):
            seen.append((loop.policy.version, batch.policy_versions.tolist(), batch.count))
            return learn(batch)

        loop.policy.learn_on_batch = spy
        for _ in range(3):
            stats = loop.step()
        assert np.isfinite(stats["total_loss"]) and loop.num_updates == 3
        assert loop.num_steps_sampled == 3 * 2 * 2 * 5
    # every round's batch was sampled with the weights of the update before it: lag 0
    assert seen == [(v, [v] * 4, 20) for v in range(3)]
    assert not math.isnan(stats["mean_rho"]) and stats["mean_rho"] == pytest.approx(1.0,
                                                                                    abs=1e-4)
