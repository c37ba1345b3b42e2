"""The Ray backend: rollout workers as Ray actors on a private local Ray.

CI installs the ``ray`` extra, so ``import ray`` below is meant to fail loudly (a collection
error, not a skip) where Ray is missing. Starting Ray costs about 7 s here: one local Ray
(2 CPUs, no dashboard) serves the whole module.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest
import ray

import impala_lab
from impala_lab.backends import make_backend
from impala_lab.backends.ray import RAY_MISSING, RayBackend, RayWorkerHandle
from impala_lab.batch import SampleBatch
from impala_lab.config import ImpalaConfig
from impala_lab.errors import WorkerError
from impala_lab.models import NumpyModel
from tests.envs import FixedLengthEnv, RaisingEnv

HIDDENS = (8,)
T, B = 5, 2
ENV3 = functools.partial(FixedLengthEnv, length=3)


def config(env=ENV3, **kw) -> ImpalaConfig:
    kw = {"num_workers": 2, "num_envs_per_worker": B, "sample_batch_size": T,
          "model": HIDDENS, "seed": 0, "backend": "ray", **kw}
    return ImpalaConfig(env=env, **kw)


def results(backend: RayBackend, futures: list, timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    pending = list(futures)
    while pending:
        assert time.monotonic() < deadline, f"futures not done after {timeout} s"
        for f in backend.wait(pending, 5.0):
            pending.remove(f)
    return [f.result() for f in futures]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def ray_backend():
    assert not ray.is_initialized()
    backend = RayBackend(config(), ray_init_kwargs={"num_cpus": 2})
    yield backend
    backend.shutdown()
    assert not ray.is_initialized()


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError) as info:
        make_backend(config())
    assert str(info.value) == RAY_MISSING
    assert RAY_MISSING == "backend='ray' needs the 'ray' extra: pip install 'impala_lab[ray]'"


def test_init_kwargs_local_loopback_or_cluster_address():
    local = RayBackend.init_kwargs(config())
    assert local["include_dashboard"] is False
    assert local["_node_ip_address"] == "127.0.0.1"
    assert local["num_cpus"] == os.cpu_count()
    assert local["ignore_reinit_error"] is True and "address" not in local
    # Actors find impala_lab where the driver did, even if it is not installed.
    assert local["job_config"].code_search_path == [os.path.dirname(os.path.dirname(
        os.path.abspath(impala_lab.__file__)))]
    remote = RayBackend.init_kwargs(config(ray_address="10.0.0.5:6379"))
    assert remote["address"] == "10.0.0.5:6379"
    assert not {"num_cpus", "_node_ip_address", "job_config"} & set(remote)
    assert RayBackend.init_kwargs(config(), {"num_cpus": 2})["num_cpus"] == 2


def test_importing_the_package_does_not_import_ray():
    code = ("import impala_lab.backends, impala_lab.backends.base, sys; "
            "print('ray' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.split() == ["False", "False"]


def test_local_ray_listens_on_loopback_only(ray_backend):
    assert ray_backend.started_ray and ray.is_initialized()
    nodes = ray.nodes()
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"]
    assert ray.cluster_resources()["CPU"] == 2
    assert ray_backend.cpus_per_actor == 1.0
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") is None  # restored


def test_actors_sample_with_weights_put_once(ray_backend):
    env = ENV3()
    model = NumpyModel(env.observation_space, env.action_space, hiddens=HIDDENS)
    weights = model.initial_weights(3)
    model.set_weights(weights)
    handles = [ray_backend.make_worker(i) for i in range(2)]
    assert all(isinstance(h, RayWorkerHandle) for h in handles)
    ref = ray_backend.put_weights(weights, 3)
    assert isinstance(ref, ray.ObjectRef)
    for h in handles:
        h.set_weights(ref)
    futs = [[h.sample() for _ in range(2)] for h in handles]  # two in flight each
    for fs in futs:
        batches = results(ray_backend, fs)
        for k, batch in enumerate(batches):
            assert isinstance(batch, SampleBatch)
            batch.validate(check_values=True)
            assert batch.obs.shape == (T, B, 2)
            assert batch.policy_versions.tolist() == [3] * B
            expected = (k * T + np.arange(T)) % 3  # fresh envs, in request order
            np.testing.assert_array_equal(batch.obs[:, :, 0], np.stack([expected] * B, 1))
            logits, _ = model(batch.obs.reshape(T * B, 2))
            np.testing.assert_allclose(batch.behaviour_logits.reshape(T * B, 2), logits,
                                       rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(batches[0].bootstrap_obs, batches[1].obs[0])
        assert all(f.completion_time is not None for f in fs)

    infos = results(ray_backend, [h.info() for h in handles])
    pids = ray_backend.worker_pids()
    assert sorted(pids) == sorted(i["pid"] for i in infos)
    for info in infos:
        assert info["tensorflow_imported"] is False and info["keras_imported"] is False
        assert info["weights_version"] == 3 and info["env_id"] == "FixedLengthEnv"
        assert info["rss_bytes"] > 0
    for h in handles:
        ray_backend.stop_worker(h)
    assert ray_backend.handles == []
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "stop_worker left the actor process running"


def test_env_error_becomes_worker_error_with_the_actor_traceback(ray_backend):
    backend = RayBackend(config(functools.partial(RaisingEnv, every=3, length=10),
                                num_envs_per_worker=1))
    assert not backend.started_ray  # Ray was running already: this backend only uses it
    h = backend.make_worker(4)
    f1, f2 = h.sample(), h.sample()
    with pytest.raises(WorkerError) as info:
        results(backend, [f1])
    err = info.value
    assert err.worker_index == 4 and err.env_id == "RaisingEnv"
    assert "RuntimeError: boom at step 3" in str(err)
    assert "boom at step" in err.remote_traceback
    assert "tests/envs.py" in err.remote_traceback
    assert not h.is_alive()  # the broken env is not reused
    with pytest.raises(WorkerError, match=r"ended after an earlier error \(RuntimeError: boom"):
        results(backend, [f2])
    f3 = h.sample()  # the actor was killed: a new request fails too
    with pytest.raises(WorkerError):
        results(backend, [f3])
    backend.shutdown()
    assert ray.is_initialized()  # not this backend's Ray


def test_unpicklable_env_factory_is_refused(ray_backend):
    conn = sqlite3.connect(":memory:")

    def env_with_db():
        conn.execute("select 1")
        return FixedLengthEnv()

    backend = RayBackend(config(env_with_db, num_workers=1))
    try:
        with pytest.raises(ValueError, match=r"cannot send the env factory '.*env_with_db'.*"
                                             r"importable module"):
            backend.make_worker(0)
        assert backend.handles == []
    finally:
        backend.shutdown()
        conn.close()


def test_wait_times_out_empty_and_shutdown_is_idempotent(ray_backend):
    backend = RayBackend(config(num_workers=1))
    h = backend.make_worker(0)
    assert backend.wait([], 1.0) == []
    fut = h.sample()
    assert results(backend, [fut])[0].count == T * B
    assert backend.wait([fut], 0) == [fut]
    backend.shutdown()
    backend.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        backend.make_worker(1)


def test_a_hung_actor_is_ended_and_replaced_by_the_driver(ray_backend, tmp_path):
    # One env of the run blocks in step() (its 13th: in its actor's third sample): the driver
    # sees the actor owe a sample longer than sample_timeout_s, kills it and starts another.
    from impala_lab import Impala
    from tests.envs import HangOnceEnv

    env = functools.partial(HangOnceEnv, marker=str(tmp_path / "hung"), at_step=13, length=7)
    # 10 s: a new actor's first sample counts from its creation, and starting one took more
    # than 3 s here on a busy machine
    with Impala(config(env=env, train_batch_size=20, sample_timeout_s=10.0)) as run:
        first = list(run.workers)

        def replaced(s: dict) -> bool:
            return any(w["index"] == 2 and w["samples"] >= 3 for w in s["workers"])

        result = run.train(replaced, max_seconds=90, report_interval=0.1)
        assert result["stop_reason"] == "stop condition"
        assert result["num_worker_failures"] == 1
        (hung,) = [w for w in first if w not in run.workers]
        assert not hung.is_alive()
        with pytest.raises(ray.exceptions.RayActorError):  # the actor was killed
            ray.get(hung.actor.pid.remote(), timeout=30)
