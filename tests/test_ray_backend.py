"""The Ray backend: rollout workers as Ray actors on a private local Ray.

What every backend does is tested in test_backends.py; here what only this one does.

CI installs the ``ray`` extra, so ``import ray`` below is meant to fail loudly (a collection
error, not a skip) where Ray is missing. Starting Ray costs about 7 s here: one local Ray
(2 CPUs, no dashboard) serves the whole module.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import ray

import impala_lab
from impala_lab.backends import make_backend
from impala_lab.backends.ray import RAY_MISSING, RayBackend, RayWorkerHandle
from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError, WorkerError
from tests import backend_helpers as helpers
from tests.backend_helpers import ENV3, model_for, results
from tests.envs import RaisingEnv
from tests.leaks import wait_gone


def config(env=ENV3, **kw) -> ImpalaConfig:
    return helpers.config(env, backend="ray", **kw)


@pytest.fixture(scope="module")
def ray_backend():
    assert not ray.is_initialized()
    backend = RayBackend(config(), ray_init_kwargs={"num_cpus": 2})
    yield backend
    backend.shutdown()
    assert not ray.is_initialized()


def test_missing_ray_names_the_extra(monkeypatch):
    built = config()
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    # a config is refused before any process starts (tests/test_clear_errors.py); a backend
    # built from a config made while Ray was there still names the extra
    with pytest.raises(ConfigError, match=r"backend='ray' is invalid: Ray is not installed: "
                                          r"pip install 'impala_lab\[ray\]'"):
        config()
    with pytest.raises(ImportError) as info:
        make_backend(built)
    assert str(info.value) == RAY_MISSING
    assert RAY_MISSING == "backend='ray' needs the 'ray' extra: pip install 'impala_lab[ray]'"


def test_init_kwargs_local_ray_or_cluster_address():
    local = RayBackend.init_kwargs(config())
    assert local["include_dashboard"] is False
    assert local["num_cpus"] == os.cpu_count()
    assert local["ignore_reinit_error"] is True
    assert local["address"] == "local"  # a new Ray, even beside a `ray start` cluster
    # Actors find impala_lab where the driver did, even if it is not installed.
    assert local["job_config"].code_search_path == [os.path.dirname(os.path.dirname(
        os.path.abspath(impala_lab.__file__)))]
    remote = RayBackend.init_kwargs(config(ray_address="10.0.0.5:6379"))
    assert remote["address"] == "10.0.0.5:6379"
    assert not {"num_cpus", "include_dashboard", "job_config"} & set(remote)
    assert RayBackend.init_kwargs(config(), {"num_cpus": 2})["num_cpus"] == 2


def test_importing_the_package_does_not_import_ray():
    code = ("import impala_lab.backends, impala_lab.backends.base, sys; "
            "print('ray' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.split() == ["False", "False"]


def test_local_ray_is_one_node_of_this_machines_cpus(ray_backend):
    assert ray_backend.started_ray and ray.is_initialized()
    assert len(ray.nodes()) == 1
    assert ray.cluster_resources()["CPU"] == os.cpu_count()
    assert ray_backend.cpus_per_actor == 1.0


def test_the_backend_knows_its_raylets_socket_and_the_raylet_answers(ray_backend):
    import socket

    [node] = ray.nodes()
    assert ray_backend.raylet_socket == node["RayletSocketName"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(ray_backend.raylet_socket)
    ray_backend.check_raylet("an actor died")  # the raylet answers: the worker error stands


def test_weights_are_put_once_and_stop_worker_ends_the_actor_process(ray_backend):
    # Sampling itself is the contract of every backend (test_backends.py).
    handles = [ray_backend.make_worker(i) for i in range(2)]
    assert all(isinstance(h, RayWorkerHandle) for h in handles)
    ref = ray_backend.put_weights(model_for(ENV3).initial_weights(3), 3)
    assert isinstance(ref, ray.ObjectRef)  # one object, read by every actor
    for h in handles:
        h.set_weights(ref)
    infos = results(ray_backend, [h.info() for h in handles])
    pids = ray_backend.worker_pids()
    assert sorted(pids) == sorted(i["pid"] for i in infos)
    assert [i["weights_version"] for i in infos] == [3, 3]
    for h in handles:
        ray_backend.stop_worker(h)
    assert ray_backend.handles == []
    assert wait_gone(pids, 60.0) == [], "stop_worker left the actor process running"


def test_env_error_becomes_worker_error_with_the_actor_traceback(ray_backend):
    backend = RayBackend(config(functools.partial(RaisingEnv, every=3, length=10),
                                num_envs=1))
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


def test_a_shut_down_backend_starts_no_actor(ray_backend):
    backend = RayBackend(config(num_workers=1))
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
