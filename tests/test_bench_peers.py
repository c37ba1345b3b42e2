"""`make bench-peers`, the side-by-side with Stable-Baselines3's PPO, without its venv: the
requirement hash and stamp, the summary and its intervals, the tables, the run order, the PPO
worker against stand-ins for torch and SB3, and the Makefile target."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest


def test_peers_requirements_hash_ignores_order_and_follows_pins_and_python():
    from bench import peers

    base = peers.requirements_hash(["stable-baselines3==2.9.2", "torch==2.14.1"], "3.11.7")
    assert base == peers.requirements_hash([" torch==2.14.1", "stable-baselines3==2.9.2", ""],
                                           "3.11.7")
    assert base != peers.requirements_hash(["stable-baselines3==2.9.2", "torch==2.14.0"],
                                           "3.11.7")
    assert base != peers.requirements_hash(["stable-baselines3==2.9.2", "torch==2.14.1"],
                                           "3.12.1")
    assert len(base) == 64 and int(base, 16) >= 0


def test_peers_venv_is_current_only_when_built_to_the_end_for_these_pins(tmp_path):
    from bench import peers

    venv = tmp_path / "venv"
    reqs = ("stable-baselines3==2.9.2", "torch==2.14.1")
    assert not peers.venv_is_current(venv, reqs)  # missing
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert not peers.venv_is_current(venv, reqs)  # no stamp: the build did not finish
    stamp = {"requirements_sha256": peers.requirements_hash(reqs)}
    (venv / peers.STAMP).write_text(json.dumps(stamp))
    assert peers.venv_is_current(venv, reqs)
    assert not peers.venv_is_current(venv, ("stable-baselines3==2.9.2", "torch==2.15.0"))
    (venv / peers.STAMP).write_text("{not json")
    assert not peers.venv_is_current(venv, reqs)
    assert peers.dir_size_mb(venv) >= 0


def _peers_results() -> dict:
    from bench import peers

    ppo = {"solved": True, "seconds_to_target": 16.04, "env_steps_to_target": 64_000}
    two = {"solved": True, "seconds_to_target": 30.5, "env_steps_to_target": 66_000}
    imp = {"solved": True, "seconds_to_target": 21.5, "env_steps_to_target": 1_234_567}
    runs = [{"seed": 4711, "ppo_zoo": ppo, "ppo_two_cores": two, "impala_lab": imp},
            {"seed": 815, "ppo_zoo": {**ppo, "seconds_to_target": 20.0, "env_steps_to_target":
                                      68_000},
             "ppo_two_cores": {**two, "seconds_to_target": 29.5},
             "impala_lab": {"solved": False, "seconds_to_target": None,
                            "env_steps_to_target": None}},
            {"seed": 3, "ppo_zoo": None,  # the PPO worker failed on this seed
             "ppo_two_cores": {**two, "seconds_to_target": 30.8},
             "impala_lab": {**imp, "seconds_to_target": 12.0, "env_steps_to_target": 700_000}}]
    results = {"runs": runs, "max_seconds": 120.0, "stop_return": 475.0,
               "machine": {"nproc": 2}, "loadavg": {"start": [1.5, 1, 1], "end": [2.5, 2, 1]},
               "ppo_versions": {"stable-baselines3": "2.9.2", "torch": "2.14.1"}}
    results["summary"] = peers.summarize(runs, seed=0)
    return results


def test_peers_summary_counts_an_unreached_seed_as_infinitely_slow():
    s = _peers_results()["summary"]
    # PPO zoo: 16.04, 20.0 and a failed run (inf): median 20.0; impala_lab: 21.5, inf, 12.0.
    assert {k: s["ppo_zoo"][k] for k in ("n", "num_solved", "median_s", "worst_s",
                                         "median_env_steps")} == {
        "n": 3, "num_solved": 2, "median_s": 20.0, "worst_s": None, "median_env_steps": 68_000}
    assert s["impala_lab"]["median_s"] == 21.5 and s["impala_lab"]["num_solved"] == 2
    assert s["ppo_two_cores"]["worst_s"] == 30.8 and s["ppo_two_cores"]["median_s"] == 30.5
    # the bootstrap median of {29.5, 30.5, 30.8} stays within them
    low, high = s["ppo_two_cores"]["median_s_ci95"]
    assert 29.5 <= low <= 30.5 <= high <= 30.8
    # a median over resamples that may hold two infs reaches inf at the top
    assert s["ppo_zoo"]["median_s_ci95"][1] == math.inf


def test_peers_median_interval_and_verdicts():
    from bench import peers

    assert peers.median_interval([5.0] * 7, seed=1) == (5.0, 5.0)
    low, high = peers.median_interval([1.0, 2.0, 3.0, 4.0, 100.0], seed=2)
    assert 1.0 <= low <= 3.0 <= high <= 100.0
    fast = {"n": 10, "median_s_ci95": [10.0, 12.0]}
    slow = {"n": 9, "median_s_ci95": [20.0, 25.0]}
    wide = {"n": 3, "median_s_ci95": [11.0, 30.0]}
    (c,) = peers.comparisons({"impala_lab": fast, "ppo_zoo": slow})
    assert c["verdict"] == "impala_lab faster" and (c["n_a"], c["n_b"]) == (10, 9)
    (c,) = peers.comparisons({"ppo_zoo": slow, "impala_lab": fast})
    assert c["verdict"] == "impala_lab faster"
    (c,) = peers.comparisons({"ppo_two_cores": wide, "impala_lab": fast})
    assert c["verdict"] == "inconclusive"


def test_peers_tables_show_each_seed_side_by_side_with_medians_and_intervals():
    from bench import peers

    results = _peers_results()
    table = peers.format_table(results).splitlines()
    assert table[0].split() == ["seed", "PPO", "zoo", "s", "PPO", "zoo", "env", "steps",
                                "PPO", "2", "cores", "s", "PPO", "2", "cores", "env", "steps",
                                "impala_lab", "s", "impala_lab", "env", "steps"]
    assert table[2].split() == ["4711", "16.0", "64,000", "30.5", "66,000", "21.5", "1,234,567"]
    assert table[3].split() == ["815", "20.0", "68,000", "29.5", "66,000", ">", "120", "(not",
                                "reached)", "n/a"]
    assert table[4].split() == ["3", "error", "error", "30.8", "66,000", "12.0", "700,000"]
    assert table[5].split() == ["median", "(3", "seeds)", "20.0", "68,000", "30.5", "66,000",
                                "21.5", "1,234,567"]
    text = "\n".join(table)
    assert "PPO zoo: n=3, solved 2/3, median 20.0 s [" in text
    assert "worst not reached" in text
    assert "PPO 2 cores (n=3) vs impala_lab (n=3): inconclusive" in text
    md = peers.format_markdown(results)
    assert md.startswith("| seed | PPO zoo s | PPO zoo env steps | PPO 2 cores s | "
                         "PPO 2 cores env steps | impala_lab s | impala_lab env steps |\n")
    assert "| 815 | 20.0 | 68,000 | 29.5 | 66,000 | > 120 (not reached) | n/a |" in md
    assert "PPO zoo: RL Zoo's way: DummyVecEnv, one torch thread" in md
    assert "PPO 2 cores: both cores: SubprocVecEnv" in md


def test_peers_runs_every_variant_on_the_same_seed_in_rotating_order():
    from bench import peers

    systems = ("ppo_zoo", "ppo_two_cores", "impala_lab")
    assert [peers.run_order(systems, i) for i in range(4)] == [
        systems, ("ppo_two_cores", "impala_lab", "ppo_zoo"),
        ("impala_lab", "ppo_zoo", "ppo_two_cores"), systems]
    argv = peers.ppo_command(42, 90.0, "ppo_two_cores", Path("/v"))
    assert argv == ["/v/bin/python", "-m", "bench.peers", "--ppo-worker", "42",
                    "--ppo-variant", "ppo_two_cores", "--max-seconds", "90.0"]
    with pytest.raises(ValueError, match="unknown PPO variant 'ppo_fast': choose one of "
                                         "ppo_zoo, ppo_two_cores"):
        peers.ppo_command(1, 1.0, "ppo_fast")


@pytest.mark.parametrize("variant, vec_env, threads", [
    ("ppo_zoo", "DummyVecEnv", 1), ("ppo_two_cores", "SubprocVecEnv", 7)])
def test_the_ppo_worker_steps_its_envs_and_sets_torch_threads_as_its_variant_says(
        monkeypatch, variant, vec_env, threads):
    """The worker against stand-ins for torch and SB3 (the peers venv is not built here):
    which VecEnv class it asks for, and whether it caps torch's threads."""
    import importlib.metadata
    import types

    from bench import peers

    calls: dict = {}
    torch = types.SimpleNamespace(_threads=7)
    torch.set_num_threads = lambda n: setattr(torch, "_threads", n)
    torch.get_num_threads = lambda: torch._threads
    vec = types.ModuleType("stable_baselines3.common.vec_env")
    vec.DummyVecEnv = type("DummyVecEnv", (), {})
    vec.SubprocVecEnv = type("SubprocVecEnv", (), {})

    def make_vec_env(env_id, n_envs, seed, vec_env_cls):
        calls.update(env_id=env_id, n_envs=n_envs, seed=seed, vec_env_cls=vec_env_cls)
        return types.SimpleNamespace(close=lambda: None)

    class PPO:
        def __init__(self, policy, env, **kw):
            calls["ppo"] = kw
            self.num_timesteps = 0

        def learn(self, total_timesteps, callback):
            calls["total_timesteps"] = total_timesteps

    sb3 = types.ModuleType("stable_baselines3")
    sb3.PPO = PPO
    callbacks = types.ModuleType("stable_baselines3.common.callbacks")
    callbacks.BaseCallback = object
    env_util = types.ModuleType("stable_baselines3.common.env_util")
    env_util.make_vec_env = make_vec_env
    for name, module in {"torch": torch, "stable_baselines3": sb3,
                         "stable_baselines3.common": types.ModuleType("x"),
                         "stable_baselines3.common.callbacks": callbacks,
                         "stable_baselines3.common.env_util": env_util,
                         "stable_baselines3.common.vec_env": vec}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0")
    out = peers.ppo_worker(5, 60.0, variant=variant)
    assert calls["vec_env_cls"].__name__ == vec_env and out["vec_env"] == vec_env
    assert out["torch_threads"] == threads and out["variant"] == variant
    assert calls["n_envs"] == 8 and calls["seed"] == 5  # RL Zoo's settings both ways
    assert calls["ppo"]["n_steps"] == 32 and calls["ppo"]["n_epochs"] == 20


def test_make_bench_peers_runs_bench_peers_and_is_not_part_of_make_test(tmp_path):
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def dry(target: str) -> str:
        return subprocess.run(["make", "--no-print-directory", "-C", str(root), "-n",
                               f"VENV={tmp_path}/venv", target],
                              capture_output=True, text=True, check=True).stdout

    assert f"{tmp_path}/venv/bin/python -m bench.peers" in dry("bench-peers")
    assert "bench.peers" not in dry("test") and "bench.peers" not in dry("bench")
    assert "bench/.peers-venv/" in (root / ".gitignore").read_text().splitlines()



def test_peers_venv_extra_installs_once_and_is_recorded_in_the_stamp(tmp_path):
    from bench import peers

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    python = venv / "bin" / "python"  # stands in for the venv's pip: records its arguments
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    python.chmod(0o755)
    (venv / peers.STAMP).write_text(json.dumps({"requirements_sha256": "x"}))
    reqs = peers.ensure_extra(venv, "mujoco", log=lambda *a, **k: None)
    assert reqs == list(peers.EXTRAS["mujoco"]) and reqs[0].startswith("mujoco==")
    assert calls.read_text().split("\n")[0].endswith(" ".join(reqs))
    assert json.loads((venv / peers.STAMP).read_text())["extras"] == {"mujoco": reqs}
    peers.ensure_extra(venv, "mujoco", log=lambda *a, **k: None)  # recorded: no second install
    assert len(calls.read_text().splitlines()) == 1


def test_a_peers_worker_gives_its_last_json_line_or_its_stderr():
    from bench import peers

    ok = peers.run_worker([sys.executable, "-c", "print('log'); print('{\"seed\": 5}')"], 60,
                          "seed 5")
    assert ok["seed"] == 5 and ok["wall_s"] >= 0
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"PPO worker \(Hopper-v5, seed 9\) exited with "
                                           r"3:\nboom"):
        peers.run_worker(failing, 60, "Hopper-v5, seed 9")
