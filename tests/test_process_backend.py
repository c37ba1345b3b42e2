"""The process backend: workers in spawned processes, driven through pipes and shared memory.

What every backend does is tested in test_backends.py; here what only this one does: weights
blocks, signals, env factories, faults and exit codes, futures. How its workers end (shutdown,
parents that die, scripts without a main guard) is in test_process_backend_lifetimes.py.
Spawning a worker costs about 0.5-1 s, so the tests that only sample share one pair of workers
(a module fixture); the tests that break a worker start their own.
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
from tests.backend_helpers import ENV3, B, T, config, model_for, results, shm_names
from tests.envs import FixedLengthEnv, RaisingEnv, SlowEnv
from tests.leaks import alive, wait_gone

ROOT = Path(__file__).resolve().parents[1]


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
