"""The process backend: workers in spawned processes, driven through pipes and shared memory.

What every backend does is tested in test_backends.py; here what only this one does: weights
blocks, signals, exit codes, parents that die, scripts without a main guard. Spawning a
worker costs about 0.5-1 s, so the tests that only sample share one pair of workers (a module
fixture); the tests that break a worker start their own.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import multiprocess.connection
import numpy as np
import pytest

from impala_lab.backends.process import (
    ACTOR_THREAD_ENV,
    ProcessBackend,
    ProcessWorkerHandle,
    single_threaded_blas,
)
from impala_lab.backends.shared_weights import (
    SharedWeightsReader,
    read_shared_weights,
    write_shared_weights,
)
from impala_lab.backends.worker_process import _serve
from impala_lab.errors import WorkerError
from tests.backend_helpers import ENV3, B, T, config, model_for, results
from tests.envs import FixedLengthEnv, RaisingEnv, SlowEnv
from tests.leaks import alive, wait_gone
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]


def shm_names(prefix: str) -> set[str]:
    """The weights blocks in /dev/shm (and the owner's lock file, while one is there)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def block_names(prefix: str) -> set[str]:
    """The weights blocks alone, without the owner's lock file."""
    return shm_names(prefix) - {prefix + "lock"}


@pytest.fixture(scope="module")
def pair():
    backend = ProcessBackend(config())
    handles = [backend.make_worker(i) for i in range(2)]
    yield backend, handles
    pids = [h.pid for h in handles]
    backend.shutdown()
    assert wait_gone(pids, 0.1) == []


# ---------------------------------------------------------------------- sampling
def test_weight_blocks_are_reused_and_released(pair):
    backend, handles = pair
    model = model_for(ENV3)
    prefix = backend.blocks.prefix
    seen = set()
    refs = []
    for v in range(10, 16):
        ref = backend.put_weights(model.initial_weights(v), v)
        seen.add(ref.name)
        refs.append(ref)
        for h in handles:
            h.set_weights(ref)
        batches = results(backend, [h.sample() for h in handles])
        assert [b.policy_versions[0] for b in batches] == [v, v]
    in_use, free = backend.blocks.names()
    assert in_use == [ref.name]  # every worker answered after reading it: only the latest
    assert len(free) <= 2
    assert len(seen) <= 3, f"blocks are reused, not created per broadcast: {sorted(seen)}"
    assert block_names(prefix) == set(in_use) | set(free)
    assert prefix + "lock" in shm_names(prefix)  # the owner holds its lock while it lives
    # A reference to a released (maybe overwritten) block is refused, not silently read.
    with pytest.raises(ValueError, match=r"was already released; pass the reference the "
                                         r"latest put_weights\(\) returned"):
        handles[0].set_weights(refs[0])
    with pytest.raises(TypeError, match="SharedWeights"):
        handles[0].set_weights((model.initial_weights(0), 0))


def test_shared_weights_round_trip_any_dtype_and_shape():
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.5], np.float64),
               np.zeros((0, 4), np.float32), np.arange(5, dtype=np.int64)]
    block, ref = write_shared_weights(weights, version=9, serial=4, name=f"iltest{os.getpid()}")
    try:
        out = read_shared_weights(ref)
        assert [a.dtype for a in out] == [a.dtype for a in weights]
        for a, b in zip(out, weights):
            np.testing.assert_array_equal(a, b)
        write_shared_weights([w + 1 for w in weights], version=10, serial=5, block=block)
        with pytest.raises(ValueError, match=r"holds \(serial, version, arrays\) \(5, 10, 4\)"):
            read_shared_weights(ref)
    finally:
        block.close()
        block.unlink()


def test_reader_keeps_blocks_open_and_still_checks_the_header():
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    blocks, refs = [], []
    reader = SharedWeightsReader(max_open=2)
    try:
        for i in range(3):
            block, ref = write_shared_weights([w * i for w in weights], version=i, serial=i,
                                              name=f"iltest{os.getpid()}r{i}")
            blocks.append(block)
            refs.append(ref)
            np.testing.assert_array_equal(reader.read(ref)[0], weights[0] * i)
        assert list(reader._open) == [refs[1].name, refs[2].name]  # the oldest was closed
        write_shared_weights([w + 1 for w in weights], version=5, serial=9, block=blocks[2])
        # The open block now holds a later broadcast: refused, as without the cache.
        with pytest.raises(ValueError, match=r"holds \(serial, version, arrays\) \(9, 5, 1\)"):
            reader.read(refs[2])
    finally:
        reader.close()
        for block in blocks:
            block.close()
            block.unlink()
    assert reader._open == {}


def test_workers_never_import_tensorflow_and_ignore_sigint(pair):
    backend, handles = pair
    results(backend, [h.info() for h in handles])  # up: ignoring SIGINT from their first line
    for h in handles:
        os.kill(h.pid, signal.SIGINT)
    infos = results(backend, [h.info() for h in handles])
    for h, info in zip(handles, infos):
        assert info["pid"] == h.pid and info["ppid"] == os.getpid()
        assert info["tensorflow_imported"] is False
        assert info["keras_imported"] is False
        assert info["sigint_ignored"] is True
        assert 5e6 < info["rss_bytes"] < 200e6
    batches = results(backend, [h.sample() for h in handles])  # still working
    assert [b.count for b in batches] == [T * B, T * B]
    assert sorted(backend.worker_pids()) == sorted(h.pid for h in handles)
    assert all(h.is_alive() for h in handles)


def _environ_of(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def test_workers_start_with_one_blas_thread(monkeypatch):
    # set here, not inherited: the user's own value wins, the others are 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    backend = ProcessBackend(config(num_workers=1))
    try:
        worker = backend.make_worker(0)
        # Until the child has exec'd Python, /proc shows the environment the driver itself
        # was started with; a worker that has answered a request has long been past that.
        results(backend, [worker.sample()])
        env = _environ_of(worker.pid)
    finally:
        backend.shutdown()
    assert {name: env.get(name) for name in ACTOR_THREAD_ENV} == {
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1"}
    assert "OPENBLAS_NUM_THREADS" not in os.environ  # the driver's own is restored


def test_single_threaded_blas_keeps_what_the_user_set_and_restores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with single_threaded_blas():
        assert os.environ["OMP_NUM_THREADS"] == "3"
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "3"
    assert "OPENBLAS_NUM_THREADS" not in os.environ


# ---------------------------------------------------------------------- env factories
def test_lambda_closing_over_a_local_variable_travels_by_value():
    length = 4  # only the closure knows it: the worker must get it by value
    backend = ProcessBackend(config(lambda: FixedLengthEnv(length=length, obs_dim=3),
                                    num_workers=1))
    try:
        h = backend.make_worker(0)
        batch = results(backend, [h.sample()])[0]
        np.testing.assert_array_equal(batch.obs[:, 0, 0], [0, 1, 2, 3, 0])
        assert batch.obs.shape == (T, B, 3)
        assert h.env_id.endswith("<locals>.<lambda>")
    finally:
        backend.shutdown()


NOTEBOOK_SCRIPT = textwrap.dedent("""
    # Run with `python -c`: like a notebook, __main__ has no file a worker could import.
    import sys
    sys.path.insert(0, {root!r})
    import gymnasium as gym
    import numpy as np
    from impala_lab.backends.process import ProcessBackend
    from impala_lab.config import ImpalaConfig

    LENGTH = 4

    class CountingEnv(gym.Env):
        def __init__(self):
            self.observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
            self.action_space = gym.spaces.Discrete(2)
        def reset(self, *, seed=None, options=None):
            self.t = 0
            return np.zeros(1, np.float32), {{}}
        def step(self, action):
            self.t += 1
            return np.full(1, self.t, np.float32), 1.0, self.t >= LENGTH, False, {{}}

    class Doubled(gym.ObservationWrapper):
        def observation(self, obs):
            return 2 * obs

    def make_env():
        return Doubled(CountingEnv())

    backend = ProcessBackend(ImpalaConfig(env=make_env, num_workers=1, num_envs_per_worker=1,
                                          sample_batch_size=6, model=(8,), seed=0))
    try:
        batch = backend.make_worker(0).sample().result()
        print(batch.obs[:, 0, 0].tolist(), batch.episode_lengths.tolist())
    finally:
        backend.shutdown()
""")


def test_env_classes_defined_in_a_notebook_reach_the_worker():
    out = subprocess.run([sys.executable, "-c", NOTEBOOK_SCRIPT.format(root=str(ROOT))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 2.0, 4.0, 6.0, 0.0, 2.0] [4]"


def test_env_that_cannot_be_built_fails_the_first_request():
    backend = ProcessBackend(config(functools.partial(FixedLengthEnv, length=0),
                                    num_workers=1))
    try:
        h = backend.make_worker(3)
        f1, f2 = h.sample(), h.sample()
        results_or_errors = []
        for f in (f1, f2):
            with pytest.raises(WorkerError) as info:
                results(backend, [f])
            results_or_errors.append(info.value)
        first, second = results_or_errors
        assert first.worker_index == 3 and first.env_id == "FixedLengthEnv"
        assert "could not start: ValueError" in str(first)
        assert "length=0 must be >= 1" in first.remote_traceback
        assert "ended after an earlier error" in str(second)
        h.process.join(5)
        assert h.process.exitcode == 1
        assert not h.is_alive()
    finally:
        backend.shutdown()


# ---------------------------------------------------------------------- faults
def test_env_error_reaches_the_driver_with_the_worker_traceback():
    backend = ProcessBackend(config(functools.partial(RaisingEnv, every=3, length=10),
                                    num_workers=1, num_envs=1))
    try:
        h = backend.make_worker(0)
        model = model_for(RaisingEnv)
        ref = backend.put_weights(model.initial_weights(0), 0)
        h.set_weights(ref)
        f1, f2 = h.sample(), h.sample()
        done = []
        deadline = time.monotonic() + 20
        while len(done) < 2 and time.monotonic() < deadline:
            done += [f for f in backend.wait([f1, f2], 1.0) if f not in done]
        assert set(done) == {f1, f2}  # the error, then the worker's exit: both are done
        assert f1.completion_time <= f2.completion_time
        with pytest.raises(WorkerError) as info:
            f1.result()
        err = info.value
        assert err.worker_index == 0 and err.env_id == "RaisingEnv"
        assert "RuntimeError: boom at step 3" in str(err)
        assert 'raise RuntimeError(f"boom at step {self.total_steps}")' in err.remote_traceback
        assert "tests/envs.py" in err.remote_traceback
        assert "stepping env index 0" in err.remote_traceback  # the worker's note
        with pytest.raises(WorkerError, match="ended after an earlier error"):
            f2.result()
        h.process.join(5)
        assert h.process.exitcode == 1  # a broken env is not reused
        assert not h.is_alive()
        f3 = h.sample()  # a request to an ended worker fails at once
        assert f3.done()
        with pytest.raises(WorkerError):
            f3.result()
        assert backend.blocks.names()[0] == [ref.name]
    finally:
        backend.shutdown()
    assert shm_names(backend.blocks.prefix) == set()


HANGS = functools.partial(SlowEnv, delay_s=3600.0, length=100)  # a sample never ends


def test_wait_blocks_without_spinning_and_a_killed_worker_fails_its_futures(monkeypatch):
    backend = ProcessBackend(config(HANGS, num_workers=1, num_envs=1, T=10))
    try:
        h = backend.make_worker(5)
        assert isinstance(h, ProcessWorkerHandle)
        futs = [h.sample(), h.sample()]
        # It blocks in the OS's poll() on the pipe and the sentinel: one look, one wait for
        # the rest of the timeout, one last look. Polling would look again and again.
        timeouts: list[float | None] = []
        real_wait = multiprocess.connection.wait

        def recording_wait(objects, timeout=None):
            timeouts.append(timeout)
            return real_wait(objects, timeout)

        monkeypatch.setattr(multiprocess.connection, "wait", recording_wait)
        assert backend.wait(futs, 0.5) == []
        assert len(timeouts) <= 4 and 0.0 < max(timeouts) <= 0.5, timeouts
        monkeypatch.undo()

        os.kill(h.pid, signal.SIGKILL)
        # Woken by the pipe's EOF: a wait that ran out would return nothing.
        done = backend.wait(futs, 60.0)
        assert set(done) == set(futs)
        for f in futs:
            with pytest.raises(WorkerError) as info:
                f.result()
            assert info.value.worker_index == 5 and info.value.env_id == "SlowEnv"
            assert "was killed by SIGKILL (exit code -9)" in str(info.value)
            assert f"pid {h.pid}" in str(info.value)
        assert not h.is_alive()
        assert backend.worker_pids() == []
        backend.stop_worker(h)  # stopping a dead worker is fine
        assert backend.handles == []
    finally:
        backend.shutdown()


class FakePipe:
    """The worker's end of the pipe, in this process: ``driver_sends`` queues commands as the
    driver's pickled messages; ``answers`` are the worker's replies."""

    def __init__(self, *commands: tuple) -> None:
        self.incoming: list[bytes] = []
        self.answers: list[tuple] = []
        self.driver_sends(*commands)

    def driver_sends(self, *commands: tuple) -> None:
        self.incoming += [pickle.dumps(c, protocol=5) for c in commands]

    def recv_bytes(self) -> bytes:
        if not self.incoming:
            raise EOFError
        return self.incoming.pop(0)

    def poll(self, timeout: float) -> bool:
        return bool(self.incoming)

    def send_bytes(self, data: bytes) -> None:
        self.answers.append(pickle.loads(data))


class CountingWorker:
    """Samples "batch 1", "batch 2", ...; ``during_sample(n)`` runs inside the n-th sample."""

    env_id = "FakeEnv"

    def __init__(self, during_sample=lambda n: None) -> None:
        self.samples = 0
        self.during_sample = during_sample

    def sample(self) -> str:
        self.samples += 1
        self.during_sample(self.samples)
        return f"batch {self.samples}"


def test_a_worker_finishes_its_sample_then_reads_stop_before_the_queued_ones():
    pipe = FakePipe(("sample",))
    worker = CountingWorker(
        during_sample=lambda n: n == 1 and pipe.driver_sends(*[("sample",)] * 3, ("stop",)))
    _serve(pipe, worker, reader=None)  # returns: the worker process exits with code 0
    assert worker.samples == 1 and pipe.answers == [("ok", "batch 1")]
    assert pipe.incoming == []  # the queued samples were read, and dropped


def test_a_worker_serves_its_requests_in_order_until_the_pipe_closes():
    pipe = FakePipe(("sample",), ("sample",))
    worker = CountingWorker(during_sample=lambda n: n == 2 and pipe.driver_sends(("sample",)))
    with pytest.raises(EOFError):  # the driver closed the pipe: worker_main returns
        _serve(pipe, worker, reader=None)
    assert pipe.answers == [("ok", "batch 1"), ("ok", "batch 2"), ("ok", "batch 3")]


def test_stop_worker_fails_pending_requests_and_ends_the_process():
    backend = ProcessBackend(config(ENV3, num_workers=2, num_envs=1, T=20))
    try:
        h0, h1 = backend.make_worker(0), backend.make_worker(1)
        results(backend, [h0.sample()])  # the worker is up
        futs = [h0.sample() for _ in range(4)]
        backend.stop_worker(h0)
        # It read "stop" and exited by itself (code 0), not terminated after the join.
        assert h0.exitcode == 0
        assert not alive(h0.pid)
        for f in futs:
            assert f.done()
            with pytest.raises(WorkerError, match="stopped by the driver"):
                f.result()
        assert backend.handles == [h1]
        backend.stop_worker(h0)  # twice: nothing left to do
        assert h0.exitcode == 0 and not h0.is_alive()
        assert results(backend, [h1.sample()])[0].count == 20
    finally:
        backend.shutdown()


# ---------------------------------------------------------------------- lifetimes
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
    from impala_lab.config import ImpalaConfig
    from impala_lab.actor.numpy_model import NumpyModel
    from tests.envs import SlowEnv

    mode, inside = {mode!r}, {inside!r}

    def sleep_inside(seconds):  # marks this worker as inside a sample, then sleeps
        open(os.path.join(inside, str(os.getpid())), "w").close()
        time.sleep(seconds)

    # mode "sleep": every sample hangs (an hour per step), so a worker is deaf to its pipe
    delay = 0.0 if mode != "sleep" else 3600.0
    env = functools.partial(SlowEnv, delay_s=delay, length=3, sleep=sleep_inside)
    backend = ProcessBackend(ImpalaConfig(env=env, num_workers=2, num_envs_per_worker=2,
                                          sample_batch_size=5, model=(8,), seed=0))
    handles = [backend.make_worker(i) for i in range(2)]
    e = env()
    weights = NumpyModel(e.observation_space, e.action_space,
                         backend.config.model_spec).initial_weights(0)
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
    from impala_lab.config import ImpalaConfig
    from impala_lab.errors import WorkerError
    from impala_lab.actor.numpy_model import NumpyModel
    from tests.envs import FixedLengthEnv

    env = functools.partial(FixedLengthEnv, length=3)
    backend = ProcessBackend(ImpalaConfig(env=env, num_workers=2, num_envs_per_worker=2,
                                          sample_batch_size=5, model=(8,), seed=0))
    handles = [backend.make_worker(i) for i in range(2)]
    e = env()
    weights = NumpyModel(e.observation_space, e.action_space,
                         backend.config.model_spec).initial_weights(0)
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


# ---------------------------------------------------------------------- futures
def test_a_pending_future_waits_in_the_wait_the_backend_injected():
    # No process: the handle's pipe and process are stand-ins, and the "backend" is the
    # wait function handed in, which reads the answer off the pipe as ProcessBackend does.
    import ast
    import pickle
    import threading
    from types import SimpleNamespace

    from impala_lab.backends import process_handle
    from impala_lab.backends.shared_weights import WeightBlocks

    sent: list[bytes] = []
    conn = SimpleNamespace(send_bytes=sent.append)
    process = SimpleNamespace(pid=12345, is_alive=lambda: True)
    waited = []

    def wait_until_done(fut):
        waited.append(fut)
        handle._on_answer(pickle.dumps(("ok", "the batch")))

    lock = threading.RLock()
    handle = process_handle.ProcessWorkerHandle(0, process, conn, "Env-v0", lock=lock,
                                                blocks=WeightBlocks(lock),
                                                wait_until_done=wait_until_done)
    fut = handle.sample()
    assert pickle.loads(sent[0]) == ("sample",) and not fut.done() and waited == []
    assert fut.result() == "the batch" and waited == [fut] and fut.done()
    assert fut.result() == "the batch" and waited == [fut]  # done: no second wait
    # The handle's module needs no backend: not even a type-checking import of it.
    tree = ast.parse(Path(process_handle.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "impala_lab.backends.process" not in imported
