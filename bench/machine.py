"""The machine a bench runs on: what it is, and a way to load it.

    busy_processes(n)                           n spinning processes beside a block (load)
    machine_info()                              nproc, CPU model, python/TF versions
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def busy_processes(n: int = 1) -> Iterator[list[int]]:
    """``n`` CPU-bound Python processes spinning beside whatever runs inside the block (a
    loaded machine); ended when it exits. Each also ends if its parent dies."""
    code = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
            "    for _ in range(1_000_000):\n        pass\n")
    procs = [subprocess.Popen([sys.executable, "-S", "-c", code], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory, load, python / TensorFlow / numpy / gymnasium versions."""
    import importlib.metadata as md

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    kb = _status_kb_meminfo()
    if kb:
        mem_gb = round(kb * 1024 / 1e9, 1)

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "cpu_model": cpu, "mem_gb": mem_gb, "loadavg_at_start": list(os.getloadavg()),
            "python": platform.python_version(), "platform": platform.platform(),
            "tensorflow": version("tensorflow-cpu") or version("tensorflow"),
            "keras": version("keras"), "numpy": version("numpy"),
            "gymnasium": version("gymnasium")}


def _status_kb_meminfo() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None
