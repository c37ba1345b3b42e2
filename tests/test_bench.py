"""Smoke test of the benchmarks (``python -m bench``): each function runs with tiny durations
and returns finite, positive figures of the documented structure. No timing thresholds: the
targets are the bench's business, not the test suite's."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import machine, pipeline, solves
from tests.waiting import wait_for


def _positive(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_sampling_ceiling_counts_env_steps_of_every_worker():
    r = pipeline.sampling_ceiling(num_workers=2, seconds=0.5)
    assert r["num_workers"] == 2 and r["envs_per_worker"] == 8
    # Whole samples of the preset's [25, 8] only: the count is a multiple of 200.
    assert r["env_steps"] > 0 and r["env_steps"] % 200 == 0
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
    assert c["batch_shape"] == [25, 8]  # train_batch_size 200: one [25, 8] sample
    assert c["steps"] >= 1 and _positive(c["samples_per_s"]) and _positive(c["step_ms"])
    assert c["samples_per_s"] == pytest.approx(200 * 1e3 / c["step_ms"], rel=0.01)
    assert _positive(e["trained_per_s"] / c["samples_per_s"])


def test_side_by_side_windows_alternate_and_ratios_are_of_the_medians():
    r = pipeline.sampling_side_by_side(num_workers=1, rounds=2, seconds=0.5, warmup_s=0.5,
                                       measure_memory=True)
    ceil, e2e = r["ceiling"]["rounds"], r["end_to_end"]["rounds"]
    assert len(ceil) == len(e2e) == 2 and all(_positive(x) for x in ceil + e2e)
    # Ratios are rounded to 4 decimals: the rounding (at most 5e-5) bounds the error of a small one.
    assert r["ratio"] == pytest.approx(
        (e2e[0] + e2e[1]) / (ceil[0] + ceil[1]), rel=1e-3, abs=5e-5)  # median of two = mean
    assert r["round_ratios"] == [pytest.approx(e / c, rel=1e-3, abs=5e-5)
                                 for e, c in zip(e2e, ceil)]
    assert r["memory"]["num_actors"] == 1
    ll = pipeline.learner_side_by_side(num_sgd_iter=2, rounds=1, seconds=0.5, warmup_s=0.5,
                                       idle_s=0.1)
    assert ll["ceiling"]["batch_shape"] == [25, 8] and ll["fed"]["num_sgd_iter"] == 2
    assert ll["ratio"] == pytest.approx(
        ll["fed"]["trained_per_s"] / ll["ceiling"]["samples_per_s"], rel=1e-3, abs=5e-5)


def _run(seed: int, seconds: float | None, steps: int | None = None, low: float | None = None,
         after: float | None = 60.0, limit: float = 60.0, wall: float = 90.0) -> dict:
    """A fabricated `time_to_solve` result: reached at ``seconds`` (None: never)."""
    reached = seconds is not None
    return {"seed": seed, "reached": reached, "solved": reached and seconds <= limit,
            "wall_s": wall, "seconds_to_target": seconds,
            "env_steps_to_target": steps if reached else None,
            "train_after_target": 60.0, "return_min_after_target": low if reached else None,
            "seconds_after_target": after if reached else None,
            "stop_reason": "train_after_target" if reached else "max_seconds",
            "final_return_mean": 480.0 if reached else 9.4, "final_env_steps": 1_000_000}


def test_summarize_solves_counts_an_unsolved_seed_as_a_failure():
    runs = [{"seed": 0, "solved": True, "wall_s": 50.0, "seconds_to_target": 40.0,
             "env_steps_to_target": 300_000},
            {"seed": 1, "solved": False, "wall_s": 110.0, "seconds_to_target": None,
             "env_steps_to_target": None},
            {"seed": 2, "solved": True, "wall_s": 60.0, "seconds_to_target": 50.0,
             "env_steps_to_target": 400_000}]
    s = solves.summarize_solves(runs, 100.0)
    assert (s["num_solved"], s["median_s"], s["min_s"], s["max_s"]) == (2, 50.0, 40.0, None)
    # The unsolved seed's env steps count as infinite too: the median is the larger solved one.
    assert (s["median_env_steps"], s["max_env_steps"], s["median_wall_s"]) == (
        400_000, None, 60.0)
    assert s["solve_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert solves.summarize_solves(runs[1:2] * 2 + runs[:1], 100.0)["median_s"] is None
    # Without a window after the target, "stayed" is not measured.
    assert s["num_stayed"] == 0 and s["lowest_after_target"] is None
    assert [r["stayed"] for r in s["runs"]] == [None, None, None]
    target = bench_main._target("solve", None, "<=", 60.0)
    assert target["passed"] is False


def test_summarize_solves_rate_median_worst_and_stays_solved():
    runs = [_run(11, 12.0, 600_000, low=455.0), _run(22, 18.0, 900_000, low=430.0),
            _run(33, 25.0, 1_400_000, low=390.0),  # solved, then fell below 400
            _run(44, 75.0, 3_000_000, low=470.0),  # reached 475 after the 60 s limit
            _run(55, None, wall=130.0)]  # never reached it
    s = solves.summarize_solves(runs, 120.0, solve_limit_s=60.0, after_s=60.0)
    assert (s["num_runs"], s["num_solved"], s["num_reached"], s["solve_rate"]) == (5, 3, 4, 0.6)
    assert s["seeds"] == [11, 22, 33, 44, 55]
    # Seconds and env steps: the late seed with its time, the unreached one as infinite.
    assert (s["median_s"], s["min_s"], s["max_s"]) == (25.0, 12.0, None)
    assert (s["median_env_steps"], s["min_env_steps"], s["max_env_steps"]) == (
        1_400_000, 600_000, None)
    assert [r["stayed"] for r in s["runs"]] == [True, True, False, None, None]
    assert (s["num_stayed"], s["lowest_after_target"]) == (2, 390.0)
    # Every seed reached: the worst is a number.
    s2 = solves.summarize_solves(runs[:4], 120.0, solve_limit_s=60.0, after_s=60.0)
    assert (s2["max_s"], s2["max_env_steps"], s2["median_s"]) == (75.0, 3_000_000, 21.5)
    assert s2["median_env_steps"] == 1_150_000


def test_stays_solved_needs_the_whole_window_after_the_target():
    full = _run(1, 10.0, 500_000, low=450.0, after=59.2)  # within one report interval
    short = _run(2, 11.0, 500_000, low=450.0, after=30.0)  # the run's cap came first
    s = solves.summarize_solves([full, short], 120.0, solve_limit_s=60.0, after_s=60.0)
    assert [r["stayed"] for r in s["runs"]] == [True, False]
    assert s["num_stayed"] == 1
    assert s["lowest_after_target"] is None  # an incomplete window fails the target
    row = bench_main.solve_targets({**s, "load_procs": 0})[-1]
    assert row["value"] is None and not row["passed"] and "(1/2 solved seeds stayed" in row["name"]
    # No seed solved: nothing to stay, and the target fails rather than passing vacuously.
    none = solves.summarize_solves([_run(3, None)], 120.0, solve_limit_s=60.0, after_s=60.0)
    assert none["lowest_after_target"] is None and none["solve_rate"] == 0.0


def test_solve_targets_pass_exactly_at_their_goals():
    # Median of 20 = the mean of the 10th and 11th: 6.0 s and 400,000 env steps exactly.
    runs = [_run(i, 5.0 if i < 10 else 7.0, 300_000 if i < 10 else 500_000, low=420.0)
            for i in range(20)]
    s = solves.summarize_solves(runs, 120.0, solve_limit_s=60.0, after_s=60.0)
    rows = bench_main.solve_targets({**s, "load_procs": 0})
    assert [(t["name"], t["value"], t["op"], t["target"], t["passed"]) for t in rows] == [
        ("solve: seeds reaching 475 within 60 s (20/20)", 1.0, ">=", 1.0, True),
        ("solve: median s from process start to mean 475", 6.0, "<=", 6.0, True),
        ("solve: median env steps to mean 475, millions", 0.4, "<=", 0.4, True),
        ("solve: lowest mean in the 60 s after 475 (20/20 solved seeds stayed >= 400)",
         420.0, ">=", 400.0, True)]
    # One seed that never solves fails the quiet solve rate (every seed must).
    missed = solves.summarize_solves([*runs[:19], _run(99, None)], 120.0,
                                     solve_limit_s=60.0, after_s=60.0)
    row = bench_main.solve_targets({**missed, "load_procs": 0})[0]
    assert (row["value"], row["passed"]) == (0.95, False)
    # With a busy process beside, 19 of 20 is enough, 18 is not.
    loaded = solves.summarize_solves([*runs[:18], _run(98, 70.0, 5), _run(99, None)], 60.0,
                                     solve_limit_s=60.0)
    (row,) = bench_main.solve_targets({**loaded, "load_procs": 1})
    assert row["name"] == ("solve, 1 busy process beside: seeds reaching 475 within 60 s "
                           "(18/20)")
    assert (row["value"], row["target"], row["passed"]) == (0.9, 0.95, False)


def test_draw_seeds_are_distinct_and_random_per_run():
    import random

    a, b = solves.draw_seeds(20), solves.draw_seeds(20)
    assert len(set(a)) == 20 and all(0 <= x < solves.SEED_RANGE for x in a)
    assert a != b  # 1 chance in ~1e80 of a false failure
    assert solves.draw_seeds(5, random.Random(7)) == solves.draw_seeds(5, random.Random(7))


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu_ticks(pid: int) -> int:
    fields = _proc_stat(pid)
    return int(fields[11]) + int(fields[12]) if fields else -1  # utime + stime


def test_busy_processes_spin_beside_the_block_and_end_with_it():
    with machine.busy_processes(2) as pids:
        assert len(pids) == 2
        # Spinning: each uses CPU time (a tenth of a second of it), and is never ended or
        # stopped (running, or runnable and just scheduled out).
        hz = os.sysconf("SC_CLK_TCK")
        wait_for(lambda: all(_cpu_ticks(pid) >= hz // 10 for pid in pids), "the processes spin")
        assert all(_proc_stat(pid)[0] in ("R", "S") for pid in pids)
    assert all(_proc_stat(pid) is None for pid in pids)  # ended and reaped


def test_main_solve_prints_the_random_seeds_and_writes_the_solve_table(tmp_path, monkeypatch,
                                                                     capsys):
    calls, loads = [], []

    def fake_time_to_solve(seed, max_seconds, train_after_target=None, solve_limit_s=None):
        calls.append((seed, max_seconds, train_after_target, solve_limit_s))
        if seed == calls[0][0] and train_after_target is None:  # loaded: the first seed fails
            return _run(seed, None, wall=61.0)
        return _run(seed, 5.5, 300_000, low=450.0, after=train_after_target)

    class FakeLoad:
        def __init__(self, n):
            loads.append(n)

        def __enter__(self):
            return [12345]

        def __exit__(self, *exc):
            loads.append("ended")

    monkeypatch.setattr(solves, "time_to_solve", fake_time_to_solve)
    monkeypatch.setattr(machine, "busy_processes", FakeLoad)
    code = bench_main.main(["--only", "solve,solve_loaded", "--solve-seeds", "3",
                            "--load-procs", "2", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    seeds = results["solve_seeds"]
    assert len(seeds) == 3 and results["benchmarks"]["solve"]["seeds"] == seeds
    assert f"3 seeds drawn at random for this run: {', '.join(map(str, seeds))}" in out
    # Idle: cap 120 s and 60 s more after 475; loaded: cap 60 s, no window, same seeds.
    assert calls == [(s, 120.0, 60.0, 60.0) for s in seeds] + [(s, 60.0, None, 60.0)
                                                                for s in seeds]
    assert loads == [2, "ended"]
    assert [t["passed"] for t in results["targets"]] == [True, True, True, True, False]
    assert results["benchmarks"]["solve_loaded"]["num_solved"] == 2
    md = (tmp_path / "results.md").read_text()
    assert "| solve: seeds reaching 475 within 60 s (3/3) | 1.000 | >= 1 | met |" in md
    assert "| solve: median env steps to mean 475, millions | 0.300 M | <= 0.4 M | met |" in md
    assert ("| machine otherwise idle | 3/3 | 5.5 s | 5.5 s | 300,000 | 300,000 | "
            "3/3 for 60 s |") in md
    assert ("| 2 busy processes beside | 2/3 | 5.5 s | never | 300,000 | never | "
            "not measured |") in md
    assert f"Seeds, drawn at random for this run: {', '.join(map(str, seeds))}." in md
    assert f"seed {seeds[0]}: NOT solved" in out and "3/3 solved seeds stayed >= 400" in out
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_solve_seeds_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_main.main(["--only", "solve", "--solve-seeds", "0"])
    assert exc.value.code == 2 and "--solve-seeds=0" in capsys.readouterr().err


def test_time_to_solve_reports_an_unsolved_capped_run():
    r = solves.time_to_solve(seed=0, max_seconds=1.0, extra_args=("--num-workers", "1"))
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


def test_the_performance_page_shows_the_committed_bench_results():
    root = Path(__file__).resolve().parents[1]
    results = json.loads((root / "docs" / "results" / "results.json").read_text())
    assert not results["quick"], "docs/results/results.json must come from a full `make bench`"
    page = (root / "docs" / "performance.md").read_text()
    assert bench_main.format_markdown(results) in page, (
        "docs/performance.md's table differs from docs/results/results.json: "
        "paste docs/results/results.md")
    assert (root / "docs" / "results" / "results.png").is_file()


def test_only_rejects_an_unknown_benchmark(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_main.main(["--only", "sampling,speed"])
    assert exc.value.code == 2
    assert "unknown benchmark(s) ['speed']" in capsys.readouterr().err


def test_profile_aggregates_self_and_inclusive_shares_of_py_spy_raw_output():
    from bench.profile import REPO, aggregate

    raw = "\n".join([
        f"thread (1): MainThread;<module> (x.py:1);step ({REPO}/impala_lab/driver/impala.py:10);"
        f"wait (/v/lib/python3.11/site-packages/multiprocess/connection.py:5) 3",
        f"thread (2): impala-learner;Thread._bootstrap (threading.py:1);"
        f"learn ({REPO}/impala_lab/learner/vtrace_policy.py:7);"
        f"learn ({REPO}/impala_lab/learner/vtrace_policy.py:9) 1",
        "",
    ])
    agg = aggregate(raw, top=10)
    assert agg["samples"] == 4
    assert agg["threads"] == {"MainThread": 0.75, "impala-learner": 0.25}
    assert agg["self"] == [("wait (multiprocess/connection.py:5)", 0.75),
                           ("learn (impala_lab/learner/vtrace_policy.py:9)", 0.25)]
    # Lines merge per function, a recursive call counts once, start-up frames are left out.
    assert dict(agg["inclusive"]) == {"step (impala_lab/driver/impala.py)": 0.75,
                                      "wait (multiprocess/connection.py)": 0.75,
                                      "learn (impala_lab/learner/vtrace_policy.py)": 0.25}
    assert [share for _, share in agg["inclusive"]] == [0.75, 0.75, 0.25]
    assert aggregate("", 5) == {"samples": 0, "threads": {}, "self": [], "inclusive": []}


def test_memory_task_runs_both_policies_on_each_seed_and_counts_a_miss_as_a_failure(monkeypatch):
    from bench import recurrent

    calls = []

    def fake(seed, max_s, stop, extra, solve_limit_s):
        calls.append((seed, max_s, stop, extra, solve_limit_s))
        lstm = extra[-1] == "true"
        reached = lstm and seed != 3
        return {"seed": seed, "reached": reached, "solved": reached, "wall_s": 100.0,
                "seconds_to_target": 60.0 + seed if reached else None,
                "env_steps_to_target": 1_000_000 * seed if reached else None,
                "best_return_mean": 350.0 if reached else 40.0 + seed}

    monkeypatch.setattr(solves, "time_to_solve", fake)
    lines = []
    r = recurrent.memory_task([1, 2, 3], 300.0, log=lambda *a, **k: lines.append(a[0]))
    env = ("--env", "impala_lab/StatelessCartPole-v1")
    assert calls == [(s, 300.0, 350.0, (*env, "--use-lstm", flag), 300.0)
                     for s in (1, 2, 3) for flag in ("true", "false")]
    s, ff = r["lstm"], r["feed_forward"]
    assert (s["num_solved"], s["solve_rate"], s["median_s"], s["max_s"]) == (
        2, pytest.approx(2 / 3, abs=1e-4), 62.0, None)  # seed 3 never: infinitely slow
    assert (s["median_env_steps"], s["max_env_steps"]) == (2_000_000, None)
    assert (ff["num_reached"], ff["median_best_return_mean"], ff["min_best_return_mean"],
            ff["max_best_return_mean"]) == (0, 42.0, 41.0, 43.0)
    assert len(lines) == 6 and "seed 3 (3/3), LSTM: did not reach 350" in lines[4]
    rows = bench_main.recurrent_targets(r)
    assert [t["passed"] for t in rows] == [False, False, True]
    assert rows[0]["name"] == "recurrent: LSTM seeds reaching 350 within 300 s (2/3)"
    assert (rows[1]["value"], rows[1]["op"], rows[1]["target"]) == (62.0, "<=", 60.0)
    md = "\n".join(bench_main.recurrent_markdown({"recurrent": r}))
    assert "| LSTM (`--use-lstm true`) | 2/3 | 62.0 s | never | 2,000,000 | never |" in md
    assert "| feed-forward (`--use-lstm false`) | 0/3 | never | never | never | never | " \
           "42.0 (41.0-43.0) |" in md


def test_recurrent_speed_sides_alternate_and_ratios_are_of_the_windows():
    from bench import recurrent

    a = recurrent.actor_forward(num_envs=4, rounds=2, seconds=0.05)
    assert a["num_envs"] == 4 and len(a["rounds"]) == 2
    assert all(_positive(x) for pair in a["rounds"] for x in pair)
    assert a["ratio"] == pytest.approx(
        sum(lstm / mlp for mlp, lstm in a["rounds"]) / 2, abs=1e-3)  # median of two = mean
    ll = recurrent.learner_rates(rounds=1, seconds=0.2, warmup_steps=1)
    assert ll["batch_shape"] == [50, 8]  # the preset's batches: one [50, 8] worker sample
    (mlp, lstm), = ll["rounds"]
    assert (ll["mlp_samples_per_s"], ll["lstm_samples_per_s"]) == (mlp, lstm)
    assert _positive(mlp) and _positive(lstm)
    assert ll["ratio"] == pytest.approx(lstm / mlp, abs=5e-4)  # rounded to 3 decimals


def test_minatar_cpu_share_finds_exactly_the_worker_processes_and_their_cpu():
    from bench import minatar
    from impala_lab.backends.process import ProcessBackend
    from tests.backend_helpers import config

    backend = ProcessBackend(config())
    try:
        handles = [backend.make_worker(i) for i in range(2)]
        for h in handles:
            h.info().result()
        assert minatar._worker_pids(os.getpid()) == sorted(h.pid for h in handles)
        before, t0 = minatar._cpu_seconds(os.getpid()), time.process_time()
        while time.process_time() - t0 < 0.2:  # burn 0.2 s of this process's CPU
            pass
        # The same CPU time as the process's own count (every thread), to its 10 ms ticks.
        burnt = time.process_time() - t0
        assert minatar._cpu_seconds(os.getpid()) - before == pytest.approx(burnt, abs=0.03)
    finally:
        backend.shutdown()


def test_minatar_markdown_shows_cores_solves_and_the_impala_run():
    from bench import minatar

    game = {"stop_return": 17.5, "env_step_us": 3.0, "learner_cnn": {"samples_per_s": 50000.0},
            "learner_impala": {"samples_per_s": 12000.0},
            **{f"forward_{n}_b{b}_us_per_step": 1.0 for n in ("cnn", "impala") for b in (8, 16)},
            "cpu": {"window_s": 30.0, "driver_learner_cores": 1.12, "worker_cores": [0.15, 0.27]},
            "solve": {"runs": [{"seed": 7, "solved": True, "seconds_to_target": 95.8,
                                "env_steps_to_target": 1858560, "final_return_mean": 15.4,
                                "frames_per_s": 18945.6}]},
            "impala_run": {"seed": 9, "final_env_steps": 653440, "final_return_mean": 8.1,
                           "frames_per_s": 5078.0}}
    text = minatar.markdown({"games": {"MinAtar/Breakout-v1": game}})
    assert "| 50,000, 12,000 | 1.12; 0.15, 0.27 |" in text
    assert "| MinAtar/Breakout-v1 | 17.5 | 7 | True | 95.8 | 1858560 | 15.4 | 18945.6 |" in text
    assert "| MinAtar/Breakout-v1 | 9 | 653440 | 8.1 | 5078.0 |" in text
    # --solve-only: no timings measured, so no costs table; the solve table alone.
    solve_only = {k: game[k] for k in ("stop_return", "solve")}
    text = minatar.markdown({"games": {"MinAtar/Freeway-v1": solve_only}})
    assert text.splitlines()[0].startswith("| game | target | seed | reached |")
    assert "| MinAtar/Freeway-v1 | 17.5 | 7 | True |" in text and "IMPALA" not in text


def test_minatar_solve_only_runs_the_solves_alone(monkeypatch):
    from bench import minatar

    calls = []

    def fake_solve(env_id, target, seed):
        calls.append((env_id, target))
        return {"seed": seed, "solved": True, "seconds_to_target": 90.0,
                "env_steps_to_target": 3_000_000, "final_return_mean": target + 1,
                "final_env_steps": 3_100_000, "wall_s": 95.0}

    def never(*a, **k):
        raise AssertionError("--solve-only measured a cost")

    monkeypatch.setattr(minatar, "solve_run", fake_solve)
    for name in ("actor_timings", "actor_cpu_share", "learner_samples_per_s", "impala_run"):
        monkeypatch.setattr(minatar, name, never)
    r = minatar.run(2, False, log=lambda *a, **k: None, solve_only=True,
                    games={"MinAtar/Seaquest-v1": 16.0, "MinAtar/Freeway-v1": 47.0})
    assert calls == [("MinAtar/Seaquest-v1", 16.0)] * 2 + [("MinAtar/Freeway-v1", 47.0)] * 2
    assert [t["name"] for t in r["targets"]] == [
        "MinAtar/Seaquest-v1: seeds reaching 16 within 600 s",
        "MinAtar/Freeway-v1: seeds reaching 47 within 600 s"]
    assert all(t["ok"] and t["value"] == 2 for t in r["targets"])
    assert r["games"]["MinAtar/Freeway-v1"]["solve"]["runs"][0]["frames_per_s"] == \
        pytest.approx(3_100_000 / 95.0, abs=0.1)
