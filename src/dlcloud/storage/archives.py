"""Validation of uploaded archives before anything is stored or unpacked.

Rejected: absolute paths, ``..`` components, symlinks, hard links, device files and FIFOs, more members
than allowed (the directories entries imply count), more unpacked bytes than allowed; in tar archives (which
become stored trees) also names that are not UTF-8, contain a backslash or a reserved ``.dlcloud-`` segment,
or are longer or deeper than ``MAX_PATH_BYTES`` / ``MAX_PATH_DEPTH`` (decompression bombs are caught by the declared
sizes, which are exactly what extraction would write, and by the size actually decompressed).

Tar archives are first scanned header by header (``scan_tar_headers``), streaming through the
decompressor, before ``tarfile`` parses them: ``tarfile`` reads a pax extended header or a GNU long
name whole into memory, so a 700 KB .tar.gz declaring a 700 MiB pax header cost 700 MiB. Metadata
members (pax ``x``/``g``/``X``, GNU ``L``/``K``) larger than ``MAX_TAR_METADATA_BYTES`` and GNU sparse
files (whose maps ``tarfile`` also keeps in memory) are refused there.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from dlcloud.errors import InvalidArchive, PayloadTooLarge

MAX_TAR_METADATA_BYTES = 1024 * 1024  # one pax header or GNU long name; real ones are a few hundred bytes
# an entry's path: the work of unpacking, walking and deleting grows with depth x entries, so a small archive
# of deep empty files would cost minutes of CPU and millions of inodes (every directory counts as an entry)
MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255
MAX_PATH_DEPTH = 32
RESERVED_PREFIX = ".dlcloud-"  # names the object store keeps for itself (storage/objects.py)
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)  # extended headers of the next member
_METADATA_TYPES = (*_PAX_TYPES, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_CHUNK = 1024 * 1024


def failure_text(exc: BaseException, root: Path | None = None) -> str:
    """Why reading or unpacking an archive failed, in words that name no path of the server: an OSError's
    reason alone, with the archive entry it concerns where its path lies under ``root`` (where the archive is
    unpacked); any other error's own text (tarfile's, zipfile's and the decompressors' name no file)."""
    if not isinstance(exc, OSError) or (exc.filename is None and exc.filename2 is None):
        return str(exc)
    reason = exc.strerror or type(exc).__name__
    if root is not None and isinstance(exc.filename, str | bytes):
        path = Path(os.fsdecode(exc.filename))
        if path.is_relative_to(root) and path != root:
            return f"{reason}: {path.relative_to(root).as_posix()!r}"
    return reason


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


def check_tree_name(name: str, dirs: set[str], what: str = "archive entry") -> int:
    """The stricter rules of an archive that becomes a stored tree (code, model artifacts, datasets): UTF-8,
    no backslash, no reserved name, bounded length and depth. Adds the directories the entry implies to
    ``dirs``; returns how many were new (they count as entries). ``what`` names the entry in messages
    (the objects of a dataset registered in place follow the same rules)."""
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArchive(f"{what} {name!r} is not valid UTF-8; name files in UTF-8") from None
    shown = name if len(name) <= 80 else name[:77] + "..."
    if "\\" in name:
        raise InvalidArchive(f"{what} {shown!r} contains a backslash; use '/' between directories")
    if len(raw) > MAX_PATH_BYTES:
        raise InvalidArchive(f"{what} {shown!r} has a path of {len(raw)} bytes; at most {MAX_PATH_BYTES}")
    parts = [p for p in PurePosixPath(name).parts if p not in (".", "")]
    if len(parts) > MAX_PATH_DEPTH:
        raise InvalidArchive(f"{what} {shown!r} is {len(parts)} levels deep; at most {MAX_PATH_DEPTH}")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise InvalidArchive(f"{what} {shown!r} has a name longer than {MAX_SEGMENT_BYTES} bytes")
        if part.startswith(RESERVED_PREFIX):
            raise InvalidArchive(f"{what} {shown!r}: names starting with {RESERVED_PREFIX!r} are reserved")
    new = 0
    for i in range(1, len(parts)):
        d = "/".join(parts[:i])
        if d not in dirs:
            dirs.add(d)
            new += 1
    return new


def _too_big(total: int, limits: ArchiveLimits) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"archive unpacks to more than {limits.max_unpacked_bytes} bytes (the limit); "
        "exclude data and build outputs (.dlcloudignore) or raise max_unpacked_bytes",
        details={"limit": limits.max_unpacked_bytes, "unpacked_at_least": total},
    )


def _open_decompressed(path: Path) -> BinaryIO:
    """The tar stream of a plain, gzip, bzip2 or xz file (the formats tarfile's "r:*" reads)."""
    with path.open("rb") as f:
        magic = f.read(6)
    opener: dict[bytes, Callable[[Path, str], Any]] = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ": lzma.open}
    for prefix, open_ in opener.items():
        if magic.startswith(prefix):
            stream: Any = open_(path, "rb")
            try:
                stream.peek(1)  # the first block decompresses, or the file is not what its magic says
                return stream
            except (OSError, EOFError, lzma.LZMAError, zlib.error):
                stream.close()  # tarfile then reads it as a plain tar, and so do we
    return path.open("rb")


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = stream.read(min(left, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _skip(stream: BinaryIO, n: int) -> None:
    while n > 0:
        chunk = stream.read(min(n, _CHUNK))
        if not chunk:
            return  # truncated: tarfile reports it
        n -= len(chunk)


def _pax_size(payload: bytes, global_header: bool) -> int | None:
    """The ``size`` record of a pax header, which replaces the next member's size; refuses sparse maps."""
    if b"GNU.sparse." in payload:
        raise InvalidArchive("archive holds a GNU sparse file; sparse files are not allowed (archive a plain copy)")
    size = None
    pos = 0
    while match := _PAX_RECORD.match(payload, pos):
        length = int(match.group(1))
        if length <= len(match.group(0)) or match.start(1) + length > len(payload):
            raise InvalidArchive("archive has a malformed pax extended header")
        if match.group(2) == b"size":
            value = payload[match.end(0) : match.start(1) + length - 1]
            if global_header or not value.isdigit():
                raise InvalidArchive("archive has a pax header with an invalid 'size' record")
            size = int(value)
        pos += length
    return size


def scan_tar_headers(path: Path, limits: ArchiveLimits, max_metadata: int = MAX_TAR_METADATA_BYTES) -> None:
    """Walk the raw 512-byte headers of a tar (plain or compressed) as a stream, before tarfile parses it.

    Follows the members exactly as tarfile does (pax ``size`` records included) and refuses, before
    anything big is read: a metadata member over ``max_metadata`` bytes (InvalidArchive), GNU sparse
    files, more members than ``limits.max_members`` and declared sizes over ``limits.max_unpacked_bytes``.
    Ends where tarfile ends (a zero, short or invalid header); what tarfile cannot read it reports itself.
    """
    count = total = 0
    size_override: int | None = None  # from the pax header in front of the next member
    pax_pending = False
    try:
        with _open_decompressed(path) as stream:
            while True:
                block = stream.read(tarfile.BLOCKSIZE)
                try:
                    info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                except tarfile.HeaderError:
                    return
                kind = info.type
                if kind == tarfile.GNUTYPE_SPARSE:
                    raise InvalidArchive(
                        "archive holds a GNU sparse file; sparse files are not allowed (archive a plain copy)"
                    )
                if kind in _METADATA_TYPES:
                    if info.size > max_metadata:
                        what = "pax extended header" if kind not in (b"L", b"K") else "GNU long name or link"
                        raise InvalidArchive(
                            f"archive has a {what} of {info.size} bytes; at most {max_metadata} bytes are allowed",
                            details={"limit": max_metadata, "size": info.size},
                        )
                    payload = _read_exactly(stream, info.size)
                    _skip(stream, -info.size % tarfile.BLOCKSIZE)
                    if kind in _PAX_TYPES:
                        if pax_pending:
                            raise InvalidArchive("archive has two pax extended headers for one member")
                        pax_pending = True
                        size_override = _pax_size(payload, global_header=False)
                    elif kind == tarfile.XGLTYPE:
                        _pax_size(payload, global_header=True)
                    continue
                size = info.size if size_override is None else size_override
                size_override, pax_pending = None, False
                count += 1
                if count > limits.max_members:
                    raise InvalidArchive(f"archive has more than {limits.max_members} entries (the limit)")
                if info.isreg() or kind not in tarfile.SUPPORTED_TYPES:
                    total += size
                    if total > limits.max_unpacked_bytes:
                        raise _too_big(total, limits)
                    _skip(stream, size + (-size % tarfile.BLOCKSIZE))
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise InvalidArchive(f"not a valid tar or tar.gz archive: {failure_text(exc)}") from None


def validate_tar(path: Path, limits: ArchiveLimits) -> int:
    """Check a .tar / .tar.gz; returns the unpacked size. Scans the headers first (``scan_tar_headers``),
    then reads the whole stream once with tarfile."""
    scan_tar_headers(path, limits)
    total = 0
    count = 0
    dirs: set[str] = set()
    try:
        with tarfile.open(path, mode="r:*") as tf:
            for member in tf:
                _check_name(member.name)
                count += 1 + check_tree_name(member.name, dirs)  # the directories it implies count too
                if count > limits.max_members:
                    raise InvalidArchive(
                        f"archive has more than {limits.max_members} entries (the limit; directories count)"
                    )
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
        raise InvalidArchive(f"not a valid tar or tar.gz archive: {failure_text(exc)}") from None
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
        raise InvalidArchive(f"not a valid zip/wheel archive: {failure_text(exc)}") from None
    return total


def validate_sdist(path: Path, limits: ArchiveLimits) -> int:
    size = validate_tar(path, limits)
    with tarfile.open(path, mode="r:*") as tf:
        names = tf.getnames()
    if not any(n.count("/") == 1 and n.endswith(("/setup.py", "/pyproject.toml")) for n in names):
        raise InvalidArchive("an sdist must contain <name>-<version>/pyproject.toml or setup.py at its top level")
    return size
