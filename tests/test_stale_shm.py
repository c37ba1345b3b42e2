"""Weights blocks left in /dev/shm by a driver killed with its whole process group.

Each new `ProcessBackend` unlinks this user's ``il<pid>_*`` blocks whose driver is gone (or
whose pid now belongs to a process that started after the block was written), and leaves
live drivers' blocks alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from impala_lab import ImpalaConfig
from impala_lab.backends.process import ProcessBackend

SHM = Path("/dev/shm")
REPO = Path(__file__).resolve().parents[1]
CONFIG = dict(backend="process", num_workers=1, num_envs_per_worker=1, sample_batch_size=10,
              train_batch_size=10, model=(8,), seed=0)

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm (not Linux)")


def blocks_of(pid: int) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"il{pid}_*"))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def start_backend() -> None:
    ProcessBackend(ImpalaConfig(**CONFIG)).shutdown()


DRIVER = textwrap.dedent("""
    import numpy as np
    from impala_lab import ImpalaConfig
    from impala_lab.backends.process import ProcessBackend

    backend = ProcessBackend(ImpalaConfig(backend="process", num_workers=1, model=(8,)))
    for version in range(3):  # the latest block and those kept for reuse
        backend.put_weights([np.full(1000, version, np.float32)], version)
    print("ready", flush=True)
    import time
    time.sleep(60)
""")


def test_blocks_of_a_driver_killed_with_its_process_group_go_when_a_backend_starts():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE,
                              text=True, env=env, start_new_session=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        assert blocks_of(driver.pid), "the driver made no weights block"
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its resource tracker
        driver.wait(timeout=10)
        time.sleep(0.5)
        left = blocks_of(driver.pid)
        assert left, "nothing was left behind to clean up"
        start_backend()
        assert blocks_of(driver.pid) == [], f"stale blocks still in /dev/shm: {left}"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        for name in blocks_of(driver.pid):
            (SHM / name).unlink(missing_ok=True)


def test_only_blocks_whose_driver_is_gone_are_removed():
    live = subprocess.Popen(["sleep", "60"])
    reused = subprocess.Popen(["sleep", "60"])
    gone = dead_pid()
    made = {
        "stale": SHM / f"il{gone}_a1b2c3_0",
        "live": SHM / f"il{live.pid}_a1b2c3_0",
        "reused": SHM / f"il{reused.pid}_a1b2c3_0",  # written an hour before its pid started
        "other name": SHM / f"il{gone}_not_a_block",
        "ours": SHM / f"il{os.getpid()}_a1b2c3_7",
    }
    try:
        for path in made.values():
            path.write_bytes(b"\0" * 64)
        hour_ago = time.time() - 3600
        os.utime(made["reused"], (hour_ago, hour_ago))
        start_backend()
        assert not made["stale"].exists()
        assert not made["reused"].exists()
        assert made["live"].exists()
        assert made["other name"].exists()
        assert made["ours"].exists()
    finally:
        for proc in (live, reused):
            proc.kill()
            proc.wait()
        for path in made.values():
            path.unlink(missing_ok=True)
