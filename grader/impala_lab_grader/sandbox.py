"""Where a hand-in runs: a bubblewrap sandbox that holds the student's world and nothing else.

``bwrap``: new PID, network, IPC and UTS namespaces, a user id of its own (never root) with no
capabilities. Its files: the system's folders read-only (``/usr``, ``/etc``, ``/lib``...),
the interpreter (`world.interpreter_binds`), the student package's dependencies in the
interpreter's site-packages folder (`world.entries`, emptied of anything else first), the
student build and the grading child's modules at ``/grader/lib``, the hand-in's cells at
``/grader/handin``, and a private ``/tmp`` and ``/dev/shm`` with a size cap. Every folder
where Python code or the course could live is hidden where a bound folder holds it
(`world.hidden`): the working directory, ``PYTHONPATH``, the installed library, the course,
the other hand-ins. A seccomp filter refuses memfds and System V shared memory and message
queues. When the grader ends the sandbox, its whole PID namespace goes with it.

Resources: a cgroup for the whole sandbox where one can be made (`impala_lab_grader.cgroup`:
memory, shared memory and tmpfs pages included, and tasks); else per-process limits and a
watchdog that sums the tree's memory and counts its tasks. Either way: wall time, CPU time per
process (a backstop), 64 MiB per file, no core files, and the results read from a pipe with
a cap (`impala_lab_grader.channel`).

``--unsandboxed`` (notebooks you trust only): a plain child of this interpreter in a session
of its own, the student build first on its path, the same limits, this process its
subreaper; it runs as you and can read, write and signal what you can.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from impala_lab_grader import world
from impala_lab_grader.cgroup import Cgroup
from impala_lab_grader.channel import RESULT_CAP

LOG_KEEP = 4000  # characters of the child's output kept for a message
TMP_BYTES = 256 * 2**20  # the sandbox's /tmp
SHM_BYTES = 64 * 2**20  # its /dev/shm
POLL_S = 0.1
INSIDE_BUILD, INSIDE_HANDIN = "/grader/lib", "/grader/handin"
INSTALL = ("install bubblewrap (Debian, Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo "
           "dnf install bubblewrap; in a clone: make grader-deps), or pass --unsandboxed to "
           "grade notebooks you trust without isolation")
# the only variables a hand-in sees (no tokens, no paths of the machine)
_ENV_KEEP = ("IMPALA_LAB_", "TF_CPP_", "TF_NUM_", "TF_ENABLE_", "OMP_", "MKL_", "OPENBLAS_",
             "CUDA_VISIBLE_DEVICES")
# seccomp: the audit architecture, and the system calls refused (memory no rlimit counts)
_SECCOMP = {"x86_64": (0xC000003E, (29, 68, 319, 447)),  # shmget msgget memfd_create/secret
            "aarch64": (0xC00000B7, (186, 194, 279, 447))}


class NoSandbox(RuntimeError):
    """bubblewrap is missing or cannot make a sandbox here (the message says why and how to
    install it)."""


@dataclass
class Limits:
    """What one hand-in may use: wall seconds, MiB of memory (the whole sandbox), tasks
    (processes and threads), CPU seconds per process (`cpu_seconds`)."""

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
      stopped: the limit that ended it or that the kernel enforced: "time", "memory",
        "processes", or "".
      data: the bytes of the result pipe, or None when it sent more than `RESULT_CAP`.
      log: the tail of the child's stdout and stderr.
    """

    returncode: int
    stopped: str
    data: bytes | None
    log: str


def _uid() -> int:
    return 60000 + os.getpid() % 5000  # a user id no one else runs processes as


def seccomp_program() -> bytes | None:
    """A classic BPF program for bwrap's ``--seccomp``: other architectures' calls kill the
    process, `_SECCOMP`'s calls fail with EPERM, everything else is allowed (None on a
    machine this does not know)."""
    known = _SECCOMP.get(platform.machine())
    if known is None:
        return None
    arch, calls = known
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, 0x80000000), (ld, 0, 0, 0)]
    if platform.machine() == "x86_64":  # the x32 ABI: call numbers with bit 30 set
        prog.append((jge, len(calls) + 1, 0, 0x40000000))
    prog += [(jeq, len(calls) - i, 0, nr) for i, nr in enumerate(calls)]
    prog += [(ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | errno.EPERM)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def _within(path: str, folders: list[str]) -> bool:
    return any(path != f and world.under(path, (f,)) for f in folders)


def bwrap_args(build: Path, handin: Path, hide: list[str], seccomp_fd: int | None) -> list[str]:
    """The bwrap command line up to the child's own command (see the module docstring).

    Args:
      build: the folder holding the student build and the child's modules.
      handin: the folder holding the hand-in's cells.
      hide: folders to hide besides `world.hidden`'s own (the hand-ins' folders).
      seccomp_fd: a readable fd holding `seccomp_program`, or None.
    """
    made: set[str] = {"/tmp"}
    if os.geteuid() == 0:  # privileged: no user namespace; setpriv drops to our uid inside
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                "--uid", str(_uid()), "--gid", str(_uid())]
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMP_BYTES),
             "--tmpfs", "/tmp", "--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs",
             "/dev/shm"]
    bound = []
    for path in world.SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    interpreter = world.interpreter_binds()
    bound += interpreter[2::3]

    def ancestors(path: str) -> list[str]:
        out = []
        for parent in reversed(Path(path).parents):
            p = str(parent)
            if p != "/" and p not in made and not any(world.under(p, (b,)) for b in bound):
                made.add(p)
                out += ["--perms", "0755", "--dir", p]
        return out

    for i in range(0, len(interpreter), 3):
        args += [*ancestors(interpreter[i + 2]), *interpreter[i:i + 3]]
    target = world.site_target()
    hidden = [h for h in world.hidden(hide) if _within(h, bound)]
    hidden = [h for h in hidden if not _within(h, hidden)] + ([] if _within(
        target, hidden) or target in hidden else [target])
    for path in hidden:
        args += [*ancestors(path), "--tmpfs", path]
    for name, path in world.entries().items():
        args += ["--ro-bind", str(path), f"{target}/{name}"]
    args += [*ancestors(INSIDE_BUILD), "--ro-bind", str(build), INSIDE_BUILD,
             "--ro-bind", str(handin), INSIDE_HANDIN, "--chdir", "/tmp", "--clearenv"]
    for key, value in child_env().items():
        args += ["--setenv", key, value]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if os.geteuid() == 0:
        uid = str(_uid())
        return [*args, "--", "setpriv", "--reuid", uid, "--regid", uid, "--clear-groups",
                "--bounding-set", "-all", "--inh-caps", "-all", "--"]
    return [*args, "--"]


def child_env() -> dict[str, str]:
    """The grading child's environment, in both modes."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_KEEP)}
    env.update(HOME="/tmp", TMPDIR="/tmp", PATH="/usr/local/bin:/usr/bin:/bin",
               LANG="C.UTF-8", PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR="/tmp",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    return env


@contextlib.contextmanager
def seccomp_fd() -> Iterator[int | None]:
    """A readable fd holding `seccomp_program` (None where there is none), closed after."""
    program = seccomp_program()
    if program is None:
        yield None
        return
    read, write = os.pipe()
    os.write(write, program)
    os.close(write)
    try:
        yield read
    finally:
        os.close(read)


@cache
def bwrap_problem() -> str:
    """Why a sandbox cannot be made here ("" when it can): tried once per process, with the
    student's world and the interpreter (numpy must import inside)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing"
    try:
        with tempfile.TemporaryDirectory() as empty, seccomp_fd() as fd:
            os.chmod(empty, 0o755)
            cmd = [*bwrap_args(Path(empty), Path(empty), [], fd), world.python(), "-I", "-c",
                   "import numpy"]
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=60, pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.TimeoutExpired, world.WorldError) as exc:
        return f"bwrap could not start: {exc}"
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"bwrap failed here ({tail[0][:300]})"
    return ""


def require_bwrap() -> None:
    """Raises `NoSandbox` (why, and how to install bubblewrap) where none can be made."""
    problem = bwrap_problem()
    if problem:
        raise NoSandbox(f"no sandbox: {problem}; {INSTALL}")


def _become_subreaper() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _table() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (parent pid, resident bytes, start time in clock ticks after boot, threads)
    of every process visible here."""
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
        out[int(name)] = (int(stat[1]), rss, int(stat[19]), int(stat[17]))
    return out


def _pss(pid: int) -> int:
    """The proportional set size of a process, in bytes (pages shared after a fork counted
    once over the processes that share them)."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/smaps_rollup",
                                                         "rb") as fh:
        for line in fh:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def tree(root: int, table: dict[int, tuple[int, int, int, int]] | None = None) -> list[int]:
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
        subreaper: bool, pass_fds: tuple[int, ...] = (), cgroup: Cgroup | None = None
        ) -> Outcome:
    """Runs the child `cmd` (whose last argument is replaced by the result pipe's fd) under
    `limits`, in `cgroup` when there is one; returns when it and everything it started are
    gone. With `subreaper` (unsandboxed) this process becomes the child subreaper, and
    whatever the child started that comes back to it is killed too."""
    if subreaper:
        _become_subreaper()
    result_r, result_w = os.pipe()
    log_r, log_w = os.pipe()
    before = {pid for pid, (ppid, *_) in _table().items() if ppid == os.getpid()}
    cmd = [*cmd[:-1], str(result_w)]
    if cgroup is not None:
        cmd = cgroup.wrap(cmd)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_w, stderr=log_w,
                            pass_fds=(result_w, *pass_fds), cwd=cwd, env=env,
                            start_new_session=True)
    born = _table().get(proc.pid, (0, 0, 0, 0))[2]  # its start time, read while it runs
    os.close(result_w)
    os.close(log_w)
    reader = _Reader(result_r, log_r)
    stopped = _watch(proc, reader, limits, cgroup)
    _reap(proc, before, born)
    if cgroup is not None:
        cgroup.kill()
        stopped = stopped or cgroup.hit()
    grace = time.monotonic() + 1.0
    while reader.fds and time.monotonic() < grace:  # what is still in the pipes
        reader.pump(0.05)
    result, log = reader.finish()
    return Outcome(proc.returncode, stopped, None if reader.overflow else result, log)


def _watch(proc: subprocess.Popen, reader: _Reader, limits: Limits,
           cgroup: Cgroup | None) -> str:
    deadline = time.monotonic() + limits.timeout
    next_check = 0.0
    while proc.poll() is None:
        reader.pump(POLL_S)
        now = time.monotonic()
        if now >= deadline:
            return "time"
        if now < next_check:
            continue
        next_check = now + 2 * POLL_S
        if cgroup is not None:  # the kernel enforces its limits: stop at the first it did
            hit = cgroup.hit()
            if hit:
                return hit
        else:
            table = _table()
            pids = tree(proc.pid, table)
            if sum(table.get(p, (0, 0, 0, 1))[3] for p in pids) > limits.processes:
                return "processes"
            limit = limits.memory_mb * 2**20
            if sum(table.get(p, (0, 0, 0, 0))[1] for p in pids) > limit and sum(
                    _pss(p) for p in pids) > limit:
                return "memory"
    return ""


def _reap(proc: subprocess.Popen, before: set[int], born: int) -> None:
    """Kills the child's tree, then every process that came back to this one (the
    subreaper) since the child started (an older orphan that came back is not its), until
    none is left."""
    for _ in range(50):
        table = _table()
        strays = [p for p, (ppid, _, start, _) in table.items() if ppid == os.getpid()
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
