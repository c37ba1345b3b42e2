"""Rollout workers as Ray actors (the ``ray`` extra: ``pip install 'impala_lab[ray]'``).

The same `RolloutWorker` as the other backends, wrapped in a Ray actor (numpy and gymnasium
only: actors never import TensorFlow). A weights broadcast is one ``ray.put`` of
``(weights, version)``; every ``set_weights`` passes that object ref, which Ray resolves in
the actor (zero-copy from the node's object store), so weights move once per broadcast and
node. A sample request is an actor task; Ray runs one caller's tasks on an actor in the
order they were submitted, so ``set_weights`` applies before the next ``sample``.
`RayBackend.wait` is ``ray.wait`` (blocking, no polling).

Ray itself is imported only when a `RayBackend` is built (`impala_lab.backends.make_backend`
imports this module lazily), so the package works without Ray installed.

Starting Ray:

- ``config.ray_address`` set: ``ray.init(address=config.ray_address)`` joins an existing
  cluster; the backend never shuts that cluster down. A head that does not answer a TCP
  connect within `JOIN_PROBE_TIMEOUT_S` is a `ConfigError` at once (``ray.init`` itself
  retries such an address for many minutes); a cluster that refuses the driver (its token
  authentication, see below) is a `ConfigError` naming the address and ``RAY_AUTH_MODE``
  after Ray's 20 s of retries.
- Ray already initialized in this process (e.g. by the notebook): the backend uses it and
  leaves it running.
- Otherwise a private local Ray starts (``address="local"``, also where a ``ray start``
  cluster runs on this machine) with the machine's CPUs, no dashboard, and every
  Ray server listening on loopback only. Ray 2.x turns ``_node_ip_address="127.0.0.1"`` into
  the machine's primary address on Linux (``ray._private.services.resolve_ip_for_localhost``)
  unless Ray runs in local-only mode, which ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` selects
  (the default on Windows and macOS); the backend sets that mode while ``ray.init`` starts
  the local processes (they inherit it) and restores the driver's setting afterwards.
  The actors get the directory holding ``impala_lab`` on their path
  (``JobConfig(code_search_path=...)``), so a source checkout works without installing.
  `RayBackend.shutdown` shuts this Ray down again.

Worker output (``print`` in an env, warnings) is streamed to the driver's terminal
(``log_to_driver=True``), except inside a Jupyter kernel, where Ray's streaming thread
would write into whichever cell runs; there it stays in Ray's log files
(``/tmp/ray/session_latest/logs``). Errors never depend on it: an env that raises reaches
the driver as `WorkerError` with the actor's traceback.

Each actor asks for ``min(1, free CPUs / num_workers)`` CPUs, so ``num_workers`` above the
CPU count shares the CPUs (as processes would) instead of leaving actors unscheduled; a
cluster with no free CPU (other jobs hold them all) is a `ConfigError` after
`FREE_CPU_WAIT_S`, not a hang. Actors are spread over the nodes (``scheduling_strategy=
"SPREAD"``), so every node samples and a lost node takes only its share of the workers.

Running on a Ray cluster (the README's "Where the workers live" has the details;
``tests/test_ray_cluster.py`` runs these steps)::

    # every node and the driver: the same Python, Ray, impala_lab and gymnasium, and
    # (Ray >= 2.52; older Ray has no token authentication, skip these two)
    export RAY_AUTH_MODE=token         # the cluster's token in ~/.ray/auth_token
    ray get-auth-token --generate      # on the head, once; copy ~/.ray/auth_token to the others
    ray start --head --port=6379       # on the head node
    ray start --address=<head>:6379    # on each other node
    impala-lab train --backend ray --ray-address <head>:6379

From Python: ``Impala(ImpalaConfig(backend="ray", ray_address="<head>:6379"))``. The env
factory travels to the actors with cloudpickle: a factory defined in a notebook is carried
by value, but the modules it imports must be installed on every node. `RayBackend.
worker_pids` gives the actors' process ids on their nodes (local ones only on one machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from impala_lab.backends.base import Backend, WorkerHandle
from impala_lab.backends.worker_info import describe_env, pickled_env, worker_info
from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError, WorkerError

__all__ = ["RayBackend", "RayWorkerHandle", "RayFuture", "RAY_MISSING"]

RAY_MISSING = "backend='ray' needs the 'ray' extra: pip install 'impala_lab[ray]'"
_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its reports; a WorkerError is plain text
JOIN_PROBE_TIMEOUT_S = 5.0  # a TCP connect to ``ray_address`` before ray.init tries it
FREE_CPU_WAIT_S = 10.0  # how long a cluster with no free CPU may take to free one


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(RAY_MISSING) from exc
    return ray


class RolloutActor:
    """The body of a worker actor: a `RolloutWorker` behind Ray method calls."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        from impala_lab.actor.rollout_worker import RolloutWorker

        self.worker = RolloutWorker(**kwargs)

    def set_weights(self, weights_and_version: tuple[list, int]) -> None:
        weights, version = weights_and_version
        self.worker.set_weights(list(weights), version)

    def sample(self) -> Any:
        return self.worker.sample()

    def info(self) -> dict[str, Any]:
        import ray

        return {**worker_info(self.worker), "node_id": ray.get_runtime_context().get_node_id()}

    def pid(self) -> int:
        return os.getpid()


class RayFuture:
    """One actor task (the `SampleFuture` protocol); ``completion_time`` is when the driver
    first saw it done."""

    __slots__ = ("_done", "completion_time", "handle", "ref", "seq")

    def __init__(self, ref: Any, handle: RayWorkerHandle) -> None:
        self.ref = ref
        self.handle = handle
        self.seq = handle._next_seq  # submission order on this actor
        handle._next_seq += 1
        self._done = False
        self.completion_time: float | None = None

    def _mark_done(self) -> None:
        if not self._done:
            self._done = True
            self.completion_time = time.monotonic()

    def done(self) -> bool:
        if not self._done:
            ready, _ = self.handle._ray.wait([self.ref], timeout=0)
            if ready:
                self._mark_done()
        return self._done

    def result(self) -> Any:
        """The task's value; a failed task or a dead actor raises `WorkerError`, and so
        does every later task of that actor (its env is broken: the actor was killed)."""
        h = self.handle
        ray = h._ray
        try:
            first = h.first_failure
            if first is not None and self.seq > first[0]:
                err = first[1]
                raise WorkerError(h.index, h.env_id, "the worker ended after an earlier error "
                                  f"({err.message})", err.remote_traceback)
            try:
                return ray.get(self.ref)
            except ray.exceptions.RayTaskError as exc:
                # ray.get raises a class derived from both RayTaskError and the cause's class;
                # its str() is Ray's report with the actor's formatted traceback.
                cause = exc.cause
                text = getattr(exc, "traceback_str", None) or str(exc)
                raise h._failed(self.seq, f"{type(cause).__name__}: {cause}",
                                _ANSI.sub("", text)) from None
            except ray.exceptions.RayActorError as exc:
                text = _ANSI.sub("", str(exc))
                raise h._failed(self.seq, f"the Ray actor died: {text.splitlines()[0]}",
                                text) from None
        finally:
            self._mark_done()


class RayWorkerHandle(WorkerHandle):
    """The driver's side of one worker actor.

    Attributes:
      index: the worker's index in the run.
      env_id: the env's name (the id, or the factory's ``__qualname__``).
      actor: the Ray actor handle.
    """

    def __init__(self, backend: RayBackend, index: int, actor: Any, env_id: str) -> None:
        self._backend = backend
        self._ray = backend._ray
        self.index = index
        self.actor = actor
        self.env_id = env_id
        self.pid_ref = actor.pid.remote()  # the actor's process id, once it has started
        self._alive = True
        self._next_seq = 0
        # (seq, error) of the earliest failed task: every later task fails with it
        self.first_failure: tuple[int, WorkerError] | None = None

    def sample(self) -> RayFuture:
        """Submits one sample task; the future's result is a `SampleBatch`."""
        return RayFuture(self.actor.sample.remote(), self)

    def info(self) -> RayFuture:
        """Submits a task returning the actor's state:
        `impala_lab.backends.worker_info.worker_info`'s
        dict and the ``node_id`` of the node it runs on."""
        return RayFuture(self.actor.info.remote(), self)

    def set_weights(self, weights_ref: Any) -> None:
        """Submits ``set_weights`` with the object ref from `RayBackend.put_weights`."""
        self.actor.set_weights.remote(weights_ref)

    def is_alive(self) -> bool:
        return self._alive

    def _failed(self, seq: int, message: str, remote_traceback: str) -> WorkerError:
        err = WorkerError(self.index, self.env_id, message, remote_traceback)
        if self.first_failure is None or seq < self.first_failure[0]:
            self.first_failure = (seq, err)
        self.kill()  # a broken env is not reused, as the process backend's worker exits
        return err

    def kill(self) -> None:
        """Ends the actor (its pending tasks fail); idempotent."""
        if self._alive:
            self._alive = False
            with contextlib.suppress(Exception):  # the actor or Ray is gone already
                self._ray.kill(self.actor, no_restart=True)

    def describe(self) -> str:
        return f"worker {self.index} (Ray actor, env {self.env_id})"


class RayBackend(Backend):
    """Rollout workers as Ray actors (see the module docstring).

    Args:
      config: the run's config; ``config.ray_address`` picks the cluster.
      ray_init_kwargs: extra ``ray.init`` arguments for a Ray this backend starts (e.g.
        ``{"num_cpus": 2}``), overriding the defaults of `init_kwargs`.

    Raises:
      ImportError: if Ray is not installed (naming the ``ray`` extra).
    """

    name = "ray"

    def __init__(self, config: ImpalaConfig, *,
                 ray_init_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        ray = _import_ray()
        self._ray = ray
        self.handles: list[RayWorkerHandle] = []
        self._closed = False
        self.started_ray = False
        joined = False
        if not ray.is_initialized():
            kwargs = self.init_kwargs(config, ray_init_kwargs)
            if config.ray_address:
                _join_cluster(ray, kwargs)
                joined = True
            else:
                # Ray's notice that token authentication is on (a ~/.ray/auth_token exists)
                # is about clusters; this private local Ray listens on loopback only.
                token_log = logging.getLogger(
                    "ray._private.authentication.authentication_token_setup")
                level = token_log.level
                token_log.setLevel(logging.ERROR)
                try:
                    with _local_only_mode(ray):
                        ray.init(**kwargs)
                finally:
                    token_log.setLevel(level)
                self.started_ray = True
        try:
            cpus = _free_cpus(ray, config, FREE_CPU_WAIT_S)
        except ConfigError:
            if joined or self.started_ray:
                ray.shutdown()  # leaves a joined cluster running
            raise
        self.cpus_per_actor = max(0.01, min(1.0, int(1e4 * cpus / config.num_workers) / 1e4))
        self._actor_class = ray.remote(num_cpus=self.cpus_per_actor,
                                       scheduling_strategy="SPREAD")(RolloutActor)
        self._env_checked = False

    @staticmethod
    def init_kwargs(config: ImpalaConfig, overrides: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
        """The ``ray.init`` arguments: join ``config.ray_address``, or start a local Ray."""
        in_notebook = "ipykernel" in sys.modules
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": not in_notebook,
                                  "logging_level": logging.WARNING}
        if config.ray_address:
            kwargs["address"] = config.ray_address
        else:
            from ray.job_config import JobConfig

            # The actors import impala_lab: find it where the driver found it, installed or not.
            package_parent = os.path.dirname(os.path.dirname(os.path.dirname(
                os.path.abspath(__file__))))
            # "local": a new Ray even where a `ray start` cluster runs on this machine, which
            # ray.init() without an address would join (and then refuse num_cpus).
            kwargs.update(address="local", num_cpus=os.cpu_count() or 1,
                          include_dashboard=False, _node_ip_address="127.0.0.1",
                          job_config=JobConfig(code_search_path=[package_parent]))
        kwargs.update(overrides or {})
        return kwargs

    # -- workers
    def _check_env(self) -> None:
        if self._env_checked:
            return
        pickled_env(self.env, "ray", "a Ray actor", "installed on every node",
                    dumps=self._ray.cloudpickle.dumps)
        self._env_checked = True

    def make_worker(self, index: int) -> RayWorkerHandle:
        """Creates actor ``index``; returns at once (Ray starts it in the background)."""
        if self._closed:
            raise RuntimeError("this RayBackend was shut down; create a new one")
        self._check_env()
        actor = self._actor_class.remote(self.worker_kwargs(index))
        handle = RayWorkerHandle(self, index, actor, describe_env(self.env))
        self.handles.append(handle)
        return handle

    def worker_pids(self) -> list[int]:
        """Process ids of the live actors (on their nodes); waits for actors to start."""
        alive = [h for h in self.handles if h.is_alive()]
        return [int(p) for p in self._ray.get([h.pid_ref for h in alive], timeout=60)]

    # -- weights
    def put_weights(self, weights: list, version: int) -> Any:
        """One ``ray.put`` of ``(weights, version)``; every actor reads that object."""
        return self._ray.put((list(weights), int(version)))

    # -- completion
    def wait(self, futures: Sequence[Any], timeout: float | None) -> list:
        """``ray.wait`` on the futures' refs: the done futures, blocking up to ``timeout``."""
        if not futures:
            return []
        ray = self._ray
        pending = {f.ref: f for f in futures if not f._done}
        refs = list(pending)

        def take_ready() -> None:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                pending[ref]._mark_done()

        if refs:
            take_ready()
            if not any(f._done for f in futures) and timeout != 0:
                ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
                if ready:
                    take_ready()  # with whatever else finished meanwhile
        return [f for f in futures if f._done]

    # -- ending
    def stop_worker(self, handle: WorkerHandle) -> None:
        """Kills the actor (its pending tasks fail with `WorkerError`)."""
        assert isinstance(handle, RayWorkerHandle)
        handle.kill()
        if handle in self.handles:
            self.handles.remove(handle)

    def shutdown(self) -> None:
        """Kills every actor; shuts Ray down if this backend started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for handle in list(self.handles):
            self.stop_worker(handle)
        if self.started_ray:
            self._ray.shutdown()


@contextlib.contextmanager
def _local_only_mode(ray: Any):
    """Ray's local-only mode while ``ray.init`` starts the local processes (see the module
    docstring): they bind to loopback; the driver's setting is restored afterwards."""
    # The only way: Ray reads the switch into this private constant when it is imported, and
    # no public option keeps a local Ray on loopback (Ray resolves 127.0.0.1 away on purpose).
    from ray._private import ray_constants

    saved_env = os.environ.get(_LOCAL_ONLY_ENV)
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_LOCAL_ONLY_ENV] = "0"
    if saved_flag is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(_LOCAL_ONLY_ENV, None)
        else:
            os.environ[_LOCAL_ONLY_ENV] = saved_env
        if saved_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag


def _join_cluster(ray: Any, kwargs: dict[str, Any]) -> None:
    """``ray.init(**kwargs)`` for ``kwargs["address"]``, with Ray's failures turned into a
    `ConfigError` naming the address and the fix."""
    address = kwargs["address"]
    _probe(address, JOIN_PROBE_TIMEOUT_S)
    # Ray < 2.52 has no token authentication and no AuthenticationError (an except clause
    # naming it would turn any failed join into an AttributeError); () catches nothing.
    auth_error = getattr(ray.exceptions, "AuthenticationError", ())
    try:
        ray.init(**kwargs)
    except auth_error as exc:  # RAY_AUTH_MODE=token, no token here
        raise ConfigError(f"ray_address={address!r}: {exc}") from None
    except (ConnectionError, RuntimeError) as exc:
        # After 20 s of retries Ray raises ConnectionError, or RuntimeError("Failed to connect
        # to GCS ..."), and often only its log says why. A refused token is the usual cause:
        # `ray start` enables token authentication when ~/.ray/auth_token exists.
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


def _probe(address: str, timeout: float) -> None:
    """Raises `ConfigError` unless a gRPC server (HTTP/2, as Ray's GCS) answers at
    ``host:port`` within ``timeout`` seconds. ``ray.init`` retries an address that is not Ray
    (an HTTP server, a database) for good, so this is checked first. Other address forms
    ("auto", "ray://...") are left to Ray."""
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


def _free_cpus(ray: Any, config: ImpalaConfig, wait_s: float) -> float:
    """The Ray cluster's free CPUs, waiting up to ``wait_s`` seconds for at least 0.01 per
    worker (actors just killed free theirs a moment later); `ConfigError` if none come."""
    deadline = time.monotonic() + wait_s
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= 0.01 * config.num_workers:
            return free
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    total = ray.cluster_resources().get("CPU", 0.0)
    where = f"at {config.ray_address!r}" if config.ray_address else "of this process"
    raise ConfigError(
        f"backend='ray': the Ray cluster {where} has {free:g} of its {total:g} CPUs free "
        f"after {wait_s:g} s, too few for num_workers={config.num_workers} actors. Other "
        "Ray jobs hold them (`ray status` shows the usage): end them, or add a node with "
        "CPUs (ray start --address=<head>:<port> --num-cpus=N)"
    )
