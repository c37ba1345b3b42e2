"""Weights blocks left in /dev/shm by a driver killed with its whole process group.

Each new `ProcessBackend` unlinks this user's ``il<pid>_*`` blocks whose owner's lock file
nobody holds any more, and leaves live drivers' blocks, and blocks without a lock file, alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from impala_lab import ImpalaConfig
from impala_lab.backends.process import ProcessBackend
from tests.leaks import wait_gone

SHM = Path("/dev/shm")
REPO = Path(__file__).resolve().parents[1]
CONFIG = dict(backend="process", num_workers=1, num_envs_per_worker=1, sample_batch_size=10,
              train_batch_size=10, model=(8,), seed=0)

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm (not Linux)")


def blocks_of(pid: int) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"il{pid}_*"))


def group_members(pgid: int) -> list[int]:
    """The pids of the processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    members.append(int(entry))
            except ProcessLookupError:
                pass
    return members


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
        group = group_members(driver.pid)  # the driver and its resource tracker
        assert driver.pid in group and len(group) >= 2
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        assert wait_gone(group, 60) == []  # no process of the group could unlink them now
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


def test_blocks_without_a_lock_file_and_other_names_are_left_alone():
    # whatever their pid says: without the owner's lock file they are not this module's
    gone = dead_pid()
    made = [SHM / f"il{gone}_a1b2c3_0", SHM / f"il{gone}_not_a_block",
            SHM / f"il{os.getpid()}_a1b2c3_7"]
    unheld = [SHM / f"il{gone}_d4e5f6_0", SHM / f"il{gone}_d4e5f6_lock"]
    try:
        for path in [*made, *unheld]:
            path.write_bytes(b"\0" * 64)
        start_backend()
        assert [p for p in made if not p.exists()] == []
        assert [p for p in unheld if p.exists()] == []  # a lock nobody holds: stale
    finally:
        for path in [*made, *unheld]:
            path.unlink(missing_ok=True)


LOCK_HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.readline()
""")


def test_a_block_whose_owner_holds_its_lock_is_kept_whatever_its_pid_says():
    # A driver in another PID namespace: its pid means nothing here (here it is dead), but the
    # lock it holds on <prefix>lock is seen from every namespace that shares /dev/shm.
    prefix = f"il{dead_pid()}_c0ffee_"
    blocks = [SHM / f"{prefix}{n}" for n in range(3)]
    lock = SHM / f"{prefix}lock"
    for path in [*blocks, lock]:
        path.write_bytes(b"\0" * 64)
    owner = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "locked"
        start_backend()
        assert all(p.exists() for p in [*blocks, lock]), "a live owner's blocks were removed"
        owner.stdin.write("\n")
        owner.stdin.flush()
        owner.wait(timeout=10)  # the owner is gone: the kernel released its lock
        start_backend()
        assert [p for p in [*blocks, lock] if p.exists()] == []
    finally:
        owner.kill()
        owner.wait()
        for path in [*blocks, lock]:
            path.unlink(missing_ok=True)


def test_a_backend_holds_its_lock_while_it_lives_and_removes_it_when_it_ends():
    from impala_lab.backends.shared_weights import WeightBlocks

    blocks = WeightBlocks()
    lock = SHM / f"{blocks.prefix}lock"
    try:
        assert lock.exists()
        fd = os.open(lock, os.O_RDONLY)
        try:
            import fcntl

            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        blocks.close()
    assert not lock.exists()


def test_a_block_removed_from_outside_is_recreated_and_a_reader_says_it_is_gone():
    import numpy as np

    from impala_lab.backends.shared_weights import (
        BlockGoneError,
        SharedWeightsReader,
        WeightBlocks,
    )

    blocks = WeightBlocks()
    reader = SharedWeightsReader()
    try:
        refs = [blocks.put([np.full(100, v, np.float32)], v) for v in range(3)]
        _, kept = blocks.names()
        assert kept, "no block kept for reuse"
        for name in kept:  # a /dev/shm cleaner removes the blocks kept for reuse
            (SHM / name).unlink()
        with pytest.raises(BlockGoneError, match=f"{kept[0]}.*is gone from shared memory"):
            reader.read(next(r for r in refs if r.name == kept[0]))
        ref = blocks.put([np.full(100, 7, np.float32)], 7)
        assert ref.name not in kept and (SHM / ref.name).exists()
        np.testing.assert_array_equal(reader.read(ref)[0], np.full(100, 7, np.float32))
    finally:
        reader.close()
        blocks.close()


UNSHARED_DRIVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from impala_lab.backends.shared_weights import SharedWeightsReader, WeightBlocks

    blocks = WeightBlocks()
    ref = blocks.put([np.arange(10, dtype=np.float32)], 1)
    print(os.getpid(), ref.name, flush=True)
    sys.stdin.readline()  # the other namespace cleans up meanwhile
    print(SharedWeightsReader().read(ref)[0].sum(), flush=True)
    blocks.close()
""")


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(),
                    reason="a PID namespace of its own needs root and util-linux's unshare")
def test_a_live_run_in_another_pid_namespace_keeps_its_blocks():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                               "-c", UNSHARED_DRIVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid_inside, name = driver.stdout.readline().split()
        assert int(pid_inside) < 10  # its own namespace: the pid here is another process's
        start_backend()  # runs the stale-block cleanup in this namespace
        assert (SHM / name).exists()
        driver.stdin.write("\n")
        driver.stdin.flush()
        assert float(driver.stdout.readline()) == 45.0
        assert driver.wait(timeout=30) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
