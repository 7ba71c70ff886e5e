"""Token buckets shared by the API processes of one host (``dlcloud up --api-workers N``): a file mapped into each
process's memory, so that a client's requests count against one limit whichever process answers them.

The file (``<data-dir>/run/rate-limits``, made by the control process at start, 0600) holds ``SLOTS`` slots of
three numbers: a 64-bit hash of the bucket's limit and key (0: free), its tokens and when they were counted
(``time.monotonic``, one clock for every process of the host). A bucket is found by open addressing from its hash,
at most ``PROBES`` slots on; a slot whose bucket has refilled to its burst holds nothing a fresh bucket would not,
so it is taken over; where all ``PROBES`` slots hold live buckets, the one counted longest ago is (its key starts
full again: a table that full holds 64 thousand live clients, and the in-process buckets forget alike past
``MAX_BUCKETS``). Every read and change happens under an exclusive ``flock`` of the file (processes) and the
caller's lock (threads of one process, which share the descriptor).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
from pathlib import Path

SLOTS = 65_536
PROBES = 32
_SLOT = struct.Struct("=Qdd")  # key hash, tokens, at
SIZE = SLOTS * _SLOT.size


def create(path: Path) -> None:
    """Make the table, empty (every slot free), replacing one a previous start left."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".new.{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, SIZE)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class SharedBuckets:
    """The buckets of every limit, in the table at ``path`` (made by ``create``)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        if os.fstat(self._fd).st_size != SIZE:
            os.close(self._fd)
            raise ValueError(f"{path} is not a rate-limit table of {SIZE} bytes")
        self._map = mmap.mmap(self._fd, SIZE)

    def locked(self) -> _Locked:
        """The table, locked for the ``with`` block against the other processes."""
        return _Locked(self)

    def find(self, limit: str, key: object, burst: float, rate: float, now: float) -> int:
        """The offset of the slot of ``limit``'s bucket ``key``, made (full) when it has none. Lock held."""
        h = int.from_bytes(hashlib.blake2b(f"{limit}\0{key!r}".encode(), digest_size=8).digest(), "big") | 1
        first = h % SLOTS
        oldest, oldest_at = -1, float("inf")
        for i in range(PROBES):
            offset = ((first + i) % SLOTS) * _SLOT.size
            slot_hash, tokens, at = _SLOT.unpack_from(self._map, offset)
            if slot_hash == h:
                return offset
            if slot_hash == 0 or tokens + (now - at) * rate >= burst:
                oldest = offset
                break
            if at < oldest_at:
                oldest, oldest_at = offset, at
        _SLOT.pack_into(self._map, oldest, h, float(burst), now)
        return oldest

    def read(self, offset: int) -> tuple[float, float]:
        """(tokens, at) of a slot ``find`` gave. Lock held."""
        _, tokens, at = _SLOT.unpack_from(self._map, offset)
        return tokens, at

    def write(self, offset: int, tokens: float, at: float) -> None:
        """Set a slot's tokens and time. Lock held."""
        slot_hash = _SLOT.unpack_from(self._map, offset)[0]
        _SLOT.pack_into(self._map, offset, slot_hash, tokens, at)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class _Locked:
    def __init__(self, table: SharedBuckets) -> None:
        self.table = table

    def __enter__(self) -> SharedBuckets:
        fcntl.flock(self.table._fd, fcntl.LOCK_EX)
        return self.table

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.table._fd, fcntl.LOCK_UN)
