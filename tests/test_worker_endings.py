"""How a worker process ends is said as it happened, and nothing it started outlives it.

- An env that calls ``sys.exit()`` is an error naming the call (it used to read "exited with
  code 0", with no hint).
- A worker killed with SIGKILL while the cgroup's OOM-kill count rose is named as killed by
  the kernel's out-of-memory killer; a plain ``kill -9`` is not.
- The processes an env starts (a simulator, a renderer) live in the worker's own session and
  are ended with it: when the driver stops the worker, and when the worker dies.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

import impala_lab.backends.process_handle as process_handle
from impala_lab.backends.process import ProcessBackend
from impala_lab.errors import WorkerError
from tests.backend_helpers import config, results
from tests.envs import FixedLengthEnv, SlowEnv
from tests.leaks import alive, wait_gone
from tests.waiting import wait_for


class ExitingEnv(FixedLengthEnv):
    """Calls ``sys.exit(code)`` at its ``at_step``-th step."""

    def __init__(self, code: Any = 0, at_step: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code, self.at_step = code, at_step

    def step(self, action: Any) -> tuple:
        if self.total_steps + 1 == self.at_step:
            sys.exit(self.code)
        return super().step(action)


class HelperEnv(SlowEnv):
    """Starts a ``sleep`` helper process at construction and writes its pid to ``pid_file``."""

    def __init__(self, pid_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.helper = subprocess.Popen(["sleep", "300"])
        with open(pid_file, "a") as fh:
            fh.write(f"{self.helper.pid}\n")


@pytest.mark.parametrize("code", [0, 3, "bye"])
def test_an_env_that_calls_sys_exit_is_named(code):
    backend = ProcessBackend(config(functools.partial(ExitingEnv, code=code), num_workers=1))
    try:
        handle = backend.make_worker(0)
        with pytest.raises(WorkerError, match=rf"the env called sys\.exit\({code!r}\), which "
                                              r"would end the worker process") as info:
            results(backend, [handle.sample()])
        assert "ExitingEnv" in str(info.value) and "sys.exit" in info.value.remote_traceback
    finally:
        backend.shutdown()


def _killed_worker_message(monkeypatch: pytest.MonkeyPatch, counts: list[int]) -> str:
    readings = iter(counts)
    monkeypatch.setattr(process_handle, "oom_kill_count", lambda: next(readings))
    hangs = functools.partial(SlowEnv, delay_s=3600.0, length=100)  # a sample never ends
    backend = ProcessBackend(config(hangs, num_workers=1, num_envs=1, T=10))
    try:
        handle = backend.make_worker(0)
        future = handle.sample()
        os.kill(handle.pid, signal.SIGKILL)
        with pytest.raises(WorkerError) as info:
            results(backend, [future])
        return str(info.value)
    finally:
        backend.shutdown()


def test_a_worker_killed_while_the_oom_count_rose_is_named_an_oom_kill(monkeypatch):
    message = _killed_worker_message(monkeypatch, [4, 5])
    assert ("was killed by SIGKILL (exit code -9): the kernel's out-of-memory killer ended it "
            "(the cgroup's oom_kill count rose from 4 to 5)") in message
    assert "lower num_workers or num_envs_per_worker" in message


def test_a_plain_kill_9_is_not_called_an_oom_kill(monkeypatch):
    message = _killed_worker_message(monkeypatch, [4, 4])
    assert "out-of-memory killer ended it" not in message
    assert "nothing in impala_lab kills a running worker that way" in message


def test_an_envs_helper_processes_end_with_a_stopped_worker(tmp_path):
    pid_file = tmp_path / "helpers"
    env = functools.partial(HelperEnv, str(pid_file), delay_s=0.01, length=100)
    backend = ProcessBackend(config(env, num_workers=1, num_envs=2))
    try:
        handle = backend.make_worker(0)
        results(backend, [handle.sample()])
        helpers = [int(p) for p in pid_file.read_text().split()]
        assert len(helpers) == 2 and all(alive(p) for p in helpers)
        assert os.getpgid(helpers[0]) == handle.pid  # the worker's own group
        backend.stop_worker(handle)
        assert wait_gone(helpers) == []
    finally:
        backend.shutdown()


def test_an_envs_helper_processes_end_when_their_worker_dies(tmp_path):
    pid_file = tmp_path / "helpers"
    env = functools.partial(HelperEnv, str(pid_file), delay_s=3600.0, length=100)  # hangs
    backend = ProcessBackend(config(env, num_workers=1, num_envs=1, T=10))
    try:
        handle = backend.make_worker(0)
        future = handle.sample()
        wait_for(pid_file.exists, "the env's helper started")
        helpers = [int(p) for p in pid_file.read_text().split()]
        os.kill(handle.pid, signal.SIGKILL)
        with pytest.raises(WorkerError):
            results(backend, [future])
        assert wait_gone(helpers) == []
    finally:
        backend.shutdown()
