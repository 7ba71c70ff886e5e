"""Dataset sources: objects already in an S3 bucket that a dataset version is registered from *in place*.

dlcloud reads a source, never writes or deletes in it. A version registered in place is a manifest (path,
size and SHA-256 of every object, computed by reading them) stored in the platform's store at the version's
key, with ``Manifest.source`` naming the ``s3://bucket/prefix`` its files are read from; every later read
(a job's fetch into this host's dataset cache, a download) is verified against that manifest, so an object
changed or removed after the registration is refused (``object_damaged`` / ``object_missing``) and never
cached.

Invariants:
- **Only allowed sources.** A source must be at or under one of the admin's ``dataset_source_urls``; never
  at, under or above the platform's own store (``storage_url``), whose objects are every tenant's. Checked
  when a version is registered and again on every read (an admin who removes a source from the list stops
  its versions from being read).
- **The store's S3 settings.** Sources are read with the endpoint, credentials and client options of the
  platform's store (``s3.s3_store``): one configuration, one code path (``S3ObjectStore``).
- Names follow the rules of uploaded trees (``archives.check_tree_name``): UTF-8, no backslash, no
  ``.dlcloud-`` segment, bounded length and depth; the number of files and directories and their bytes
  follow ``max_archive_members`` and ``max_unpacked_bytes``.

Vocabulary: *source URL*, ``s3://BUCKET`` or ``s3://BUCKET/PREFIX`` (no trailing ``/``, no empty, ``.`` or
``..`` segment, segments of ``A-Z a-z 0-9 . _ + = @ , -``).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dlcloud.errors import InvalidArchive, InvalidArgument, PayloadTooLarge, SourceNotAllowed
from dlcloud.settings import Settings
from dlcloud.storage.archives import ArchiveLimits, check_tree_name
from dlcloud.storage.objects import (
    KEY_SEGMENT_RE,
    Manifest,
    ObjectDamaged,
    ObjectMissing,
    TreeEntry,
    TreeSources,
    storage_url,
)
from dlcloud.storage.s3 import S3ObjectStore, s3_store

BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
SETTING = "dataset_source_urls"
READERS = 4  # objects read at once while a manifest is computed


@dataclass(frozen=True)
class SourceUrl:
    bucket: str
    prefix: str  # "" for the whole bucket

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def contains(self, other: SourceUrl) -> bool:
        """``other`` is this location or under it."""
        if self.bucket != other.bucket:
            return False
        return not self.prefix or other.prefix == self.prefix or other.prefix.startswith(self.prefix + "/")

    def overlaps(self, other: SourceUrl) -> bool:
        return self.contains(other) or other.contains(self)


def parse_source_url(text: str, what: str = "the source") -> SourceUrl:
    """``s3://BUCKET[/PREFIX]`` as a SourceUrl; InvalidArgument saying what is wrong otherwise."""
    if not isinstance(text, str) or not text.startswith("s3://"):
        raise InvalidArgument(f"{what} {text!r} is not an s3:// URL: give s3://BUCKET/PREFIX")
    parts = urlsplit(text)
    if parts.query or parts.fragment or parts.username or parts.password or "@" in parts.netloc:
        raise InvalidArgument(f"{what} {text!r}: an s3:// URL names a bucket and a prefix only (no credentials, ?, #)")
    if not BUCKET_RE.fullmatch(parts.netloc):
        raise InvalidArgument(f"{what} {text!r}: the bucket name must be 3-63 lower-case letters, digits, '.' and '-'")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if path.endswith("/"):
        path = path[:-1]
    if path:
        for segment in path.split("/"):
            if segment in ("", ".", "..") or not KEY_SEGMENT_RE.match(segment):
                raise InvalidArgument(
                    f"{what} {text!r}: every segment of the prefix must be 1-255 of A-Z a-z 0-9 . _ + = @ , - "
                    "(no empty, '.' or '..' segment, not starting with '.')"
                )
    return SourceUrl(parts.netloc, path)


def allowed_sources(settings: Settings) -> list[SourceUrl]:
    """The admin's allow-list; InvalidArgument naming the setting for an entry that is not a source URL."""
    return [parse_source_url(u, f"{SETTING} entry") for u in settings.dataset_source_urls]


def store_location(settings: Settings) -> SourceUrl | None:
    """The platform's store as a location in S3 (None for a local store)."""
    url = storage_url(settings)
    return parse_source_url(url, "storage_url") if url.startswith("s3://") else None


def check_source(settings: Settings, text: str) -> SourceUrl:
    """The source a tenant asks to register, if it may: a valid URL (400), inside the allow-list and apart
    from the platform's own store (403 ``source_not_allowed``)."""
    src = parse_source_url(text)
    allowed = allowed_sources(settings)
    if not allowed:
        raise SourceNotAllowed(
            f"registering datasets in place is off on this server: {SETTING} is empty; push a local directory "
            "instead, or ask an administrator to allow the bucket",
            details={"allowed": []},
        )
    store = store_location(settings)
    if store is not None and store.overlaps(src):
        raise SourceNotAllowed(
            f"{src.url} is the platform's own storage ({store.url}), which holds every tenant's stored objects; "
            "register data from another bucket or prefix",
            details={"allowed": [a.url for a in allowed]},
        )
    if not any(a.contains(src) for a in allowed):
        raise SourceNotAllowed(
            f"{src.url} is not a dataset source this server allows; allowed: "
            + ", ".join(f"{a.url} (and below)" for a in allowed),
            details={"allowed": [a.url for a in allowed]},
        )
    return src


@dataclass(frozen=True)
class Progress:
    objects: int
    bytes: int


class SourceReader(TreeSources):
    """Read-only access to the allowed sources, with the platform store's S3 settings. Thread-safe."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        allowed_sources(settings)  # a bad entry fails at start, naming the setting
        self._stores: dict[SourceUrl, S3ObjectStore] = {}
        self._lock = threading.Lock()

    def store(self, src: SourceUrl) -> S3ObjectStore:
        """A read-only use of an S3ObjectStore rooted at the source (built once per source)."""
        with self._lock:
            found = self._stores.get(src)
            if found is None:
                found = self._stores[src] = s3_store(self.settings, src.bucket, src.prefix)
            return found

    def _allowed(self, source: str) -> SourceUrl:
        return check_source(self.settings, source)

    # -- registering ---------------------------------------------------------------------------------------
    def check_not_empty(self, src: SourceUrl) -> None:
        """Cheap, at registration: the bucket answers and holds an object under the prefix (InvalidArgument
        otherwise, StorageError when it cannot be read)."""
        if not self.store(src).has_source_objects():
            raise InvalidArgument(f"there is no object under {src.url}; a dataset version needs at least one file")

    def scan(
        self, src: SourceUrl, limits: ArchiveLimits, progress: Callable[[Progress], None] | None = None
    ) -> Manifest:
        """The manifest of every object under ``src``, each read whole for its SHA-256. Raises InvalidArchive
        (a name the rules refuse, a name both a file and a directory, no object), PayloadTooLarge (past the
        limits), ObjectMissing (an object vanished while it was read), StorageError."""
        store = self.store(src)
        listed = []
        dirs: set[str] = set()
        members = total = 0
        for info in store.list_source():
            members += 1 + check_tree_name(info.key, dirs, what="object")
            total += info.size
            if members > limits.max_members:
                raise PayloadTooLarge(
                    f"{src.url} holds more than {limits.max_members} files and directories (max_archive_members)"
                )
            if total > limits.max_unpacked_bytes:
                raise PayloadTooLarge(
                    f"{src.url} holds more than {limits.max_unpacked_bytes} bytes (max_unpacked_bytes)"
                )
            listed.append(info)
        if not listed:
            raise InvalidArchive(f"there is no object under {src.url}; a dataset version needs at least one file")
        clash = next((i.key for i in listed if i.key in dirs), None)
        if clash is not None:
            raise InvalidArchive(f"object {clash!r} under {src.url} is both a file and a directory of other objects")

        def read(rel: str) -> TreeEntry:
            digest = hashlib.sha256()
            size = 0
            try:
                for data in store.iter_source_object(rel):
                    digest.update(data)
                    size += len(data)
            except ObjectMissing:
                raise ObjectMissing(f"{src.url}/{rel}") from None
            return TreeEntry(rel, size, digest.hexdigest())

        entries = []
        done = Progress(0, 0)
        with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="dlcloud-source-read") as pool:
            for entry in pool.map(read, [i.key for i in listed]):
                entries.append(entry)
                done = Progress(done.objects + 1, done.bytes + entry.size)
                if done.bytes > limits.max_unpacked_bytes:  # grew while it was read
                    raise PayloadTooLarge(
                        f"{src.url} holds more than {limits.max_unpacked_bytes} bytes (max_unpacked_bytes)"
                    )
                if progress is not None:
                    progress(done)
        return Manifest.of(entries, source=src.url)

    # -- reading (TreeSources) -----------------------------------------------------------------------------
    def get_tree(self, manifest: Manifest, dest: Path) -> None:
        assert manifest.source is not None
        src = self._allowed(manifest.source)
        try:
            self.store(src).get_source_tree(manifest, dest)
        except ObjectDamaged as exc:
            raise changed(src, str(exc.details.get("key", ""))) from None
        except ObjectMissing as exc:
            raise ObjectMissing(f"{src.url}/{exc.details.get('key', '')}") from None

    def iter_file(self, source: str, entry: TreeEntry, chunk: int) -> Iterator[bytes]:
        src = self._allowed(source)
        try:
            yield from self.store(src).iter_source_object(entry.path, chunk)
        except ObjectMissing:
            raise ObjectMissing(f"{src.url}/{entry.path}") from None


def changed(src: SourceUrl, rel: str) -> ObjectDamaged:
    return ObjectDamaged(
        f"{src.url}/{rel}",
        "changed in its bucket after the dataset version was registered (its size or SHA-256 is not the "
        "manifest's); register the data again as a new version",
    )
