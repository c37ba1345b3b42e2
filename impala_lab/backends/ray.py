"""Rollout workers as Ray actors (the ``ray`` extra: ``pip install 'impala_lab[ray]'``).

The same `RolloutWorker` in a Ray actor. A broadcast is one ``ray.put`` of ``(weights,
version)`` whose object ref every ``set_weights`` passes; Ray runs one caller's tasks on an
actor in order, so ``set_weights`` applies before the next ``sample``. ``config.ray_address``
joins that cluster (never shut down here); a Ray already initialized is used as it is;
otherwise a private local Ray starts and ends with `RayBackend.shutdown` (see
`impala_lab.backends.ray_cluster`). In a Jupyter kernel the actors' output stays in Ray's log
files. Each actor asks for ``min(1, free CPUs / num_workers)`` CPUs, spread over the nodes;
docs/training.md, "A Ray cluster", has the cluster's setup.
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
from impala_lab.backends.ray_cluster import FREE_CPU_WAIT_S, free_cpus, join_cluster, start_local
from impala_lab.backends.worker_info import describe_env, pickled_env, worker_info
from impala_lab.config import ImpalaConfig
from impala_lab.errors import ClusterLostError, ConfigError, WorkerError

__all__ = ["RayBackend", "RayWorkerHandle", "RayFuture", "RAY_MISSING"]

RAY_MISSING = "backend='ray' needs the 'ray' extra: pip install 'impala_lab[ray]'"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its reports; a WorkerError is plain text


class RolloutActor:
    """The body of a worker actor: a `RolloutWorker` behind Ray method calls."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        from impala_lab.actor import make_rollout_worker

        self.worker = make_rollout_worker(**kwargs)

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
    """One actor task (a `SampleFuture`); ``completion_time``: when the driver saw it done."""

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
        does every later task of that actor (it was killed)."""
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
                h._backend.check_raylet(text)
                raise h._failed(self.seq, f"the Ray actor died: {text.splitlines()[0]}",
                                text) from None
        finally:
            self._mark_done()


class RayWorkerHandle(WorkerHandle):
    """The driver's side of one worker actor (``actor``: its Ray handle)."""

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
        """Submits a task returning the actor's `worker_info` and its node's ``node_id``."""
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


def raylet_socket(ray: Any) -> str | None:
    """This driver's raylet's socket path in Ray's node table (None if it is not there)."""
    node_id = ray.get_runtime_context().get_node_id()
    return next((node.get("RayletSocketName") for node in ray.nodes()
                 if node.get("NodeID") == node_id), None)


class RayBackend(Backend):
    """Rollout workers as Ray actors (see the module docstring); ``ray_init_kwargs`` override
    `init_kwargs` for a Ray this backend starts. Without Ray installed: ImportError."""

    name = "ray"

    def __init__(self, config: ImpalaConfig, *,
                 ray_init_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        try:
            import ray
        except ImportError as exc:
            raise ImportError(RAY_MISSING) from exc
        self._ray = ray
        self.handles: list[RayWorkerHandle] = []
        self._closed = False
        self.started_ray = False  # a local Ray of its own, shut down with this backend
        initialized_here = not ray.is_initialized()
        if initialized_here:
            kwargs = self.init_kwargs(config, ray_init_kwargs)
            if config.ray_address:
                join_cluster(ray, kwargs)
            else:
                start_local(ray, kwargs)
                self.started_ray = True
        try:
            cpus = free_cpus(ray, config, FREE_CPU_WAIT_S)
        except ConfigError:
            if initialized_here:
                ray.shutdown()  # leaves a joined cluster running
            raise
        self.raylet_socket = raylet_socket(ray)
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
            package_parent = os.path.abspath(os.path.join(__file__, "..", "..", ".."))
            # "local": a new Ray even where a `ray start` cluster runs on this machine, which
            # ray.init() without an address would join (and then refuse num_cpus).
            kwargs.update(address="local", num_cpus=os.cpu_count() or 1,
                          include_dashboard=False,
                          job_config=JobConfig(code_search_path=[package_parent]))
        kwargs.update(overrides or {})
        return kwargs

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

    def put_weights(self, weights: list, version: int) -> Any:
        """One ``ray.put`` of ``(weights, version)``; every actor reads that object."""
        return self._ray.put((list(weights), int(version)))

    def wait(self, futures: Sequence[Any], timeout: float | None) -> list:
        """``ray.wait`` on the futures' refs: the done futures, blocking up to ``timeout``."""
        pending = {f.ref: f for f in futures if not f._done}
        refs = list(pending)
        if refs:
            if timeout != 0 and not any(f._done for f in futures):  # wait for one
                self._ray.wait(refs, num_returns=1, timeout=timeout)
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                pending[ref]._mark_done()
        return [f for f in futures if f._done]

    def check_raylet(self, why: str) -> None:
        """Raises `ClusterLostError` (quoting ``why``, Ray's report of an actor's death) when
        this driver's raylet refuses the socket it had at the start: no actor can be replaced."""
        path = self.raylet_socket
        if not isinstance(path, str) or not os.path.exists(path):
            return  # cannot tell (another platform, another Ray): the worker error stands
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            try:
                sock.connect(path)
                return
            except OSError as exc:
                refused = f"{type(exc).__name__}: {exc}"
        raise ClusterLostError(
            f"the Ray cluster was lost: this driver's raylet does not answer on {path} "
            f"({refused}), so its node crashed or the raylet was killed, and no worker can be "
            f"replaced. Ray's last report: {why.splitlines()[0][:300]}")

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
