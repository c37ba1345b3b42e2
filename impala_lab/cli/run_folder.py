"""The output folder of one ``impala-lab train`` run: claimed by a lock, written as it goes.

A run writes ``config.json`` at the start and then, at every report, appends a row to
``metrics.csv`` (flushed) and replaces ``result.json`` (the state so far, ``"running"`` until
the end); every ``--checkpoint-every`` seconds it saves ``checkpoint/``. So a run killed with
SIGKILL, a lost power supply or a dead Ray head still leaves its metrics, its state and a
checkpoint to resume from (``impala-lab train --resume OUT``).

One run per folder: the run holds an exclusive ``flock`` on ``OUT/.lock`` for its whole life,
so a second run into the same folder is refused at once (the kernel drops the lock when the
holder dies, however it dies). A folder holding files that are not an impala_lab run's is
refused unless ``--overwrite``; ``--out ""`` is refused.

A full disk must not end the run: every write goes to a temporary file renamed into place, on
its own, and a write that fails is reported once on stderr and tried again at the next report.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from impala_lab.errors import ConfigError
from impala_lab.stats import jsonable

# What a run writes into its folder (anything else there is not a run's).
RUN_FILES = frozenset({"config.json", "metrics.csv", "result.json", "report.png", "policy.gif",
                       "checkpoint", "checkpoint.prev", "tensorboard", ".lock"})
LOCK_NAME = ".lock"


def _is_run_file(name: str) -> bool:
    return name in RUN_FILES or name.startswith(("checkpoint.tmp-", ".tmp-"))


class RunFolder:
    """Claims ``out`` for one run and writes its files as the run goes.

    Args:
      out: the folder (created if missing).
      overwrite: accept a folder that holds files that are not a run's.
      resume: the folder is a run's being resumed: its metrics are appended to.

    Raises:
      ConfigError: ``out`` is empty, a file, not writable, held by another run, or holds
        other files (without ``overwrite``); the message names the path and the fix.
    """

    def __init__(self, out: Path, *, overwrite: bool = False, resume: bool = False) -> None:
        if not str(out).strip():
            raise ConfigError(f"--out={str(out)!r} is invalid: give a folder for this run's "
                              "files, e.g. --out runs/cartpole")
        self.out = out
        self._warned: set[str] = set()
        self._columns: list[str] = []
        self._rows_written = 0
        self._make_folder()
        self._lock_fd = self._lock()
        others = sorted(p.name for p in out.iterdir() if not _is_run_file(p.name))
        if others and not overwrite:
            self.close()
            raise ConfigError(
                f"--out={str(out)!r} holds files that are not an impala_lab run's "
                f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}): pick another "
                "folder, or pass --overwrite to write the run's files beside them")
        if resume:
            # the earlier process's rows stay in the file; this process's history is new
            self._columns = _existing_header(out / "metrics.csv")

    def _make_folder(self) -> None:
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out={str(self.out)!r} is a file, not a folder: give a folder "
                              "for this run's files")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            probe = self.out / f".tmp-{os.getpid()}-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"--out={str(self.out)!r} cannot be written ({exc.strerror}): "
                              "give a folder you can write to") from None

    def _lock(self) -> int:
        fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"--out={str(self.out)!r} is in use by another impala-lab train "
                              f"(pid {holder}): one run per folder; give another --out, or "
                              "wait for that run to end") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def close(self) -> None:
        """Releases the folder (the lock file stays: its lock is what counts)."""
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ writing
    def write_json(self, name: str, obj: Any) -> bool:
        """Replaces ``name`` with ``obj`` as JSON, atomically; False if the disk refused."""
        return self._replace(name, json.dumps(jsonable(obj), indent=2).encode())

    def append_metrics(self, rows: list[dict[str, Any]]) -> bool:
        """Appends the rows not written yet (``rows`` is the whole history so far) to
        metrics.csv and flushes it; a row with a new column rewrites the file with the wider
        header (rare: the first report of a new figure). False if the disk refused."""
        new = rows[self._rows_written:] if self._rows_written <= len(rows) else rows
        if not new:
            return True
        columns = list(self._columns)
        for row in new:
            columns.extend(k for k in row if k not in columns)
        path = self.out / "metrics.csv"
        try:
            if columns != self._columns or not path.exists():
                ok = self._rewrite_metrics(path, columns, new)
            else:
                with open(path, "a", newline="") as fh:
                    csv.DictWriter(fh, fieldnames=columns).writerows(new)
                    fh.flush()
                ok = True
        except OSError as exc:
            return self._failed("metrics.csv", exc)
        if ok:
            self._columns, self._rows_written = columns, self._rows_written + len(new)
        return ok

    def _rewrite_metrics(self, path: Path, columns: list[str], new: list[dict]) -> bool:
        old = []
        if path.exists():
            with open(path, newline="") as fh:
                old = list(csv.DictReader(fh))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(old + new)
        return self._replace("metrics.csv", text.getvalue().encode())

    def _replace(self, name: str, data: bytes) -> bool:
        tmp = self.out / f".tmp-{os.getpid()}-{name}"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.out / name)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return self._failed(name, exc)
        self._warned.discard(name)
        return True

    def _failed(self, name: str, exc: OSError) -> bool:
        if name not in self._warned:  # once per failing file, not at every report
            self._warned.add(name)
            print(f"impala-lab: could not write {self.out / name} ({exc.strerror or exc}); "
                  "training goes on and tries again at the next report", file=sys.stderr)
        return False


def _existing_header(path: Path) -> list[str]:
    """The columns of a resumed run's metrics.csv ([] if there is none)."""
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return next(csv.reader(fh), [])
