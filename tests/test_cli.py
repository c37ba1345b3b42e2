"""The impala-lab command: a short run writes every output; bad input exits 2 with a message."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from impala_lab.cli import main
from impala_lab.config import ImpalaConfig

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "impala_lab.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_short_run_writes_config_metrics_result_report_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--backend", "inline", "--num-envs-per-worker", "4",
                   "--max-env-steps", "6000", "--report-interval", "0.2", "--seed", "3",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["backend"] == "inline" and config["num_envs_per_worker"] == 4
    assert config["seed"] == 3
    result = json.loads((out / "result.json").read_text())
    assert set(result) >= {"solved", "seconds_to_target", "env_steps_to_target", "final"}
    assert result["solved"] is False and result["stop_reason"] == "max_env_steps"
    assert result["final"]["num_steps_sampled"] >= 6000
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and "episode_return_mean" in rows[0] and "sample_throughput" in rows[0]
    assert "timing_breakdown.learner_grad_time_ms" in rows[0]
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "checkpoint" / "state.json").is_file()
    assert "steps" in proc.stdout and "results in" in proc.stdout


@pytest.mark.parametrize("args, fragments", [
    (["--num-workers", "0"], ["num_workers=0", "training would hang"]),
    (["--lr", "abc"], ["--lr='abc'", "a number"]),
    (["--backend", "procss"], ["backend='procss'", "did you mean 'process'"]),
    (["--env", "CartPol-v1"], ["env='CartPol-v1'", "did you mean 'CartPole-v1'"]),
    (["--fake-gpus", "maybe"], ["--fake-gpus='maybe'", "true or false"]),
    (["--max-seconds", "-1"], ["--max-seconds=-1.0", "positive"]),
    (["--replay-proportion", "0.5"], ["replay_buffer_num_slots=0", "at least 11"]),
])
def test_bad_input_exits_2_with_the_field_value_and_fix(args, fragments, capsys, tmp_path):
    code = main(["train", "--out", str(tmp_path / "never"), *args])
    err = capsys.readouterr().err
    assert code == 2
    for fragment in fragments:
        assert fragment in err
    assert "Traceback" not in err


def test_unknown_option_exits_2():
    with pytest.raises(SystemExit) as info:
        main(["train", "--num-wrokers", "2"])
    assert info.value.code == 2


def test_config_command_prints_the_table(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "| `train_batch_size` | `500` |" in out


def test_the_tuned_preset_fills_only_fields_the_user_left_out():
    from impala_lab.cli import build_parser, config_from_args
    from impala_lab.config import TUNED_PRESETS

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

    import impala_lab.impala

    class Interrupted:
        def __init__(self, config):
            raise KeyboardInterrupt

    monkeypatch.setattr(impala_lab.impala, "Impala", Interrupted)
    handler = signal.getsignal(signal.SIGTERM)
    code = main(["train", "--backend", "inline", "--out", str(tmp_path / "run")])
    assert code == 130
    assert "interrupted before training started" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is handler
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json"]
