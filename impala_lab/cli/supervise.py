"""A watchman for ``impala-lab train --backend ray``: the run trains in a child process.

Ray ends its driver from C++ when the driver's raylet dies or the cluster's head is lost: no
``finally`` of the run gets to say so. So with Ray the CLI process imports neither Ray nor
TensorFlow: it runs the same command line as a child (in a process group of its own), passes
signals on as SIGINT (Ray's driver dies at once on SIGTERM), ends what the child leaves in its
group, and names a lost cluster in ``result.json`` (docs/training.md, docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from impala_lab.cli.endings import EndingSignals
from impala_lab.cli.run_folder import RunFolder, read_json
from impala_lab.errors import ConfigError

#: Set in the child's environment: the child trains instead of watching.
SUPERVISED_ENV = "IMPALA_LAB_SUPERVISED"
_FORWARDED = (signal.SIGINT, *EndingSignals.SIGNALS)


def should_supervise(backend: str) -> bool:
    """True in the CLI process of a Ray run (not in the child it starts)."""
    return backend == "ray" and os.environ.get(SUPERVISED_ENV) != "1"


def _end_with_parent() -> None:
    """In the child, before it runs: SIGINT when the watchman dies (Linux's
    PR_SET_PDEATHSIG), which ends the run cleanly. Every ending comes as SIGINT, so the child
    must not inherit an ignored one (a shell's background job ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG = 1


def supervise(argv: list[str], out: Path) -> int:
    """Runs ``impala-lab <argv>`` (``argv`` after the program name) as a child and watches
    it; ``out``: the run's folder. Returns the child's exit code, 128 + N for a child ended by
    signal N, or 1 when the child ended without ending the run."""
    env = {**os.environ, SUPERVISED_ENV: "1"}
    child = subprocess.Popen([sys.executable, "-m", "impala_lab.cli.main", *argv], env=env,
                             process_group=0, preexec_fn=_end_with_parent)
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:  # as SIGINT, once (see the module doc)
        if not received:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGINT)
        received.append(signum)

    # A signal this process ignores (a shell's background job ignores SIGINT) the child
    # ignores too: it is not forwarded.
    previous = {s: signal.signal(s, forward) for s in _FORWARDED
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _end_group(child.pid)
    if received and code == 128 + signal.SIGINT:
        code = 128 + received[0]  # 143 for SIGTERM, 129 for SIGHUP, as without Ray
    return _after(code, out)


def _end_group(pgid: int, grace_s: float = 5.0) -> None:
    """Ends what the child left in its process group: a dead raylet orphans Ray's agents."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return  # nothing left
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)


def _after(code: int, out: Path) -> int:
    """The exit code of the watched run; names the loss when the child did not end it."""
    code = 128 - code if code < 0 else code
    result = read_json(out / "result.json")  # None: nothing started, or no report yet
    # 2: a config error (before anything ran, or a folder held by another run); 0: done
    if code in (0, 2) or (result is not None and result.get("stop_reason") != "running"):
        return code
    how = (f"was killed by signal {code - 128}" if code > 128 else f"exited with code {code}")
    error = (f"the Ray cluster was lost: the training process {how} without ending the run, "
             "which is how Ray ends its driver when the driver's raylet dies or the "
             "cluster's head goes away (see the Ray log lines above)")
    if result is not None:
        _write_error(out, result, error)
    checkpoint = out / "checkpoint" / "state.json"
    resume = (f"; resume with impala-lab train --resume {out}" if checkpoint.is_file()
              else "; no checkpoint was saved yet (see --checkpoint-every)")
    print(f"impala-lab: error: {error}", file=sys.stderr)
    print(f"impala-lab: metrics up to the last report and result.json are in {out}/{resume}",
          file=sys.stderr)
    return 1


def _write_error(out: Path, result: dict[str, Any], error: str) -> None:
    """Marks the run's result.json as ended by ``error`` (under the folder's lock)."""
    try:
        folder = RunFolder(out, resume=True)
    except ConfigError as exc:  # the folder is held by another run now: leave it alone
        print(f"impala-lab: result.json not updated: {exc}", file=sys.stderr)
        return
    try:
        folder.write_json("result.json", {**result, "stop_reason": "error", "error": error})
    finally:
        folder.close()
