"""This node's cache of stored trees (dataset versions), for jobs that must see them as local directories.

``TreeCache.acquire(prefix, manifest, holder)`` returns a local, read-only directory holding a stored tree's
files and pins it for ``holder`` (an attempt id) until ``release(holder)``. An entry is named by its content
(``Manifest.content_sha256()``: its files and its empty directories), so every job and tenant asking for the
same dataset content shares one copy, fetched once, and two trees that differ only in an empty directory do
not.

Layout under ``root`` (one file system, so every rename is atomic):
- ``trees/<sha>/``: an entry, the tree's files and nothing else (files 0444, directories 0555).
- ``trees/<sha>.size``: the entry's completion marker, holding its size in bytes; its mtime is the entry's
  last use (set on every acquire), the eviction order.
- ``pins/<sha>/<holder>``: an empty file per holder of the entry.
- ``locks/<sha>.lock``: the entry's ``flock``; ``space.lock``: the ``flock`` of the cap's accounting.
- ``staging/<random>/``: a fetch in progress: ``tree/`` is the download, ``size`` its reservation against
  the cap; the fetching process holds a ``flock`` on the directory as long as it lives.

Invariants:
- **Nothing partial is visible.** An entry exists once its marker does, and the marker comes last: the
  verified, read-only tree is renamed into place, then the reservation's ``size`` is renamed to the marker
  (so its bytes move from reserved to cached in one step). A directory without its marker is absent: the
  next acquire of it, or the next start, removes it. A crash leaves only staging directories, whose lock
  died with their process: the next fetch or start removes them.
- **Only verified content is cached.** ``ObjectStore.get_tree`` checks every file against the store's
  manifest; that manifest must have the caller's artifact checksum, and the staged tree exactly its files
  and sizes. Every later acquire checks the entry's files and directories against the manifest again, by
  their sizes (one ``lstat`` each: reading them all would cost as much as the fetch, so a change that keeps
  every size goes unnoticed): an entry found damaged is discarded and fetched again, or, while other holders
  pin it, refused (ObjectDamaged) until they release it.
- **A pinned entry is never evicted.** A pin is created under the entry's lock before the entry is used,
  and eviction removes an entry only under its lock after checking that it has no pin. Eviction only tries
  an entry's lock: an entry someone is pinning or fetching right now is busy and stays.
- **The cap holds across processes and restarts.** Bytes cached = the markers' sizes + the reservations of
  live fetches, all on disk. A fetch, under ``space.lock``, evicts unpinned entries least recently used first
  until its tree fits under ``max_bytes``, then reserves its size; when pinned and busy entries leave too
  little room, or the tree alone is larger than the cap, it raises CacheFull (507) and fetches nothing.
- **Pins survive restarts** (they are files): ``holders()`` lists them, so that the control plane can
  release the holders that are gone.
- **No deadlock:** the lock order is an entry's lock, then ``space.lock``; under ``space.lock`` entry locks
  are only tried, never waited for.
- Lock files may be unlinked while held (when their entry goes): a locker checks that the file it locked is
  still the one at its path, and tries again if not, so an unlinked lock never lets two lockers in.

A tree registered in place (``Manifest.source``: a dataset version whose files stay in their own bucket) is
fetched from its source by ``ObjectStore.get_tree`` and verified file by file like any other, whatever the
store's backend: an object changed there since the manifest was computed is ObjectDamaged, and nothing is
cached.

With a store that keeps its trees on this host (``tree_local_path`` is not None: the local backend) nothing
is copied and nothing counts against the cap: the store's own read-only tree directory is returned (which
also holds the store's ``.dlcloud-manifest.json``), and the pin is recorded all the same.

Thread- and process-safe: the state is all on disk and every change is made under a ``flock``. Every call may
block (a fetch downloads the tree): run it in a worker thread from async code.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dlcloud.errors import DlcloudError
from dlcloud.storage.local import make_read_only, remove_tree
from dlcloud.storage.objects import Manifest, ObjectDamaged, ObjectStore

log = logging.getLogger(__name__)

HOLDER_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
MAX_BYTES_SETTING = "dataset_cache_max_bytes"
EVICT_TRIES, EVICT_PAUSE = 10, 0.005  # how long eviction tries a busy entry's lock: 50 ms


class CacheFull(DlcloudError):
    """The node's dataset cache cannot make room for a tree (507): pinned entries fill it, or the tree alone
    is larger than its cap."""

    code = "cache_full"


def check_holder(holder: str) -> str:
    """A holder name as pins use it (a file name): 1-128 of ``[A-Za-z0-9._-]``, not ``.`` or ``..``."""
    if not HOLDER_RE.fullmatch(holder) or holder in (".", ".."):
        raise ValueError(f"not a valid cache holder: {holder!r} (1-128 of A-Z a-z 0-9 . _ -, not '.' or '..')")
    return holder


def _size_text(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit} ({n} bytes)"


def _read_int(path: Path) -> int | None:
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _open_locked(path: Path, *, wait: bool) -> int | None:
    """A descriptor holding an exclusive ``flock`` on the lock file ``path`` (created if missing); None when
    ``wait`` is False and someone else holds it. Tries again when the file was unlinked while we waited."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            st = os.fstat(fd)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if current is not None and (current.st_dev, current.st_ino) == (st.st_dev, st.st_ino):
            return fd
        os.close(fd)  # unlinked by its holder while we waited: lock the file now at the path


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold the lock file ``path``; yields False (without waiting) if ``wait`` is False and it is taken."""
    fd = _open_locked(path, wait=wait)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(root: Path) -> None:
    """Flush a staged tree to disk before it becomes an entry (a power loss must not leave a marker over
    files that never reached the disk)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _check_files(root: Path, manifest: Manifest, prefix: str) -> None:
    """The staged tree holds exactly the manifest's files, with their sizes (each file's SHA-256 was checked
    by ``get_tree`` as it was written), and nothing but files and directories."""
    found: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                found[Path(full).relative_to(root).as_posix()] = st.st_size
            elif not stat.S_ISDIR(st.st_mode):
                raise ObjectDamaged(prefix, f"came back with {name!r}, which is not a regular file")
    if found != {e.path: e.size for e in manifest.entries}:
        raise ObjectDamaged(prefix, "came back with other files than its manifest lists")
    dirs = {Path(dirpath, d).relative_to(root).as_posix() for dirpath, dirnames, _ in os.walk(root) for d in dirnames}
    wanted = set(manifest.empty_dirs)
    for e in manifest.entries:
        parts = e.path.split("/")
        wanted.update("/".join(parts[:i]) for i in range(1, len(parts)))
    if dirs != wanted:
        raise ObjectDamaged(prefix, "came back with other directories than its manifest lists")


@dataclass(frozen=True)
class _Entry:
    sha: str
    size: int
    used_ns: int  # the marker's mtime: the last acquire


class TreeCache:
    """Stored trees as local read-only directories, shared by content, pinned per holder, under a byte cap
    (see the module docstring)."""

    def __init__(self, root: Path, store: ObjectStore, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"{MAX_BYTES_SETTING} must be at least 0, got {max_bytes}")
        self.root = root.expanduser().resolve()
        self.store = store
        self.max_bytes = max_bytes
        self._trees = self.root / "trees"
        self._pins = self.root / "pins"
        self._locks = self.root / "locks"
        self._staging = self.root / "staging"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in (self._trees, self._pins, self._locks, self._staging):
            d.mkdir(exist_ok=True, mode=0o700)
        self._clean()

    # -- the interface -----------------------------------------------------------------------------------
    def acquire(self, prefix: str, manifest: Manifest, holder: str) -> Path:
        """A local read-only directory holding exactly the files of the tree ``prefix`` (fetched and verified
        now unless cached), pinned for ``holder`` until ``release(holder)``. Blocking.

        Raises:
            CacheFull: the tree does not fit beside the pinned entries, or is larger than the cap.
            ObjectDamaged: the stored tree does not match ``manifest`` or its own checksums.
            ObjectMissing, StorageError: as the store raises them.
        """
        check_holder(holder)
        sha = manifest.content_sha256()
        # a tree registered in place keeps its files at its source, not in the store's directory
        local = self.store.tree_local_path(prefix) if manifest.source is None else None
        if local is not None:
            stored = self.store.tree_manifest(prefix)  # ObjectMissing where there is no tree
            if stored.content_sha256() != sha:
                raise ObjectDamaged(prefix, "holds other files than its record names")
            with self._entry_locked(sha):
                self._pin(sha, holder)
            return local
        with self._entry_locked(sha):
            new_pin = self._pin(sha, holder)
            try:
                if self._entry_size(sha) is not None:
                    self._check_entry(prefix, manifest, sha, holder)
                if self._entry_size(sha) is None:
                    self._discard(sha)  # a directory that a crash left without its marker
                    self._fetch(prefix, manifest, sha)
                now = time.time_ns()  # explicit: the file system's own clock ticks too coarsely for LRU
                os.utime(self._marker(sha), ns=(now, now))
            except BaseException:
                if new_pin:
                    self._unpin(sha, holder)
                    with contextlib.suppress(OSError):  # fails while other holders pin it: fine
                        (self._pins / sha).rmdir()
                raise
        return self._trees / sha

    def release(self, holder: str) -> None:
        """Remove every pin of ``holder`` (none is fine); its entries may be evicted once no one else pins them."""
        check_holder(holder)
        for pins in self._pins.iterdir():
            try:
                (pins / holder).unlink()
            except FileNotFoundError:
                continue
            if SHA256_RE.fullmatch(pins.name):
                self._tidy(pins.name)

    def holders(self) -> set[str]:
        """The holders with at least one pin (after a restart: those to reconcile with the attempts alive)."""
        found: set[str] = set()
        for pins in self._pins.iterdir():
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                found.update(name for name in os.listdir(pins) if HOLDER_RE.fullmatch(name))
        return found

    def usage(self) -> tuple[int, int]:
        """(bytes cached, bytes pinned); fetches in progress count in both, as they do against the cap."""
        with self._space_locked():
            reserved = self._live_reservations()
            entries = list(self._entries())
        cached = reserved + sum(e.size for e in entries)
        pinned = reserved + sum(e.size for e in entries if self._has_pins(e.sha))
        return cached, pinned

    # -- entries -----------------------------------------------------------------------------------------
    def _marker(self, sha: str) -> Path:
        return self._trees / f"{sha}.size"

    def _entry_locked(self, sha: str, *, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        return _locked(self._locks / f"{sha}.lock", wait=wait)

    def _space_locked(self) -> contextlib.AbstractContextManager[bool]:
        return _locked(self.root / "space.lock")

    def _entry_size(self, sha: str) -> int | None:
        """The entry's size if it is complete (its marker and its directory are there), else None."""
        size = _read_int(self._marker(sha))
        return size if size is not None and (self._trees / sha).is_dir() else None

    def _entries(self) -> Iterator[_Entry]:
        """The complete entries."""
        for name in os.listdir(self._trees):
            sha = name.removesuffix(".size")
            if sha == name or not SHA256_RE.fullmatch(sha):
                continue
            size = self._entry_size(sha)
            try:
                used = self._marker(sha).stat().st_mtime_ns
            except FileNotFoundError:
                continue
            if size is not None:
                yield _Entry(sha, size, used)

    def _discard(self, sha: str) -> None:
        """Remove the entry, its marker first (so it is absent at once). Under the entry's lock."""
        self._marker(sha).unlink(missing_ok=True)
        remove_tree(self._trees / sha)

    def _check_entry(self, prefix: str, manifest: Manifest, sha: str, holder: str) -> None:
        """The complete entry still holds the tree's files at their sizes; a damaged one that no other holder
        pins is discarded (to be fetched again). Under the entry's lock."""
        try:
            _check_files(self._trees / sha, manifest, prefix)
        except (ObjectDamaged, OSError) as exc:
            others = set(os.listdir(self._pins / sha)) - {holder}
            log.error("the dataset cache's copy %s of %s is damaged (%s)", self._trees / sha, prefix, exc)
            if others:
                raise ObjectDamaged(
                    prefix,
                    f"has a damaged copy in this node's dataset cache, which {len(others)} other job(s) still "
                    "use; it is fetched again once they end",
                ) from None
            self._discard(sha)

    def _fetch(self, prefix: str, manifest: Manifest, sha: str) -> None:
        """Download, verify and install the entry ``sha``. Under the entry's lock."""
        with self._space_locked():
            self._make_room(manifest.size)
            staging, fd = self._reserve(manifest.size)
        try:
            tree = staging / "tree"
            stored = self.store.get_tree(prefix, tree, manifest)
            if stored.content_sha256() != sha:
                raise ObjectDamaged(prefix, "holds other files than its record names")
            _check_files(tree, stored, prefix)
            _sync_tree(tree)
            make_read_only(tree)
            tree.chmod(0o755)  # moving a directory to another parent needs write on it (unless root)
            os.rename(tree, self._trees / sha)
            (self._trees / sha).chmod(0o555)
            reservation = staging / "size"
            now = time.time_ns()
            os.utime(reservation, ns=(now, now))
            os.rename(reservation, self._marker(sha))  # complete: the reserved bytes are cached bytes now
            _fsync_dir(self._trees)
        except BaseException:
            if self._entry_size(sha) is None:
                self._discard(sha)
            raise
        finally:
            remove_tree(staging)
            os.close(fd)

    # -- pins --------------------------------------------------------------------------------------------
    def _pin(self, sha: str, holder: str) -> bool:
        """Record the pin (under the entry's lock); True if it is new."""
        pins = self._pins / sha
        pins.mkdir(exist_ok=True, mode=0o700)
        try:
            os.close(os.open(pins / holder, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            return False
        return True

    def _unpin(self, sha: str, holder: str) -> None:
        (self._pins / sha / holder).unlink(missing_ok=True)

    def _has_pins(self, sha: str) -> bool:
        try:
            return bool(os.listdir(self._pins / sha))
        except FileNotFoundError:
            return False

    def _tidy(self, sha: str) -> None:
        """After a release: drop the entry's empty pin directory, and its lock file if nothing is cached
        (skipped while someone holds the entry's lock)."""
        with self._entry_locked(sha, wait=False) as got:
            if not got or self._has_pins(sha):
                return
            with contextlib.suppress(FileNotFoundError):
                (self._pins / sha).rmdir()
            if self._entry_size(sha) is None:
                (self._locks / f"{sha}.lock").unlink(missing_ok=True)

    # -- space -------------------------------------------------------------------------------------------
    def _reserve(self, size: int) -> tuple[Path, int]:
        """A staging directory holding ``size`` as its reservation, locked by the descriptor returned as
        long as the fetch lives. Under ``space.lock`` (so no one sees it unlocked)."""
        staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=self._staging))
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            (staging / "size").write_text(str(size))
        except BaseException:
            remove_tree(staging)
            os.close(fd)
            raise
        return staging, fd

    def _live_reservations(self) -> int:
        """The bytes reserved by fetches in progress; removes the staging directories of dead ones. Under
        ``space.lock``."""
        total = 0
        for staging in self._staging.iterdir():
            try:
                fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:  # its fetch just finished
                continue
            except NotADirectoryError:
                staging.unlink(missing_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # alive
                total += _read_int(staging / "size") or 0
            else:
                remove_tree(staging)  # its process died mid-fetch
            finally:
                os.close(fd)
        return total

    def _make_room(self, need: int) -> None:
        """Evict unpinned entries, least recently used first, until ``need`` more bytes fit under the cap;
        CacheFull if they cannot. Under ``space.lock``."""
        reserved = self._live_reservations()
        entries = sorted(self._entries(), key=lambda e: (e.used_ns, e.sha))
        cached = reserved + sum(e.size for e in entries)
        if need > self.max_bytes:
            pinned = reserved + sum(e.size for e in entries if self._has_pins(e.sha))
            raise CacheFull(
                f"the tree is {_size_text(need)}, more than the dataset cache of this node holds at all: "
                f"{_size_text(self.max_bytes)} ({_size_text(pinned)} of it pinned by running jobs); "
                f"raise {MAX_BYTES_SETTING} to at least {need}",
                details={"needed_bytes": need, "max_bytes": self.max_bytes, "pinned_bytes": pinned},
            )
        for entry in entries:
            if cached + need <= self.max_bytes:
                return
            if self._evict(entry.sha):
                cached -= entry.size
        if cached + need <= self.max_bytes:
            return
        # everything left is pinned, or in use by a fetch or an acquire right now
        raise CacheFull(
            f"the dataset cache of this node has no room for a tree of {_size_text(need)}: it holds at most "
            f"{_size_text(self.max_bytes)} and {_size_text(cached)} of it are pinned by running jobs; "
            f"wait for jobs to end or raise {MAX_BYTES_SETTING} to at least {cached + need}",
            details={"needed_bytes": need, "max_bytes": self.max_bytes, "pinned_bytes": cached},
        )

    def _evict(self, sha: str) -> bool:
        """Remove the entry unless it is pinned or busy; True if its bytes are gone."""
        # A complete entry's lock is only ever held for a moment (an acquire pinning it, a release tidying
        # up): a few short tries tell that from an entry in use, without ever waiting on it (lock order).
        for _ in range(EVICT_TRIES):
            with self._entry_locked(sha, wait=False) as got:
                if got:
                    return self._evict_locked(sha)
            time.sleep(EVICT_PAUSE)
        return False

    def _evict_locked(self, sha: str) -> bool:
        """Remove the entry, its empty pin directory and its lock file unless it has a pin (the pins are
        checked here, under the entry's lock, where no acquire can be adding one)."""
        if self._has_pins(sha):
            return False
        self._discard(sha)
        with contextlib.suppress(FileNotFoundError):
            (self._pins / sha).rmdir()
        (self._locks / f"{sha}.lock").unlink(missing_ok=True)
        return True

    def _clean(self) -> None:
        """At start: remove what crashes left (dead fetches' staging, directories without their marker,
        markers without their directory); anything busy is left to its owner."""
        with self._space_locked():
            self._live_reservations()
        for name in os.listdir(self._trees):
            sha = name.removesuffix(".size")
            if not SHA256_RE.fullmatch(sha):
                continue
            with self._entry_locked(sha, wait=False) as got:
                if got and self._entry_size(sha) is None:
                    self._discard(sha)
