"""bench.continuous, bench.peers_pendulum and bench.peers_mujoco: their tables from made-up
runs (no training)."""

from __future__ import annotations

import json
import math

import pytest

from bench import continuous, peers_mujoco, peers_pendulum, seed_summary, solves


def test_the_continuous_bench_table_names_seeds_rate_and_interval():
    runs = [{"seed": s, "reached": ok, "solved": ok, "wall_s": 60.0, "seconds_to_target": t,
             "env_steps_to_target": e, "return_min_after_target": low,
             "seconds_after_target": 60.0 if ok else None}
            for s, ok, t, e, low in [(11, True, 40.0, 3_000_000, -230.0),
                                     (12, True, 55.0, 4_000_000, -420.0),
                                     (13, False, None, None, None)]]
    summary = solves.summarize_solves(runs, 300.0, solve_limit_s=300.0, after_s=60.0,
                                      stay_floor=continuous.ENVS["Pendulum-v1"][2])
    summary["solve_rate_ci95"] = [round(x, 3) for x in seed_summary.wilson_interval(2, 3)]
    summary.update(env="Pendulum-v1", target=-250.0)
    row = continuous.markdown([summary]).splitlines()[-1]
    assert row.startswith("| Pendulum-v1 | 11, 12, 13 | -250 within 300 s: 2/3 [0.21, 0.94] |")
    # a seed that never reached the target makes the median and the worst "never"
    assert "| 55.0 s | never | 4.00M | never | -400 for 60 s: 1/2 (lowest -420.0) |" in row


def test_the_continuous_bench_refuses_an_env_without_a_target(capsys):
    with pytest.raises(SystemExit):
        continuous.main(["--envs", "mujoco,Walker2d-v5"])
    err = capsys.readouterr().err
    assert "--envs: Walker2d-v5 has no target here" in err and "HalfCheetah-v5" in err


def _pair(seed, ppo_s, ppo_steps, impala_s, impala_steps):
    def run(s, steps):
        return {"seed": seed, "solved": s is not None, "seconds_to_target": s,
                "env_steps_to_target": steps, "wall_s": 1.0}
    return {"seed": seed, "ppo_zoo": run(ppo_s, ppo_steps),
            "impala_lab": run(impala_s, impala_steps)}


def test_the_pendulum_peers_summary_gives_per_seed_ratios_of_seconds_and_steps():
    runs = [_pair(1, 100.0, 90_000, 50.0, 3_000_000), _pair(2, 120.0, 100_000, 40.0, 2_000_000),
            _pair(3, None, None, 60.0, 4_000_000)]
    s = peers_pendulum.summarize(runs)
    assert s["ppo_zoo"]["num_solved"] == 2 and s["impala_lab"]["num_solved"] == 3
    assert s["ppo_zoo"]["worst_s"] is None  # a seed that never got there: infinitely slow
    assert s["seconds_ratio"]["n"] == 2
    assert s["seconds_ratio"]["median"] == (100 / 50 + 120 / 40) / 2
    assert math.isclose(s["env_steps_ratio"]["median"], (0.03 + 0.05) / 2)
    text = peers_pendulum.markdown({"summary": s, "seeds": [1, 2, 3], "max_seconds": 300.0})
    assert "| SB3 PPO, RL Zoo's Pendulum-v1 settings | 2/3 | 120.0 [100.0, never] | never |" \
        in text
    assert "| impala_lab, tuned preset | 3/3 | 50.0 [40.0, 60.0] | 60.0 | 3,000,000 |" in text
    assert "PPO / impala_lab in seconds: median 2.50x" in text
    assert "Median seconds, by their 95% intervals: impala_lab faster (n = 3 and 3)." in text
    assert "Seeds (drawn at random): 1, 2, 3; cap 300 s per run." in text


def _budget_run(returns, steps, seconds_to_target=None, budget=400.0):
    marks = peers_mujoco.checkpoint_times(budget)
    return {"checkpoints": [{"s": m, "return_mean": r, "episodes": 100, "env_steps": e}
                            for m, r, e in zip(marks, returns, steps)],
            "reached": seconds_to_target is not None, "seconds_to_target": seconds_to_target}


def test_the_mujoco_peers_summary_compares_returns_at_the_budget():
    assert peers_mujoco.checkpoint_times(400.0) == [100.0, 200.0, 300.0, 400.0]
    steps = [1, 2, 3, 4]
    runs = [{"seed": 7, "ppo_zoo": _budget_run([100, 300, 500, 700], steps),
             "impala_lab": _budget_run([900, 1600, 1800, 2000], steps, 150.0)},
            {"seed": 8, "ppo_zoo": _budget_run([None, 200, 400, 600], steps),
             "impala_lab": _budget_run([800, 1400, 1700, 1900], steps, 220.0)},
            {"seed": 9, "ppo_zoo": _budget_run([150, 350, 550, 800], steps),
             "impala_lab": _budget_run([700, 1300, 1600, 1700], steps, 250.0)}]
    s = peers_mujoco.summarize(runs)
    ppo, impala = s["ppo_zoo"], s["impala_lab"]
    assert (ppo["n"], ppo["num_reached"], impala["num_reached"]) == (3, 0, 3)
    assert (ppo["median_return"], ppo["worst_return"]) == (700, 600)
    assert ppo["median_return_at"]["100.0"] == 100  # no episode yet counts as -inf
    assert impala["median_seconds_to_target"] == 220.0
    assert s["verdict"] == "impala_lab, tuned preset higher"
    text = peers_mujoco.markdown({"budget": 400.0, "summaries": {"HalfCheetah-v5": s},
                                  "seeds": {"HalfCheetah-v5": [7, 8, 9]}})
    assert ("| HalfCheetah-v5 | impala_lab, tuned preset | 1900 [1700, 2000] | 1700 | 800 | "
            "1400 | 1700 | 0.00M | 1500: 3/3 (220 s) |") in text
    assert "| HalfCheetah-v5 | SB3 PPO, RL Zoo's settings | 700 [600, 800] | 600 |" in text
    assert ("HalfCheetah-v5: return at 400 s, by the 95% intervals of the medians: impala_lab, "
            "tuned preset higher (n = 3 and 3); seeds (drawn at random): 7, 8, 9.") in text


def test_the_mujoco_peers_verdict_is_inconclusive_when_the_intervals_overlap():
    runs = [{"seed": i, "ppo_zoo": _budget_run([0, 0, 0, r], [1] * 4),
             "impala_lab": _budget_run([0, 0, 0, r + 10], [1] * 4)}
            for i, r in enumerate([1000, 1500, 2000])]
    assert peers_mujoco.summarize(runs)["verdict"] == "inconclusive"
    assert peers_mujoco.summarize(runs[:2])["verdict"] == \
        "not compared (fewer than 3 seeds a side)"


def test_the_mujoco_peers_bench_refuses_an_unknown_env_and_a_bad_budget(capsys):
    with pytest.raises(SystemExit):
        peers_mujoco.main(["--envs", "Walker2d-v5"])
    assert "--envs='Walker2d-v5': choose from HalfCheetah-v5, Hopper-v5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peers_mujoco.main(["--budget", "0"])
    assert "--budget=0: give a positive number of seconds" in capsys.readouterr().err


def test_the_mujoco_peers_targets_are_the_continuous_bench_targets():
    assert {e: continuous.ENVS[e][0] for e in peers_mujoco.TARGETS} == peers_mujoco.TARGETS


def test_the_mujoco_peers_results_are_named_by_envs_and_budget():
    assert peers_mujoco.results_name(["HalfCheetah-v5", "Hopper-v5"], 300.0) == \
        "peers_mujoco_halfcheetah_hopper_300s"
    assert peers_mujoco.results_name(["Hopper-v5"], 1200.0) == "peers_mujoco_hopper_1200s"


def test_each_seeds_fall_from_its_own_best_is_reported():
    runs = [{"seed": 7, "ppo_zoo": {**_budget_run([1, 2, 3, 800], [1] * 4),
                                    "best_return_mean": 1000.0},
             "impala_lab": {**_budget_run([1, 2, 3, 2000], [1] * 4), "best_return_mean": 2000.0}},
            {"seed": 8, "ppo_zoo": _budget_run([1, 2, 3, 700], [1] * 4),
             "impala_lab": {**_budget_run([1, 2, 3, 1500], [1] * 4), "best_return_mean": 3000.0}}]
    s = peers_mujoco.summarize(runs)
    assert s["ppo_zoo"]["falls_from_best"] == [0.2, None]  # no full window: not measured
    assert s["impala_lab"]["falls_from_best"] == [0.0, 0.5]
    text = peers_mujoco.markdown({"budget": 400.0, "summaries": {"Hopper-v5": s},
                                  "seeds": {"Hopper-v5": [7, 8]}})
    assert ("impala_lab, tuned preset: each seed's fall from its own best trailing mean at "
            "400 s: 0%, 50%.") in text
    assert "SB3 PPO, RL Zoo's settings: each seed's fall from its own best trailing mean at " \
           "400 s: 20%, n/a." in text


def test_the_best_trailing_mean_counts_only_full_windows(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("episode_return_mean,episode_return_count\n5000,12\n900,100\n1200,100\n"
                    "1100,100\n")
    assert peers_mujoco.best_full_window(path) == 1200.0
    assert peers_mujoco.best_full_window(tmp_path / "missing.csv") is None


def test_the_mujoco_bench_runs_in_pieces_and_resumes_the_missing_seeds(tmp_path, monkeypatch):
    from bench import peers

    calls = []

    def fake(system):
        def run(env_id, seed, budget):
            calls.append((system, seed))
            return {**_budget_run([1, 2, 3, 4], [1] * 4, budget=budget),
                    "best_return_mean": 4.0}
        return run

    monkeypatch.setattr(peers, "ensure_venv", lambda: {"path": "fake"})
    monkeypatch.setattr(peers, "ensure_extra", lambda venv, name: [])
    monkeypatch.setattr(peers_mujoco, "run_ppo", fake("ppo_zoo"))
    monkeypatch.setattr(peers_mujoco, "run_impala", fake("impala_lab"))
    args = ["--envs", "Hopper-v5", "--budget", "400", "--seeds", "3", "--out", str(tmp_path)]
    assert peers_mujoco.main([*args, "--max-pairs", "2"]) == 0
    saved = json.loads((tmp_path / "peers_mujoco_hopper_400s.json").read_text())
    seeds = saved["seeds"]["Hopper-v5"]
    assert [r["seed"] for r in saved["runs"]["Hopper-v5"]] == seeds[:2]
    assert peers_mujoco.main([*args, "--resume"]) == 0
    saved = json.loads((tmp_path / "peers_mujoco_hopper_400s.json").read_text())
    assert saved["seeds"]["Hopper-v5"] == seeds
    assert [r["seed"] for r in saved["runs"]["Hopper-v5"]] == seeds
    assert sorted(calls) == sorted((s, seed) for seed in seeds for s in ("ppo_zoo", "impala_lab"))
    assert saved["summaries"]["Hopper-v5"]["impala_lab"]["n"] == 3
