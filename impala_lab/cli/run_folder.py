"""The output folder of one ``impala-lab train`` run: claimed by a lock, written as it goes.

One run per folder: the run holds an exclusive ``flock`` on ``OUT/.lock`` for its whole life
(the kernel drops it however the holder dies), and the folder stays the run's only while its
and its lock's inodes are the ones the run locked. Writes cannot tear: files are renamed into
place, a ``metrics.csv`` row is appended whole or truncated back. docs/reliability.md lists
each fault and what happens.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from impala_lab.cli.endings import say
from impala_lab.errors import ConfigError, ImpalaError
from impala_lab.stats import csv_number, jsonable

LOCK_NAME = ".lock"
# An earlier run's results: a fresh run is refused where one of them is.
RESULT_FILES = ("metrics.csv", "result.json", "checkpoint", "checkpoint.prev", "tensorboard",
                "report.png", "policy.gif")
# What a run writes into its folder (anything else there is not a run's).
RUN_FILES = frozenset({*RESULT_FILES, "config.json", "run.json", LOCK_NAME})
MAX_PENDING_ROWS = 10_000  # metrics rows kept while the disk refuses them


class FolderLost(ImpalaError):
    """The run's folder was removed or replaced while the run wrote into it."""


def _is_run_file(name: str) -> bool:
    return name in RUN_FILES or name.startswith(("checkpoint.tmp-", ".tmp-"))


def _path_error(out: Path, exc: OSError) -> ConfigError:
    """One line for a folder path the system refuses, with the fix."""
    why = {errno.ELOOP: "is a symbolic link loop (or goes through one): give a real folder",
           errno.ENAMETOOLONG: "has a name longer than the file system allows (255 bytes a "
                               "folder name): give a shorter --out",
           errno.ENOTDIR: "goes through a file, not a folder: give a folder"}.get(exc.errno)
    return ConfigError(f"--out={str(out)!r} {why}" if why else
                       f"--out={str(out)!r} cannot be written ({exc.strerror or exc}): give a "
                       "folder you can write to")


class RunFolder:
    """Claims ``out`` (created if missing) for one run and writes its files as the run goes;
    ``overwrite`` accepts a folder of other files and replaces an earlier run's, ``resume``
    continues the run there. A refused folder is left as it was.

    Attributes:
      unwritten: the files whose latest write failed, with the reason (tried again later).
      lost: the folder stopped being this run's (see `FolderLost`).

    Raises:
      ConfigError: a folder that cannot be this run's; the message names the path and the fix.
    """

    def __init__(self, out: Path, *, overwrite: bool = False, resume: bool = False) -> None:
        self.out = Path(out)
        self.unwritten: dict[str, str] = {}
        self.lost = False
        self._columns: list[str] = []
        self._pending: list[dict[str, Any]] = []
        self._created: list[Path] = []  # what this claim made: removed if it is refused
        self._lock_fd: int | None = None
        try:
            self._claim(overwrite, resume)
        except BaseException:
            self.close(undo=True)
            raise

    def _claim(self, overwrite: bool, resume: bool) -> None:
        text = str(self.out)
        names = self._existing_names()
        others = sorted(n for n in names or () if not _is_run_file(n))
        if others and not overwrite:
            raise ConfigError(
                f"--out={text!r} holds files that are not an impala_lab run's "
                f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}): pick another "
                "folder, or pass --overwrite to write the run's files beside them")
        if names is None:
            self._make_folders()
        self._lock()
        if not resume:
            earlier = [n for n in RESULT_FILES if n in (names or ())]
            if earlier and not overwrite:
                raise ConfigError(
                    f"--out={text!r} holds an earlier run ({', '.join(earlier)}): continue it "
                    f"with --resume {text}, replace it with --overwrite, or give another --out")
            self._remove_earlier_run()
        folder, lock = os.stat(self.out), os.fstat(self._lock_fd)
        self._identity = ((folder.st_dev, folder.st_ino), (lock.st_dev, lock.st_ino))

    def _existing_names(self) -> list[str] | None:
        """The folder's entries; None if it does not exist."""
        try:
            if not stat.S_ISDIR(os.stat(self.out).st_mode):
                raise ConfigError(f"--out={str(self.out)!r} is a file, not a folder: give a "
                                  "folder for this run's files")
            return os.listdir(self.out)
        except FileNotFoundError:
            if os.path.islink(self.out):
                raise ConfigError(f"--out={str(self.out)!r} is a symbolic link to a missing "
                                  f"folder ({os.readlink(self.out)}): create it, or give "
                                  "another --out") from None
            return None
        except OSError as exc:
            raise _path_error(self.out, exc) from None

    def _make_folders(self) -> None:
        for path in reversed((self.out, *self.out.parents)):
            if os.path.lexists(path):
                continue
            try:
                os.mkdir(path)
            except OSError as exc:
                raise _path_error(self.out, exc) from None
            self._created.append(path)

    def _lock(self) -> None:
        path = self.out / LOCK_NAME
        existed = os.path.lexists(path)
        try:
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    0o644)
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ELOOP):
                kind = "a folder" if exc.errno == errno.EISDIR else "a symbolic link"
                raise ConfigError(f"{path} is {kind}, not impala-lab's lock file: remove it, "
                                  "or give another --out") from None
            raise _path_error(self.out, exc) from None
        if not existed:
            self._created.append(path)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock_fd, 64, 0).decode(errors="replace").strip()
            raise ConfigError(f"--out={str(self.out)!r} is in use by another impala-lab train "
                              f"(pid {holder or 'unknown'}): one run per folder; give another "
                              "--out, or wait for that run to end") from None
        except OSError as exc:  # ENOLCK, EOPNOTSUPP: some network and FUSE file systems
            raise ConfigError(f"--out={str(self.out)!r} is on a file system without file locks "
                              f"({exc.strerror}), which keep two runs out of one folder: give "
                              "a folder on a local disk") from None
        with contextlib.suppress(OSError):  # the pid only names the holder in a refusal
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, str(os.getpid()).encode(), 0)

    def _remove_earlier_run(self) -> None:
        """A fresh run's folder: what an earlier run left there goes (its lock stays)."""
        for name in os.listdir(self.out):
            path = self.out / name
            if name == LOCK_NAME or not _is_run_file(name):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def close(self, undo: bool = False) -> None:
        """Releases the folder (the lock file stays: its lock is what counts); ``undo``
        also removes what the claim made (a refused folder is left as it was)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        for path in reversed(self._created) if undo else ():
            with contextlib.suppress(OSError):
                os.rmdir(path) if path.is_dir() else path.unlink()
        self._created = []

    def check(self) -> None:
        """Raise `FolderLost` unless ``out`` is still the folder this run locked."""
        if not self.lost:
            try:
                folder = os.stat(self.out)
                lock = os.stat(self.out / LOCK_NAME, follow_symlinks=False)
                self.lost = ((folder.st_dev, folder.st_ino),
                             (lock.st_dev, lock.st_ino)) != self._identity
            except OSError:
                self.lost = True
        if self.lost:
            raise FolderLost(f"the run's folder {self.out}/ was removed or replaced while the "
                             "run was writing into it: nothing more is written there (a folder "
                             "made at that path since is not this run's)")

    def write_json(self, name: str, obj: Any) -> bool:
        """Replaces ``name`` with ``obj`` as JSON, atomically; False if the disk refused."""
        data = json.dumps(jsonable(obj), indent=2).encode()
        return self.write_file(name, lambda path: path.write_bytes(data))

    def write_file(self, name: str, write: Callable[[Path], Any]) -> bool:
        """``write(path)`` writes a temporary file that then replaces ``name``; False if the
        disk refused (an `OSError`; any other error of ``write`` is raised)."""
        try:
            self._write(name, write)
        except OSError as exc:
            return self._failed(name, exc)
        self.unwritten.pop(name, None)
        return True

    def write_first(self, files: dict[str, Any]) -> None:
        """The run's first files (name -> JSON object): a folder that refuses them is a
        `ConfigError`, and the claim is undone (nothing has started yet)."""
        for name, obj in files.items():
            data = json.dumps(jsonable(obj), indent=2).encode()
            try:
                self._write(name, lambda path, data=data: path.write_bytes(data))
            except OSError as exc:
                self.close(undo=True)
                why = exc.strerror or exc
                raise ConfigError(f"--out={str(self.out)!r} cannot be written ({why}, writing "
                                  f"{name}): free some space there, or give a folder you can "
                                  "write to") from None

    def _write(self, name: str, write: Callable[[Path], Any]) -> None:
        self.check()
        tmp = self.out / f".tmp-{os.getpid()}-{name}"
        try:
            write(tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.out / name)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def append_metrics(self, rows: Iterable[dict[str, Any]]) -> bool:
        """Appends ``rows`` (and any that an earlier failure left waiting) to metrics.csv; a
        row with a new column rewrites the file with the wider header. False if the disk
        refused (the rows wait for the next call)."""
        self.check()
        self._pending.extend(rows)
        del self._pending[:-MAX_PENDING_ROWS]
        if not self._pending:
            return True
        columns = list(self._columns)
        for row in self._pending:
            columns.extend(k for k in row if k not in columns)
        path = self.out / "metrics.csv"
        try:
            if columns != self._columns or not path.exists():
                earlier = _parse(path.read_text(errors="replace"))[1] if path.exists() else []
                self._replace_metrics(columns, earlier + self._pending)
            else:
                _append(path, _csv_text(columns, self._pending, header=False))
        except OSError as exc:
            return self._failed("metrics.csv", exc)
        self._columns, self._pending = columns, []
        self.unwritten.pop("metrics.csv", None)
        return True

    def cut_metrics(self, max_env_steps: int) -> list[dict[str, str]]:
        """A resumed run's metrics.csv: rows torn by a kill and rows past the checkpoint's
        ``max_env_steps`` are dropped (the file is replaced if any were); the rows kept."""
        path = self.out / "metrics.csv"
        if not path.exists():
            return []
        data = path.read_bytes()
        whole = data[:data.rfind(b"\n") + 1].replace(b"\0", b"")  # a torn last line goes
        header, rows = _parse(whole.decode(errors="replace"))
        kept = [r for r in rows if csv_number(r.get("num_steps_sampled")) <= max_env_steps]
        self._columns = header
        if whole != data or len(kept) != len(rows):
            self._replace_metrics(header, kept)
        return kept

    def _replace_metrics(self, columns: list[str], rows: list[dict[str, Any]]) -> None:
        data = _csv_text(columns, rows, header=True).encode()
        self._write("metrics.csv", lambda p: p.write_bytes(data))

    def _failed(self, name: str, exc: OSError) -> bool:
        if name not in self.unwritten:  # once per failing file, not at every report
            say(f"impala-lab: could not write {self.out / name} ({exc.strerror or exc}); "
                "training goes on and tries again at the next report", err=True)
        self.unwritten[name] = str(exc.strerror or exc)
        return False


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file of a run (config.json, run.json, result.json); None if it is
    missing or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _csv_text(columns: list[str], rows: list[dict[str, Any]], header: bool) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _append(path: Path, text: str) -> None:
    """Appends ``text`` whole or not at all: a failure truncates the file back."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(text.encode())
            while view:
                view = view[os.write(fd, view):]
        except BaseException:  # ENOSPC, or a signal between two partial writes
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _parse(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """A metrics.csv's header and its whole rows (a row with another field count is torn)."""
    reader = csv.reader(io.StringIO(text))
    rows: list[dict[str, str]] = []
    header: list[str] = []
    with contextlib.suppress(csv.Error):  # a quoted field torn at the end: the rows so far
        header = next(reader, [])
        for fields in reader:
            if len(fields) == len(header):
                rows.append(dict(zip(header, fields, strict=True)))
    return header, rows
