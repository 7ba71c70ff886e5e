"""The object store: every byte dlcloud keeps (code uploads, model artifacts, datasets) lives under a key.

Two backends implement ``ObjectStore``: ``LocalObjectStore`` (a directory, by default the data dir) and
``S3ObjectStore`` (an S3-compatible bucket and prefix, ``storage/s3.py``). Rows store keys, never paths.

Invariants every backend keeps (and tests/unit/storage/test_object_stores.py checks on both):
- **Nothing partial is visible.** An object appears under its key complete or not at all; a tree
  (``put_tree``) appears whole or not at all: readers see it only once its manifest is there, and the
  manifest is written last.
- **Checksums end to end.** ``put_file`` computes the SHA-256 of what it sends and refuses a mismatch
  with the caller's expected value before anything is visible (``checksum_mismatch``, 400); the stored
  object carries its SHA-256 (S3: object metadata) and ``get_file`` / ``get_tree`` verify what they wrote
  against it and delete what does not match (``ObjectDamaged``, 500).
- **Stored objects are never modified**: a key is written once; writing it again replaces it whole.

Vocabulary: *key*, a relative POSIX path of segments (``code/t-1/c-2/code.tar.gz``), no ``.``/``..``,
no empty segment, no leading ``/``; *tree*, a set of regular files under a key prefix with a manifest
(``TreeEntry`` per file: relative path, size, SHA-256), used for model artifacts and dataset versions.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dlcloud.checksums import MANIFEST_HEADER, file_sha256
from dlcloud.errors import DlcloudError
from dlcloud.settings import Settings

CHUNK = 1024 * 1024
KEY_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_+=@,-][A-Za-z0-9._+=@,-]{0,254}$")
MANIFEST_FORMAT = "dlcloud-tree-manifest-v1"


class StorageError(DlcloudError):
    """The object store cannot be reached or refused a request (503: try again later)."""

    code = "storage_unavailable"


class ObjectMissing(DlcloudError):
    """An object or tree dlcloud stored is not there (500: lost outside dlcloud's control)."""

    code = "object_missing"

    def __init__(self, key: str) -> None:
        super().__init__(f"object {key!r} is missing from the store", details={"key": key})


class ObjectDamaged(DlcloudError):
    """A stored object does not match its checksum or manifest (500: damaged or altered in the store)."""

    code = "object_damaged"

    def __init__(self, key: str, what: str) -> None:
        super().__init__(f"stored object {key!r} {what}: it was damaged or altered", details={"key": key})


def checksum_mismatch(key: str, expected: str, actual: str) -> DlcloudError:
    """What a caller's bytes that do not match the checksum it declared raise (400)."""
    return DlcloudError(
        f"the bytes for {key!r} do not match the declared SHA-256 (expected {expected[:16]}..., got {actual[:16]}...)",
        code="checksum_mismatch",
        details={"key": key},
    )


def check_key(key: str) -> str:
    """A key as the stores accept it; ValueError otherwise (keys are built by dlcloud, never by users)."""
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") or not KEY_SEGMENT_RE.match(p) for p in parts):
        raise ValueError(f"not a valid storage key: {key!r}")
    return key


def check_rel_path(rel: str) -> str:
    """A file path inside a tree: relative, POSIX, no ``.``/``..``/empty segments, no NUL or backslash."""
    p = PurePosixPath(rel)
    if (
        not rel
        or p.is_absolute()
        or any(part in (".", "..") for part in rel.split("/"))
        or "" in rel.split("/")
        or "\0" in rel
        or "\\" in rel
        or any(part.startswith(".dlcloud-") for part in rel.split("/"))
    ):
        raise ValueError(f"not a valid path inside a tree: {rel!r} (names starting with '.dlcloud-' are reserved)")
    return rel


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str | None  # None: stored without one (written by something else than dlcloud)
    modified: float | None = None  # Unix time it was written, where the backend tells


@dataclass(frozen=True)
class TreeEntry:
    path: str  # relative POSIX path inside the tree
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The files of a tree, sorted by path (as ``dlcloud.checksums`` sorts them), and its empty directories
    (kept so that a tree comes back as it was; they do not count in the checksum).

    ``source``: where the files are when they are not beside the manifest in the store — the
    ``s3://bucket/prefix`` of a dataset version registered in place, whose objects dlcloud reads (verified
    against this manifest) and never writes. None: the files are the store's own, under the tree's prefix.
    """

    entries: tuple[TreeEntry, ...]
    empty_dirs: tuple[str, ...] = ()
    source: str | None = None

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def artifact_sha256(self) -> str:
        """The canonical artifact checksum (``dlcloud.checksums``) of the files in this manifest."""
        digest = hashlib.sha256(MANIFEST_HEADER)
        for e in self.entries:
            digest.update(f"{e.path}\0{e.sha256}\0{e.size}\n".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def content_sha256(self) -> str:
        """The SHA-256 of everything the tree holds: its files (paths, sizes, checksums) and its empty
        directories, which ``artifact_sha256`` leaves out. Two trees with the same value look the same
        (wherever their files are read from: ``source`` does not count)."""
        return hashlib.sha256(self._body_json(with_source=False)).hexdigest()

    def to_json(self) -> bytes:
        return self._body_json(with_source=True)

    def _body_json(self, *, with_source: bool) -> bytes:
        body: dict[str, object] = {
            "format": MANIFEST_FORMAT,
            "files": [[e.path, e.size, e.sha256] for e in self.entries],
            "empty_dirs": list(self.empty_dirs),
        }
        if with_source and self.source is not None:
            body["source"] = self.source
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
            raise ValueError("not a dlcloud tree manifest")
        entries = tuple(TreeEntry(check_rel_path(str(p)), int(n), str(h)) for p, n, h in body["files"])
        dirs = tuple(check_rel_path(str(d)) for d in body.get("empty_dirs") or ())
        source = body.get("source")
        if source is not None and not (isinstance(source, str) and source.startswith("s3://")):
            raise ValueError(f"a tree manifest's source must be an s3:// URL, got {source!r}")
        return cls(entries, dirs, source)

    @classmethod
    def of(cls, entries: Iterable[TreeEntry], empty_dirs: Iterable[str] = (), source: str | None = None) -> Manifest:
        return cls(
            tuple(sorted(entries, key=lambda e: e.path.encode("utf-8", "surrogateescape"))),
            tuple(sorted(empty_dirs)),
            source,
        )


class TreeSources(abc.ABC):
    """Read-only access to the places trees registered in place keep their files (``Manifest.source``).
    The store is given one where such trees may exist (``storage/sources.py``); every read is verified
    against the manifest by the caller's store."""

    @abc.abstractmethod
    def get_tree(self, manifest: Manifest, dest: Path) -> None:
        """Write the manifest's files, read from ``manifest.source``, under ``dest``, each verified (size and
        SHA-256): ObjectDamaged for a file that changed there, ObjectMissing for one that is gone."""

    @abc.abstractmethod
    def iter_file(self, source: str, entry: TreeEntry, chunk: int) -> Iterator[bytes]:
        """One file's bytes from ``source`` (unverified: ``ObjectStore.iter_tree_file`` checks them)."""


def scan_tree(root: Path) -> Manifest:
    """The manifest of the regular files under ``root`` (links and special files refused: ValueError)."""
    entries: list[TreeEntry] = []
    empty: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if not dirnames and not filenames and Path(dirpath) != root:
            empty.append(check_rel_path(Path(dirpath).relative_to(root).as_posix()))
        for name in [*dirnames, *filenames]:
            full = Path(dirpath) / name
            st = os.lstat(full)
            rel = full.relative_to(root).as_posix()
            if stat.S_ISREG(st.st_mode):
                entries.append(TreeEntry(check_rel_path(rel), st.st_size, file_sha256(full)))
            elif not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"{rel} is a link or special file; only regular files and directories are stored")
    return Manifest.of(entries, empty)


class ObjectStore(abc.ABC):
    """Bytes under keys, and trees of files under key prefixes. Thread-safe; every call may block (run it
    in a worker thread from async code)."""

    url: str  # where it stores: file:///path or s3://bucket/prefix (no credentials)
    on_this_host = False  # whether what it stores is on this host's disks (lost with the host)
    # where the files of trees registered in place are read (``Manifest.source``); None: no such tree can
    # be read through this store (``open_object_store`` gives one from the settings)
    sources: TreeSources | None = None

    # -- single objects ----------------------------------------------------------------------------------
    def put_file(self, key: str, src: Path, *, sha256: str | None = None) -> ObjectInfo:
        """Store the file ``src`` under ``key`` (replacing what is there) and return what was stored.

        ``sha256``: the checksum the caller expects; a mismatch raises checksum_mismatch (400) and stores nothing.
        """
        actual = file_sha256(src)
        if sha256 is not None and actual != sha256:
            raise checksum_mismatch(key, sha256, actual)
        return self._put_file(check_key(key), src, actual)

    def get_file(self, key: str, dest: Path, *, sha256: str | None = None) -> ObjectInfo:
        """Write the object to ``dest`` (complete or not at all) and verify it against its stored checksum
        and ``sha256`` if given (ObjectDamaged, and ``dest`` removed, on a mismatch)."""
        info = self._get_file(check_key(key), dest)
        for expected in {sha256, info.sha256} - {None}:
            if file_sha256(dest) != expected:
                dest.unlink(missing_ok=True)
                raise ObjectDamaged(key, "does not match its SHA-256")
        return info

    def iter_bytes(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """The object's bytes in chunks (not verified: the caller checks the checksum at the end if it must)."""
        return self._iter_bytes(check_key(key), chunk)

    def head(self, key: str) -> ObjectInfo | None:
        return self._head(check_key(key))

    def delete(self, key: str) -> None:
        """Delete the object; a missing one is fine."""
        self._delete(check_key(key))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix/`` (recursive, in key order)."""
        return self._list(check_key(prefix))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix/`` (a tree, or everything of a tenant); returns how many."""
        return self._delete_prefix(check_key(prefix))

    def local_path(self, key: str) -> Path | None:
        """Where the object is on this host's file system, if the backend keeps it there (read it, never
        write it); None for remote backends."""
        return None

    # -- trees -------------------------------------------------------------------------------------------
    def put_tree(self, prefix: str, src: Path, manifest: Manifest | None = None) -> Manifest:
        """Store the files under the directory ``src`` as the tree ``prefix`` (visible whole or not at all).

        ``manifest``: the files' manifest if the caller already computed it (checked while uploading).
        """
        return self._put_tree(check_key(prefix), src, manifest or scan_tree(src))

    def get_tree(self, prefix: str, dest: Path, manifest: Manifest | None = None) -> Manifest:
        """Write the tree's files under the directory ``dest`` (created), each verified against ``manifest``
        (the caller's, e.g. from a record it trusts; default: the stored one); returns the manifest used."""
        manifest = manifest or self.tree_manifest(prefix)
        check_key(prefix)
        if manifest.source is not None:
            self._sources(manifest.source).get_tree(manifest, dest)
        else:
            self._get_tree(prefix, manifest, dest)
        return manifest

    def put_tree_manifest(self, prefix: str, manifest: Manifest) -> None:
        """Store the manifest of a tree registered in place (its files stay at ``manifest.source``) as the
        tree ``prefix``: readers see it like any tree, and read its files from the source."""
        if manifest.source is None:
            raise ValueError("put_tree_manifest stores manifests whose files are elsewhere; use put_tree")
        self._put_tree_manifest(check_key(prefix), manifest)

    def _sources(self, source: str) -> TreeSources:
        if self.sources is None:
            raise StorageError(
                f"the tree's files are at {source}, and this server reads no dataset sources "
                "(dataset_source_urls is empty)"
            )
        return self.sources

    def tree_manifest(self, prefix: str) -> Manifest:
        """The manifest of a stored tree; ObjectMissing when there is no (complete) tree at ``prefix``."""
        return self._tree_manifest(check_key(prefix))

    def iter_tree_file(
        self, prefix: str, entry: TreeEntry, chunk: int = CHUNK, *, source: str | None = None
    ) -> Iterator[bytes]:
        """One file of a tree, in chunks, verified against its manifest entry as it is read (ObjectDamaged
        as soon as it is longer, or after the last chunk if its size or SHA-256 differ). ``source``: the
        manifest's, for a tree registered in place (the file is read there)."""
        key = f"{check_key(prefix)}/{check_rel_path(entry.path)}"
        if source is not None:
            key = f"{source.rstrip('/')}/{entry.path}"
            chunks = self._sources(source).iter_file(source, entry, chunk)
        else:
            chunks = self._iter_bytes(key, chunk)
        digest = hashlib.sha256()
        size = 0
        for data in chunks:
            size += len(data)
            if size > entry.size:
                raise ObjectDamaged(key, "is longer than its manifest says")
            digest.update(data)
            yield data
        if size != entry.size:
            raise ObjectDamaged(key, "is shorter than its manifest says")
        if digest.hexdigest() != entry.sha256:
            raise ObjectDamaged(key, "does not match the SHA-256 in its manifest")

    def delete_tree(self, prefix: str) -> None:
        """Delete a tree (its manifest first, so a half-deleted tree is no longer visible)."""
        self._delete_tree(check_key(prefix))

    def tree_local_path(self, prefix: str) -> Path | None:
        """The directory holding the tree's files on this host, if the backend keeps them there."""
        return None

    def check(self) -> None:
        """Make sure the store can be used now (a bucket exists and answers; a directory is there):
        StorageError saying what is wrong otherwise. Called once at start."""
        return None

    def sweep(self, max_age_seconds: float) -> None:
        """Remove what crashed writes left behind, older than ``max_age_seconds`` (nothing by default)."""
        return None

    # -- hooks -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _put_file(self, key: str, src: Path, sha256: str) -> ObjectInfo: ...

    @abc.abstractmethod
    def _get_file(self, key: str, dest: Path) -> ObjectInfo: ...

    @abc.abstractmethod
    def _iter_bytes(self, key: str, chunk: int) -> Iterator[bytes]: ...

    @abc.abstractmethod
    def _head(self, key: str) -> ObjectInfo | None: ...

    @abc.abstractmethod
    def _delete(self, key: str) -> None: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> Iterator[ObjectInfo]: ...

    @abc.abstractmethod
    def _delete_prefix(self, prefix: str) -> int: ...

    @abc.abstractmethod
    def _put_tree(self, prefix: str, src: Path, manifest: Manifest) -> Manifest: ...

    @abc.abstractmethod
    def _get_tree(self, prefix: str, manifest: Manifest, dest: Path) -> None: ...

    @abc.abstractmethod
    def _tree_manifest(self, prefix: str) -> Manifest: ...

    @abc.abstractmethod
    def _delete_tree(self, prefix: str) -> None: ...

    @abc.abstractmethod
    def _put_tree_manifest(self, prefix: str, manifest: Manifest) -> None: ...


def storage_url(settings: Settings) -> str:
    """The configured store's URL: ``storage_url``, else the data directory as a ``file://`` URL."""
    return settings.storage_url or settings.data_dir.as_uri()
