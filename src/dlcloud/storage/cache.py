"""This host's cache of stored objects, for what must be a local file (a job's code archive or package).

Content-addressed: ``<root>/<sha256[:2]>/<sha256>`` holds an object whose SHA-256 is its name, so every job
and tenant that may read the same bytes shares one copy, and a copy is valid forever. A fetch takes a lock
per entry (``flock``), so several callers asking at once fetch once; the download goes to a temporary file,
is verified (``ObjectStore.get_file``) and renamed into place, so a partial entry is never seen and a crash
leaves only a temporary file, cleaned at the next fetch of that entry. Survives restarts.

With a local object store nothing is copied: the object's own file is used (``ObjectStore.local_path``).
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from dlcloud.storage.objects import ObjectStore

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ObjectCache:
    def __init__(self, root: Path, store: ObjectStore) -> None:
        self.root = root
        self.store = store

    def path(self, key: str, sha256: str) -> Path:
        """A local file with the object's bytes: the store's own where it is local, else a cached copy
        (fetched and verified now if missing). Blocking."""
        local = self.store.local_path(key)
        if local is not None:
            return local
        if not SHA256_RE.match(sha256):
            raise ValueError(f"not a SHA-256: {sha256!r}")
        entry = self.root / sha256[:2] / sha256
        if entry.is_file():
            os.utime(entry)  # recently used
            return entry
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_path = entry.parent / f".{sha256}.lock"
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not entry.is_file():  # another caller fetched it while we waited
                tmp = entry.parent / f".{sha256}.part"
                tmp.unlink(missing_ok=True)
                self.store.get_file(key, tmp, sha256=sha256)
                tmp.chmod(0o444)
                os.replace(tmp, entry)
        return entry
