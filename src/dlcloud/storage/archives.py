"""Validation of uploaded archives before anything is stored or unpacked.

Rejected: absolute paths, ``..`` components, symlinks, hard links, device files and FIFOs, more members
than allowed, and more unpacked bytes than allowed (decompression bombs are caught by the declared
sizes, which are exactly what extraction would write, and by the size actually decompressed).
"""

from __future__ import annotations

import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dlcloud.errors import InvalidArchive, PayloadTooLarge


@dataclass(frozen=True)
class ArchiveLimits:
    max_unpacked_bytes: int
    max_members: int


def _check_name(name: str) -> None:
    if not name or "\x00" in name:
        raise InvalidArchive("archive contains an entry with an empty or invalid name")
    if name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise InvalidArchive(f"archive entry {name!r} has an absolute path; only relative paths are allowed")
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if ".." in parts:
        raise InvalidArchive(f"archive entry {name!r} contains '..'; entries must stay inside the archive root")


def _too_big(total: int, limits: ArchiveLimits) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"archive unpacks to more than {limits.max_unpacked_bytes} bytes (the limit); "
        "exclude data and build outputs (.dlcloudignore) or raise max_unpacked_bytes",
        details={"limit": limits.max_unpacked_bytes, "unpacked_at_least": total},
    )


def validate_tar(path: Path, limits: ArchiveLimits) -> int:
    """Check a .tar / .tar.gz; returns the unpacked size. Reads the whole stream once."""
    total = 0
    count = 0
    try:
        with tarfile.open(path, mode="r:*") as tf:
            for member in tf:
                count += 1
                if count > limits.max_members:
                    raise InvalidArchive(f"archive has more than {limits.max_members} entries (the limit)")
                _check_name(member.name)
                if member.issym() or member.islnk():
                    raise InvalidArchive(
                        f"archive entry {member.name!r} is a link; links are not allowed (copy the file instead)"
                    )
                if not (member.isfile() or member.isdir()):
                    raise InvalidArchive(
                        f"archive entry {member.name!r} is a device, FIFO or other special file; "
                        "only regular files and directories are allowed"
                    )
                total += member.size
                if total > limits.max_unpacked_bytes:
                    raise _too_big(total, limits)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidArchive(f"not a valid tar or tar.gz archive: {exc}") from None
    return total


def validate_zip(path: Path, limits: ArchiveLimits) -> int:
    """Check a zip (wheel); returns the unpacked size."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > limits.max_members:
                raise InvalidArchive(f"archive has more than {limits.max_members} entries (the limit)")
            total = 0
            for info in infos:
                _check_name(info.filename)
                mode = (info.external_attr >> 16) & 0o170000
                if mode not in (0, 0o100000, 0o040000):
                    raise InvalidArchive(
                        f"archive entry {info.filename!r} is a link or special file; only regular files are allowed"
                    )
                total += info.file_size
                if total > limits.max_unpacked_bytes:
                    raise _too_big(total, limits)
            bad = zf.testzip()
            if bad is not None:
                raise InvalidArchive(f"archive entry {bad!r} is corrupt")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InvalidArchive(f"not a valid zip/wheel archive: {exc}") from None
    return total


def validate_sdist(path: Path, limits: ArchiveLimits) -> int:
    size = validate_tar(path, limits)
    with tarfile.open(path, mode="r:*") as tf:
        names = tf.getnames()
    if not any(n.count("/") == 1 and n.endswith(("/setup.py", "/pyproject.toml")) for n in names):
        raise InvalidArchive("an sdist must contain <name>-<version>/pyproject.toml or setup.py at its top level")
    return size
