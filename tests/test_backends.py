"""The contract every backend keeps (inline, process and ray): the driver's loop runs on any.

Each test runs once per backend. Ray starts once for the module (a private local Ray, 2 CPUs,
about 7 s); CI installs the ``ray`` extra, so a missing Ray fails loudly. What only one
backend does (shared-memory blocks, actor placement, exit codes) is tested in its own file.
"""

from __future__ import annotations

import functools
import itertools
import threading

import numpy as np
import pytest

from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.backends import BACKENDS, backend_class, make_backend
from impala_lab.backends.worker_info import worker_info
from impala_lab.batch import SampleBatch
from impala_lab.config_checks import BACKENDS as CONFIG_BACKENDS
from impala_lab.errors import WorkerError
from impala_lab.model_spec import ModelSpec
from tests.backend_helpers import ENV3, HIDDENS, B, T, config, model_for, results
from tests.envs import FixedLengthEnv, RaisingEnv
from tests.leaks import wait_gone
from tests.waiting import wait_for

DESCRIBE = {"inline": "worker {index} (inline, env FixedLengthEnv)",
            "process": "worker {index} (process {pid}, env FixedLengthEnv)",
            "ray": "worker {index} (Ray actor, env FixedLengthEnv)"}


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module's ray cases, shut down after them."""
    import ray

    from impala_lab.backends.ray import RayBackend

    assert not ray.is_initialized()
    keeper = RayBackend(config(backend="ray"), ray_init_kwargs={"num_cpus": 2})
    yield
    keeper.shutdown()
    assert not ray.is_initialized()


@pytest.fixture(params=list(BACKENDS))
def name(request) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


@pytest.fixture
def build(name):
    """``build(env, **config)``: a backend of the case's kind, shut down after the test."""
    made = []

    def build_backend(env=ENV3, **kw):
        backend = make_backend(config(env, backend=name, **kw))
        made.append(backend)
        return backend

    yield build_backend
    for backend in made:
        backend.shutdown()


def test_one_registry_names_every_backend():
    assert list(BACKENDS) == list(CONFIG_BACKENDS)
    with pytest.raises(ValueError, match=r"backend='zzz' is invalid: choose one of 'process'"):
        backend_class("zzz")


def test_make_backend_builds_the_named_backend(name, build):
    backend = build()
    assert isinstance(backend, backend_class(name)) and backend.name == name
    assert backend.handles == []
    assert backend.worker_pids() == []


def test_samples_are_valid_batches_in_request_order(name, build):
    backend = build()
    handles = [backend.make_worker(i) for i in range(2)]
    model = model_for(ENV3)
    w7 = model.initial_weights(7)
    model.set_weights(w7)
    ref = backend.put_weights(w7, 7)
    for h in handles:
        h.set_weights(ref)
    futs = [[h.sample() for _ in range(3)] for h in handles]  # three in flight per worker
    for h, fs in zip(handles, futs):
        batches = results(backend, fs)
        times = [f.completion_time for f in fs]
        assert None not in times and times == sorted(times)
        for k, batch in enumerate(batches):
            assert isinstance(batch, SampleBatch)
            batch.validate(check_values=True)
            assert batch.obs.shape == (T, B, 2) and batch.behaviour_logits.shape == (T, B, 2)
            assert batch.policy_versions.tolist() == [7] * B
            # FixedLengthEnv: obs[..., 0] counts the steps of the episode (length 3), so the
            # k-th batch continues exactly where the (k-1)-th ended.
            expected = (k * T + np.arange(T)) % 3
            np.testing.assert_array_equal(batch.obs[:, :, 0], np.stack([expected] * B, 1))
            logits, _ = model(batch.obs.reshape(T * B, 2))
            np.testing.assert_allclose(batch.behaviour_logits.reshape(T * B, 2), logits,
                                       rtol=1e-5, atol=1e-6)
            assert batch.episode_lengths.tolist() == [3] * len(batch.episode_lengths)
        for a, b in itertools.pairwise(batches):
            np.testing.assert_array_equal(a.bootstrap_obs, b.obs[0])
        assert h.is_alive()
        assert h.describe() == DESCRIBE[name].format(index=h.index, pid=getattr(h, "pid", 0))


def test_set_weights_applies_before_the_next_request_only(build):
    backend = build(num_workers=1)
    h = backend.make_worker(0)
    model = model_for(ENV3)
    w1, w2 = model.initial_weights(1), model.initial_weights(2)
    h.set_weights(backend.put_weights(w1, 1))
    f1, f2 = h.sample(), h.sample()
    h.set_weights(backend.put_weights(w2, 2))
    f3 = h.sample()
    b1, b2, b3 = results(backend, [f1, f2, f3])
    assert [b.policy_versions.tolist() for b in (b1, b2, b3)] == [[1, 1], [1, 1], [2, 2]]
    model.set_weights(w2)
    logits, _ = model(b3.obs.reshape(T * B, 2))
    np.testing.assert_allclose(b3.behaviour_logits.reshape(T * B, 2), logits, rtol=1e-5,
                               atol=1e-6)


def test_an_env_error_is_a_worker_error_with_its_stage_message_and_traceback(build):
    backend = build(functools.partial(RaisingEnv, every=3, length=10), num_workers=1,
                    num_envs=1)
    h = backend.make_worker(4)
    h.set_weights(backend.put_weights(model_for(RaisingEnv).initial_weights(0), 0))
    with pytest.raises(WorkerError) as info:
        results(backend, [h.sample()])
    err = info.value
    assert (err.worker_index, err.env_id) == (4, "RaisingEnv")
    assert err.stage == "worker 4 (env RaisingEnv)"
    assert err.message == "RuntimeError: boom at step 3"
    assert str(err).startswith("worker 4 (env RaisingEnv) failed: RuntimeError: boom at step 3")
    assert 'raise RuntimeError(f"boom at step {self.total_steps}")' in err.remote_traceback
    assert "tests/envs.py" in err.remote_traceback
    # A broken env is not reused: its worker exits right after the error record.
    wait_for(lambda: not h.is_alive(), "the broken worker's exit")


def test_stop_worker_ends_one_worker_and_the_others_go_on(build):
    backend = build()
    h0, h1 = backend.make_worker(0), backend.make_worker(1)
    results(backend, [h0.sample(), h1.sample()])
    backend.stop_worker(h0)
    assert not h0.is_alive()
    assert backend.handles == [h1]
    backend.stop_worker(h0)  # twice: nothing left to do
    assert results(backend, [h1.sample()])[0].count == T * B


def test_wait_returns_the_done_futures_and_nothing_for_nothing(build):
    backend = build(num_workers=1)
    h = backend.make_worker(0)
    # Nothing to wait for returns at once: neither "no limit" nor an hour blocks.
    answers: list = []
    waiter = threading.Thread(
        target=lambda: answers.extend([backend.wait([], None), backend.wait([], 3600.0)]),
        daemon=True)
    waiter.start()
    waiter.join(60)
    assert answers == [[], []], "wait([]) blocked"
    fut = h.sample()
    assert results(backend, [fut])[0].count == T * B
    assert backend.wait([fut], 0) == [fut]


def test_shutdown_ends_every_worker_and_is_idempotent(build):
    backend = build()
    handles = [backend.make_worker(i) for i in range(2)]
    results(backend, [h.sample() for h in handles])
    pids = backend.worker_pids()
    backend.shutdown()
    assert wait_gone(pids, 10.0) == [], "shutdown left worker processes running"
    assert not any(h.is_alive() for h in handles)
    backend.shutdown()  # again: nothing to do


@pytest.mark.parametrize("remote", ["process", "ray"])
def test_workers_in_other_processes_report_their_info_and_no_tensorflow(remote, request):
    if remote == "ray":
        request.getfixturevalue("ray_session")
    backend = make_backend(config(backend=remote))
    try:
        handles = [backend.make_worker(i) for i in range(2)]
        infos = results(backend, [h.info() for h in handles])
        assert sorted(backend.worker_pids()) == sorted(i["pid"] for i in infos)
        with RolloutWorker(ENV3, model_spec=ModelSpec(HIDDENS)) as here:
            keys = set(worker_info(here))
        for h, info in zip(handles, infos):
            assert keys <= set(info)  # a backend may add its own (Ray: the node's id)
            assert info["index"] == h.index and info["env_id"] == "FixedLengthEnv"
            assert info["tensorflow_imported"] is False and info["keras_imported"] is False
            assert info["rss_bytes"] > 0
    finally:
        backend.shutdown()


def test_an_env_factory_that_cannot_travel_is_refused_before_a_worker_starts(request):
    import sqlite3

    request.getfixturevalue("ray_session")
    conn = sqlite3.connect(":memory:")

    def env_with_db():
        conn.execute("select 1")
        return FixedLengthEnv()

    try:
        for remote in ("process", "ray"):
            backend = make_backend(config(env_with_db, backend=remote, num_workers=1))
            try:
                with pytest.raises(ValueError) as info:
                    backend.make_worker(0)
                text = str(info.value)
                assert text.startswith(f"backend={remote!r} cannot send the env factory "), text
                assert "env_with_db" in text and "sqlite3.Connection" in text
                assert "importable module" in text
                assert backend.handles == []
            finally:
                backend.shutdown()
    finally:
        conn.close()
