"""Where a hand-in runs: a bubblewrap sandbox, or (where none can be made) a plain child.

``bwrap`` mode (Linux with bubblewrap and either root or user namespaces): the grading child
runs in new PID, network, IPC and UTS namespaces, as a user id of its own (never root), with
a read-only view of the interpreter and its site-packages, the exercise's student build of
`impala_lab` in place of the real one (`impala_lab.classroom.exercises._student_build`), a
read-only private copy of its notebook, and a small private ``/tmp``; nothing else of the
machine's files (no other hand-in, no checkout, no course notebooks). When the grader ends
it, the whole PID namespace goes with it.

``fallback`` mode (no bwrap, or it cannot start a sandbox here): today's child process in a
session of its own, the student build first on its path; the grader becomes the child
subreaper, so that whatever the hand-in started, even in a new session, comes back to it and
is killed. It cannot hide files or stop a hand-in from signalling the grader: the grader
prints which mode graded.

In both modes: rlimits per process (address space, file size, CPU time, process count, no
core files), a watchdog that kills the whole tree when its resident memory or its process
count passes the limit or the wall time runs out, and the results read over a pipe with a
size cap, never from a file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

RESULT_CAP = 16 * 2**20  # bytes of results read at most
LOG_KEEP = 4000  # characters of the child's output kept for a message
TMP_BYTES = 256 * 2**20  # the sandbox's /tmp
FILE_BYTES = 64 * 2**20  # RLIMIT_FSIZE
POLL_S = 0.1
# the only variables a hand-in sees (no tokens, no paths of the machine)
_ENV_KEEP = ("IMPALA_LAB_", "TF_CPP_", "TF_NUM_", "TF_ENABLE_", "OMP_", "MKL_", "OPENBLAS_",
             "CUDA_VISIBLE_DEVICES")
_SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
INSIDE_BUILD, INSIDE_HANDIN = "/grader/lib", "/grader/handin"


@dataclass
class Limits:
    """What one hand-in may use: wall seconds, MiB of memory (the whole tree), processes
    (and threads) of its user, CPU seconds per process (`cpu_seconds`)."""

    timeout: float
    memory_mb: int
    processes: int = field(default_factory=lambda: max(256, 4 * (os.cpu_count() or 1) + 64))

    @property
    def cpu_seconds(self) -> int:
        """RLIMIT_CPU of each process: what every core busy for the whole wall time uses (so
        it never ends an honest run first), a bound on a process that escapes the clock."""
        return int(self.timeout * (os.cpu_count() or 1)) + 10


@dataclass
class Outcome:
    """How the child ended and what it sent.

    Attributes:
      returncode: the child's (or the sandbox's) exit status.
      stopped: why the grader ended it: "time", "memory", "processes", or "".
      lines: the result pipe's lines, or None when it sent more than `RESULT_CAP`.
      log: the tail of the child's stdout and stderr.
    """

    returncode: int
    stopped: str
    lines: list[bytes] | None
    log: str


def requested_mode() -> str:
    """``IMPALA_LAB_SANDBOX``: "auto" (default), "bwrap" or "none"."""
    return os.environ.get("IMPALA_LAB_SANDBOX", "auto").strip().lower() or "auto"


def _uid() -> int:
    return 60000 + os.getpid() % 5000  # a user id no one else runs processes as


def _system_binds() -> list[str]:
    args = []
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _python_dirs() -> list[str]:
    """The interpreter's folders and its path entries, without any folder that holds an
    `impala_lab` source tree (a checkout: its notebooks hold the solutions)."""
    dirs = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for entry in sys.path:
        if entry and os.path.isdir(entry) and not os.path.isfile(
                os.path.join(entry, "impala_lab", "__init__.py")):
            dirs.add(os.path.abspath(entry))
    dirs = {d for d in dirs if d not in ("/", "/tmp") and not any(
        d == s or d.startswith(s + os.sep) for s in (*_SYSTEM, "/proc", "/dev"))}
    kept = sorted(d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs))
    return kept


def bwrap_args(build: Path, handin: Path, limits: Limits) -> list[str]:
    """The bwrap command line up to the child's own command (see the module docstring)."""
    made: set[str] = set()
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:  # privileged: no user namespace; setpriv drops to our uid inside
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--uid", str(_uid()), "--gid", str(_uid())]
    args += _system_binds()

    def ancestors(path: str) -> list[str]:
        out = []
        for parent in reversed(Path(path).parents):
            p = str(parent)
            if p != "/" and p not in made:
                made.add(p)
                out += ["--perms", "0755", "--dir", p]
        return out

    # /tmp first: a virtualenv that lives under /tmp is bound on top of it
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMP_BYTES),
             "--tmpfs", "/tmp"]
    made.add("/tmp")
    for d in _python_dirs():
        args += [*ancestors(d), "--ro-bind", d, d]
        if os.path.isdir(os.path.join(d, "impala_lab")):  # an installed impala_lab: hidden
            args += ["--tmpfs", os.path.join(d, "impala_lab")]
    args += [*ancestors(INSIDE_BUILD + "/x"), "--ro-bind", str(build), INSIDE_BUILD]
    args += ["--ro-bind", str(handin.parent), INSIDE_HANDIN]
    args += ["--chdir", "/tmp", "--clearenv"]
    for key, value in child_env().items():
        args += ["--setenv", key, value]
    if os.geteuid() == 0:
        uid = str(_uid())
        args += ["--", "setpriv", "--reuid", uid, "--regid", uid, "--clear-groups",
                 "--bounding-set", "-all", "--inh-caps", "-all", "--"]
    else:
        args += ["--"]
    return args


def child_env() -> dict[str, str]:
    """The grading child's environment, in both modes."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_KEEP)}
    env.update(HOME="/tmp", TMPDIR="/tmp", PATH="/usr/local/bin:/usr/bin:/bin",
               LANG="C.UTF-8", PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR="/tmp",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    return env


@cache
def bwrap_problem() -> str:
    """Why a sandbox cannot be made here ("" when it can): tried once per process."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian: apt-get install bubblewrap)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv is missing"
    probe = Path(__file__)
    cmd = [*bwrap_args(probe.parent, probe, Limits(10, 256)),
           sys.executable, "-E", "-s", "-c", "import numpy"]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start: {exc}"
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"bwrap failed here ({tail[0][:200]})"
    return ""


def choose_mode() -> tuple[str, str]:
    """(mode, why): "bwrap" where `bwrap_problem` finds none, else "fallback" and the
    reason. ``IMPALA_LAB_SANDBOX=none`` forces the fallback; ``=bwrap`` makes a missing
    sandbox an error (`RuntimeError`) instead."""
    wanted = requested_mode()
    if wanted == "none":
        return "fallback", "IMPALA_LAB_SANDBOX=none"
    problem = bwrap_problem()
    if not problem:
        return "bwrap", ""
    if wanted == "bwrap":
        raise RuntimeError(f"IMPALA_LAB_SANDBOX=bwrap, but {problem}")
    return "fallback", problem


def _become_subreaper() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, resident bytes, start time in clock ticks after boot) of every
    process visible here."""
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{name}/statm", "rb") as fh:
                rss = int(fh.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        out[int(name)] = (int(stat[1]), rss, int(stat[19]))
    return out


def tree(root: int, table: dict[int, tuple[int, int, int]] | None = None) -> list[int]:
    """`root` and its descendants."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class _Reader:
    """Reads the result pipe (capped) and the log pipe (its tail) without ever blocking."""

    def __init__(self, result_fd: int, log_fd: int) -> None:
        self.fds = {result_fd: bytearray(), log_fd: bytearray()}
        self.result_fd, self.log_fd = result_fd, log_fd
        self.overflow = False
        for fd in self.fds:
            os.set_blocking(fd, False)

    def pump(self, wait: float) -> None:
        if not self.fds:
            time.sleep(wait)
            return
        ready, _, _ = select.select(list(self.fds), [], [], wait)
        for fd in ready:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.close(fd)
                continue
            buf = self.fds[fd]
            if fd == self.log_fd:
                buf += chunk
                del buf[:-LOG_KEEP]
            elif len(buf) + len(chunk) > RESULT_CAP:
                self.overflow = True
            else:
                buf += chunk

    def close(self, fd: int) -> None:
        buf = self.fds.pop(fd, None)
        if buf is not None:
            setattr(self, "result" if fd == self.result_fd else "log", bytes(buf))
            os.close(fd)

    def finish(self) -> tuple[bytes, str]:
        for fd in list(self.fds):
            self.close(fd)
        return self.result, self.log.decode("utf-8", errors="replace")


def run(cmd: list[str], limits: Limits, *, cwd: str, env: dict[str, str] | None,
        subreaper: bool) -> Outcome:
    """Runs the child `cmd` (whose last argument is replaced by the result pipe's fd) under
    `limits`; returns when it and everything it started are gone. With `subreaper` (the
    fallback mode) this process becomes the child subreaper, and whatever the child started
    that comes back to it is killed too."""
    if subreaper:
        _become_subreaper()
    result_r, result_w = os.pipe()
    log_r, log_w = os.pipe()
    before = {pid for pid, (ppid, *_) in _table().items() if ppid == os.getpid()}
    cmd = [*cmd[:-1], str(result_w)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_w, stderr=log_w,
                            pass_fds=(result_w,), cwd=cwd, env=env, start_new_session=True)
    born = _table().get(proc.pid, (0, 0, 0))[2]  # its start time, read while it runs
    os.close(result_w)
    os.close(log_w)
    reader = _Reader(result_r, log_r)
    stopped = _watch(proc, reader, limits)
    _reap(proc, before, born)
    grace = time.monotonic() + 1.0
    while reader.fds and time.monotonic() < grace:  # what is still in the pipes
        reader.pump(0.05)
    result, log = reader.finish()
    lines = None if reader.overflow else result.splitlines()
    return Outcome(proc.returncode, stopped, lines, log)


def _watch(proc: subprocess.Popen, reader: _Reader, limits: Limits) -> str:
    deadline = time.monotonic() + limits.timeout
    next_check = 0.0
    while proc.poll() is None:
        reader.pump(POLL_S)
        now = time.monotonic()
        if now >= deadline:
            return "time"
        if now >= next_check:
            next_check = now + 2 * POLL_S
            table = _table()
            pids = tree(proc.pid, table)
            if sum(table.get(p, (0, 0, 0))[1] for p in pids) > limits.memory_mb * 2**20:
                return "memory"
            if len(pids) > limits.processes:
                return "processes"
    return ""


def _reap(proc: subprocess.Popen, before: set[int], born: int) -> None:
    """Kills the child's tree, then every process that came back to this one (the
    subreaper) since the child started (an older orphan that came back is not its), until
    none is left."""
    for _ in range(50):
        table = _table()
        strays = [p for p, (ppid, _, start) in table.items() if ppid == os.getpid()
                  and p not in before and p != proc.pid and start >= born]
        victims = (tree(proc.pid, table) if proc.poll() is None else []) + [
            d for s in strays for d in tree(s, table)]
        if not victims:
            break
        _kill(victims)
        for pid in strays:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if proc.poll() is None:
            proc.wait()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
