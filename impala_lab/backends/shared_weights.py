"""Weights in shared memory: one block per broadcast, written once, read by every worker.

`ProcessBackend.put_weights` writes the arrays, the version and a broadcast serial into a block
no worker is using; ``set_weights`` sends only the block's name and layout (a `SharedWeights`),
and a worker copies the arrays out when it starts its next sample. The driver thus never waits
on a worker's pipe, whatever the size of the weights (``bench/transport.py`` measures both).

`WeightBlocks` releases a block once it is not the latest broadcast and every worker told to
use it has answered a later request or ended; two released blocks are kept for reuse (a new
block costs page faults). Blocks are named ``il<driver pid>_<random>_<n>`` and owned through a
``flock`` on ``<prefix>lock`` (containers sharing ``/dev/shm`` see each other's locks, not
pids); each new `WeightBlocks` first unlinks this user's stale blocks (`remove_stale_blocks`:
a killed process group takes its resource tracker along). docs/reliability.md has the faults.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from multiprocess import resource_tracker, shared_memory

__all__ = ["BlockGoneError", "SharedWeights", "SharedWeightsReader", "WeightBlocks",
           "read_shared_weights", "remove_stale_blocks", "weights_layout",
           "write_shared_weights"]

_ALIGN = 64  # byte alignment of each array in a weights block
_HEADER = 64  # block header: int64 serial, version, number of arrays
_HEADER_FORMAT = "3q"
_MAX_FREE_BLOCKS = 2  # released blocks kept for reuse
_BLOCK_NAME = re.compile(r"il(\d+)(_[0-9a-f]{6}_)\d+")  # ``WeightBlocks.prefix`` + a number
_SHM_DIR = "/dev/shm"
_LOCK_SUFFIX = "lock"  # ``<prefix>lock``: the owner's lock file, beside its blocks
_LOCK_NAME = re.compile(r"il(\d+)(_[0-9a-f]{6}_)lock")


class BlockGoneError(RuntimeError):
    """A weights block named in a broadcast is no longer in shared memory."""


@dataclass(frozen=True)
class SharedWeights:
    """A reference to one broadcast's weights in a shared-memory block.

    What `ProcessBackend.put_weights` returns and ``set_weights`` sends to a worker. Blocks
    are reused, so ``serial`` (unique per broadcast), not ``name``, tells broadcasts apart.

    Attributes:
      name: the block's name (``SharedMemory(name=...)``).
      serial, version: the broadcast's number and the weights version (also in the header).
      layout: per array, ``(byte offset, shape, dtype.str)``, in ``get_weights()`` order.
      size: bytes of the block in use (header and arrays).
    """

    name: str
    serial: int
    version: int
    layout: tuple[tuple[int, tuple[int, ...], str], ...]
    size: int


def weights_layout(weights: Sequence[np.ndarray]
                   ) -> tuple[tuple[tuple[int, tuple[int, ...], str], ...], int]:
    """Where each array goes in a block: ``(layout, bytes needed)`` (see `SharedWeights`)."""
    layout = []
    offset = _HEADER
    for w in weights:
        a = np.asarray(w)
        layout.append((offset, tuple(int(d) for d in a.shape), a.dtype.str))
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    return tuple(layout), offset


def write_shared_weights(
    weights: Sequence[np.ndarray], version: int, serial: int = 0, name: str | None = None,
    block: shared_memory.SharedMemory | None = None,
) -> tuple[shared_memory.SharedMemory, SharedWeights]:
    """Writes ``weights`` (any shapes and dtypes), ``version`` and ``serial`` into ``block``
    (open, large enough, read by nobody now) or a new block called ``name`` (None: any name).
    Returns ``(block, ref)``: the open block (the caller closes and unlinks it) and its
    reference."""
    arrays = [np.asarray(w) for w in weights]
    layout, size = weights_layout(arrays)
    new = block is None
    if block is None:
        block = shared_memory.SharedMemory(name=name, create=True, size=size)
    elif block.size < size:
        raise ValueError(f"write_shared_weights: block {block.name!r} has {block.size} bytes, "
                         f"the weights need {size}; pass block=None to create a larger one")
    try:
        struct.pack_into(_HEADER_FORMAT, block.buf, 0, serial, version, len(arrays))
        for (off, shape, dtype), a in zip(layout, arrays):
            # a temporary view: none may outlive the block's mapping (close() refuses)
            np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=off)[...] = a
    except BaseException:
        if new:
            block.close()
            block.unlink()
        raise
    return block, SharedWeights(block.name, int(serial), int(version), layout, size)


def read_shared_weights(ref: SharedWeights,
                        block: shared_memory.SharedMemory | None = None) -> list[np.ndarray]:
    """Copies the arrays of ``ref`` out of its block.

    ``block``: the block ``ref`` names, already open, or None to open it for this read. A
    ValueError if the block's header does not match ``ref`` (a bookkeeping bug).
    """
    opened = block is None
    if block is None:
        block = _open_block(ref.name)
    try:
        found = struct.unpack_from(_HEADER_FORMAT, block.buf, 0)
        expected = (ref.serial, ref.version, len(ref.layout))
        if found != expected:
            raise ValueError(
                f"shared weights block {ref.name!r} holds (serial, version, arrays) {found}, "
                f"expected {expected}: it was overwritten while a worker still needed it")
        # temporary views, copied out: none may outlive the block's mapping
        return [np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=off).copy()
                for off, shape, dtype in ref.layout]
    finally:
        if opened:
            block.close()


def _open_block(name: str) -> shared_memory.SharedMemory:
    """Opens a weights block by name; a missing one is a `BlockGoneError` that says why."""
    try:
        return shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        raise BlockGoneError(
            f"the shared weights block {name!r} is gone from shared memory ({_SHM_DIR} on "
            "Linux) while this run still uses it: something outside impala_lab removed it "
            "(a cleaner of /dev/shm, or a tool that empties it); the driver writes the next "
            "broadcast into a new block") from None


class SharedWeightsReader:
    """A worker's reader of broadcast weights that keeps the last few blocks open (opening
    one costs a resource-tracker round trip and a mapping; the driver reuses a handful)."""

    def __init__(self, max_open: int = 8) -> None:
        self._max_open = max_open
        self._open: dict[str, shared_memory.SharedMemory] = {}

    def read(self, ref: SharedWeights) -> list[np.ndarray]:
        block = self._open.pop(ref.name, None)
        if block is None:
            block = _open_block(ref.name)
            if block.size < ref.size:  # a block of that name, but not the one written
                block.close()
                raise ValueError(f"shared weights block {ref.name!r} has {block.size} bytes, "
                                 f"the reference needs {ref.size}")
        self._open[ref.name] = block  # most recently used last
        while len(self._open) > self._max_open:
            oldest = next(iter(self._open))
            self._open.pop(oldest).close()
        return read_shared_weights(ref, block)

    def close(self) -> None:
        for block in self._open.values():
            with contextlib.suppress(BufferError, OSError):
                block.close()
        self._open.clear()


@dataclass
class _Block:
    memory: shared_memory.SharedMemory
    serial: int
    users: int = 0  # set_weights commands naming this block not yet known to be consumed


class WeightBlocks:
    """The driver's weights blocks: one written per broadcast, counted while workers may
    still read it, then kept for reuse or unlinked (see the module docstring).

    ``lock`` guards the bookkeeping (the process backend passes its request queues' lock, so a
    worker's blocks are released under the lock that completes its requests). ``prefix``
    starts every block name: ``il<driver pid>_<random>_``.
    """

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._lock = lock if lock is not None else threading.RLock()
        self._blocks: dict[str, _Block] = {}  # blocks in use: the latest, or still named
        self._free: list[shared_memory.SharedMemory] = []  # unused blocks, kept for reuse
        self._latest: str | None = None
        remove_stale_blocks()  # left by drivers killed with their resource tracker
        self.prefix = f"il{os.getpid()}_{secrets.token_hex(3)}_"
        self._owner_lock = _hold_owner_lock(self.prefix)
        self._num_blocks = 0
        self._serial = 0

    def put(self, weights: Sequence[np.ndarray], version: int) -> SharedWeights:
        """Writes the weights into a block no worker is using (a reused one if possible)."""
        with self._lock:
            self._serial += 1
            _, size = weights_layout(weights)
            # a kept block that something else unlinked cannot be opened by name: drop it
            for gone in [m for m in self._free if not _exists(m.name)]:
                self._free.remove(gone)
                _unlink(gone)
            reuse = next((m for m in self._free if m.size >= size), None)
            if reuse is not None:
                self._free.remove(reuse)
            name = f"{self.prefix}{self._num_blocks}"
            memory, ref = write_shared_weights(weights, version, serial=self._serial,
                                               name=name, block=reuse)
            if reuse is None:
                self._num_blocks += 1
            self._blocks[ref.name] = _Block(memory, ref.serial)
            self._latest = ref.name
            self._collect()
        return ref

    def acquire(self, ref: SharedWeights) -> None:
        """Counts one more worker told to read ``ref``; refuses a released block."""
        with self._lock:
            block = self._blocks.get(ref.name)
            if block is None or block.serial != ref.serial:
                raise ValueError(f"set_weights: the weights block {ref.name!r} (version "
                                 f"{ref.version}) was already released; pass the reference the "
                                 "latest put_weights() returned")
            block.users += 1

    def release(self, names: list[str]) -> None:
        """One worker is done with each block of ``names`` (read, skipped, or ended)."""
        if not names:
            return
        with self._lock:
            for name in names:
                block = self._blocks.get(name)
                if block is not None:
                    block.users -= 1
            self._collect()

    def _collect(self) -> None:
        """Frees every block no worker can still read (never the latest one): keeps a few
        for reuse, unlinks the rest."""
        for name, block in list(self._blocks.items()):
            if block.users <= 0 and name != self._latest:
                del self._blocks[name]
                if len(self._free) < _MAX_FREE_BLOCKS:
                    self._free.append(block.memory)
                else:
                    _unlink(block.memory)

    def names(self) -> tuple[list[str], list[str]]:
        """``(in use, kept for reuse)``: in use are the latest and those workers may read."""
        with self._lock:
            return list(self._blocks), [m.name for m in self._free]

    def close(self) -> None:
        """Unlinks every block (call once no worker runs); idempotent."""
        with self._lock:
            blocks, self._blocks = self._blocks, {}
            free, self._free = self._free, []
            self._latest = None
            for memory in [b.memory for b in blocks.values()] + free:
                _unlink(memory)
            if self._owner_lock is not None:
                _release_owner_lock(self.prefix, self._owner_lock)
                self._owner_lock = None


def remove_stale_blocks(shm_dir: str = _SHM_DIR) -> list[str]:
    """Unlink the weights blocks of drivers that are gone; returns the names removed.

    Blocks are grouped by prefix ``il<pid>_<random>_`` and are stale exactly when nobody holds
    the ``flock`` of their lock file ``<prefix>lock``, whatever PID namespace the owner ran in.
    Blocks without a lock file, other users' blocks and other names are left alone; without
    ``/dev/shm`` there is nothing to do.
    """
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    groups: dict[str, list[str]] = {}
    for name in names:
        match = _BLOCK_NAME.fullmatch(name) or _LOCK_NAME.fullmatch(name)
        if match is not None:
            groups.setdefault(name[: match.end(2)], []).append(name)
    removed = []
    for prefix, members in groups.items():
        lock_name = prefix + _LOCK_SUFFIX
        blocks = [n for n in members if n != lock_name]
        with _owner_gone(os.path.join(shm_dir, lock_name)) as gone:
            if gone:
                removed += _unlink_paths(shm_dir, blocks)
    return sorted(removed)


@contextlib.contextmanager
def _owner_gone(lock_path: str) -> Iterator[bool]:
    """Yields whether the owner of the blocks beside ``lock_path`` is gone, holding its lock
    meanwhile (so the owner cannot come back between the check and the unlink); removes a
    dead owner's lock."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:  # no lock file: not blocks this module owns
        yield False
        return
    try:
        if os.fstat(fd).st_uid != os.getuid():
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: the owner lives, in this PID namespace or another
            yield False
            return
        yield True
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
    finally:
        os.close(fd)


def _unlink_paths(shm_dir: str, names: list[str]) -> list[str]:
    removed = []
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
    return removed


def _hold_owner_lock(prefix: str, shm_dir: str = _SHM_DIR) -> int | None:
    """Creates ``<prefix>lock`` already locked: written under a temporary name, locked, then
    renamed into place, so that no cleaner ever sees it unlocked. None where there is no
    ``/dev/shm`` (blocks there are not files this module can list either)."""
    if not os.path.isdir(shm_dir):
        return None
    tmp = os.path.join(shm_dir, f"{prefix}tmp{secrets.token_hex(3)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, os.path.join(shm_dir, prefix + _LOCK_SUFFIX))
    # The resource tracker unlinks it with the blocks if the driver is killed.
    resource_tracker.register(f"/{prefix}{_LOCK_SUFFIX}", "shared_memory")
    return fd


def _release_owner_lock(prefix: str, fd: int, shm_dir: str = _SHM_DIR) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(shm_dir, prefix + _LOCK_SUFFIX))
    resource_tracker.unregister(f"/{prefix}{_LOCK_SUFFIX}", "shared_memory")
    os.close(fd)


def _exists(name: str, shm_dir: str = _SHM_DIR) -> bool:
    """Whether a block of this name can still be opened (always True where blocks are not
    files in ``shm_dir``)."""
    return not os.path.isdir(shm_dir) or os.path.exists(os.path.join(shm_dir, name))


def _unlink(memory: shared_memory.SharedMemory) -> None:
    with contextlib.suppress(Exception):
        memory.close()
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()
