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
    claims_markdown,
    paper_claims,
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


def test_a_cell_gives_iqms_with_intervals_median_worst_best_peak_and_solves():
    runs = [_record("vtrace", 0.0, 32, s, curve, solved)
            for s, curve, solved in ((1, [[0, 10.0], [100, 500.0], [200, 9.0]], 100),
                                     (2, [[0, 10.0], [200, 200.0]], None),
                                     (3, [[0, 10.0], [200, 100.0]], None))]
    x = cell(runs)
    assert (x["median"], x["worst"], x["best"], x["peak"], x["solved"], x["n"]) == (
        100.0, 9.0, 200.0, 200.0, 1, 3)
    # n = 3: the IQM cuts nothing, so it is the mean; run means 254.75, 105, 55
    assert x["final"] == pytest.approx((9 + 200 + 100) / 3)
    assert x["run_mean"] == pytest.approx((254.75 + 105 + 55) / 3)
    # a bootstrap interval of a mean of 3 values lies within their range and holds the mean
    assert 9.0 <= x["final_ci"][0] < x["final"] < x["final_ci"][1] <= 200.0
    assert 55.0 <= x["run_mean_ci"][0] < x["run_mean"] < x["run_mean_ci"][1] <= 254.75
    assert cell(runs) == x  # the bootstrap's generator is seeded: the same table every time


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
    settings = StudySettings(num_seeds=5, lags=(0, 32), sweep_seeds=5)
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
    assert len(results["runs"]) == 40 + 20 and results["seeds"] == seeds
    t = table2(results)
    assert t["vtrace"][1.0]["median"] == 200 + 100 + 32
    assert t["none"][0.0]["final"] == 9 + 32
    text = table2_markdown(results)
    # every seed alike: each interval is a point
    assert ("| V-trace | final **232 [232, 232]** · run mean 126 [126, 126] · 475 reached "
            "0/5") in text
    assert "| No-correction | final 41 [41, 41] · run mean 30 [30, 30] · 475 reached 0/5" in text
    sweep_text = sweep_markdown(results)
    assert ("| V-trace | run mean 110 [110, 110] · final 200 [200, 200] | run mean 126 [126, "
            "126] · final 232 [232, 232] |") in sweep_text
    verdicts = {c["claim"]: c["verdict"] for c in paper_claims(results)}
    assert verdicts == {
        "no replay: V-trace ahead of no correction": "agrees",
        "no replay: V-trace ahead of epsilon-correction": "agrees",
        "no replay: 1-step IS ahead of no correction": "agrees",
        "replay: V-trace ahead of every other correction": "agrees",
        "V-trace gains from replay": "agrees",
        "no other correction gains from replay": "differs",  # each gains 100 here
        "lag 32: V-trace ahead of no correction": "agrees",  # the sweep's largest lag
    }
    assert ("| V-trace gains from replay | agrees (+100 [+100, +100], n 5 vs 5) | agrees "
            "(+50 [+50, +50], n 5 vs 5) |") in claims_markdown(results)


def _spread(correction: str, finals: list[float]) -> list[dict]:
    return [_record(correction, 0.0, 32, k, [[0, 10.0], [100, f]]) for k, f in enumerate(finals)]


@pytest.mark.parametrize("vtrace, none, verdict", [
    ([200, 210, 220, 230, 240, 250], [10, 20, 30, 40, 50, 60], "agrees"),
    ([10, 20, 30, 40, 50, 60], [200, 210, 220, 230, 240, 250], "differs"),
    ([10, 200, 30, 240, 50, 60], [20, 210, 40, 230, 30, 50], "inconclusive"),
])
def test_a_claim_agrees_differs_or_is_inconclusive_by_the_interval_of_the_difference(
        vtrace, none, verdict):
    results = {"settings": {"extra_policy_lag": 32, "lags": [32], "replay_proportions": [0.0],
                            "corrections": ["none", "vtrace"]},
               "runs": _spread("vtrace", vtrace) + _spread("none", none)}
    (claim,) = [c for c in paper_claims(results)
                if c["claim"] == "no replay: V-trace ahead of no correction"]
    assert claim["verdict"] == verdict
    (test,) = claim["tests"]
    assert test["n"] == (6, 6)
    low, high = test["ci95"]
    assert low <= test["difference"] <= high


def test_several_runs_at_a_time_each_in_a_process_of_its_own(tmp_path):
    settings = StudySettings(env_steps=400, num_seeds=1, lags=(32,), sweep_seeds=1,
                             corrections=("none", "vtrace"), replay_proportions=(0.0,))
    with pytest.raises(ValueError, match=r"jobs=0: run at least 1 run at a time"):
        run_study(settings, tmp_path, progress=None, jobs=0)
    results = run_study(settings, tmp_path, progress=None, jobs=2)
    assert [(r["correction"], r["lag"]) for r in results["runs"]] == [("none", 32),
                                                                      ("vtrace", 32)]
    for run in results["runs"]:
        assert run["curve"] and run["policy_lag_at_training"] >= 0
        name = f"{run['correction']}_replay0_lag32_seed{run['seed']}.json"
        assert json.loads((tmp_path / name).read_text()) == run  # written by the worker


def test_too_few_seeds_a_side_are_inconclusive_whatever_the_interval():
    results = {"settings": {"extra_policy_lag": 32, "lags": [32], "replay_proportions": [0.0],
                            "corrections": ["none", "vtrace"]},
               "runs": _spread("vtrace", [400, 410, 420, 430]) + _spread("none", [9, 9, 9, 9])}
    (claim,) = [c for c in paper_claims(results)
                if c["claim"] == "no replay: V-trace ahead of no correction"]
    assert claim["verdict"] == "inconclusive" and claim["tests"][0]["ci95"][0] > 300


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
