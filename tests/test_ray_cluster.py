"""The Ray backend against a real two-node Ray cluster, started the way the README tells users.

`tests.ray_cluster.LocalCluster` runs the README's commands on this machine: token
authentication (``RAY_AUTH_MODE=token``, the token in ``~/.ray/auth_token``; Ray >= 2.52, older
Ray has none and the test of a driver without the token is skipped), ``ray start
--head`` with 2 CPUs and the custom resource ``node_a``, and a second node with 1 CPU and
``node_b`` joining it at ``127.0.0.1:<port>``, in a private temp dir on free ports. Starting it
takes 20-60 s here (the nodes' Python agents are the slow part on a loaded machine); the
whole module 130-150 s. Every process of the cluster is killed when the module ends, passed
or failed.

The tests run in file order: the one that kills the second node's raylet, then the one that
kills the head, come last.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import ray

import impala_lab.backends.ray
from impala_lab import Impala, ImpalaConfig
from impala_lab.backends.ray_cluster import JOIN_PROBE_TIMEOUT_S
from impala_lab.errors import ConfigError
from tests.ray_cluster import TOKEN_AUTH, LocalCluster, free_port
from tests.waiting import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(address: str, **kw) -> ImpalaConfig:
    kw = {"env": "CartPole-v1", "backend": "ray", "ray_address": address, "num_workers": 2,
          "num_envs_per_worker": 2, "sample_batch_size": 10, "train_batch_size": 200,
          "model": (16,), "seed": 0, **kw}
    return ImpalaConfig(**kw)


@pytest.fixture(scope="module")
def cluster():
    saved = os.environ.get("RAY_AUTH_MODE")
    assert not ray.is_initialized()
    if TOKEN_AUTH:
        # The driver (this process) needs token mode too. Ray caches the mode when it first
        # reads it, so it is read again (as Ray does when ray.init turns token mode on).
        os.environ["RAY_AUTH_MODE"] = "token"
        ray._raylet.Config.initialize("")
    started = LocalCluster.start(head_cpus=2, second_cpus=1)
    try:
        yield started
    finally:
        try:
            if ray.is_initialized():
                ray.shutdown()  # leaves the cluster; the next line ends it
        finally:
            started.stop()
            if TOKEN_AUTH:
                if saved is None:
                    os.environ.pop("RAY_AUTH_MODE", None)
                else:
                    os.environ["RAY_AUTH_MODE"] = saved
                ray._raylet.Config.initialize("")


def node_ids(cluster: LocalCluster) -> dict[str, str]:
    """Label (``node_a``, ``node_b``) -> Ray node id, of the live nodes."""
    if not ray.is_initialized():
        ray.init(address=cluster.address, logging_level="WARNING")
    return {label: node["NodeID"] for node in ray.nodes() if node["Alive"]
            for label in node["Resources"] if label.startswith("node_")}


def live_actors() -> list[dict]:
    # ray.util.state (`ray list actors`) needs the dashboard of ray[default]; the GCS's actor
    # table is always there.
    return [a for a in ray._private.state.actors().values() if a["State"] != "DEAD"]


def test_an_address_nothing_listens_on_is_a_config_error_within_seconds():
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        Impala(config(address))
    took = time.monotonic() - start
    assert took < JOIN_PROBE_TIMEOUT_S + 5, took  # ray.init alone retried for 13 minutes
    message = str(info.value)
    assert message.startswith(f"ray_address={address!r} is unreachable: nothing accepted a "
                              "connection there within 5 s (ConnectionRefusedError")
    assert f"ray start --head --port={address.split(':')[1]}" in message
    assert not ray.is_initialized()


@pytest.mark.skipif(not TOKEN_AUTH, reason="Ray < 2.52 has no token authentication")
def test_a_driver_without_the_token_is_told_to_set_ray_auth_mode(cluster, tmp_path):
    # What a user who skipped the README's `export RAY_AUTH_MODE=token` sees: exit code 2 and
    # one line, after Ray's 20 s of retries.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "impala_lab.cli.main", "train", "--backend", "ray",
         "--ray-address", cluster.address, "--max-env-steps", "1000", "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"impala-lab: error: ray_address={cluster.address!r}: Ray could not "
                           "join the cluster there"), last
    assert "set RAY_AUTH_MODE=token" in last and "~/.ray/auth_token" in last
    assert took < 60, took


def test_the_cli_trains_on_the_cluster_and_leaves_it_as_it_found_it(cluster, tmp_path):
    before = node_ids(cluster)
    assert set(before) == {"node_a", "node_b"}
    total = ray.cluster_resources()["CPU"]
    assert total == 3 and live_actors() == []
    proc = subprocess.run(
        [sys.executable, "-m", "impala_lab.cli.main", "train", "--backend", "ray",
         "--ray-address", cluster.address, "--num-workers", "2", "--max-env-steps", "3000",
         "--quiet", "--out", str(tmp_path)],
        cwd=REPO, env=os.environ, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "result.json").exists()
    # The run's actors are gone (killed by the backend, then the job ended), their CPUs free
    # again, and both nodes still up.
    wait_for(lambda: live_actors() == [], "the run's actors to end", interval=0.2)
    wait_for(lambda: ray.available_resources().get("CPU") == total, "the CPUs to be free",
             interval=0.2)
    assert node_ids(cluster) == before


def test_a_run_without_an_address_starts_its_own_ray_beside_the_cluster(cluster):
    # `ray start` recorded the cluster in its temp dir (RAY_TMPDIR for Ray's default one),
    # where a bare ray.init() would find and join it (and then refuse num_cpus).
    code = ("from impala_lab.backends.ray import RayBackend\n"
            "from impala_lab.config import ImpalaConfig\n"
            "import ray\n"
            "b = RayBackend(ImpalaConfig(env='CartPole-v1', backend='ray', num_workers=1))\n"
            "nodes = ray.nodes()\n"
            "print(b.started_ray, len(nodes), any('node_a' in n['Resources'] for n in nodes))\n"
            "b.shutdown()\n")
    env = {**os.environ, "RAY_TMPDIR": cluster.temp_dir}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == "True 1 False"  # one node, not the cluster's


def test_a_cluster_without_a_free_cpu_is_a_config_error_not_a_hang(cluster, monkeypatch):
    node_ids(cluster)  # connected

    @ray.remote
    class Holder:
        def ready(self) -> bool:
            return True

    # Another job's actors hold every CPU of both nodes. (The wait itself is timed on a fake
    # clock in tests/test_ray_address.py; here it is cut short.)
    monkeypatch.setattr(impala_lab.backends.ray, "FREE_CPU_WAIT_S", 1.0)
    holders = [Holder.options(num_cpus=2, resources={"node_a": 1}).remote(),
               Holder.options(num_cpus=1, resources={"node_b": 1}).remote()]
    try:
        assert ray.get([h.ready.remote() for h in holders], timeout=60) == [True, True]
        with pytest.raises(ConfigError) as info:
            Impala(config(cluster.address))
        assert str(info.value).startswith(
            f"backend='ray': the Ray cluster at {cluster.address!r} has 0 of its 3 CPUs free "
            "after 1 s, too few for num_workers=2 actors.")
        assert "ray start --address=<head>:<port> --num-cpus=N" in str(info.value)
    finally:
        for h in holders:
            ray.kill(h)
    wait_for(lambda: ray.available_resources().get("CPU") == 3, "the CPUs to be free", interval=0.2)


def test_workers_spread_over_both_nodes_and_a_lost_nodes_worker_is_replaced(cluster):
    ids = node_ids(cluster)
    label = {node_id: name for name, node_id in ids.items()}

    def placement(run: Impala) -> dict[int, str]:
        return {w.index: label[w.info().result()["node_id"]] for w in run.workers}

    with Impala(config(cluster.address)) as run:
        assert run.backend.cpus_per_actor == 1.0
        assert sorted(placement(run).values()) == ["node_a", "node_b"]
        result = run.train(lambda s: s["num_steps_sampled"] >= 2000, max_seconds=60,
                           report_interval=0.5)
        assert result["stop_reason"] == "stop condition"
        (lost,) = [i for i, name in placement(run).items() if name == "node_b"]

        cluster.kill_raylet("node_b")  # the second node is gone, with its worker
        sampled = run.num_steps_sampled

        def replaced(s: dict) -> bool:
            return any(w["index"] >= 2 and w["samples"] >= 3 for w in s["workers"])

        start = time.monotonic()
        result = run.train(replaced, max_seconds=90, report_interval=0.5)
        assert result["stop_reason"] == "stop condition"
        assert result["num_worker_failures"] == 1
        assert time.monotonic() - start < 60
        assert lost not in placement(run)
        # The replacement could only go to the head, where the run samples on.
        assert sorted(placement(run).values()) == ["node_a", "node_a"]
        assert run.num_steps_sampled > sampled
    wait_for(lambda: live_actors() == [], "the run's actors to end", interval=0.2)


def test_a_lost_head_ends_a_cli_run_with_a_clear_error_and_its_outputs(cluster, tmp_path):
    # Last: it kills the head. This process leaves the cluster first (Ray would end it too).
    if ray.is_initialized():
        ray.shutdown()
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "impala_lab.cli.main", "train", "--backend", "ray",
         "--ray-address", cluster.address, "--num-workers", "1", "--max-seconds", "200",
         "--quiet", "--out", str(out)],
        cwd=REPO, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (out / "result.json").exists() or proc.poll() is not None,
                 "the run's first report", timeout=120, interval=0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        (head,) = [n for n in cluster.nodes if n.resource == "node_a"]
        for pid in head.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=90)  # Ray's own retries would take minutes
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("impala-lab: error:")]
    assert len(errors) == 1 and "the Ray cluster was lost" in errors[0], err[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "error" and "the Ray cluster was lost" in result["error"]
    assert (out / "metrics.csv").stat().st_size > 0
