"""A cgroup for one sandbox: memory and tasks counted for the whole tree, and a kill that
reaches every process in it.

The kernel charges a cgroup with all the memory its processes make: their pages, shared
memory, memfds and tmpfs files included, with no swap to escape to. At the memory limit its
OOM killer ends a process of the sandbox; at the task limit (processes and threads) a fork
fails. `Cgroup.hit` reads which limit the kernel enforced, so that a message can name it.

cgroup v2 where this process's cgroup delegates the memory and pids controllers to child
groups (its ``cgroup.subtree_control`` names both: a systemd unit with ``Delegate=yes``, a
container's root); cgroup v1 where the memory and pids hierarchies are mounted and writable
(as root). Elsewhere `Cgroup.make` says why not, and the grader falls back to per-process
limits and a watchdog (`impala_lab_grader.sandbox`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


def _mounts() -> dict[str, Path]:
    """Controller (or "cgroup2") -> where its hierarchy is mounted."""
    out: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            head, _, tail = line.partition(" - ")
            fstype, _, options = [*tail.split(), "", "", ""][:3]
            mount = Path(head.split()[4])
            if fstype == "cgroup2":
                out.setdefault("cgroup2", mount)
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option in ("memory", "pids"):
                        out.setdefault(option, mount)
    return out


def _own() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path in that hierarchy."""
    out = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path.lstrip("/")
    return out


def _events(path: Path, key: str) -> int:
    """The count `key` in a flat "key value" file (0 when absent)."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


class Cgroup:
    """One sandbox's cgroup (see the module docstring): `make` it, start the sandbox in it
    (`wrap`), read `hit` and `pids`, then `kill` and `remove`."""

    def __init__(self, version: int, dirs: list[Path]) -> None:
        self.version, self.dirs = version, dirs

    @classmethod
    def make(cls, name: str, memory_bytes: int, tasks: int) -> tuple[Cgroup | None, str]:
        """A new cgroup `name` with the limits, or (None, why not)."""
        try:
            mounts, own = _mounts(), _own()
        except OSError as exc:
            return None, f"cannot read this process's cgroups ({exc})"
        parent = mounts.get("cgroup2", _ROOT) / own.get("", "")
        delegated = set()
        with contextlib.suppress(OSError):
            delegated = set((parent / "cgroup.subtree_control").read_text().split())
        if "" in own and {"memory", "pids"} <= delegated:
            group = cls(2, [parent / name])
            files = {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": tasks}
        elif "memory" in mounts and "pids" in mounts and "memory" in own and "pids" in own:
            group = cls(1, [mounts["memory"] / own["memory"] / name,
                            mounts["pids"] / own["pids"] / name])
            files = {"memory.limit_in_bytes": memory_bytes,
                     "memory.memsw.limit_in_bytes": memory_bytes, "pids.max": tasks}
        else:
            return None, ("no cgroup controllers for memory and processes delegated to this "
                          "process")
        try:
            for folder in group.dirs:
                folder.mkdir()
            for file, value in files.items():
                path = next((d / file for d in group.dirs if (d / file).exists()), None)
                if path is not None:
                    path.write_text(str(value))
        except OSError as exc:
            group.remove()
            return None, f"cannot make a cgroup here ({exc.strerror or exc})"
        return group, ""

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` run by a shell that first moves itself into the cgroup, then becomes
        `cmd`: everything the sandbox starts is in the cgroup from its first instruction."""
        script = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; '
                  'shift; exec "$@"')
        return ["/bin/sh", "-c", script, "sh",
                *(str(d / "cgroup.procs") for d in self.dirs), "--", *cmd]

    def pids(self) -> list[int]:
        """The processes in the cgroup."""
        with contextlib.suppress(OSError, ValueError):
            return [int(p) for p in (self.dirs[0] / "cgroup.procs").read_text().split()]
        return []

    def hit(self) -> str:
        """Which limit the kernel enforced: "processes" (a fork failed at the task limit),
        "memory" (the OOM killer ended a process), or ""."""
        pids_dir = self.dirs[-1]
        if _events(pids_dir / "pids.events", "max") > 0:
            return "processes"
        memory = self.dirs[0] / ("memory.events" if self.version == 2 else "memory.oom_control")
        if _events(memory, "oom_kill") > 0:
            return "memory"
        return ""

    def kill(self) -> None:
        """Kills every process in the cgroup and waits (a few seconds at most) until none
        is left."""
        kill_file = self.dirs[0] / "cgroup.kill"
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def remove(self) -> None:
        """Removes the cgroup's folders (once its processes are gone)."""
        for folder in self.dirs:
            for _ in range(20):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
