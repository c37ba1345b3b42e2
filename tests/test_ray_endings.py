"""How a ``impala-lab train --backend ray`` run ends when Ray or a signal ends it.

Ray ends its driver from C++ when the driver's raylet dies, so the CLI trains in a child
process that a small watchman (`impala_lab.cli.supervise`) waits for. Each test starts a real
run on a Ray of its own (``ray.init`` in the child), waits for its first report, then:

- SIGKILLs that Ray's raylet: one error line that names the lost cluster, exit code 1,
  ``result.json`` saying so, the metrics kept, nothing of the run left alive;
- sends the watchman SIGTERM: the run ends as Ctrl-C ends it (outputs written), exit 143;
- SIGKILLs the watchman: the kernel tells the child, which ends the run cleanly all the same.

Every run is started with SIGINT's default handler (a background ``make test`` ignores it),
since SIGINT is how the watchman asks the child to end.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.soak import live_processes
from tests.signals import default_sigint

pytest.importorskip("ray")

CLI = [sys.executable, "-m", "impala_lab.cli.main", "train", "--env", "CartPole-v1",
       "--backend", "ray", "--num-workers", "2", "--max-seconds", "150", "--quiet"]
FIRST_REPORT_TIMEOUT_S = 120.0
END_TIMEOUT_S = 60.0


def start(out: Path) -> subprocess.Popen:
    """A Ray run into ``out``, returned once its first report is written."""
    proc = subprocess.Popen([*CLI, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + FIRST_REPORT_TIMEOUT_S
    while not (out / "result.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no first report (exit {proc.poll()}): "
                                 f"{proc.communicate()[1][-2000:]}")
        time.sleep(0.2)
    return proc


def stat_of(pid: int) -> list[str] | None:
    return next((fields for p, fields in live_processes() if p == pid), None)


def trainer_pid(watchman: int) -> int:
    """The watchman's child: the process that trains."""
    (pid,) = [p for p, fields in live_processes() if int(fields[1]) == watchman]
    return pid


def group_members(pgid: int) -> list[int]:
    return [p for p, fields in live_processes() if int(fields[2]) == pgid]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_gone(pgid: int, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in left if stat_of(p) is not None]


def metrics_rows(out: Path) -> int:
    with open(out / "metrics.csv", newline="") as fh:
        return len(list(csv.DictReader(fh)))


def test_a_dead_raylet_is_a_clear_error_with_the_outputs_written(tmp_path):
    out = tmp_path / "run"
    proc = start(out)
    try:
        child = trainer_pid(proc.pid)
        (raylet,) = [p for p in group_members(child) if "/raylet/raylet " in cmdline(p)]
        os.kill(raylet, signal.SIGKILL)
        _, err = proc.communicate(timeout=END_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    # Ray either exits the driver at once (the watchman names the loss) or first reports the
    # actors dead (the backend finds its raylet gone and names the loss): one clear error.
    errors = [ln for ln in err.splitlines() if ln.startswith("impala-lab: error:")]
    assert len(errors) == 1, err[-3000:]
    assert ("the Ray cluster was lost" in errors[0]
            and ("exited with code 1 without ending the run" in errors[0]
                 or "this driver's raylet does not answer" in errors[0])), errors[0]
    assert "workers failed" not in err  # never taken for a broken env
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "error"
    assert "the Ray cluster was lost" in result["error"]
    assert metrics_rows(out) >= 1
    assert wait_gone(child) == []  # Ray's agents, orphaned by the raylet, were ended too


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_watchman_ends_the_run_cleanly(tmp_path, how):
    out = tmp_path / "run"
    proc = start(out)
    child = trainer_pid(proc.pid)
    try:
        proc.send_signal(how)
        proc.communicate(timeout=END_TIMEOUT_S)
        # SIGKILL: the watchman is gone at once, the run it watched ends on its own
        deadline = time.monotonic() + END_TIMEOUT_S
        while stat_of(child) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (143 if how == signal.SIGTERM else -signal.SIGKILL)
    assert stat_of(child) is None
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "interrupted"
    assert (out / "checkpoint" / "state.json").is_file()
    assert metrics_rows(out) >= 1
    assert wait_gone(child) == []


def test_check_raylet_tells_a_dead_raylet_from_a_live_one(tmp_path):
    import socket
    import types

    from impala_lab.backends.ray import RayBackend
    from impala_lab.errors import ClusterLostError

    path = str(tmp_path / "raylet")
    fake = types.SimpleNamespace(raylet_socket=path)
    RayBackend.check_raylet(fake, "no socket file: cannot tell")  # no error
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        RayBackend.check_raylet(fake, "the actor died")  # the raylet answers: no error
    # the socket file stays behind its dead listener, as a SIGKILLed raylet's does
    with pytest.raises(ClusterLostError, match=r"^the Ray cluster was lost: this driver's "
                       r"raylet does not answer on .*raylet \(ConnectionRefusedError: .*"
                       r"Ray's last report: the actor died$"):
        RayBackend.check_raylet(fake, "the actor died\nmore lines")
