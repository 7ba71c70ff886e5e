"""Model artifacts on local disk.

Layout under ``<data_dir>/models``::

    <tenant_id>/<model_id>/<version>/<artifact>   a registered version; <artifact> is one file or one tree
    .uploads/<tenant_id>/<upload_id>.tar.gz        uploaded archives waiting for a register call
    .staging/<random>/<artifact>                   an artifact being received

Invariants:
- An artifact reaches its version directory only complete: it is received into a staging directory on the
  same filesystem (unpacked from a validated archive, or copied from a job's outputs), checksummed
  (``dlcloud.checksums``), made read-only (files 0444, directories 0555) and then renamed into place in
  one step. Whatever fails on the way is deleted, so no partial artifact is ever visible.
- An artifact holds regular files and directories only: no links, devices or FIFOs; its size and entry
  count are bounded by the same limits as code uploads (``archives.ArchiveLimits``).
- A stored artifact is never modified; ``verify`` tells whether it still matches its checksum.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dlcloud import tarsafe
from dlcloud.checksums import ArtifactDigest, artifact_digest
from dlcloud.checksums import verify as verify_checksum
from dlcloud.errors import DlcloudError, InvalidArchive, InvalidArgument, PayloadTooLarge
from dlcloud.storage.archives import ArchiveLimits, validate_tar

ARTIFACT_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}$")
CHUNK = 1024 * 1024


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
        raise InvalidArchive(f"not a valid tar or tar.gz archive: {exc}") from None
    if len(names) != 1:
        shown = ", ".join(sorted(names)[:5]) or "nothing"
        raise InvalidArchive(
            f"the archive must hold exactly one top-level file or directory (the artifact); found {len(names)}: {shown}"
        )
    return check_artifact_name(names.pop())


def make_read_only(path: Path) -> None:
    """Files 0444, directories 0555 (bottom-up, so every directory is still writable while its content changes)."""
    if not path.is_dir():
        path.chmod(0o444)
        return
    for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)


def remove_tree(path: Path) -> None:
    """Delete a file or a (read-only) tree; a missing path is fine."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    path.chmod(0o700)
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path)


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
    """The local artifact store under ``root`` (``<data_dir>/models``)."""

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

    def upload_dir(self, tenant_id: str) -> Path:
        return self.root / ".uploads" / tenant_id

    def upload_path(self, tenant_id: str, upload_id: str) -> Path:
        return self.upload_dir(tenant_id) / f"{upload_id}.tar.gz"

    def model_dir(self, tenant_id: str, model_id: str) -> Path:
        return self.root / tenant_id / model_id

    def version_dir(self, tenant_id: str, model_id: str, version: int) -> Path:
        return self.model_dir(tenant_id, model_id) / str(version)

    # -- receiving ---------------------------------------------------------------------------------------
    def _new_staging(self) -> Path:
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
            raise InvalidArchive(f"cannot unpack the archive: {exc}") from None
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

    def commit(self, staged: StagedArtifact, version_dir: Path) -> Path:
        """Make the staged artifact read-only and rename it into ``version_dir``; returns the artifact path."""
        make_read_only(staged.path)
        self.private_dir(version_dir.parent)
        remove_tree(version_dir)  # only a crash can leave one behind: version numbers are never reused
        os.rename(staged.dir, version_dir)
        version_dir.chmod(0o555)
        return version_dir / staged.name

    def discard(self, staged: StagedArtifact) -> None:
        remove_tree(staged.dir)

    def sweep(self, max_age_seconds: float) -> None:
        """Delete uploads and staging dirs older than ``max_age_seconds`` (left by clients or crashes)."""
        cutoff = time.time() - max_age_seconds
        for parent in (self.root / ".staging", *(self.root / ".uploads").glob("*")):
            if not parent.is_dir():
                continue
            for entry in parent.iterdir():
                try:
                    if entry.lstat().st_mtime < cutoff:
                        remove_tree(entry)
                except OSError:
                    continue


def iter_tar_gz(path: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    """Stream the artifact at ``path`` as a .tar.gz whose one top-level entry is the artifact's name.

    Written block by block (no temporary file, no whole file in memory); unpacked files get 0644,
    directories 0755.
    """
    z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    base = path.parent

    def entries() -> Iterator[Path]:
        if not path.is_dir():
            yield path
            return
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            yield Path(dirpath)
            for name in sorted(filenames):
                yield Path(dirpath) / name

    for full in entries():
        st = os.lstat(full)
        info = tarfile.TarInfo(full.relative_to(base).as_posix())
        info.mtime = int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            info.type, info.mode = tarfile.DIRTYPE, 0o755
        elif stat.S_ISREG(st.st_mode):
            info.mode, info.size = 0o644, st.st_size
        else:
            raise OSError(f"{full} is not a regular file or directory; the stored artifact was altered")
        if out := z.compress(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")):
            yield out
        if info.isfile():
            remaining = info.size
            with full.open("rb") as f:
                while remaining > 0:
                    data = f.read(min(chunk, remaining))
                    if not data:
                        raise OSError(f"{full} became shorter while it was sent; the stored artifact was altered")
                    remaining -= len(data)
                    if out := z.compress(data):
                        yield out
            pad = -info.size % tarfile.BLOCKSIZE
            if pad and (out := z.compress(b"\0" * pad)):
                yield out
    yield z.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + z.flush()
