"""The process backend's lifetimes: how its workers end, and what they leave behind.

A shutdown, a parent killed mid-sample, a clean exit with or without shutdown(), an exit while
a background thread drives the workers, a script without a main guard: each must leave no
worker process, no weights block in /dev/shm and no warning. Most run a driver script in a
child process, so that it can die or exit under its workers. Sampling, env factories, faults
and futures are in test_process_backend.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from impala_lab.backends.process import ProcessBackend
from tests.backend_helpers import ENV3, config, model_for, results, shm_names
from tests.leaks import alive, wait_gone
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]


def test_shutdown_ends_every_worker_in_order_and_leaves_no_process_or_block():
    backend = ProcessBackend(config(ENV3, num_workers=2))
    handles = [backend.make_worker(i) for i in range(2)]
    ref = backend.put_weights(model_for(ENV3).initial_weights(0), 0)
    for h in handles:
        h.set_weights(ref)
    futs = [h.sample() for h in handles for _ in range(2)]
    results(backend, futs[:1])
    pids = [h.pid for h in handles]
    prefix = backend.blocks.prefix
    assert shm_names(prefix)
    backend.shutdown()
    # Each read "stop" and exited by itself (code 0), none terminated after the join.
    assert [h.exitcode for h in handles] == [0, 0]
    assert wait_gone(pids, 0.1) == []
    assert shm_names(prefix) == set()
    backend.shutdown()  # again: nothing to do
    assert backend.worker_pids() == []
    with pytest.raises(RuntimeError, match="shut down"):
        backend.make_worker(2)


PARENT_SCRIPT = textwrap.dedent("""
    import functools, os, sys, time
    sys.path.insert(0, {root!r})
    from impala_lab.backends.process import ProcessBackend
    from tests.backend_helpers import config, model_for
    from tests.envs import SlowEnv

    mode, inside = {mode!r}, {inside!r}

    def sleep_inside(seconds):  # marks this worker as inside a sample, then sleeps
        open(os.path.join(inside, str(os.getpid())), "w").close()
        time.sleep(seconds)

    # mode "sleep": every sample hangs (an hour per step), so a worker is deaf to its pipe
    delay = 0.0 if mode != "sleep" else 3600.0
    env = functools.partial(SlowEnv, delay_s=delay, length=3, sleep=sleep_inside)
    backend = ProcessBackend(config(env))
    handles = [backend.make_worker(i) for i in range(2)]
    weights = model_for(env).initial_weights(0)
    for h in handles:
        h.info().result()  # the worker is up
    for v in range(3):
        ref = backend.put_weights(weights, v)
        for h in handles:
            h.set_weights(ref)
        futures = [h.sample() for h in handles]
        if mode != "sleep":
            for f in futures:
                f.result()
    while mode == "sleep" and len(os.listdir(inside)) < 2:
        time.sleep(0.01)  # until each worker is inside its hanging sample
    print(backend.blocks.prefix, *backend.worker_pids(), flush=True)
    if mode == "sleep":
        time.sleep(60)
    elif mode == "shutdown":
        backend.shutdown()
    # "exit": leave it to the atexit hook
""")


def run_parent(mode: str, inside: Path) -> subprocess.Popen:
    """The script in ``mode``; its workers mark themselves in the folder ``inside`` when
    they enter a sample."""
    script = PARENT_SCRIPT.format(root=str(ROOT), mode=mode, inside=str(inside))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def test_workers_exit_when_their_parent_is_killed(tmp_path):
    # The workers are inside samples that never end when the parent dies, so only their
    # watchdog (not a closed pipe) can end them.
    parent = run_parent("sleep", tmp_path)
    pids: list[int] = []
    try:
        line = parent.stdout.readline().split()
        assert len(line) == 3, parent.stderr.read()
        prefix, pids = line[0], [int(p) for p in line[1:]]
        assert all(alive(p) for p in pids)
        parent.kill()
        parent.wait(60)
        assert wait_gone(pids, 60.0) == [], "workers outlived their parent"
        # The resource tracker unlinks the weights blocks once the workers are gone.
        wait_for(lambda: not shm_names(prefix), "the weights blocks unlinked")
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()
        parent.stderr.close()
        for pid in wait_gone(pids, 0.0):  # a failed test leaves no hanging worker behind
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["shutdown", "exit"])
def test_clean_exit_leaves_no_block_and_no_warning(mode, tmp_path):
    parent = run_parent(mode, tmp_path)
    out, err = parent.communicate(timeout=30)
    assert parent.returncode == 0, err
    prefix, *pids = out.split()
    assert wait_gone([int(p) for p in pids], 1.0) == []
    assert shm_names(prefix) == set()
    assert "resource_tracker" not in err and "leaked" not in err, err
    assert "Traceback" not in err, err


THREAD_SCRIPT = textwrap.dedent("""
    import functools, os, sys, threading, time
    sys.path.insert(0, {root!r})
    from impala_lab.backends.process import ProcessBackend
    from impala_lab.errors import WorkerError
    from tests.backend_helpers import config, model_for
    from tests.envs import FixedLengthEnv

    env = functools.partial(FixedLengthEnv, length=3)
    backend = ProcessBackend(config(env))
    handles = [backend.make_worker(i) for i in range(2)]
    weights = model_for(env).initial_weights(0)
    done = [0]

    def drive():  # a driver loop in a daemon thread, as Impala.start() runs one
        futures = [h.sample() for h in handles for _ in range(2)]
        version = 0
        try:
            while True:
                for f in backend.wait(futures, 0.1):
                    futures.remove(f)
                    f.result()
                    done[0] += 1
                    version += 1
                    f.handle.set_weights(backend.put_weights(weights, version))
                    futures.append(f.handle.sample())
        except WorkerError as exc:  # the expected end: the workers were stopped under it
            assert "stopped by the driver" in str(exc), exc
        except RuntimeError as exc:  # put_weights after shutdown
            assert "shut down" in str(exc), exc
        except BaseException as exc:
            os.write(2, f"UNEXPECTED {{exc!r}}".encode())
            raise

    threading.Thread(target=drive, daemon=True).start()
    while done[0] < 20:
        time.sleep(0.05)
    print(backend.blocks.prefix, *backend.worker_pids(), flush=True)
    # The interpreter exits now, with the thread in backend.wait(): the atexit hook stops
    # the workers under it.
""")


def test_exit_while_a_background_thread_drives_the_workers():
    out = subprocess.run([sys.executable, "-c", THREAD_SCRIPT.format(root=str(ROOT))],
                         capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    prefix, *pids = out.stdout.split()
    assert len(pids) == 2
    assert wait_gone([int(p) for p in pids], 2.0) == []
    assert shm_names(prefix) == set()


@pytest.mark.slow
def test_a_script_without_a_main_guard_is_told_how_to_fix_it(tmp_path):
    import subprocess
    import textwrap

    script = tmp_path / "train_me.py"
    script.write_text(textwrap.dedent("""
        from impala_lab import Impala, ImpalaConfig

        run = Impala(ImpalaConfig.tuned("CartPole-v1", num_workers=1,
                                        restart_failed_workers=False))
        run.train(max_env_steps=2000)
    """))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "exited with code 1; its pending sample requests are lost while starting" in (
        proc.stderr)
    assert f"The script {str(script)!r} has no 'if __name__ == \"__main__\":' guard" in (
        proc.stderr)
    # With the guard the same script trains.
    script.write_text("if __name__ == '__main__':\n" + textwrap.indent(
        script.read_text().replace("run.train", "print(run.train").rstrip() + "['stop_reason'])",
        "    ") + "\n    run.stop()\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("max_env_steps")

