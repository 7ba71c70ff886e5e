"""Model artifacts received on this host: checked and staged here, then stored as a tree in the object store.

Layout under the staging root (``<data_dir>/tmp/models``)::

    .staging/<random>/<artifact>                   an artifact being received

Invariants:
- An artifact is staged whole before anything is stored: unpacked from a validated archive, or copied from
  a job's outputs, then checksummed (``dlcloud.checksums``); whatever fails on the way is deleted. The
  registry then stores it with ``ObjectStore.put_tree``, which makes it visible whole or not at all.
- An artifact holds regular files and directories only: no links, devices or FIFOs; its size and entry
  count are bounded by the same limits as code uploads (``archives.ArchiveLimits``).
- Downloads stream a stored tree as a .tar.gz (``iter_tar_gz_files``), each file verified as it is read.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dlcloud import tarsafe
from dlcloud.checksums import ArtifactDigest, artifact_digest
from dlcloud.checksums import verify as verify_checksum
from dlcloud.errors import DlcloudError, InvalidArchive, InvalidArgument, PayloadTooLarge
from dlcloud.storage.archives import ArchiveLimits, failure_text, validate_tar
from dlcloud.storage.local import remove_tree
from dlcloud.storage.objects import Manifest, ObjectDamaged, ObjectStore, TreeEntry

ARTIFACT_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}$")
CHUNK = 1024 * 1024
log = logging.getLogger(__name__)


def check_artifact_name(name: str, error: type[DlcloudError] = InvalidArchive) -> str:
    if not ARTIFACT_NAME_RE.match(name):
        raise error(
            f"artifact name {name!r} is not allowed: use 1-200 letters, digits, '.', '_', '+', '-', "
            "not starting with '.', '+' or '-'"
        )
    return name


def archive_top_level(archive: Path) -> str:
    """The one top-level file or directory of a (validated) tar archive: the artifact's name."""
    names: set[str] = set()
    try:
        with tarfile.open(archive, mode="r:*") as tf:
            for member in tf:
                parts = PurePosixPath(member.name.replace("\\", "/")).parts
                if parts:
                    names.add(parts[0])
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidArchive(f"not a valid tar or tar.gz archive: {failure_text(exc)}") from None
    if len(names) != 1:
        shown = ", ".join(sorted(names)[:5]) or "nothing"
        raise InvalidArchive(
            f"the archive must hold exactly one top-level file or directory (the artifact); found {len(names)}: {shown}"
        )
    return check_artifact_name(names.pop())


def verify(path: Path, sha256: str) -> bool:
    """Whether the stored artifact at ``path`` still has the checksum it was registered with."""
    return verify_checksum(path, sha256)


@dataclass(frozen=True)
class StagedArtifact:
    """An artifact received into ``dir`` (which holds only it), not yet in its version directory."""

    dir: Path
    name: str
    digest: ArtifactDigest

    @property
    def path(self) -> Path:
        return self.dir / self.name


class ArtifactStore:
    """Where artifacts are staged on this host, under ``root``."""

    def __init__(self, root: Path, limits: ArchiveLimits):
        self.root = root
        self.limits = limits

    # -- paths -----------------------------------------------------------------------------------------
    def private_dir(self, path: Path) -> Path:
        """Create ``path`` and any missing parent under the root with mode 0700."""
        missing = [p for p in (path, *path.parents) if p.is_relative_to(self.root) and not p.exists()]
        for p in reversed(missing):
            p.mkdir(mode=0o700, exist_ok=True)
        return path

    # -- receiving ---------------------------------------------------------------------------------------
    def _new_staging(self) -> Path:
        self.root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self.private_dir(self.root / ".staging")
        return Path(tempfile.mkdtemp(prefix="stage-", dir=staging))

    def _checked_digest(self, path: Path) -> ArtifactDigest:
        try:
            digest = artifact_digest(path)
        except ValueError as exc:
            raise InvalidArchive(str(exc)) from None
        if digest.size > self.limits.max_unpacked_bytes:
            raise self._too_big(digest.size)
        return digest

    def _too_big(self, size: int) -> PayloadTooLarge:
        limit = self.limits.max_unpacked_bytes
        return PayloadTooLarge(
            f"the artifact is more than {limit} bytes (the limit; max_unpacked_bytes)",
            details={"limit": limit, "size_at_least": size},
        )

    def stage_archive(self, archive: Path) -> StagedArtifact:
        """Validate a tar(.gz) holding one top-level file or directory and unpack it into a staging dir."""
        validate_tar(archive, self.limits)
        name = archive_top_level(archive)
        staging = self._new_staging()
        try:
            with tarfile.open(archive, mode="r:*") as tf:
                tarsafe.extractall(tf, staging)
            return StagedArtifact(staging, name, self._checked_digest(staging / name))
        except (tarfile.TarError, EOFError, OSError) as exc:
            remove_tree(staging)
            raise InvalidArchive(f"cannot unpack the archive: {failure_text(exc, staging)}") from None
        except BaseException:
            remove_tree(staging)
            raise

    def stage_copy(self, src: Path, name: str, shown: str) -> StagedArtifact:
        """Copy a regular file or a directory tree (no links, no special files) into a staging dir.

        ``shown`` names ``src`` in error messages (the path as the user gave it).
        """
        check_artifact_name(name, InvalidArgument)
        staging = self._new_staging()
        counts = [0, 0]  # entries, bytes

        def copy(s: Path, d: Path, rel: str) -> None:
            st = os.lstat(s)
            counts[0] += 1
            if counts[0] > self.limits.max_members:
                raise InvalidArgument(f"{shown} has more than {self.limits.max_members} entries (the limit)")
            if stat.S_ISLNK(st.st_mode):
                raise InvalidArgument(
                    f"{rel} is a symbolic link; links are not copied into a model artifact (write the file itself)"
                )
            if stat.S_ISREG(st.st_mode):
                counts[1] += st.st_size
                if counts[1] > self.limits.max_unpacked_bytes:
                    raise self._too_big(counts[1])
                shutil.copyfile(s, d, follow_symlinks=False)
            elif stat.S_ISDIR(st.st_mode):
                d.mkdir(mode=0o700)
                for child in sorted(os.listdir(s)):
                    copy(s / child, d / child, f"{rel}/{child}")
            else:
                raise InvalidArgument(f"{rel} is a device, FIFO or socket; only regular files and directories")

        try:
            copy(src, staging / name, shown)
            return StagedArtifact(staging, name, self._checked_digest(staging / name))
        except BaseException:
            remove_tree(staging)
            raise

    def stage_stored(self, objects: ObjectStore, key: str, manifest: Manifest, rel: str, shown: str) -> StagedArtifact:
        """Copy the file or the directory ``rel`` of the stored tree at ``key`` (whose ``manifest`` is given)
        into a staging dir, each file verified as it is read; the artifact limits apply. InvalidArgument
        (naming ``shown``) when the tree has no such file or directory."""
        name = rel.rsplit("/", 1)[-1]
        check_artifact_name(name, InvalidArgument)
        inside = [e for e in manifest.entries if e.path == rel or e.path.startswith(rel + "/")]
        dirs = [d for d in manifest.empty_dirs if d == rel or d.startswith(rel + "/")]
        if not inside and not dirs:
            raise InvalidArgument(f"no file or directory {shown!r}")
        if len(inside) + len(dirs) > self.limits.max_members:
            raise InvalidArgument(f"{shown} has more than {self.limits.max_members} entries (the limit)")
        total = sum(e.size for e in inside)
        if total > self.limits.max_unpacked_bytes:
            raise self._too_big(total)
        parent = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        staging = self._new_staging()
        try:
            for d in dirs:
                (staging / d.removeprefix(parent)).mkdir(parents=True, exist_ok=True, mode=0o700)
            for e in inside:
                dest = staging / e.path.removeprefix(parent)
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                with dest.open("wb") as f:
                    for data in objects.iter_tree_file(key, e):
                        f.write(data)
            return StagedArtifact(staging, name, self._checked_digest(staging / name))
        except BaseException:
            remove_tree(staging)
            raise

    def discard(self, staged: StagedArtifact) -> None:
        remove_tree(staged.dir)

    def sweep(self, max_age_seconds: float) -> None:
        """Delete staging dirs older than ``max_age_seconds`` (left by crashes)."""
        cutoff = time.time() - max_age_seconds
        for parent in (self.root / ".staging",):
            if not parent.is_dir():
                continue
            for entry in parent.iterdir():
                try:
                    if entry.lstat().st_mtime < cutoff:
                        remove_tree(entry)
                except OSError:
                    continue


def iter_tar_gz(path: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    """Stream the artifact at ``path`` (a file or a directory tree on this host) as a .tar.gz whose one
    top-level entry is the artifact's name."""
    base = path.parent

    def opener(full: Path, size: int) -> Callable[[], Iterator[bytes]]:
        def read() -> Iterator[bytes]:
            remaining = size
            with full.open("rb") as f:
                while remaining > 0:
                    data = f.read(min(chunk, remaining))
                    if not data:
                        raise OSError(f"{full} became shorter while it was sent; the stored artifact was altered")
                    remaining -= len(data)
                    yield data

        return read

    files, empty_dirs = [], []
    for full in [path] if not path.is_dir() else sorted(path.rglob("*")):
        st = os.lstat(full)
        if stat.S_ISDIR(st.st_mode):
            if not any(full.iterdir()):
                empty_dirs.append(full.relative_to(base).as_posix())
        elif stat.S_ISREG(st.st_mode):
            files.append((full.relative_to(base).as_posix(), st.st_size, opener(full, st.st_size)))
        else:
            raise OSError(f"{full} is not a regular file or directory; the stored artifact was altered")
    return iter_tar_gz_files(files, empty_dirs)


def iter_tar_gz_files(
    files: Iterable[tuple[str, int, Callable[[], Iterator[bytes]]]], empty_dirs: Iterable[str] = ()
) -> Iterator[bytes]:
    """Stream files as a .tar.gz: (relative POSIX path, size, a function giving its bytes in chunks), then
    the empty directories.

    Written block by block (no temporary file, no whole file in memory); each file's directories come
    first; unpacked files get 0644, directories 0755. A file whose bytes run short or long of its size
    raises OSError (the stream is then cut, so the client's checksum fails).
    """
    z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    mtime = int(time.time())
    seen: set[str] = set()

    def header(info: tarfile.TarInfo) -> bytes:
        info.mtime = mtime
        return z.compress(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))

    def dirs(rel: str, inclusive: bool) -> Iterator[bytes]:
        parts = rel.split("/")
        for i in range(1, len(parts) + (1 if inclusive else 0)):
            d = "/".join(parts[:i])
            if d not in seen:
                seen.add(d)
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                if out := header(info):
                    yield out

    for rel, size, read in files:
        yield from dirs(rel, inclusive=False)
        info = tarfile.TarInfo(rel)
        info.mode, info.size = 0o644, size
        if out := header(info):
            yield out
        sent = 0
        for data in read():
            sent += len(data)
            if sent > size:
                raise OSError(f"{rel} is longer than its recorded size; the stored artifact was altered")
            if out := z.compress(data):
                yield out
        if sent != size:
            raise OSError(f"{rel} is shorter than its recorded size; the stored artifact was altered")
        pad = -size % tarfile.BLOCKSIZE
        if pad and (out := z.compress(b"\0" * pad)):
            yield out
    for d in empty_dirs:
        yield from dirs(d, inclusive=True)
    yield z.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + z.flush()


def iter_stored_tree(objects: ObjectStore, key: str, manifest: Manifest) -> Iterator[bytes]:
    """A stored tree (a model artifact, a dataset version) as a .tar.gz stream, each file verified as it is
    read. A file damaged in the store is logged and sent padded or cut to its recorded size: the archive
    stays well-formed and the client's checksum check refuses it."""

    def reader(entry: TreeEntry) -> Callable[[], Iterator[bytes]]:
        def read() -> Iterator[bytes]:
            sent = 0
            try:
                for data in objects.iter_tree_file(key, entry, source=manifest.source):
                    sent += len(data)
                    yield data
            except ObjectDamaged as exc:
                log.error("%s (in %s); the download will fail its checksum", exc.message, objects.url)
                if sent < entry.size:
                    yield b"\0" * (entry.size - sent)

        return read

    return iter_tar_gz_files([(e.path, e.size, reader(e)) for e in manifest.entries], manifest.empty_dirs)
