"""A two-node Ray cluster on this machine, started with ``ray start`` as the README tells users.

`LocalCluster.start` runs the README's commands (with Ray >= 2.52, token authentication on,
the token in ``~/.ray/auth_token``, made by ``ray get-auth-token --generate`` if missing; older
Ray has neither, and its clusters no authentication) with a private ``--temp-dir`` and free
ports, so it never meets another Ray on the machine: a head node
labelled with the custom resource ``node_a`` and a second node labelled ``node_b`` joining it
at ``127.0.0.1:<port>``.

Each ``ray start`` runs in a session of its own, and every process it leaves (GCS, raylet,
agents, and the worker processes the raylet starts) stays in that session: `kill_raylet`
kills one node's raylet (a lost node), `stop` kills both sessions whatever happened. ``ray
stop`` is never used: it ends every Ray on the machine, other users' and other tests' too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from bench.soak import live_processes

RAY = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT_S = 180.0
START_ATTEMPTS = 3
STOP_TIMEOUT_S = 30.0
# Token authentication (RAY_AUTH_MODE=token, `ray get-auth-token`) came with Ray 2.52; a
# cluster of an older Ray has no authentication, and its `ray` has no get-auth-token command.
TOKEN_AUTH = Version(importlib.metadata.version("ray")) >= Version("2.52")


class RayStartError(RuntimeError):
    """``ray start`` exited with an error."""


def _raise_priority() -> None:
    """In the ``ray start`` child: a higher CPU priority while the node starts, where that is
    allowed (root). Ray's raylet gives its dashboard agent a fixed 15 s to start, which a
    machine loaded by other processes misses; once up, the node's processes get the normal
    priority back."""
    with contextlib.suppress(OSError):
        os.nice(-10)


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_pids(sid: int) -> list[int]:
    """Processes in session ``sid`` (the ``ray start`` that led it has exited)."""
    return [pid for pid, fields in live_processes() if int(fields[3]) == sid]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclasses.dataclass
class Node:
    resource: str  # the custom resource that labels it: node_a (head), node_b
    sid: int  # the session of its `ray start`, which all its processes keep

    def pids(self) -> list[int]:
        return session_pids(self.sid)

    def raylet_pid(self) -> int:
        (pid,) = [p for p in self.pids() if "/raylet/raylet " in cmdline(p)]
        return pid


@dataclasses.dataclass
class LocalCluster:
    temp_dir: str
    port: int
    env: dict[str, str]
    nodes: list[Node] = dataclasses.field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, head_cpus: int = 2, second_cpus: int = 1) -> LocalCluster:
        """Starts the head (``head_cpus``, resource ``node_a``) and a second node
        (``second_cpus``, ``node_b``), in up to `START_ATTEMPTS` tries: Ray's raylet gives
        its dashboard agent a fixed 15 s to start, which a loaded machine can miss (``ray
        start`` then fails with "The current node timed out during startup"). What a failed
        try started is stopped before the next."""
        env = {**os.environ, "RAY_AUTH_MODE": "token"} if TOKEN_AUTH else {**os.environ}
        env.pop("RAY_ADDRESS", None)
        if TOKEN_AUTH:
            subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True,
                           capture_output=True, timeout=60)
        for attempt in range(1, START_ATTEMPTS + 1):
            # Short: Ray's unix socket paths live under it (at most 107 bytes).
            cluster = cls(tempfile.mkdtemp(prefix="ilrc", dir="/tmp"), free_port(), env)
            try:
                cluster._ray_start("node_a", head_cpus, "--head", f"--port={cluster.port}",
                                   f"--ray-client-server-port={free_port()}",
                                   f"--dashboard-port={free_port()}",
                                   "--include-dashboard=false")
                cluster._ray_start("node_b", second_cpus, f"--address={cluster.address}")
                return cluster
            except RayStartError:
                cluster.stop()
                if attempt == START_ATTEMPTS:
                    raise
            except BaseException:
                cluster.stop()
                raise
        raise AssertionError("unreachable")

    def _ray_start(self, resource: str, cpus: int, *args: str) -> None:
        # Every port a node opens is a free one (defaults such as the agent's 52365 would be
        # shared by both nodes, and by any other Ray here).
        ports = [f"--{name}={free_port()}" for name in (
            "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")]
        proc = subprocess.Popen(
            [RAY, "start", *args, f"--num-cpus={cpus}", f"--resources={{\"{resource}\": 1}}",
             f"--temp-dir={self.temp_dir}", "--object-store-memory=100000000",
             "--disable-usage-stats", *ports],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=_raise_priority)
        # The child called setsid: its pid is the id of the session its daemons keep.
        self.nodes.append(Node(resource, proc.pid))
        try:
            out, _ = proc.communicate(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        for pid in self.nodes[-1].pids():  # started: back to the normal priority
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, 0)
        if proc.returncode != 0:
            raise RayStartError(f"ray start for {resource} failed ({proc.returncode}):\n"
                               f"{out[-2000:]}\n{self._raylet_errors()}")

    def _raylet_errors(self) -> str:
        """The raylets' error lines (why a node did not come up)."""
        lines = []
        for log in sorted(Path(self.temp_dir).glob("session_*/logs/raylet*.out")):
            lines += [f"{log.name}: {line[:400]}" for line in log.read_text().splitlines()
                      if " E " in line[:40] or " C " in line[:40]]
        return "\n".join(lines[-10:])

    def kill_raylet(self, resource: str) -> int:
        """SIGKILLs the raylet of the node labelled ``resource``; returns its pid."""
        (node,) = [n for n in self.nodes if n.resource == resource]
        pid = node.raylet_pid()
        os.kill(pid, signal.SIGKILL)
        return pid

    def pids(self) -> list[int]:
        return [p for node in self.nodes for p in node.pids()]

    def stop(self) -> None:
        """SIGKILLs every process of both nodes, waits until they are gone, removes the temp
        dir. Safe to call twice."""
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        left = self.pids()
        if left:
            raise RuntimeError(f"Ray processes left after {STOP_TIMEOUT_S:g} s: "
                               + "; ".join(f"{p} {cmdline(p)[:80]}" for p in left))
