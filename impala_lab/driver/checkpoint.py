"""Checkpoint files: a directory of state.json, weights.npz and optimizer.npz.

`write_checkpoint` never touches the previous checkpoint's files: it writes and fsyncs them
in ``<path>.tmp-<pid>-<random>/``, renames ``path`` to ``<path>.prev``, the new directory to
``path``, then removes ``<path>.prev``. A kill at any moment leaves the old or the new
checkpoint (between the renames only ``<path>.prev``, which `read_checkpoint` reads with a
warning); docs/reliability.md lists each fault.

Arrays are .npz without pickle or compression; state.json carries their sha256, shapes and
dtypes. Each ``.npy`` header is checked against both before any array is loaded (a small file
that declares a huge array is refused without allocating it), and loaded arrays must be finite.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from impala_lab.backends.base import pid_exists
from impala_lab.config import ImpalaConfig, field_names
from impala_lab.errors import ConfigError

CHECKPOINT_FORMAT = 1
CHECKPOINT_COUNTERS = ("num_steps_sampled", "num_steps_trained", "num_weight_syncs",
                       "episodes_total", "elapsed_s")

logger = logging.getLogger("impala_lab")

_CHECKPOINT_FILES = ("state.json", "weights.npz", "optimizer.npz")
# Files the earlier in-place writer could leave inside a checkpoint directory.
_LEGACY_PARTIALS = ("state.json.tmp", "weights.npz.tmp", "optimizer.npz.tmp")
# Counters are exact in a float64 and in JSON below 2**53 (9e15 env steps: far beyond any run).
_COUNTER_LIMIT = 2**53
_ELAPSED_LIMIT_S = 1e10  # about 300 years
_save_lock = threading.Lock()  # one save at a time in this process (they share .prev names)


def checkpoint_state(config: Mapping[str, Any], policy_version: int,
                     counters: Mapping[str, Any]) -> dict[str, Any]:
    """state.json's fields but ``sha256`` (`write_checkpoint` adds it): ``config`` as
    ``ImpalaConfig.to_dict()``, the weights' ``policy_version`` and `CHECKPOINT_COUNTERS`."""
    return {"format": CHECKPOINT_FORMAT, "config": dict(config),
            "policy_version": policy_version, "counters": dict(counters)}


def prev_checkpoint_path(path: str | os.PathLike) -> Path:
    """Where the previous checkpoint waits while ``path`` is replaced: ``<path>.prev``."""
    path = Path(os.path.abspath(path))
    return path.with_name(path.name + ".prev")


def write_checkpoint(path: str | os.PathLike, state: Mapping[str, Any],
                     weights: list[np.ndarray], optimizer: list[np.ndarray]) -> Path:
    """Write a checkpoint to ``path`` atomically (see the module docstring); returns ``path``.

    ``state`` is state.json without ``sha256``. Raises OSError (a full disk) with the previous
    checkpoint intact, and ValueError if ``path`` holds anything but checkpoint files.
    """
    target = Path(os.path.abspath(path))
    prev = prev_checkpoint_path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _save_lock:
        for existing in (target, prev):
            _check_replaceable(existing)
        _remove_stale_partials(target)
        tmp = parent / f"{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            digests, layouts = {}, {}
            for name, arrays in (("weights.npz", weights), ("optimizer.npz", optimizer)):
                with open(tmp / name, "wb") as fh:
                    np.savez(fh, *arrays)
                    _flush_and_sync(fh)
                digests[name] = _sha256(tmp / name)
                layouts[name] = [[list(a.shape), a.dtype.str] for a in map(np.asarray, arrays)]
            with open(tmp / "state.json", "w") as fh:
                fh.write(json.dumps({**state, "sha256": digests, "arrays": layouts}, indent=2))
                _flush_and_sync(fh)
            _fsync_dir(tmp)
            if target.exists():
                # ``target`` is complete: a ``prev`` left by a killed save is not needed.
                if prev.exists():
                    shutil.rmtree(prev)
                os.rename(target, prev)
            os.rename(tmp, target)
            _fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if not target.exists() and prev.exists():
                with contextlib.suppress(OSError):
                    os.rename(prev, target)  # put the previous checkpoint back
            raise
        if prev.exists():
            shutil.rmtree(prev, ignore_errors=True)
            _fsync_dir(parent)
    return target


def _check_replaceable(path: Path) -> None:
    """A save replaces ``path`` (and removes ``<path>.prev``) only if it is a checkpoint."""
    if not path.exists():
        return
    if not path.is_dir():
        raise ValueError(f"{path}: exists and is not a checkpoint directory; save elsewhere")
    others = sorted(p.name for p in path.iterdir()
                    if p.name not in _CHECKPOINT_FILES + _LEGACY_PARTIALS)
    if others:
        raise ValueError(f"{path}: holds files that are not part of a checkpoint "
                         f"({', '.join(others[:5])}); a save replaces the whole directory, so "
                         f"save to a path of its own (e.g. {path / 'checkpoint'})")


def _remove_stale_partials(target: Path) -> None:
    """Remove ``<target>.tmp-<pid>-*`` directories whose saving process is gone."""
    pattern = re.compile(re.escape(target.name) + r"\.tmp-(\d+)-[0-9a-f]+")
    for entry in target.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and not pid_exists(int(match.group(1))) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _flush_and_sync(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # file systems that cannot sync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def read_checkpoint(path: str | os.PathLike, *, fallback_to_prev: bool = False
                    ) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    """Read and verify a checkpoint; a missing, truncated or tampered file is named.

    ``path`` missing beside a ``<path>.prev`` checkpoint (a save killed between its renames)
    reads ``<path>.prev``, with a warning; ``fallback_to_prev=True`` also reads it when
    ``path`` cannot be read (by default that error is raised).
    """
    return read_checkpoint_at(path, fallback_to_prev=fallback_to_prev)[1:]


def read_checkpoint_at(path: str | os.PathLike, *, fallback_to_prev: bool = False
                       ) -> tuple[Path, dict, list[np.ndarray], list[np.ndarray]]:
    """`read_checkpoint`, with the directory it read first: ``path`` or ``<path>.prev``."""
    root = Path(path)
    prev = prev_checkpoint_path(root)
    if not root.exists() and (prev / "state.json").is_file():
        logger.warning("%s is missing and %s is there: a save was interrupted while it swapped "
                       "the new checkpoint in; reading the previous checkpoint", root, prev)
        return (prev, *_read_checkpoint_dir(prev))
    try:
        return (root, *_read_checkpoint_dir(root))
    except (OSError, ValueError) as exc:
        if not (fallback_to_prev and (prev / "state.json").is_file()):
            raise
        logger.warning("%s; reading the previous checkpoint %s (fallback_to_prev=True)",
                       exc, prev)
        return (prev, *_read_checkpoint_dir(prev))


def _read_checkpoint_dir(root: Path) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    state_file = root / "state.json"
    if not state_file.is_file():
        raise FileNotFoundError(f"{state_file}: no checkpoint here (state.json is missing)")
    try:
        state = json.loads(state_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{state_file}: not a valid checkpoint state ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{state_file}: unknown checkpoint format "
                         f"{state.get('format') if isinstance(state, dict) else state!r}")
    counters = state.get("counters")
    missing = [k for k, kind in (("config", dict), ("counters", dict), ("sha256", dict))
               if not isinstance(state.get(k), kind)]
    missing += [f"counters.{k}" for k in CHECKPOINT_COUNTERS
                if isinstance(counters, dict) and k not in counters]
    missing += [] if "policy_version" in state else ["policy_version"]
    if missing:
        raise ValueError(f"{state_file}: not a valid checkpoint state (missing or mistyped: "
                         f"{', '.join(missing)})")
    _check_counters(state_file, state)
    arrays = {}
    for name in ("weights.npz", "optimizer.npz"):
        file = root / name
        if not file.is_file():
            raise FileNotFoundError(f"{file}: checkpoint file is missing")
        expected = state.get("sha256", {}).get(name)
        if expected != _sha256(file):
            raise ValueError(f"{file}: checksum mismatch (the file is truncated or was "
                             "modified after the checkpoint was written)")
        declared = (state.get("arrays") or {}).get(name)
        _check_npz_headers(file, declared)
        try:
            with np.load(file, allow_pickle=False) as data:
                arrays[name] = [data[f"arr_{i}"] for i in range(len(data.files))]
        except Exception as exc:
            raise ValueError(f"{file}: cannot read the arrays ({exc})") from None
        _check_finite(file, arrays[name])
    return state, arrays["weights.npz"], arrays["optimizer.npz"]


def _check_npz_headers(file: Path, declared: list | None) -> None:
    """Reads every array's ``.npy`` header, none of its data: each must be uncompressed, hold
    plain numbers and exactly the bytes its header declares, and match ``declared``
    (state.json's ``[shape, dtype]`` list; None for a checkpoint written before it was kept)."""
    try:
        with zipfile.ZipFile(file) as archive:
            members = archive.infolist()
            for i, member in enumerate(members):
                shape, dtype = _stored_array_header(archive, member)
                if declared is not None and i < len(declared) and (
                        [list(shape), dtype.str] != list(declared[i])):
                    raise ValueError(f"{member.filename} is {dtype.str} {list(shape)}, state.json "
                                     f"says {declared[i][1]} {declared[i][0]}")
            if declared is not None and len(members) != len(declared):
                raise ValueError(f"holds {len(members)} arrays, state.json lists {len(declared)}")
    except (ValueError, zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ValueError(f"{file}: not a valid checkpoint array file ({exc})") from None


def _stored_array_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo
                         ) -> tuple[tuple[int, ...], np.dtype]:
    """One member's shape and dtype, from its header, checked against the bytes it holds."""
    if member.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{member.filename} is compressed (impala_lab writes arrays "
                         "uncompressed, so an array's size is bounded by the file's)")
    with archive.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(fh)
        data_bytes = member.file_size - fh.tell()
    if dtype.hasobject:
        raise ValueError(f"{member.filename} holds Python objects (a pickle), which impala_lab "
                         "never loads")
    need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if need != data_bytes:
        raise ValueError(f"{member.filename} declares {dtype.str} {list(shape)} ({need} bytes) "
                         f"but holds {data_bytes} bytes")
    return shape, dtype


def _check_finite(file: Path, arrays: list[np.ndarray]) -> None:
    for i, array in enumerate(arrays):
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            raise ValueError(f"{file}: array {i} ({array.dtype.str} {list(array.shape)}) holds "
                             f"{bad} NaN or infinite values: these weights cannot be trained "
                             "from; restore an earlier checkpoint (<path>.prev, if there is one)")


def _check_counters(state_file: Path, state: dict) -> None:
    """Counters are integers in [0, 2**53) (elapsed_s: a finite number of seconds >= 0)."""
    values = {f"counters.{k}": v for k, v in state["counters"].items()
              if k in CHECKPOINT_COUNTERS}
    values["policy_version"] = state["policy_version"]
    for name, value in values.items():
        seconds = name == "counters.elapsed_s"
        kinds, limit = (int | float, _ELAPSED_LIMIT_S) if seconds else (int, _COUNTER_LIMIT)
        # (NaN and inf fail the range)
        if isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value < limit:
            rule = (f"a finite number of seconds in [0, {limit:g})" if seconds
                    else "an integer in [0, 2**53)")
            raise ValueError(f"{state_file}: {name}={value!r} is invalid: it must be {rule} "
                             "(the file was damaged or edited)")


def restored_config(root: Path, state: Mapping[str, Any], overrides: dict[str, Any],
                    env_creator: Any = None) -> ImpalaConfig:
    """The checkpoint's config, with the config fields of ``overrides`` (taken out of it) and
    ``env_creator`` as its ``env``; its ``ray_address`` is dropped (with a warning) unless
    ``overrides`` names one: a file must not make this process join a cluster. An invalid
    result is a `ConfigError` naming ``<root>/state.json``."""
    data = dict(state["config"])
    if env_creator is not None:
        data["env"] = env_creator
    known = field_names()
    fields = {k: overrides.pop(k) for k in list(overrides) if k in known}
    if data.get("ray_address") and "ray_address" not in fields:
        logger.warning("%s names ray_address=%r; restore does not connect to an address from a "
                       "file: pass ray_address=... to join it (a local Ray starts instead)",
                       root / "state.json", data["ray_address"])
        data["ray_address"] = None
    try:
        return ImpalaConfig.from_dict({**data, **fields})
    except ConfigError as exc:
        what = "the checkpoint's config with the overrides" if fields else (
            "the checkpoint's config")
        raise ConfigError(f"{root / 'state.json'}: {what} is invalid: {exc}") from None
