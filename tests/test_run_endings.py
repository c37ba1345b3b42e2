"""How ``impala-lab train`` ends when what is around it fails: its output streams, its disk,
its evaluation, the signals it gets during its last seconds.

Each test is a fault that ended a run wrongly before: stdout on ``/dev/full``, closed with
``>&-`` or on a terminal that hung up killed the run or gave a traceback and exit 1; a full
disk ended with exit 0 and "results in ..." beside a result.json that still said "running";
an env that raised only in evaluation failed silently (exit 0, ``error: null``) and
``--stop-on eval`` could never stop; one that hung there held the run past ``--max-seconds``
and a SIGTERM then gave a traceback; a second Ctrl-C during the final saves lost the report.
They drive the CLI with `tests.fake_run.FakeImpala` (no TensorFlow), in a subprocess where a
signal, a stream or a terminal is involved.
"""

from __future__ import annotations

import csv
import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fake_run

REPO = Path(__file__).resolve().parents[1]
QUICK = ("--report-interval", "0.02", "--quiet")


def fake_cli(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.fake_run", "train", *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            text=True, **popen)


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def result_of(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)


# ---------------------------------------------------------------------- output streams
@pytest.mark.parametrize("stdout", ["/dev/full", "closed before the start", "reader gone",
                                    "stderr on /dev/full"])
def test_a_failing_stdout_ends_the_progress_output_never_the_run(tmp_path, stdout):
    out = tmp_path / "run"
    args = ("--out", str(out), "--max-env-steps", "20000", "--report-interval", "0.02")
    if stdout == "/dev/full":  # ENOSPC on every write
        with open("/dev/full", "w") as full:
            proc = fake_cli(*args, stdout=full, stderr=subprocess.PIPE)
    elif stdout == "stderr on /dev/full":  # with an error to say there: a failed evaluation
        with open("/dev/full", "w") as full:
            proc = fake_cli(*args, "--env", "RaisesInEval-v0", "--evaluation-interval", "1000",
                            stdout=subprocess.PIPE, stderr=full)
        stdout_text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, stdout_text  # the final evaluation failed: said, exit 1
        assert "evaluation failed" in result_of(out)["error"]
        return
    elif stdout == "closed before the start":  # `>&-`, with --quiet as well
        proc = fake_cli(*args, "--quiet", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        preexec_fn=lambda: os.close(1))
    else:  # `| head -n 1`
        proc = fake_cli(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.readline()
        proc.stdout.close()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "Error" not in stderr, stderr[-3000:]
    assert result_of(out)["stop_reason"] == "max_env_steps"
    assert len(rows(out / "metrics.csv")) == 21
    assert sorted(p.name for p in out.iterdir()) == [  # nothing took stdout's place
        ".lock", "checkpoint", "config.json", "metrics.csv", "policy.gif", "report.png",
        "result.json", "run.json"]


def test_a_terminal_that_hangs_up_ends_the_run_with_129_and_its_outputs(tmp_path):
    out = tmp_path / "run"
    master, slave = pty.openpty()

    def own_the_terminal() -> None:  # a login shell's job: the pty is its terminal
        import fcntl
        import termios

        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    with open(tmp_path / "stderr", "w") as err:
        proc = fake_cli("--out", str(out), "--max-seconds", "300", "--report-interval", "0.05",
                        stdin=slave, stdout=slave, stderr=err, preexec_fn=own_the_terminal)
    os.close(slave)
    try:
        wait_for(lambda: (out / "metrics.csv").is_file(), 60, "the first report")
        os.read(master, 1024)  # the live view draws on the terminal
        os.close(master)  # the terminal hangs up: SIGHUP, then EIO on every write
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 129, stderr
    assert "Traceback" not in stderr
    assert result_of(out)["stop_reason"] == "interrupted"
    assert (out / "report.png").is_file() and (out / "checkpoint" / "state.json").is_file()


# ---------------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (``mount -t tmpfs``, as root); where mounting is refused, the test runs
    with ENOSPC injected at the write calls instead (``FAKE_FAIL_WRITES``)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> None:
    """Fill ``disk`` to its last byte."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while os.write(fd, b"\0" * 512):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)


def test_a_disk_that_fills_mid_run_ends_saying_what_was_not_written(
        tmp_path, small_disk):
    disk = small_disk or tmp_path
    out = disk / "run"
    env = {} if small_disk else {"FAKE_FAIL_WRITES": "metrics.csv,result.json,report.png"}
    proc = fake_cli("--out", str(out), "--max-seconds", "300", *QUICK, env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (out / "result.json").is_file() or proc.poll() is not None, 60,
                 "the first report")
        if small_disk:
            fill(disk)
        time.sleep(0.2)  # reports meet the full disk
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr  # the signal, and the last line says what is missing
    last = stdout.strip().splitlines()[-1]
    assert "could NOT write result.json" in last and "No space left on device" in last, last
    assert "results in" not in last
    assert "Traceback" not in stderr
    assert stderr.count(f"could not write {out / 'result.json'}") == 1  # said once
    for name in ("policy.gif", "report.png"):  # never a 0-byte file
        assert not (out / name).exists() or (out / name).stat().st_size > 0
    if small_disk:
        # every row whole: the file parses, each row with the header's fields
        with open(out / "metrics.csv", newline="") as fh:
            table = list(csv.reader(fh))
        assert len(table) > 1 and {len(r) for r in table} == {len(table[0])}


def test_without_a_signal_unwritten_outputs_end_with_exit_1(tmp_path):
    out = tmp_path / "run"
    proc = fake_cli("--out", str(out), "--max-env-steps", "3000", *QUICK,
                    env={"FAKE_FAIL_WRITES": "result.json,policy.gif"},
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert stdout.strip().splitlines()[-1].endswith(
        f"could NOT write result.json, policy.gif (No space left on device): {out}/ holds "
        "what was written before")
    assert len(rows(out / "metrics.csv")) == 4 and not (out / "result.json").exists()


def test_a_full_disk_before_the_start_is_one_line_and_leaves_nothing(tmp_path, small_disk):
    if small_disk is None:
        pytest.skip("cannot mount a tmpfs here (needs root): the fault is the disk itself")
    fill(small_disk)
    out = small_disk / "run"
    proc = fake_cli("--out", str(out), "--max-env-steps", "1000", *QUICK,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert stderr.strip().splitlines() == [
        f"impala-lab: error: --out='{out}' cannot be written (No space left on device, writing "
        "config.json): free some space there, or give a folder you can write to"]
    assert not out.exists()


# ---------------------------------------------------------------------- signals at the end
def test_a_second_ctrl_c_during_the_final_saves_waits_for_them(tmp_path):
    out = tmp_path / "run"
    code = ("import os, signal, sys; from tests import fake_run\n"
            "def stop(self):\n"
            "    os.kill(os.getpid(), signal.SIGINT); os.kill(os.getpid(), signal.SIGINT)\n"
            "fake_run.FakeImpala.stop = stop\n"
            "sys.exit(fake_run.main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "train", "--out", str(out),
                           "--max-env-steps", "3000", *QUICK], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("writing the run's outputs first") == 1
    assert result_of(out)["stop_reason"] == "max_env_steps"
    assert (out / "report.png").stat().st_size > 0 and (out / "policy.gif").stat().st_size > 0


# ---------------------------------------------------------------------- evaluation
def test_an_evaluation_that_raises_is_reported_in_the_metrics_and_the_result(tmp_path, capsys):
    out = tmp_path / "run"
    assert fake_run.main(["train", "--env", "RaisesInEval-v0", "--evaluation-interval", "1",
                          "--out", str(out), "--max-env-steps", "3000", *QUICK]) == 1
    err = capsys.readouterr().err
    assert ("impala-lab: error: ImpalaError: evaluation failed: RuntimeError: this env breaks "
            "in evaluation") in err
    result = result_of(out)
    assert result["error"].startswith("ImpalaError: evaluation failed: RuntimeError")
    assert result["final_evaluation"] == "failed"
    assert result["final"]["evaluation"]["num_failed"] >= 1
    errors = [r["evaluation.error"] for r in rows(out / "metrics.csv")]
    assert errors[-1] == "RuntimeError: this env breaks in evaluation"


def test_stop_on_eval_says_why_it_cannot_stop_when_evaluations_fail(tmp_path, capsys):
    out = tmp_path / "run"
    assert fake_run.main(["train", "--env", "RaisesInEval-v0", "--evaluation-interval", "1",
                          "--stop-on", "eval", "--stop-return", "100", "--out", str(out),
                          "--max-seconds", "300", *QUICK]) == 1
    err = capsys.readouterr().err
    assert "--stop-on eval cannot stop this run: its evaluations fail (RuntimeError: this " \
           "env breaks in evaluation)" in err
    assert result_of(out)["stop_reason"] == "error"


def test_the_final_evaluation_never_holds_the_run_past_max_seconds(tmp_path):
    out = tmp_path / "run"
    # Evaluations of their own have an hour: only --max-seconds can end this one.
    proc = fake_cli("--env", "HangsInEval-v0", "--evaluation-interval", "1000", "--out",
                    str(out), "--max-env-steps", "2000", "--max-seconds", "3", *QUICK,
                    env={"FAKE_EVAL_TIMEOUT": "3600"},
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    result = result_of(out)
    assert result["stop_reason"] == "max_env_steps" and result["final_evaluation"] == "failed"
    assert "the env hangs in reset() or step() when evaluated" in result["error"]


def test_sigterm_during_the_final_evaluation_ends_the_run_cleanly(tmp_path):
    out = tmp_path / "run"
    proc = fake_cli("--env", "HangsInEval-v0", "--evaluation-interval", "1000", "--out",
                    str(out), "--max-env-steps", "2000", *QUICK,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:  # the second report is the last: the final evaluation starts after it
        wait_for(lambda: len(rows(out / "metrics.csv")) >= 2 if (out / "metrics.csv").is_file()
                 else False, 60, "the last report")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert result_of(out)["stop_reason"] == "interrupted"


def test_a_hang_up_ignored_at_the_start_stays_ignored():
    from impala_lab.cli.endings import EndingSignals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # `nohup impala-lab train ...`
    try:
        ending = EndingSignals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == ending._handle
        ending.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
