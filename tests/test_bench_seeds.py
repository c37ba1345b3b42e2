"""bench.seeds, bench.seed_summary and impala_lab.classroom.seed_stats: the interquartile mean and
its bootstrap interval on known data, curve areas by hand, verdicts, and the runner on a fake run
command (no TensorFlow)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import seed_runs, seed_summary, seeds
from impala_lab.classroom import seed_stats

FAKE = Path(__file__).parent / "data" / "fake_seed_run.py"
REPO = Path(__file__).resolve().parents[1]


def test_iqm_cuts_a_quarter_from_each_end():
    # n = 10: floor(10 / 4) = 2 cut from each end, the mean of the middle 6
    values = [100, 1, 2, 3, 4, 5, 6, 7, 8, -50]
    assert seed_stats.iqm(values) == pytest.approx((2 + 3 + 4 + 5 + 6 + 7) / 6)
    assert seed_stats.iqm([1, 2, 3]) == 2.0  # n = 3 cuts nothing
    assert math.isnan(seed_stats.iqm([]))
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (4, 5, 7, 10, 13, 20):
        x = rng.normal(size=n)
        assert seed_stats.iqm(x) == pytest.approx(scipy_stats.trim_mean(x, 0.25))


@pytest.mark.parametrize("k, n, want", [(5, 5, (0.5655, 1.0)), (0, 5, (0.0, 0.4345)),
                                         (3, 6, (0.1876, 0.8124)), (26, 26, (0.8713, 1.0))])
def test_the_wilson_interval_matches_the_formula_by_hand(k, n, want):
    low, high = seed_summary.wilson_interval(k, n)
    assert (low, high) == pytest.approx(want, abs=1e-4)
    assert seed_summary.wilson_interval(0, 0) == (0.0, 1.0)


def test_the_bootstrap_interval_of_two_values_spans_them():
    # resamples of {0, 1}: means 0, 0.5, 1 with chances 1/4, 1/2, 1/4: the 2.5th and 97.5th
    # percentiles are 0 and 1
    low, high = seed_stats.bootstrap_interval([0.0, 1.0], np.random.default_rng(1))
    assert (low, high) == (0.0, 1.0)
    assert seed_stats.bootstrap_interval([7.0] * 6, np.random.default_rng(1)) == (7.0, 7.0)


def test_the_bootstrap_interval_agrees_with_scipys():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(3).exponential(10.0, size=12)
    low, high = seed_stats.bootstrap_interval(x, np.random.default_rng(4), num_resamples=20000)
    ref = scipy_stats.bootstrap((x,), lambda s, axis: scipy_stats.trim_mean(s, 0.25, axis=axis),
                                n_resamples=20000, method="percentile",
                                rng=np.random.default_rng(5)).confidence_interval
    width = high - low
    assert low == pytest.approx(ref.low, abs=0.05 * width)
    assert high == pytest.approx(ref.high, abs=0.05 * width)
    assert low < seed_stats.iqm(x) < high


def test_a_paired_difference_knows_the_runs_belong_together():
    a = np.random.default_rng(6).normal(100.0, 30.0, size=10)
    b = a + 5.0
    diff, low, high = seed_stats.difference_interval(b, a, np.random.default_rng(7), paired=True)
    assert diff == pytest.approx(5.0) and low == pytest.approx(5.0) and high == pytest.approx(5.0)
    _, low_u, high_u = seed_stats.difference_interval(b, a, np.random.default_rng(7))
    assert low_u < 0 < high_u  # unpaired, the spread between runs hides the 5
    assert seed_summary.verdict(low, high, ("b", "a")) == "b better"
    assert seed_summary.verdict(-high, -low, ("b", "a")) == "a better"
    assert seed_summary.verdict(low_u, high_u) == "inconclusive"
    with pytest.raises(ValueError, match="one value per run on both sides, got 10 and 9"):
        seed_stats.difference_interval(a, b[:9], np.random.default_rng(0), paired=True)


def test_the_area_holds_each_report_until_the_next_and_the_last_until_the_budget():
    # 10 over [0, 3), 20 over [3, 4]: (30 + 20) / 4
    assert seed_summary.area_under_curve([1, 3], [10, 20], 4.0) == pytest.approx(12.5)
    # NaN reports are skipped; reports past the budget do not count
    assert seed_summary.area_under_curve([1, 2, 3, 9], [math.nan, 10, 20, 99], 4.0) == \
        pytest.approx((10 * 3 + 20 * 1) / 4)
    assert math.isnan(seed_summary.area_under_curve([1], [math.nan], 4.0))


def test_commands_get_their_seed_and_out(tmp_path):
    argv = seed_runs.command_for("train --env CartPole-v1 --lr 0.01", 5, tmp_path)
    assert argv[1:] == ["-m", "impala_lab.cli.main", "train", "--env", "CartPole-v1", "--lr",
                        "0.01", "--seed", "5", "--out", str(tmp_path), "--quiet"]
    assert seed_runs.command_for("impala-lab train", 2, tmp_path)[3:4] == ["train"]
    assert seed_runs.command_for("run.py --s {seed} --o {out}", 9, tmp_path) == [
        "run.py", "--s", "9", "--o", str(tmp_path)]
    with pytest.raises(SystemExit):
        seed_runs.command_for("run.py --seed 3", 9, tmp_path)
    plan = seed_runs.plan_runs({"a": "x {seed} {out}", "b": "y {seed} {out}"}, [1, 2, 3], tmp_path)
    assert [(r.setting, r.seed) for r in plan] == [("a", 1), ("b", 1), ("b", 2), ("a", 2),
                                                   ("a", 3), ("b", 3)]


def test_the_runner_reports_n_intervals_and_verdicts_of_fake_runs(tmp_path, capsys):
    fake = f"{sys.executable} {FAKE} --seed {{seed}} --out {{out}}"
    report = seeds.main([
        "--setting", f"low={fake} --level 100 --fail-seed 17",
        "--setting", f"high={fake} --level 300", "--seeds", "10,11,12,13,14,15,16,17",
        "--jobs", "2", "--metric", "episode_return_mean",
        "--metric", "evaluation.episode_return_mean_greedy", "--solve-return", "250",
        "--budget", "10", "--out", str(tmp_path), "--bootstrap-seed", "0",
        "--compare-metrics"])
    printed = capsys.readouterr().out
    assert "seeds given: 10, 11, 12, 13, 14, 15, 16, 17" in printed
    assert "low seed 17" in printed and "FAILED: exit code 3" in printed
    low = report["analysis"]["settings"]["low"]["episode_return_mean"]
    high = report["analysis"]["settings"]["high"]["episode_return_mean"]
    assert low["failed"] == 1 and low["final"]["n"] == 8 and low["final"]["n_finite"] == 7
    assert high["final"]["n"] == 8 and high["final"]["solved"] == 8
    assert low["final"]["solved"] == 0
    # finals are level + seed % 10: seeds 10..16 give 100..106 (17 failed)
    assert low["final"]["iqm"] == pytest.approx(seed_stats.iqm([100, 101, 102, 103, 104,
                                                                105, 106]))
    assert low["final"]["worst"] == 100.0 and high["final"]["worst"] == 300.0
    # the AUC by hand for seed 10, level 100: (10*t/10) held from report t; the first
    # finite value (t=2, 20) also over [0, 2)
    seed10 = low["runs"][0]
    assert seed10["seed"] == 10
    assert seed10["auc"] == pytest.approx((20 * 3 + sum(10 * t for t in range(3, 10))) / 10)
    verdicts = {(c["metric"], c["figure"]): c for c in report["analysis"]["between_settings"]}
    final = verdicts[("episode_return_mean", "final")]
    assert final["verdict"] == "high better" and (final["n_a"], final["n_b"]) == (7, 8)
    paired = next(c for c in report["analysis"]["between_metrics"]
                  if c["setting"] == "high" and c["figure"] == "final")
    assert paired["verdict"] == "evaluation.episode_return_mean_greedy better"
    assert paired["ci95"] == pytest.approx([5.0, 5.0])
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert saved["seeds"] == [10, 11, 12, 13, 14, 15, 16, 17]
    md = (tmp_path / "seeds.md").read_text()
    assert "| low | 8 | 1 | 0/8 |" in md and "high better" in md
    assert (tmp_path / "seeds.png").stat().st_size > 1000


def test_drawn_seeds_are_printed_and_bad_arguments_refused(tmp_path, capsys):
    fake = f"{sys.executable} {FAKE} --seed {{seed}} --out {{out}}"
    report = seeds.main(["--setting", f"one={fake}", "--n", "3", "--jobs", "2",
                         "--out", str(tmp_path), "--metric", "episode_return_mean",
                         "--metric", "evaluation.episode_return_mean_greedy"])
    assert report["analysis"]["between_metrics"] == []  # not asked for
    printed = capsys.readouterr().out
    drawn = report["seeds"]
    assert len(drawn) == 3 and report["seeds_drawn"] == "at random"
    assert f"seeds drawn at random: {', '.join(map(str, drawn))}" in printed
    for bad, words in ((["--setting", "noequals"], "write NAME=COMMAND"),
                       (["--setting", "a=x", "--n", "0"], "--n 0 is invalid"),
                       (["--setting", "a=x", "--jobs", "0"], "--jobs 0 is invalid"),
                       (["--setting", "a=x", "--seeds", "1,x"], "--seeds '1,x' is invalid"),
                       (["--setting", "a=x", "--seeds", "-3"], "--seeds '-3' is invalid"),
                       (["--setting", "a=x", "--timeout", "-1"], "--timeout -1 is invalid"),
                       (["--setting", "a=x", "--timeout", "nan"], "--timeout nan is invalid"),
                       ([], "give at least one --setting")):
        with pytest.raises(SystemExit) as info:
            seeds.parse_args(bad)
        err = capsys.readouterr().err
        assert info.value.code == 2 and words in err and err.count("\n") == 1, err


def test_the_evaluation_cost_is_the_ratio_of_neighbouring_windows():
    from bench import evaluation_cost

    pairs = [{"on": {"env_steps_per_s": on, "driver_step_ms": 10.0},
              "off": {"env_steps_per_s": off, "driver_step_ms": 10.0}}
             for on, off in ((90.0, 100.0), (45.0, 50.0), (180.0, 200.0), (9.0, 10.0))]
    s = evaluation_cost.summary({"pairs": pairs}, np.random.default_rng(0))
    steps = s["env_steps_per_s"]
    # the load moved the rates 20-fold, but each pair's ratio is 0.9
    assert steps["n"] == 4 and steps["median_ratio"] == pytest.approx(0.9)
    assert steps["ci95"] == pytest.approx([0.9, 0.9])
    assert steps["verdict"] == "evaluation on is lower"
    assert s["driver_step_ms"]["verdict"] == "inconclusive"  # ratios of exactly 1


def test_a_metric_that_is_no_column_exits_2_naming_it(tmp_path, capsys):
    fake = f"{sys.executable} {FAKE} --seed {{seed}} --out {{out}}"
    with pytest.raises(SystemExit) as info:
        seeds.main(["--setting", f"one={fake}", "--seeds", "1,2", "--jobs", "1",
                    "--metric", "episode_return_meen", "--out", str(tmp_path)])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bench.seeds: error: --metric or --x 'episode_return_meen' is not a column of "
        f"{tmp_path / 'one' / 'seed_1' / 'metrics.csv'}; did you mean 'episode_return_mean', "
        "'evaluation.episode_return_mean_greedy'?")


def run_seeds(*argv: str, **popen) -> subprocess.Popen:
    """``python -m bench.seeds`` whose train settings run `tests.fake_run` (no TensorFlow)."""
    code = ("import sys; import bench.seed_runs as r; r.TRAIN_MODULE = 'tests.fake_run'; "
            "import bench.seeds as s; sys.exit(s.exit_code(s.main(sys.argv[1:])))")
    return subprocess.Popen([sys.executable, "-c", code, *argv], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, **popen)


def test_failed_runs_make_the_command_exit_1(tmp_path):
    fake = f"{sys.executable} {FAKE} --seed {{seed}} --out {{out}} --fail-seed 17"
    proc = run_seeds("--setting", f"one={fake}", "--seeds", "16,17", "--out", str(tmp_path),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "1 of 2 runs FAILED" in stderr and "| one | 2 | 1 |" in stdout


def test_a_rerun_resumes_a_killed_train_run_and_replaces_the_others(tmp_path, monkeypatch,
                                                                     capsys):
    from tests import fake_run

    monkeypatch.setattr(seed_runs, "TRAIN_MODULE", "tests.fake_run")
    setting = "train --max-env-steps 3000 --report-interval 0.01"
    argv = ["--setting", f"a={setting}", "--seeds", "1,2", "--jobs", "1", "--out",
            str(tmp_path)]
    assert seeds.main(argv)["failed_runs"] == 0
    # Seed 1 was killed at its first checkpoint: an earlier checkpoint, result.json running.
    killed = tmp_path / "a" / "seed_1"
    early = tmp_path / "early"
    assert fake_run.main(["train", "--max-env-steps", "1000", "--report-interval", "0.01",
                          "--seed", "1", "--out", str(early), "--quiet"]) == 0
    shutil.rmtree(killed / "checkpoint")
    shutil.copytree(early / "checkpoint", killed / "checkpoint")
    result = json.loads((killed / "result.json").read_text())
    (killed / "result.json").write_text(json.dumps({**result, "stop_reason": "running"}))
    capsys.readouterr()
    report = seeds.main(argv)
    printed = capsys.readouterr().out
    assert f"a seed 1: an earlier run in {killed} was resumed" in printed
    assert f"a seed 2: an earlier run in {tmp_path / 'a' / 'seed_2'} was restarted" in printed
    assert report["failed_runs"] == 0
    for seed in (1, 2):  # one run each, its steps never going back
        rows = (tmp_path / "a" / f"seed_{seed}" / "metrics.csv").read_text().splitlines()[1:]
        assert [int(r.split(",")[1]) for r in rows] == [1000, 2000, 3000, 3000]


def test_sigterm_to_bench_seeds_ends_its_runs_cleanly(tmp_path):
    proc = run_seeds("--setting", "a=train --max-seconds 300 --report-interval 0.05",
                     "--seeds", "5", "--out", str(tmp_path), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    run = tmp_path / "a" / "seed_5"
    try:
        deadline = time.monotonic() + 60
        while not (run / "metrics.csv").is_file():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        child = int((run / ".lock").read_text())
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr
    assert "ended by signal 15: the runs in flight were ended" in stderr
    assert json.loads((run / "result.json").read_text())["stop_reason"] == "interrupted"
    with pytest.raises(ProcessLookupError):  # the run is gone, not orphaned
        os.kill(child, 0)
