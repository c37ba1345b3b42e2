"""bench.cores: CPU time per thread and per process from /proc, and the shares (no training)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from bench import cores

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_thread_is_counted_apart_from_the_main_thread():
    tid = []
    started, go, spun, release = (threading.Event() for _ in range(4))

    def busy():
        tid.append(threading.get_native_id())
        started.set()
        go.wait(30)  # spins only after the first read
        _spin(0.3)
        spun.set()
        release.wait(30)  # alive until read: a thread's /proc entry goes when it ends

    before = cores.thread_times(os.getpid())
    thread = threading.Thread(target=busy)
    thread.start()
    try:
        started.wait(30)
        mid = cores.snapshot(threading.get_native_id(), tid[0], [])
        go.set()
        spun.wait(30)
        after = cores.snapshot(threading.get_native_id(), tid[0], [])
    finally:
        go.set()
        release.set()
        thread.join()
    # the thread's CPU time between the two reads: the 0.3 s it spun (clock ticks of 10 ms)
    assert 0.25 <= after["learner thread"] - mid["learner thread"] <= 1.0
    assert tid[0] not in before  # a new thread, not one of those before
    assert set(after) == {"driver main thread", "learner thread", "TensorFlow threads",
                          "other driver threads"}


def test_a_process_cpu_time_and_a_gone_one():
    assert cores.cpu_seconds(f"/proc/{os.getpid()}/stat") > 0
    assert cores.cpu_seconds("/proc/999999999/stat") is None


def test_shares_divide_by_wall_time_and_cores_and_leave_the_rest_idle():
    before = {"driver main thread": 1.0, "learner thread": 2.0, "worker 0": 0.0}
    after = {"driver main thread": 3.0, "learner thread": 6.0, "worker 0": 5.0}
    s = cores.shares(before, after, wall_s=10.0, num_cores=2)
    assert s["driver main thread"] == {"cores": 0.2, "share": 0.1}
    assert s["learner thread"] == {"cores": 0.4, "share": 0.2}
    assert s["worker 0"] == {"cores": 0.5, "share": 0.25}
    assert s["idle"] == {"cores": 0.9, "share": 0.45}


def test_the_table_names_every_part_and_the_throughput():
    run = {"env": "CartPole-v1", "num_workers": 2, "num_envs_per_worker": 8, "wall_s": 20.0,
           "num_cores": 2, "num_sgd_iter": 1, "sampled_per_s": 120000, "trained_per_s": 119000,
           "learner_queue_mean": 0.5, "learner_dequeue_time_ms": 1.25,
           "learner_grad_time_ms": 6.5,
           "parts": {"learner thread": {"cores": 0.61, "share": 0.305},
                     "idle": {"cores": 0.05, "share": 0.025}}}
    text = cores.markdown([run])
    assert "**CartPole-v1** (tuned preset, 2 workers x 8 envs, 20 s on 2 cores)" in text
    assert "| learner thread | 0.61 | 30% |" in text and "| idle | 0.05 | 2% |" in text
    assert "Sampled 120,000 and trained 119,000 env steps/s (num_sgd_iter 1)" in text


def test_an_env_without_its_package_is_named_with_the_package():
    assert cores.unavailable("CartPole-v1") == ""
    assert "ale-py" in cores.unavailable("ALE/NoSuchGame-v5")
