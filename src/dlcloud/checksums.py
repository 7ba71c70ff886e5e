"""The canonical checksum of a model artifact, shared by the registry, the SDK and the model server.

Pure standard library, so every side computes exactly the same value. An artifact is one regular file or
one directory tree. Its checksum is the hex SHA-256 of a manifest::

    dlcloud-artifact-manifest-v1\\n
    <path>\\0<hex SHA-256 of the file>\\0<size in bytes>\\n      (one line per regular file, sorted by path)

``path`` is the file's POSIX path relative to the artifact's parent directory, so it starts with the
artifact's own name (``model.pt``; ``export/saved_model.pb``). Directories count only through the files
in them; modification times, modes and owners do not count, so a file or a tree has the same checksum
wherever it is unpacked. Links and special files are not allowed in an artifact: they make the checksum
fail (``ValueError``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MANIFEST_HEADER = b"dlcloud-artifact-manifest-v1\n"
CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ArtifactDigest:
    sha256: str
    size: int  # bytes in all files
    files: int


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _entries(path: Path, base: Path | None = None) -> list[tuple[str, Path]]:
    """(POSIX path relative to ``base``, full path) of every regular file; ValueError on links and special
    files. ``base``: the artifact's parent by default (paths start with the artifact's name)."""
    base = path.parent if base is None else base
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        return [(path.name, path)]
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path.name} is a link or special file; an artifact holds regular files only")
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            full = Path(dirpath) / name
            mode = os.lstat(full).st_mode
            rel = full.relative_to(base).as_posix()
            if stat.S_ISREG(mode):
                found.append((rel, full))
            elif not stat.S_ISDIR(mode):
                raise ValueError(f"{rel} is a link or special file; an artifact holds regular files only")
    found.sort(key=lambda e: e[0].encode("utf-8", "surrogateescape"))
    return found


def artifact_digest(path: Path, *, contents_only: bool = False) -> ArtifactDigest:
    """The checksum, total size and file count of the artifact at ``path`` (a file or a directory).

    ``contents_only``: paths relative to the directory ``path`` itself, not to its parent — a dataset
    version's checksum, whose files have no common top-level name."""
    manifest = hashlib.sha256(MANIFEST_HEADER)
    size = 0
    entries = _entries(path, path if contents_only else None)
    for rel, full in entries:
        file_size = full.stat().st_size
        size += file_size
        line = f"{rel}\0{file_sha256(full)}\0{file_size}\n"
        manifest.update(line.encode("utf-8", "surrogateescape"))
    return ArtifactDigest(manifest.hexdigest(), size, len(entries))


def verify(path: Path, sha256: str) -> bool:
    """Whether the artifact at ``path`` still has checksum ``sha256`` (False if it is missing or altered)."""
    try:
        return artifact_digest(path).sha256 == sha256
    except (OSError, ValueError):
        return False
