"""``ray_address`` must lead to a Ray cluster within a deadline, or be a clear error.

``ray.init`` retries an address for good when something there accepts connections but is not
Ray (an HTTP server, say): before it is called, the backend sends HTTP/2's client preface and
expects a gRPC server's SETTINGS frame back, as Ray's GCS sends.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from impala_lab.backends.ray_cluster import JOIN_PROBE_TIMEOUT_S, probe
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
    t0 = time.monotonic()
    # Python's server answers HTTP/2's preface with an HTML error page: the message quotes it.
    with pytest.raises(ConfigError, match=rf"^ray_address='{http_server}' is not a Ray "
                                          r"cluster: .*it answered: '<!DOCTYPE HTML>'"):
        probe(http_server, 5.0)
    assert time.monotonic() - t0 < 5.0


def test_a_server_that_never_answers_is_refused_after_the_deadline(silent_server):
    with pytest.raises(ConfigError, match=r"is not a Ray cluster: .*it answered: 'no answer' "
                                          r"within 0\.5 s"):
        probe(silent_server, 0.5)


def test_a_grpc_server_passes_theprobe(http2_server):
    probe(http2_server, 5.0)  # no error: ray.init is left to join it


def test_the_run_refuses_an_http_server_before_starting_anything(http_server):
    pytest.importorskip("ray")
    from impala_lab import Impala, ImpalaConfig

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="is not a Ray cluster"):
        Impala(ImpalaConfig(env="CartPole-v1", backend="ray", ray_address=http_server,
                            num_workers=1))
    assert time.monotonic() - t0 < JOIN_PROBE_TIMEOUT_S + 30  # never Ray's endless retries
