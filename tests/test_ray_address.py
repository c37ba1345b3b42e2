"""``ray_address`` must lead to a Ray cluster within a deadline, or be a clear error.

``ray.init`` retries an address for good when something there accepts connections but is not
Ray (an HTTP server, say): before it is called, the backend sends HTTP/2's client preface and
expects a gRPC server's SETTINGS frame back, as Ray's GCS sends. A cluster whose CPUs are all
held by other jobs is an error after `FREE_CPU_WAIT_S`, not a hang (on a fake clock here;
tests/test_ray_cluster.py meets it on a real cluster).
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from impala_lab.backends.ray_cluster import FREE_CPU_WAIT_S, JOIN_PROBE_TIMEOUT_S, free_cpus, probe
from impala_lab.errors import ConfigError


@pytest.fixture
def http_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def http2_server():
    """Answers any connection with an empty SETTINGS frame, as a gRPC server does."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(64)
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    listener.close()


@pytest.fixture
def silent_server():
    """Accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_an_http_server_is_not_taken_for_a_ray_head(http_server):
    # Python's server answers HTTP/2's preface with an HTML error page: the message quotes it
    # (what it answered, not "no answer": the probe did not sit out its deadline).
    with pytest.raises(ConfigError, match=rf"^ray_address='{http_server}' is not a Ray "
                                          r"cluster: .*it answered: '<!DOCTYPE HTML>'"):
        probe(http_server, 60.0)


def test_a_server_that_never_answers_is_refused_after_the_deadline(silent_server):
    with pytest.raises(ConfigError, match=r"is not a Ray cluster: .*it answered: 'no answer' "
                                          r"within 0\.5 s"):
        probe(silent_server, 0.5)


def test_a_grpc_server_passes_theprobe(http2_server):
    probe(http2_server, 60.0)  # no error: ray.init is left to join it


def test_the_run_refuses_an_http_server_before_starting_anything(http_server):
    pytest.importorskip("ray")
    from impala_lab import Impala, ImpalaConfig

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="is not a Ray cluster"):
        Impala(ImpalaConfig(env="CartPole-v1", backend="ray", ray_address=http_server,
                            num_workers=1))
    assert time.monotonic() - t0 < JOIN_PROBE_TIMEOUT_S + 30  # never Ray's endless retries


class FakeRay:
    """A cluster of 3 CPUs whose free CPUs are ``free`` at each look, the last one for good;
    time passes only in its ``sleep``."""

    def __init__(self, *free: float) -> None:
        self.free = list(free)
        self.now = 1000.0
        self.sleeps: list[float] = []

    def available_resources(self) -> dict:
        return {"CPU": self.free.pop(0) if len(self.free) > 1 else self.free[0]}

    def cluster_resources(self) -> dict:
        return {"CPU": 3.0}

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


CLUSTER = SimpleNamespace(num_workers=2, ray_address="10.0.0.1:6379")


def test_a_cluster_with_no_free_cpu_is_an_error_after_the_wait():
    ray = FakeRay(0.0)
    with pytest.raises(ConfigError) as info:
        free_cpus(ray, CLUSTER, FREE_CPU_WAIT_S, clock=ray.clock, sleep=ray.sleep)
    assert str(info.value).startswith(
        f"backend='ray': the Ray cluster at '10.0.0.1:6379' has 0 of its 3 CPUs free after "
        f"{FREE_CPU_WAIT_S:g} s, too few for num_workers=2 actors.")
    assert set(ray.sleeps) == {0.2}  # it looked every 0.2 s for the whole wait, no longer
    assert FREE_CPU_WAIT_S <= ray.now - 1000.0 < FREE_CPU_WAIT_S + 0.2 + 1e-9


def test_cpus_freed_during_the_wait_are_taken():
    ray = FakeRay(0.0, 0.0, 0.0, 1.5)  # actors just killed free theirs a moment later
    assert free_cpus(ray, CLUSTER, FREE_CPU_WAIT_S, clock=ray.clock, sleep=ray.sleep) == 1.5
    assert ray.sleeps == [0.2] * 3
