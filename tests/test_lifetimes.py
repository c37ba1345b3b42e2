"""Whole runs on the process backend: learning, and no child process left behind, ever."""

from __future__ import annotations

import _thread
import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import impala_lab
from impala_lab import Impala, ImpalaConfig
from tests.leaks import alive, children_of, wait_gone
from tests.signals import default_sigint

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_process_backend_learns_cartpole_within_bounded_env_steps():
    # The tuned preset: the older recipe here (Adam, grad_clip 40) sometimes collapsed to a
    # return of 9.3 (notebook 06), and the process backend's timing picks which runs do.
    cfg = ImpalaConfig.tuned("CartPole-v1", backend="process", seed=0)
    with Impala(cfg) as run:
        assert len(run.backend.worker_pids()) == 2
        result = run.train(lambda s: s["episode_return_count"] >= 20
                           and s["episode_return_mean"] >= 195,
                           max_env_steps=1_500_000, report_interval=0.5)
    assert result["stop_reason"] == "stop condition", result["episode_return_mean"]
    assert result["num_steps_sampled"] <= 1_500_000


def test_stop_and_context_manager_leave_no_worker_behind():
    with Impala(ImpalaConfig(backend="process", seed=1)) as run:
        run.train(max_env_steps=500)
        pids = run.backend.worker_pids()
        assert len(pids) == 2 and all(alive(p) for p in pids)
    assert wait_gone(pids) == []
    assert run.stopped


def test_a_dropped_run_is_cleaned_up_by_garbage_collection():
    run = Impala(ImpalaConfig(backend="process", seed=2))
    pids = run.backend.worker_pids()
    del run
    gc.collect()
    assert wait_gone(pids) == []


def test_shutdown_all_ends_every_run():
    runs = [Impala(ImpalaConfig(backend="process", num_workers=1, seed=s)) for s in (3, 4)]
    pids = [p for r in runs for p in r.backend.worker_pids()]
    assert len(pids) == 2
    impala_lab.shutdown_all()
    assert all(r.stopped for r in runs)
    assert wait_gone(pids) == []


def test_keyboard_interrupt_in_train_ends_the_run_and_its_workers():
    run = Impala(ImpalaConfig(backend="process", seed=5))
    pids = run.backend.worker_pids()
    # interrupt_main does nothing while SIGINT is ignored (a background `make test`): set up
    # Python's own handler for this test, as in an interactive session.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(2.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.train(max_seconds=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert run.stopped
    assert wait_gone(pids) == []
    # running the cell again works: a fresh run starts
    with Impala(ImpalaConfig(backend="process", num_workers=1, seed=6)) as again:
        again.train(max_env_steps=200)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_cli_interrupt_ends_within_10_s_with_results_and_checkpoint(tmp_path, sig):
    out = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "impala_lab.cli", "train", "--max-seconds", "300",
         "--report-interval", "0.5", "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    try:
        for line in proc.stdout:  # wait until training reports sampled env steps
            match = re.search(r"steps\s+([\d,]+)", line)
            if match and int(match.group(1).replace(",", "")) > 0:
                break
        workers = children_of(proc.pid)
        assert workers, "the CLI should have started worker processes"
        start = time.monotonic()
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=10)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert elapsed < 10, elapsed
    assert proc.returncode == 128 + sig, stderr[-2000:]  # 130, 143, 129: which signal it was
    assert "interrupted" in stdout
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "interrupted"
    assert result["final"]["num_steps_sampled"] > 0
    assert (out / "checkpoint" / "state.json").is_file()
    assert (out / "metrics.csv").is_file() and (out / "report.png").is_file()
    assert wait_gone(workers, timeout=5) == []
