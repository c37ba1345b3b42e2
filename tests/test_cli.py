"""The impala-lab command: a short run writes every output; bad input exits 2 with a message;
the last line says whether the target was reached; --train-after-target trains on after it."""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from impala_lab.cli.main import main
from impala_lab.cli.train import final_line
from impala_lab.config import ImpalaConfig

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "impala_lab.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_a_cartpole_gif(path: Path) -> None:
    """A looping GIF of CartPole frames (320 px wide), at least a reset and one step: white
    with a dark cart in every frame, and the pole moves."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as gif:
        assert gif.format == "GIF" and gif.size == (320, 213) and gif.info.get("loop") == 0
        assert 2 <= gif.n_frames <= 300
        frames = []
        for k in (0, gif.n_frames - 1):
            gif.seek(k)
            frames.append(np.asarray(gif.convert("RGB"), dtype=np.int32))
    for frame in frames:
        dark = (frame.sum(axis=2) < 100).mean()
        assert (frame == 255).all(axis=2).mean() > 0.8 and 0.002 < dark < 0.1
    assert np.abs(frames[0] - frames[1]).sum() > 0


def test_write_gif_keeps_the_episodes_colours_and_scales_wide_frames(tmp_path):
    import numpy as np
    from PIL import Image

    from impala_lab.cli.play import write_gif

    # 40 frames of 640x20: a black square moving over a background whose colour changes every
    # 10 frames; five colours in all, so the shared palette holds each of them exactly
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (250, 250, 250)]
    frames = []
    for k in range(40):
        frame = np.empty((20, 640, 3), np.uint8)
        frame[:] = colours[k // 10]
        frame[:, 10 * k:10 * k + 10] = 0
        frames.append(frame)
    write_gif(frames, tmp_path / "a.gif", fps=10)
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.size == (320, 10) and gif.n_frames == 40 and gif.info["duration"] == 100
        for k in range(gif.n_frames):
            gif.seek(k)
            image = np.asarray(gif.convert("RGB"))
            assert tuple(image[5, 300]) == colours[k // 10], k
            assert (image[:, 5 * k:5 * k + 5] == 0).all(), k
    with pytest.raises(ValueError, match="no frames to write"):
        write_gif([], tmp_path / "b.gif")


def test_a_short_run_writes_config_metrics_result_report_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--backend", "inline", "--num-envs-per-worker", "4",
                   "--max-env-steps", "6000", "--report-interval", "0.2", "--seed", "3",
                   "--stop-return", "10000", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["backend"] == "inline" and config["num_envs_per_worker"] == 4
    assert config["seed"] == 3
    result = json.loads((out / "result.json").read_text())
    assert set(result) >= {"solved", "seconds_to_target", "env_steps_to_target", "final"}
    assert result["solved"] is False and result["stop_reason"] == "max_env_steps"
    assert result["final"]["num_steps_sampled"] >= 6000
    assert result["seconds_after_target"] is None and result["return_min_after_target"] is None
    # The health monitor's findings, in result.json and as two metrics.csv columns.
    health = result["health"]
    assert health == result["final"]["health"] and health["status"] in ("ok", "warning")
    assert set(health) == {"status", "flags", "seen", "num_updates_skipped"}
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and "episode_return_mean" in rows[0] and "sample_throughput" in rows[0]
    assert "timing_breakdown.learner_grad_time_ms" in rows[0]
    assert all(r["health.status"] in ("ok", "warning") for r in rows)
    assert rows[-1]["health.flags"] == ";".join(f["code"] for f in health["flags"])
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "checkpoint" / "state.json").is_file()
    # The agent itself: one episode of the final policy, CartPole drawn by pygame, as a GIF,
    # and not a word from pygame or SDL on the way.
    assert_a_cartpole_gif(out / "policy.gif")
    for noise in ("pygame", "XDG_RUNTIME_DIR", "policy.gif"):
        assert noise not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "steps" in proc.stdout
    # One clear last line: not reached, the best trailing mean, what the monitor saw, where.
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(
        r"impala-lab: did NOT reach mean return 10000 within 6,000 env steps \(best trailing "
        r"mean [\d.]+, last [\d.]+\); health monitor saw: .+; results in " + re.escape(f"{out}/"),
        last), last


def test_train_after_target_trains_on_and_reports_the_lowest_return_after_it(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--backend", "inline", "--num-workers", "1", "--stop-return", "15",
                   "--train-after-target", "2", "--max-seconds", "120", "--report-interval",
                   "0.2", "--seed", "1", "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["solved"] is True and result["stop_reason"] == "stop condition"
    assert result["train_after_target"] == 2.0
    assert 2.0 <= result["seconds_after_target"] < 60
    # The lowest mean return from the report that reached 15 to the end of training.
    with open(out / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["episode_return_count"] == "100"]
    # The target may be met between reports (train() checks it every 0.1 s): the rows
    # from there on are those with at least the env steps it was met at.
    after = [float(r["episode_return_mean"]) for r in rows
             if int(r["num_steps_sampled"]) >= result["env_steps_to_target"]]
    assert result["return_min_after_target"] == pytest.approx(min(after))
    assert result["best_return_mean"] >= result["return_min_after_target"]
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(
        r"impala-lab: reached mean return 15 in [\d.]+ s \([\d,]+ env steps\), then trained "
        r"[\d.]+ s more \(lowest mean return [\d.]+\)(; health monitor saw: .+)?; results in "
        + re.escape(f"{out}/"), last), last


def test_the_target_is_noted_when_met_not_at_the_next_report(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--backend", "inline", "--num-workers", "1", "--stop-return", "15",
                   "--max-seconds", "120", "--report-interval", "100", "--seed", "2",
                   "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["solved"] is True and result["stop_reason"] == "stop condition"
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    # No report came (100 s apart): the one row is the final stats, taken when train()
    # stopped, right after the check that met the target.
    assert len(rows) == 1
    assert int(rows[0]["num_steps_sampled"]) >= result["env_steps_to_target"]
    assert float(rows[0]["episode_return_mean"]) >= 15
    assert result["seconds_to_target"] < 100


def _args(**kw) -> argparse.Namespace:
    base = dict(stop_return=475.0, max_seconds=300.0, max_env_steps=None, train_after_target=0.0)
    return argparse.Namespace(**{**base, **kw})


def _result(**kw) -> dict:
    seen = {"value_loss_spike": {"first_s": 40.2, "last_s": 44.0, "times": 3, "message": "."},
            "entropy_collapsed": {"first_s": 41.4, "last_s": 299.0, "times": 1, "message": "."}}
    base = {"solved": False, "seconds_to_target": None, "env_steps_to_target": None,
            "seconds_after_target": None, "return_min_after_target": None,
            "best_return_mean": 382.06, "stop_reason": "max_seconds",
            "health": {"status": "warning", "flags": [], "seen": seen,
                       "num_updates_skipped": 0},
            "final": {"episode_return_mean": 9.31, "episode_return_count": 100,
                      "time_total_s": 300.4, "num_steps_sampled": 31_000_000}}
    return {**base, **kw}


def test_the_last_line_says_whether_the_target_was_reached_and_what_went_wrong():
    out = Path("runs/demo")
    healthy = {"status": "ok", "flags": [], "seen": {}, "num_updates_skipped": 0}
    assert final_line(_result(solved=True, seconds_to_target=14.21, env_steps_to_target=812_000,
                              stop_reason="stop condition", health=healthy), _args(), out) == (
        "impala-lab: reached mean return 475 in 14.2 s (812,000 env steps); results in "
        "runs/demo/")
    assert final_line(_result(), _args(), out) == (
        "impala-lab: did NOT reach mean return 475 within 300 s (best trailing mean 382.1, "
        "last 9.3); health monitor saw: value-loss spike at 40 s (3 times), entropy collapsed "
        "at 41 s; results in runs/demo/")
    assert final_line(_result(stop_reason="max_env_steps", health=healthy),
                      _args(max_env_steps=20_000), out) == (
        "impala-lab: did NOT reach mean return 475 within 20,000 env steps (best trailing mean "
        "382.1, last 9.3); health monitor saw: nothing wrong; results in runs/demo/")
    assert final_line(_result(stop_reason="interrupted", best_return_mean=None,
                              final={"episode_return_mean": 20.0, "episode_return_count": 7,
                                     "time_total_s": 3.14, "num_steps_sampled": 900}),
                      _args(), out, interrupted=True) == (
        "impala-lab: interrupted: did NOT reach mean return 475 before the interrupt at 3.1 s "
        "(7 episodes, too few for a mean); health monitor saw: value-loss spike at 40 s "
        "(3 times), entropy collapsed at 41 s; results in runs/demo/")
    assert final_line(_result(solved=True, seconds_to_target=20.0, env_steps_to_target=1_500_000,
                              seconds_after_target=60.04, return_min_after_target=412.5,
                              stop_reason="stop condition"),
                      _args(train_after_target=60.0), out) == (
        "impala-lab: reached mean return 475 in 20.0 s (1,500,000 env steps), then trained "
        "60.0 s more (lowest mean return 412.5); health monitor saw: value-loss spike at 40 s "
        "(3 times), entropy collapsed at 41 s; results in runs/demo/")
    assert final_line(_result(stop_reason="max_env_steps", health=healthy),
                      _args(stop_return=None, max_env_steps=20_000), out) == (
        "impala-lab: trained 300.4 s, 31,000,000 env steps (stop: max_env_steps); best trailing "
        "mean 382.1, last 9.3; results in runs/demo/")


@pytest.mark.parametrize("args, fragments", [
    (["--num-workers", "0"], ["num_workers=0", "training would hang"]),
    (["--lr", "abc"], ["--lr='abc'", "a number"]),
    (["--backend", "procss"], ["backend='procss'", "did you mean 'process'"]),
    (["--env", "CartPol-v1"], ["env='CartPol-v1'", "did you mean 'CartPole-v1'"]),
    (["--fake-gpus", "maybe"], ["--fake-gpus='maybe'", "true or false"]),
    (["--max-seconds", "-1"], ["--max-seconds=-1.0", "positive"]),
    (["--replay-proportion", "0.5"], ["replay_buffer_num_slots=0", "at least 9"]),
    (["--stop-return", "10", "--train-after-target", "-1"],
     ["--train-after-target=-1.0", "seconds >= 0"]),
    (["--train-after-target", "5"], ["--train-after-target=5.0", "without --stop-return"]),
])
def test_bad_input_exits_2_with_the_field_value_and_fix(args, fragments, capsys, tmp_path):
    code = main(["train", "--out", str(tmp_path / "never"), *args])
    err = capsys.readouterr().err
    assert code == 2
    for fragment in fragments:
        assert fragment in err
    assert "Traceback" not in err


def test_unknown_option_exits_2_with_the_closest_options(capsys):
    assert main(["train", "--num-wrokers", "2", "--lrr=0.1"]) == 2
    err = capsys.readouterr().err
    assert err == ("impala-lab train: error: unrecognized arguments: --num-wrokers (did you "
                   "mean --num-workers or --max-num-workers?), 2, --lrr=0.1 (did you mean "
                   "--lr?); see impala-lab train --help\n")


def test_config_command_prints_the_table(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "| `train_batch_size` | `500` |" in out


def test_train_help_gives_each_default_once_and_the_tuned_preset_value(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    # RLlib's default and the value the run actually takes on the default env.
    assert "(default: 1; 8 in CartPole-v1's tuned preset)" in text
    assert "(default: 0.0005; 0.003 in CartPole-v1's tuned preset)" in text
    assert "Discount factor. (default: 0.99) --vf-loss-coeff" in text  # not tuned: one default
    # An option left unset by default is not followed by a second "(default: None)".
    assert ") (default: None)" not in text
    assert "reaches this --stop-on" in text


def test_the_tuned_preset_fills_only_fields_the_user_left_out():
    from impala_lab.cli.main import build_parser, config_from_args
    from impala_lab.presets import TUNED_PRESETS

    tuned = config_from_args(build_parser().parse_args(["train", "--lr", "0.01"]))
    assert tuned.lr == 0.01  # the user's value wins
    assert tuned.num_envs_per_worker == TUNED_PRESETS["CartPole-v1"]["num_envs_per_worker"]
    assert tuned.vf_loss_coeff == TUNED_PRESETS["CartPole-v1"]["vf_loss_coeff"]
    rllib = config_from_args(build_parser().parse_args(["train", "--preset", "rllib"]))
    assert rllib == ImpalaConfig()
    other = config_from_args(build_parser().parse_args(["train", "--env", "Acrobot-v1"]))
    assert other == ImpalaConfig(env="Acrobot-v1")  # no tuned values for this env
    assert ImpalaConfig.tuned("CartPole-v1", seed=1) == tuned.replace(lr=0.003, seed=1)


def test_a_run_time_error_still_writes_results_and_exits_1_with_the_message(tmp_path, capsys):
    import gymnasium as gym

    if "ImpalaLabRaising-v0" not in gym.registry:
        gym.register("ImpalaLabRaising-v0", entry_point="tests.envs:RaisingEnv",
                     kwargs={"every": 40, "length": 5})
    out = tmp_path / "run"
    code = main(["train", "--env", "ImpalaLabRaising-v0", "--backend", "inline",
                 "--num-workers", "1", "--num-envs-per-worker", "1",
                 "--sample-batch-size", "10", "--train-batch-size", "10",
                 "--restart-failed-workers", "false", "--max-seconds", "60", "--quiet",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "impala-lab: error: WorkerError" in err and "boom at step 40" in err
    assert "(env ImpalaLabRaising-v0) failed" in err and f"are in {out}/" in err
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "error" and result["solved"] is False
    assert result["error"].startswith("WorkerError") and "boom at step 40" in result["error"]
    assert result["final"]["last_error"] == result["error"]
    # Steps 1-30 were sampled fine; the failing request may cut the last fine one short.
    assert result["final"]["num_steps_sampled"] in (20, 30)
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert "boom at step 40" in rows[-1]["last_error"]
    assert (out / "checkpoint" / "state.json").is_file()


def test_ctrl_c_while_the_run_is_built_exits_130_without_a_traceback(tmp_path, capsys,
                                                                     monkeypatch):
    import signal

    import impala_lab.driver.impala

    class Interrupted:
        def __init__(self, config):
            raise KeyboardInterrupt

    monkeypatch.setattr(impala_lab.driver.impala, "Impala", Interrupted)
    handler = signal.getsignal(signal.SIGTERM)
    code = main(["train", "--backend", "inline", "--out", str(tmp_path / "run")])
    assert code == 130
    assert "interrupted before training started" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is handler
    # the folder's lock file, config.json and run.json: nothing else was written
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock", "config.json",
                                                                   "run.json"]


@pytest.mark.parametrize("env, versions", [
    ("CartPole-v9", "'CartPole-v0', 'CartPole-v1'"),
    ("MinAtar/Breakout-v9", "'MinAtar/Breakout-v0', 'MinAtar/Breakout-v1'"),
])
def test_an_unknown_version_of_a_registered_env_lists_the_registered_ones(env, versions, capsys,
                                                                          tmp_path):
    import gymnasium

    if env.startswith("MinAtar") and "MinAtar/Breakout-v1" not in gymnasium.registry:
        pytest.skip("minatar is not installed here: its games are not registered")
    assert main(["train", "--env", env, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (
        f"impala-lab: error: env={env!r} is invalid: gymnasium does not know this env id; the "
        f"registered versions are {versions}\n")  # not "install minatar": it is installed
