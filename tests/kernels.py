"""Notebook kernels for the tests, over IPC (unix sockets), not TCP.

jupyter_client picks a kernel's five TCP ports by binding port 0 and letting go before the
kernel binds them; in between another process can take one. A kernel that bound only some of
its ports stays alive but never answers, and the test waits out its whole timeout: two CI
runs lost a notebook test that way (notebooks 05 and 07, each fine alone in seconds). Unix
sockets under the test's own folder cannot collide.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import nbclient
from jupyter_client.manager import KernelManager

# Below pytest's 300 s, so that a cell that hangs is named (nbclient's CellTimeoutError
# shows its source) instead of pytest-timeout's stack of the waiting client.
CELL_TIMEOUT_S = 240


def notebook_client(nb: Any, kernel_name: str, socket_dir: Path, cwd: Path,
                    timeout: int = CELL_TIMEOUT_S) -> nbclient.NotebookClient:
    """A `nbclient.NotebookClient` that runs ``nb`` in ``cwd`` with a kernel of
    ``kernel_name`` whose channels are unix sockets in ``socket_dir``."""
    socket_dir.mkdir(parents=True, exist_ok=True)
    km = KernelManager(kernel_name=kernel_name, transport="ipc",
                       ip=str(socket_dir / f"k{uuid.uuid4().hex[:8]}"))
    return nbclient.NotebookClient(nb, km=km, timeout=timeout, kernel_name=kernel_name,
                                   resources={"metadata": {"path": str(cwd)}})
