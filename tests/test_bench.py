"""Smoke test of the benchmarks (``python -m bench``): each function runs with tiny durations
and returns finite, positive figures of the documented structure. No timing thresholds: the
targets are the bench's business, not the test suite's."""

from __future__ import annotations

import json
import math
import os

import pytest

from bench import __main__ as bench_main
from bench import pipeline


def _positive(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_sampling_ceiling_counts_env_steps_of_every_worker():
    r = pipeline.sampling_ceiling(num_workers=2, seconds=0.5)
    assert r["num_workers"] == 2 and r["envs_per_worker"] == 8
    # Whole samples of [50, 8] only: the count is a multiple of 400.
    assert r["env_steps"] > 0 and r["env_steps"] % 400 == 0
    assert _positive(r["env_steps_per_s"]) and r["seconds"] >= 0.5
    assert r["env_steps_per_s"] == pytest.approx(r["env_steps"] / r["seconds"], rel=0.01)


def test_end_to_end_with_memory_and_learner_ceiling_ratio():
    e = pipeline.end_to_end(num_workers=1, seconds=1.0, warmup_s=1.0, measure_memory=True)
    assert _positive(e["env_steps_per_s"]) and _positive(e["trained_per_s"])
    assert _positive(e["learner_busy_samples_per_s"])
    mem = e["memory"]
    assert mem["num_actors"] == 1
    # The driver holds TensorFlow: far more than an actor, which never imports it.
    assert mem["driver_peak_mb"] > mem["actor_peak_mb"] > 0
    assert mem["peak_total_mb"] >= mem["driver_peak_mb"]
    c = pipeline.learner_ceiling(seconds=0.3, warmup_steps=1)
    assert c["batch_shape"] == [50, 16]  # train_batch_size 500 of [50, 8] samples: 2 of them
    assert c["steps"] >= 1 and _positive(c["samples_per_s"]) and _positive(c["step_ms"])
    assert c["samples_per_s"] == pytest.approx(800 * 1e3 / c["step_ms"], rel=0.01)
    assert _positive(e["trained_per_s"] / c["samples_per_s"])


def test_side_by_side_windows_alternate_and_ratios_are_of_the_medians():
    r = pipeline.sampling_side_by_side(num_workers=1, rounds=2, seconds=0.5, warmup_s=0.5,
                                       measure_memory=True)
    ceil, e2e = r["ceiling"]["rounds"], r["end_to_end"]["rounds"]
    assert len(ceil) == len(e2e) == 2 and all(_positive(x) for x in ceil + e2e)
    assert r["ratio"] == pytest.approx(
        (e2e[0] + e2e[1]) / (ceil[0] + ceil[1]), rel=1e-3)  # the median of two is the mean
    assert r["round_ratios"] == [pytest.approx(e / c, rel=1e-3) for e, c in zip(e2e, ceil)]
    assert r["memory"]["num_actors"] == 1
    ll = pipeline.learner_side_by_side(num_sgd_iter=2, rounds=1, seconds=0.5, warmup_s=0.5,
                                       idle_s=0.1)
    assert ll["ceiling"]["batch_shape"] == [50, 16] and ll["fed"]["num_sgd_iter"] == 2
    assert ll["ratio"] == pytest.approx(
        ll["fed"]["trained_per_s"] / ll["ceiling"]["samples_per_s"], rel=1e-3)


def test_summarize_solves_counts_an_unsolved_seed_as_a_failure():
    runs = [{"seed": 0, "solved": True, "wall_s": 50.0, "seconds_to_target": 40.0,
             "env_steps_to_target": 300_000},
            {"seed": 1, "solved": False, "wall_s": 110.0, "seconds_to_target": None,
             "env_steps_to_target": None},
            {"seed": 2, "solved": True, "wall_s": 60.0, "seconds_to_target": 50.0,
             "env_steps_to_target": 400_000}]
    s = pipeline.summarize_solves(runs, 100.0)
    assert (s["num_solved"], s["median_s"], s["min_s"], s["max_s"]) == (2, 50.0, 40.0, None)
    assert (s["median_env_steps"], s["median_wall_s"]) == (350_000, 60.0)
    assert pipeline.summarize_solves(runs[1:2] * 2 + runs[:1], 100.0)["median_s"] is None
    target = bench_main._target("solve", None, "<=", 60.0)
    assert target["passed"] is False


def test_time_to_solve_reports_an_unsolved_capped_run():
    r = pipeline.time_to_solve(seed=0, max_seconds=1.0, extra_args=("--num-workers", "1"))
    assert r["solved"] is False and r["seconds_to_target"] is None
    assert r["stop_reason"] == "max_seconds"
    assert _positive(r["wall_s"]) and r["final_env_steps"] > 0


def test_main_writes_results_and_plot(tmp_path, monkeypatch):
    fake = {
        "sampling": {"env_steps_per_s": 1000.0},
        "e2e": {"env_steps_per_s": 700.0, "trained_per_s": 650.0,
                "learner_busy_samples_per_s": 900.0,
                "memory": {"peak_total_mb": 700.0, "driver_peak_mb": 600.0,
                           "actor_peak_mb": 45.0, "num_actors": 2}},
    }
    monkeypatch.setattr(pipeline, "sampling_ceiling",
                        lambda n, s: {**fake["sampling"], "num_workers": n})
    monkeypatch.setattr(pipeline, "end_to_end",
                        lambda n, s, w, measure_memory=False: {**fake["e2e"], "num_workers": n})
    monkeypatch.setattr(pipeline, "sampling_side_by_side",
                        lambda n, rounds, s, w, measure_memory=False: {
                            "ceiling": {**fake["sampling"], "rounds": [1000.0]},
                            "end_to_end": fake["e2e"], "memory": fake["e2e"]["memory"],
                            "ratio": 0.7, "round_ratios": [0.7]})
    code = bench_main.main(["--quick", "--only", "sampling,memory,scaling",
                            "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [t["passed"] for t in results["targets"]] == [True, True, True]
    assert results["targets"][0]["value"] == 0.7
    scaling = results["benchmarks"]["scaling"]
    assert [r["num_workers"] for r in scaling] == [1, 2, 4]
    assert scaling[1]["end_to_end_env_steps_per_s"] == 700.0  # the side-by-side figure
    assert results["machine"]["nproc"] == os.cpu_count()
    assert (tmp_path / "results.png").stat().st_size > 10_000
    table = (tmp_path / "results.md").read_text()
    assert "| sampling: end to end / sampling ceiling (N=2) | 0.700 | >= 0.6 | met |" in table
    assert "| 2 | 1,000 | 700.0 |" in table


def test_readme_shows_the_committed_bench_results():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    results = json.loads((root / "bench" / "results.json").read_text())
    assert not results["quick"], "bench/results.json must come from a full `make bench`"
    readme = (root / "README.md").read_text()
    assert bench_main.format_markdown(results) in readme, (
        "README's Performance table differs from bench/results.json: paste bench/results.md")
    assert (root / "bench" / "results.png").is_file()


def test_only_rejects_an_unknown_benchmark(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_main.main(["--only", "sampling,speed"])
    assert exc.value.code == 2
    assert "unknown benchmark(s) ['speed']" in capsys.readouterr().err


def test_profile_aggregates_self_and_inclusive_shares_of_py_spy_raw_output():
    from bench.profile import REPO, aggregate

    raw = "\n".join([
        f"thread (1): MainThread;<module> (x.py:1);step ({REPO}/impala_lab/impala.py:10);"
        f"wait (/v/lib/python3.11/site-packages/multiprocess/connection.py:5) 3",
        f"thread (2): impala-learner;Thread._bootstrap (threading.py:1);"
        f"learn ({REPO}/impala_lab/policy.py:7);learn ({REPO}/impala_lab/policy.py:9) 1",
        "",
    ])
    agg = aggregate(raw, top=10)
    assert agg["samples"] == 4
    assert agg["threads"] == {"MainThread": 0.75, "impala-learner": 0.25}
    assert agg["self"] == [("wait (multiprocess/connection.py:5)", 0.75),
                           ("learn (impala_lab/policy.py:9)", 0.25)]
    # Lines merge per function, a recursive call counts once, start-up frames are left out.
    assert dict(agg["inclusive"]) == {"step (impala_lab/impala.py)": 0.75,
                                      "wait (multiprocess/connection.py)": 0.75,
                                      "learn (impala_lab/policy.py)": 0.25}
    assert [share for _, share in agg["inclusive"]] == [0.75, 0.75, 0.25]
    assert aggregate("", 5) == {"samples": 0, "threads": {}, "self": [], "inclusive": []}
