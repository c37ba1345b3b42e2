"""Joining a Ray cluster or starting a private one, for `impala_lab.backends.ray`: `join_cluster`
probes the address first (`probe`) and turns Ray's failures into a `ConfigError` naming the
address and the fix, `start_local` starts a private Ray, and `free_cpus` waits a
little for a cluster with no free CPU, then says so.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError

JOIN_PROBE_TIMEOUT_S = 5.0  # a TCP connect to ``ray_address`` before ray.init tries it
FREE_CPU_WAIT_S = 10.0  # how long a cluster with no free CPU may take to free one


def start_local(ray: Any, kwargs: dict[str, Any]) -> None:
    """``ray.init(**kwargs)`` of a private local Ray, with Ray's notice about token
    authentication silenced meanwhile. Its servers listen where Ray's own default puts them on
    this system (on Linux the machine's main address; docs/training.md says more)."""
    token_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    saved_level = token_log.level
    token_log.setLevel(logging.ERROR)
    try:
        ray.init(**kwargs)
    finally:
        token_log.setLevel(saved_level)


def join_cluster(ray: Any, kwargs: dict[str, Any]) -> None:
    """``ray.init(**kwargs)`` for ``kwargs["address"]``, with Ray's failures turned into a
    `ConfigError` naming the address and the fix."""
    address = kwargs["address"]
    probe(address, JOIN_PROBE_TIMEOUT_S)
    # Ray < 2.52 has no AuthenticationError; () catches nothing.
    auth_error = getattr(ray.exceptions, "AuthenticationError", ())
    try:
        ray.init(**kwargs)
    except auth_error as exc:  # RAY_AUTH_MODE=token, no token here
        raise ConfigError(f"ray_address={address!r}: {exc}") from None
    except (ConnectionError, RuntimeError) as exc:
        # After 20 s of retries, often with only Ray's log saying why; the usual cause is a
        # refused token (`ray start` enables them when ~/.ray/auth_token exists).
        text = str(exc)
        if isinstance(exc, RuntimeError) and "GCS" not in text:
            raise
        first = text.splitlines()[0].split(". Last connection error")[0]
        refused = " (InvalidAuthToken)" if "InvalidAuthToken" in text else ""
        raise ConfigError(
            f"ray_address={address!r}: Ray could not join the cluster there "
            f"({first}{refused}). A "
            "cluster with token authentication refuses a driver without its token: set "
            "RAY_AUTH_MODE=token in this process's environment (before Ray is first used), "
            "with the cluster's token in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or "
            "RAY_AUTH_TOKEN"
        ) from None


# The client preface of HTTP/2 and an empty SETTINGS frame: a gRPC server (Ray's GCS is one)
# answers with a SETTINGS frame of its own (frame type 4, the 4th byte of its 9-byte header).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4


def probe(address: str, timeout: float) -> None:
    """Raises `ConfigError` unless a gRPC server (HTTP/2, as Ray's GCS) answers at
    ``host:port`` within ``timeout`` seconds: ``ray.init`` retries an address that is not Ray
    for many minutes. Other forms ("auto", "ray://...") are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(_HTTP2_PREFACE)
            header = conn.recv(64)
    except TimeoutError:
        header = b""
    except OSError as exc:
        raise ConfigError(
            f"ray_address={address!r} is unreachable: nothing accepted a connection there "
            f"within {timeout:g} s ({type(exc).__name__}: {exc}). Start the cluster's head "
            f"there (ray start --head --port={port}) or fix the address; without "
            "ray_address a local Ray starts"
        ) from None
    if len(header) < 4 or header[3] != _HTTP2_SETTINGS:
        seen = header[:40].decode("latin-1").splitlines()[0] if header else "no answer"
        raise ConfigError(
            f"ray_address={address!r} is not a Ray cluster: the server there does not speak "
            f"Ray's protocol (gRPC over HTTP/2; it answered: {seen!r} within {timeout:g} s). "
            "Give the address of the cluster's head, the --port of `ray start --head` "
            "(6379 by default)"
        )


def free_cpus(ray: Any, config: ImpalaConfig, wait_s: float, *,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> float:
    """The Ray cluster's free CPUs, waiting up to ``wait_s`` seconds (on ``clock``, looking
    every 0.2 s) for at least 0.01 per worker (actors just killed free theirs a moment
    later); `ConfigError` if none come."""
    deadline = clock() + wait_s
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= 0.01 * config.num_workers:
            return free
        if clock() >= deadline:
            break
        sleep(0.2)
    total = ray.cluster_resources().get("CPU", 0.0)
    where = f"at {config.ray_address!r}" if config.ray_address else "of this process"
    raise ConfigError(
        f"backend='ray': the Ray cluster {where} has {free:g} of its {total:g} CPUs free "
        f"after {wait_s:g} s, too few for num_workers={config.num_workers} actors. Other "
        "Ray jobs hold them (`ray status` shows the usage): end them, or add a node with "
        "CPUs (ray start --address=<head>:<port> --num-cpus=N)"
    )
