"""``impala-lab train`` writes as it goes, can be resumed, and claims its folder.

Each test here is a fault that lost a run before: a SIGKILL left only config.json, a closed
stdout was a BrokenPipeError traceback, two runs wrote into one folder, a folder of other
files was written into, ``--out ""`` wrote into the current directory.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from impala_lab.cli.main import main
from impala_lab.cli.run_folder import RunFolder
from impala_lab.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
FAST = ["--backend", "inline", "--num-workers", "1", "--num-envs-per-worker", "4",
        "--sample-batch-size", "20", "--train-batch-size", "80", "--model", "16"]


def train(*args: str, **popen: object) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "impala_lab.cli", "train", *args], cwd=REPO,
                            env=env, text=True, **popen)


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)


def test_a_killed_run_leaves_metrics_result_and_checkpoint_and_resumes(tmp_path):
    out = tmp_path / "run"
    proc = train("--out", str(out), "--report-interval", "0.2", "--checkpoint-every", "1",
                 "--max-seconds", "300", "--quiet", *FAST,
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (out / "checkpoint" / "state.json").is_file()
                 and (out / "metrics.csv").is_file() and len(rows(out / "metrics.csv")) >= 3,
                 120, "a checkpoint and three metrics rows")
        proc.kill()  # SIGKILL: nothing of the run's own code runs after this
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = rows(out / "metrics.csv")
    state = json.loads((out / "result.json").read_text())
    assert state["stop_reason"] == "running" and state["final"]["num_steps_sampled"] > 0
    saved = json.loads((out / "checkpoint" / "state.json").read_text())
    resumed = train("--resume", str(out), "--max-seconds", "3", "--report-interval", "0.2",
                    "--quiet", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr[-2000:]
    after = rows(out / "metrics.csv")
    assert after[: len(before)] == before and len(after) > len(before)  # appended
    steps = [int(r["num_steps_sampled"]) for r in after[len(before):]]
    assert steps[0] >= saved["counters"]["num_steps_sampled"]  # counters went on from there
    final = json.loads((out / "result.json").read_text())
    assert final["stop_reason"] == "max_seconds"


def test_a_closed_stdout_stops_the_progress_view_not_the_run(tmp_path):
    out = tmp_path / "run"
    proc = train("--out", str(out), "--max-env-steps", "20000", "--report-interval", "0.1",
                 *FAST, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # `| head -n 1`
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
    assert json.loads((out / "result.json").read_text())["stop_reason"] == "max_env_steps"


def test_two_runs_into_one_folder_the_second_is_refused(tmp_path):
    out = tmp_path / "run"
    first = RunFolder(out)
    try:
        with pytest.raises(ConfigError, match=rf"--out='{out}' is in use by another impala-lab "
                                              rf"train \(pid {os.getpid()}\): one run per folder"):
            RunFolder(out)
    finally:
        first.close()
    RunFolder(out).close()  # free again once the first let go


def test_the_cli_refuses_a_second_run_into_a_folder_in_use(tmp_path, capsys):
    out = tmp_path / "run"
    holder = RunFolder(out)
    try:
        assert main(["train", "--out", str(out), *FAST]) == 2
    finally:
        holder.close()
    assert "is in use by another impala-lab train" in capsys.readouterr().err
    assert not (out / "config.json").exists()  # the running run's files are untouched


@pytest.mark.parametrize("case", ["empty", "file", "others", "unwritable"])
def test_bad_out_folders_are_one_line_errors_with_the_fix(tmp_path, case, capsys, monkeypatch):
    out = tmp_path / "run"
    expected = {"empty": r"--out='' is invalid: give a folder",
                "file": rf"--out='{out}' is a file, not a folder",
                "others": rf"--out='{out}' holds files that are not an impala_lab run's "
                          r"\(notes\.txt\): pick another folder, or pass --overwrite",
                "unwritable": rf"--out='{out}' cannot be written"}[case]
    arg = "" if case == "empty" else str(out)
    if case == "file":
        out.write_text("x")
    if case == "others":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if case == "unwritable":
        out.mkdir()
        monkeypatch.setattr(Path, "write_bytes", _refuse)
    assert main(["train", "--out", arg, *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(expected, err), err


def _refuse(self: Path, data: bytes) -> int:
    raise PermissionError(13, "Permission denied")


def test_overwrite_writes_beside_other_files(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    RunFolder(out, overwrite=True).close()
    assert (out / "notes.txt").read_text() == "mine"


def test_a_full_disk_is_reported_once_and_written_when_space_returns(tmp_path, capsys,
                                                                    monkeypatch):
    folder = RunFolder(tmp_path / "run")
    full = [True]
    real_replace = os.replace

    def replace(src, dst):
        if full[0]:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    history = [{"a": 1}]
    assert not folder.write_json("result.json", {"x": 1})
    assert not folder.write_json("result.json", {"x": 2})
    assert not folder.append_metrics(history)
    err = capsys.readouterr().err
    assert err.count("could not write") == 2  # once per file, not once per report
    assert "No space left on device" in err
    full[0] = False
    history.append({"a": 2, "b": 3})
    assert folder.write_json("result.json", {"x": 3}) and folder.append_metrics(history)
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == {"x": 3}
    assert rows(tmp_path / "run" / "metrics.csv") == [{"a": "1", "b": ""}, {"a": "2", "b": "3"}]
    folder.close()


def test_sighup_ends_the_run_like_ctrl_c(tmp_path):
    out = tmp_path / "run"
    proc = train("--out", str(out), "--max-seconds", "300", "--report-interval", "0.2", *FAST,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        wait_for(lambda: (out / "metrics.csv").is_file(), 120, "the first report")
        proc.send_signal(signal.SIGHUP)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 129, stderr[-2000:]
    assert json.loads((out / "result.json").read_text())["stop_reason"] == "interrupted"
    assert (out / "checkpoint" / "state.json").is_file()
