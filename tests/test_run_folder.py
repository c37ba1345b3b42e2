"""``impala-lab train`` writes as it goes, resumes as the same run, and claims its folder.

Each test here is a fault that lost or mixed a run before: a SIGKILL left only config.json,
two runs wrote into one folder (a rerun appended its rows to the earlier run's), a folder of
other files was written into, ``--out ""`` wrote into the current directory, a folder removed
mid-run was recreated without its lock, a resumed run's steps went backwards and forgot its
limits, a save killed between its renames could not be resumed. Most drive the CLI with
`tests.fake_run.FakeImpala` (no TensorFlow); the first trains for real.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from impala_lab.cli.main import main
from impala_lab.cli.run_folder import RunFolder
from impala_lab.errors import ConfigError
from tests import fake_run

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
                 "--max-seconds", "300", "--stop-return", "480", "--quiet", *FAST,
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
    checkpoint_steps = saved["counters"]["num_steps_sampled"]
    # the run's limits are kept; one given again replaces the run's (here: a step budget)
    limit = checkpoint_steps + 4000
    resumed = train("--resume", str(out), "--max-env-steps", str(limit), "--quiet",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr[-2000:]
    after = rows(out / "metrics.csv")
    kept = [r for r in before if int(r["num_steps_sampled"]) <= checkpoint_steps]
    assert after[:len(kept)] == kept  # rows past the checkpoint were cut, the rest kept
    steps = [int(r["num_steps_sampled"]) for r in after]
    assert steps == sorted(steps) and steps[-1] >= limit  # never backwards
    # (that the workers sample with the checkpoint's weights from their first request is
    # test_checkpoint_atomic.py::test_a_restored_run_samples_with_the_checkpoints_weights_...)
    final = json.loads((out / "result.json").read_text())
    assert final["stop_reason"] == "max_env_steps" and final["stop_return"] == 480
    run = json.loads((out / "run.json").read_text())
    assert (run["max_seconds"], run["stop_return"], run["max_env_steps"]) == (300, 480, limit)


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


@pytest.mark.parametrize("case", ["empty", "file", "others", "unwritable", "link loop",
                                  "dangling link", "300 characters", "lock is a folder",
                                  "no locks"])
def test_bad_out_folders_are_one_line_errors_with_the_fix(tmp_path, case, capsys, monkeypatch):
    out = tmp_path / ("d" * 300 if case == "300 characters" else "run")
    expected = {"empty": r"--out='' is invalid: give a folder",
                "file": rf"--out='{out}' is a file, not a folder",
                "others": rf"--out='{out}' holds files that are not an impala_lab run's "
                          r"\(notes\.txt\): pick another folder, or pass --overwrite",
                "unwritable": rf"--out='{out}' cannot be written \(Permission denied, writing "
                              r"config\.json\)",
                "link loop": rf"--out='{out}' is a symbolic link loop",
                "dangling link": rf"--out='{out}' is a symbolic link to a missing folder",
                "300 characters": r"has a name longer than the file system allows",
                "lock is a folder": rf"{out}/\.lock is a folder, not impala-lab's lock file: "
                                    "remove it",
                "no locks": rf"--out='{out}' is on a file system without file locks \(No "
                            r"locks available\).*give a folder on a local disk"}[case]
    arg = "" if case == "empty" else str(out)
    if case == "file":
        out.write_text("x")
    if case == "others":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if case == "unwritable":
        out.mkdir()
        monkeypatch.setattr(Path, "write_bytes", _refuse)
    if case == "link loop":
        out.symlink_to(out)
    if case == "dangling link":
        out.symlink_to(tmp_path / "gone")
    if case == "lock is a folder":
        (out / ".lock").mkdir(parents=True)
    if case == "no locks":
        monkeypatch.setattr(fcntl, "flock", _no_locks)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["train", "--out", arg, *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(expected, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # left as it was


def _refuse(self: Path, data: bytes) -> int:
    raise PermissionError(13, "Permission denied")


def _no_locks(fd: int, operation: int) -> None:
    raise OSError(errno.ENOLCK, "No locks available")


def test_a_refused_folder_gets_no_lock_and_a_made_one_is_removed(tmp_path, capsys,
                                                                 monkeypatch):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert main(["train", "--out", str(user), *FAST]) == 2
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]  # no .lock
    root_lock = os.path.lexists("/.lock")
    assert main(["train", "--out", "/", *FAST]) == 2  # the root holds other files
    assert os.path.lexists("/.lock") == root_lock
    # a folder the claim made (parents too) goes again when the claim is refused
    monkeypatch.setattr(fcntl, "flock", _no_locks)
    assert main(["train", "--out", str(tmp_path / "new" / "run"), *FAST]) == 2
    assert not (tmp_path / "new").exists()
    assert capsys.readouterr().err.count("impala-lab: error:") == 3


def fake(*argv: str) -> int:
    """``impala-lab`` with `FakeImpala` in this process."""
    return fake_run.main(list(argv))


FAKE_RUN = ("--report-interval", "0.01", "--quiet")


def test_a_fresh_run_into_an_earlier_runs_folder_is_refused_and_never_mixed(tmp_path, capsys):
    out = tmp_path / "run"
    assert fake("train", "--out", str(out), "--max-env-steps", "3000", *FAKE_RUN) == 0
    first = (out / "metrics.csv").read_text()
    assert fake("train", "--out", str(out), "--env", "Acrobot-v1", *FAKE_RUN) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"impala-lab: error: --out='{out}' holds an earlier run (metrics.csv, "
                   "result.json, checkpoint, report.png, policy.gif): continue it with --resume "
                   f"{out}, replace it with --overwrite, or give another --out")
    assert (out / "metrics.csv").read_text() == first  # untouched
    # --overwrite replaces the earlier run: nothing of it is left to mix with
    (out / "notes.txt").write_text("mine")
    assert fake("train", "--out", str(out), "--env", "Acrobot-v1", "--max-env-steps", "2000",
                "--overwrite", *FAKE_RUN) == 0
    assert [int(r["num_steps_sampled"]) for r in rows(out / "metrics.csv")] == [1000, 2000, 2000]
    assert json.loads((out / "config.json").read_text())["env"] == "Acrobot-v1"
    assert (out / "notes.txt").read_text() == "mine"


def test_a_folder_removed_mid_run_stops_the_runs_writes_and_is_not_recreated(
        tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    others: list[RunFolder] = []
    record = fake_run.FakeImpala.record

    def record_then_take_the_folder(self):
        if self.num_steps_sampled == 3000:  # the third report: another run takes the path
            shutil.rmtree(out)
            others.append(RunFolder(out))
        return record(self)

    monkeypatch.setattr(fake_run.FakeImpala, "record", record_then_take_the_folder)
    try:
        assert fake("train", "--out", str(out), "--max-env-steps", "10000", *FAKE_RUN) == 1
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing of the first run
    finally:
        others[0].close()
    err = capsys.readouterr().err
    assert f"the run's folder {out}/ was removed or replaced while the run was writing" in err
    assert f"nothing more was written into {out}/" in err and "Traceback" not in err


def test_resume_cuts_the_metrics_back_and_keeps_the_runs_limits_and_flags(tmp_path, capsys):
    out = tmp_path / "run"
    assert fake("train", "--out", str(out), "--max-env-steps", "4000", "--stop-return", "50",
                "--max-seconds", "300", "--tensorboard", "--report-interval", "0.01",
                "--checkpoint-every", "0", "--quiet") == 0
    # A kill after the checkpoint: rows past it, the last one torn, result.json "running".
    metrics = out / "metrics.csv"
    header = metrics.read_text().splitlines()[0].split(",")
    extra = [{**rows(metrics)[-1], "num_steps_sampled": str(s)} for s in (5000, 6000)]
    with open(metrics, "a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=header).writerows(extra)
        fh.write("7.1,7000,70")  # torn: a third of a row, no newline
    assert fake("train", "--resume", str(out), *FAKE_RUN) == 2  # 4000 of 4000 env steps done
    assert "nothing is left to train: give a larger --max-env-steps" in capsys.readouterr().err
    assert fake("train", "--resume", str(out), "--max-env-steps", "7000", "--lr", "0.01",
                "--quiet") == 0
    steps = [int(r["num_steps_sampled"]) for r in rows(metrics)]
    assert steps == [1000, 2000, 3000, 4000, 4000, 5000, 6000, 7000, 7000]
    run = json.loads((out / "run.json").read_text())
    assert (run["stop_return"], run["max_seconds"], run["tensorboard"]) == (50, 300, True)
    assert run["max_env_steps"] == 7000 and run["report_interval"] == 0.01
    assert run["argv"][:3] == ["train", "--out", str(out)]  # the command that started it
    assert json.loads((out / "config.json").read_text())["lr"] == 0.01
    result = json.loads((out / "result.json").read_text())
    assert result["stop_return"] == 50 and result["stop_reason"] == "max_env_steps"
    assert result["best_return_mean"] == 7.0  # over the whole run


@pytest.mark.parametrize("flag", [("--out", "elsewhere"), ("--overwrite",)])
def test_out_or_overwrite_with_resume_is_refused(tmp_path, capsys, flag):
    out = tmp_path / "run"
    assert fake("train", "--out", str(out), "--max-env-steps", "1000", *FAKE_RUN) == 0
    assert fake("train", "--resume", str(out), *flag) == 2
    assert capsys.readouterr().err.strip() == (
        f"impala-lab: error: {flag[0]} cannot go with --resume: a resumed run writes into its "
        f"own folder ({out}); drop {flag[0]}")


def test_a_save_killed_between_its_renames_resumes_from_checkpoint_prev(tmp_path):
    out = tmp_path / "run"
    assert fake("train", "--out", str(out), "--max-env-steps", "2000", *FAKE_RUN) == 0
    os.rename(out / "checkpoint", out / "checkpoint.prev")  # killed between the renames
    assert fake("train", "--resume", str(out), "--max-env-steps", "4000", *FAKE_RUN) == 0
    assert [int(r["num_steps_sampled"]) for r in rows(out / "metrics.csv")] == [
        1000, 2000, 2000, 3000, 4000, 4000]
    assert json.loads((out / "checkpoint" / "state.json").read_text())["counters"][
        "num_steps_sampled"] == 4000
    assert not (out / "checkpoint.prev").exists()


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
    assert not folder.write_json("result.json", {"x": 1})
    assert not folder.write_json("result.json", {"x": 2})
    assert not folder.append_metrics([{"a": 1}])
    err = capsys.readouterr().err
    assert err.count("could not write") == 2  # once per file, not once per report
    assert "No space left on device" in err
    assert folder.unwritten == {"result.json": "No space left on device",
                                "metrics.csv": "No space left on device"}
    full[0] = False
    # the row the disk refused waits for the next write
    assert folder.write_json("result.json", {"x": 3}) and folder.append_metrics([{"a": 2, "b": 3}])
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == {"x": 3}
    assert rows(tmp_path / "run" / "metrics.csv") == [{"a": "1", "b": ""}, {"a": "2", "b": "3"}]
    assert folder.unwritten == {}
    folder.close()


def test_a_failed_append_leaves_no_torn_row(tmp_path, monkeypatch):
    folder = RunFolder(tmp_path / "run")
    row = {"a": "1", "b": "x" * 5000}
    assert folder.append_metrics([row])
    before = (tmp_path / "run" / "metrics.csv").read_bytes()
    real_write = os.write

    def write_half_then_fill(fd, data):  # a disk that fills in the middle of the row
        if len(data) > 100:
            return real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write_half_then_fill)
    assert not folder.append_metrics([row])
    assert (tmp_path / "run" / "metrics.csv").read_bytes() == before  # truncated back
    monkeypatch.setattr(os, "write", real_write)
    assert folder.append_metrics([{"a": "3", "b": "y"}])
    assert [r["a"] for r in rows(tmp_path / "run" / "metrics.csv")] == ["1", "1", "3"]
    folder.close()


def test_a_resumed_runs_metrics_are_repaired_and_cut_back_to_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    error = "WorkerError: the env failed\nTraceback (most recent call last):\n  ..."
    text = ("num_steps_sampled,last_error,x\n1000,,1\n2000,\"" + error + "\",2\n"
            "3000,,3\n4000,,4\n5000,\"Worker")  # the last row torn inside a quoted field
    (out / "metrics.csv").write_text(text)
    folder = RunFolder(out, resume=True)
    kept = folder.cut_metrics(3000)
    assert [r["num_steps_sampled"] for r in kept] == ["1000", "2000", "3000"]
    assert kept[1]["last_error"] == error
    assert rows(out / "metrics.csv") == kept  # parseable again
    assert folder.append_metrics([{"num_steps_sampled": 3500, "x": 9, "new": 1}])
    assert [r["new"] for r in rows(out / "metrics.csv")] == ["", "", "", "1"]
    folder.close()


def test_metrics_rows_stream_to_disk_past_the_in_memory_history(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_init = fake_run.FakeImpala.__init__

    def with_a_short_history(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.history = fake_run.StatsHistory(maxlen=5)  # the history cap, 100,000 in a run

    monkeypatch.setattr(fake_run.FakeImpala, "__init__", with_a_short_history)
    assert fake("train", "--out", str(out), "--max-env-steps", "40000", "--report-interval",
                "0.001", "--quiet") == 0
    assert [int(r["num_steps_sampled"]) for r in rows(out / "metrics.csv")] == [
        *range(1000, 40001, 1000), 40000]


def test_an_edited_run_json_falls_back_to_the_defaults_not_a_traceback(tmp_path):
    out = tmp_path / "run"
    assert fake("train", "--out", str(out), "--max-env-steps", "1000", *FAKE_RUN) == 0
    (out / "run.json").write_text(json.dumps({"max_seconds": "soon", "stop_on": 3,
                                              "report_interval": None, "tensorboard": 1}))
    assert fake("train", "--resume", str(out), "--max-env-steps", "2000", *FAKE_RUN) == 0
    run = json.loads((out / "run.json").read_text())
    assert (run["max_seconds"], run["stop_on"], run["tensorboard"]) == (None, "train", False)
    assert run["report_interval"] == 0.01  # given again
