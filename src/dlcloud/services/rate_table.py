"""Token buckets shared by the API processes of one host (``dlcloud up --api-workers N``): a file mapped into each
process's memory, so that a client's requests count against one limit whichever process answers them.

The file (``<run dir>/rate-limits``, made by the control process at start, 0600 in a 0700 directory) holds a
random key (its first ``KEY_BYTES`` bytes) and then ``SLOTS`` slots of five numbers: a 64-bit hash of the bucket's
limit and key (0: free), its tokens, when they were counted (``time.monotonic``, one clock for every process of
the host), and the bucket's own rate and burst. The hash is keyed with the file's key, so no client can choose
which slot its bucket takes, nor which other bucket's probe sequence it shares.

A bucket is looked for in the ``PROBES`` slots from its hash on; found, it is used. Else it takes the first of
those slots that is free or whose bucket has refilled to its own burst (holding nothing a fresh bucket would not),
else the one counted longest ago (its owner starts full again: this needs ``PROBES`` live buckets in one window,
i.e. a table holding tens of thousands of clients at once; the in-process buckets forget past ``MAX_BUCKETS``
alike). Every read and change happens under an exclusive ``flock`` of the file (processes) and the caller's lock
(threads of one process, which share the descriptor).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import secrets
import struct
from pathlib import Path

KEY_BYTES = 16
SLOTS = 65_536
PROBES = 32
_SLOT = struct.Struct("=Qdddd")  # key hash, tokens, at, rate, burst


def size() -> int:
    return KEY_BYTES + SLOTS * _SLOT.size


def create(path: Path) -> None:
    """Make the table, empty (every slot free) with a new key, replacing one a previous start left."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".new.{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.ftruncate(fd, size())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class SharedBuckets:
    """The buckets of every limit, in the table at ``path`` (made by ``create``)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        if os.fstat(self._fd).st_size != size():
            os.close(self._fd)
            raise ValueError(f"{path} is not a rate-limit table of {size()} bytes")
        self._map = mmap.mmap(self._fd, size())
        self._key = bytes(self._map[:KEY_BYTES])

    def locked(self) -> _Locked:
        """The table, locked for the ``with`` block against the other processes."""
        return _Locked(self)

    def find(self, limit: str, key: object, burst: float, rate: float, now: float) -> int:
        """The offset of the slot of ``limit``'s bucket ``key``, made (full) when it has none. Lock held."""
        digest = hashlib.blake2b(f"{limit}\0{key!r}".encode(), digest_size=8, key=self._key).digest()
        h = int.from_bytes(digest, "big") or 1
        first = h % SLOTS
        reusable = oldest = -1
        oldest_at = float("inf")
        for i in range(PROBES):
            offset = KEY_BYTES + ((first + i) % SLOTS) * _SLOT.size
            slot_hash, tokens, at, slot_rate, slot_burst = _SLOT.unpack_from(self._map, offset)
            if slot_hash == h:
                return offset
            if reusable < 0 and (slot_hash == 0 or tokens + (now - at) * slot_rate >= slot_burst):
                reusable = offset
            if at < oldest_at:
                oldest, oldest_at = offset, at
        taken = reusable if reusable >= 0 else oldest
        _SLOT.pack_into(self._map, taken, h, float(burst), now, float(rate), float(burst))
        return taken

    def read(self, offset: int) -> tuple[float, float]:
        """(tokens, at) of a slot ``find`` gave. Lock held."""
        _, tokens, at, _, _ = _SLOT.unpack_from(self._map, offset)
        return tokens, at

    def write(self, offset: int, tokens: float, at: float) -> None:
        """Set a slot's tokens and time. Lock held."""
        slot_hash, _, _, rate, burst = _SLOT.unpack_from(self._map, offset)
        _SLOT.pack_into(self._map, offset, slot_hash, tokens, at, rate, burst)

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
