"""A job's checkpoint directory as a copy of another job's (``Workload.checkpoint_from``), on this host.

The source was written by tenant code and the copy runs with the control plane's privileges (often root), so the
source is treated as an attacker's:

- nothing is followed: every entry is opened relative to its parent directory's descriptor with ``O_NOFOLLOW``,
  so a symbolic link, at the top or inside, or a directory swapped for one while the copy runs, is never
  entered, and a link to a file elsewhere is never read;
- only regular files and directories are copied; links, FIFOs, sockets and devices are left out without being
  opened (a file is opened ``O_NONBLOCK`` and checked again with ``fstat``, so a FIFO swapped in for it cannot
  block the copy), as are files the server cannot read and directories deeper than ``MAX_DEPTH``;
- bytes are copied, never hard-linked: the new job writes its files in place and the source stays as it was.
  Holes of sparse files stay holes, so the copy takes no more disk than the source;
- the copy is the new job's own, as if it had written it: owned by its sandbox uid, directories 0700, files
  0600 (0700 when executable by their owner), modification times kept;
- bounded: at most ``max_entries`` files and directories (``settings.max_archive_members``, the bound of a
  job's saved outputs too), else nothing is copied.

The copy is made in a hidden directory beside the destination and renamed into place, so the destination
exists only whole; a crash leaves the hidden one, removed by the next try.

Vocabulary: the *source job directory* holds the source's ``checkpoints`` directory; that directory gone
means the job was deleted (``SourceGone``); the checkpoints directory alone missing means it saved none.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_DEPTH = 32  # as outputs.MAX_DEPTH: deeper directories are left out, never walked
CHUNK = 1024 * 1024
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
LINK, SPECIAL, UNREADABLE, DEEP = "link", "special", "unreadable", "too deep"


class SourceGone(Exception):
    """The source job directory is gone, or vanished while it was copied: the job was deleted."""


class TooManyEntries(Exception):
    """The source holds more than ``max_entries`` files and directories."""


@dataclass
class CopyResult:
    files: int = 0
    dirs: int = 0
    bytes: int = 0  # apparent size of the files copied
    left_out: dict[str, str] = field(default_factory=dict)  # relative path -> LINK | SPECIAL | UNREADABLE | DEEP
    source_found: bool = True  # False: the source saved no checkpoints (its directory missing): ``dest`` is empty


def copy_checkpoints(source_job: Path, name: str, dest: Path, uid: int | None, max_entries: int) -> CopyResult:
    """Copy ``source_job/name`` to ``dest`` (which must not exist yet), owned by ``uid`` (None: this process's).

    ``source_job`` is a directory the platform made; ``name`` in it, the tenant's. ``name`` missing, or not a
    directory (a link to one is not followed): ``dest`` is created empty. Raises SourceGone when ``source_job``
    is missing or an entry vanishes while it is copied, TooManyEntries past ``max_entries``; OSError for what
    fails on the destination side (a full disk). Nothing is left at ``dest`` unless the whole copy succeeded."""
    try:
        job_fd = os.open(source_job, _DIR)
    except (FileNotFoundError, NotADirectoryError):
        raise SourceGone(str(source_job)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link where the platform made a directory: not followed
            raise SourceGone(str(source_job)) from None
        raise
    result = CopyResult()
    tmp = dest.with_name(f".{dest.name}.copy")
    try:
        if os.path.lexists(tmp):  # an earlier try's, cut short: ours, and no job has run in it
            shutil.rmtree(tmp)
        os.mkdir(tmp, 0o700)
        tmp_fd = os.open(tmp, _DIR)
        try:
            _own_dir(tmp_fd, uid)
            try:
                src_fd = os.open(name, _DIR, dir_fd=job_fd)
            except FileNotFoundError:
                result.source_found = False
                src_fd = None
            except OSError as exc:  # a link (O_DIRECTORY says ENOTDIR before O_NOFOLLOW says ELOOP) or a file
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                top = os.stat(name, dir_fd=job_fd, follow_symlinks=False)
                result.left_out["."] = LINK if stat.S_ISLNK(top.st_mode) else SPECIAL
                src_fd = None
            if src_fd is not None:
                try:
                    _copy_dir(src_fd, tmp_fd, "", 1, uid, max_entries, result)
                    _keep_times(src_fd, tmp_fd)
                finally:
                    os.close(src_fd)
        finally:
            os.close(tmp_fd)
        # the source job deleted while it was copied (its directory removed last): not a copy to start from
        if not _exists(job_fd):
            raise SourceGone(str(source_job))
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(job_fd)
    return result


def _exists(dir_fd: int) -> bool:
    """Whether the directory open at ``dir_fd`` is still linked in its parent (a removed one has no links)."""
    return os.fstat(dir_fd).st_nlink > 0


def _own_dir(fd: int, uid: int | None) -> None:
    os.fchmod(fd, 0o700)  # mkdir's mode is filtered by the umask
    if uid is not None:
        os.fchown(fd, uid, uid)


def _keep_times(src_fd: int, dst_fd: int) -> None:
    st = os.fstat(src_fd)
    os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_dir(
    src_fd: int, dst_fd: int, rel_dir: str, depth: int, uid: int | None, max_entries: int, result: CopyResult
) -> None:
    try:
        names = sorted(os.listdir(src_fd))
    except PermissionError:
        result.left_out[rel_dir or "."] = UNREADABLE
        return
    for name in names:
        rel = f"{rel_dir}/{name}" if rel_dir else name
        if result.files + result.dirs + len(result.left_out) >= max_entries:
            raise TooManyEntries(str(max_entries))
        try:
            st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise SourceGone(rel) from None
        if stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                result.left_out[rel] = DEEP
                continue
            try:
                child = os.open(name, _DIR, dir_fd=src_fd)
            except FileNotFoundError:
                raise SourceGone(rel) from None
            except OSError as exc:  # swapped for a link or a file since the stat; or closed to the server
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EACCES):
                    raise
                result.left_out[rel] = UNREADABLE if exc.errno == errno.EACCES else LINK
                continue
            try:
                os.mkdir(name, 0o700, dir_fd=dst_fd)
                new = os.open(name, _DIR, dir_fd=dst_fd)
                try:
                    _own_dir(new, uid)
                    result.dirs += 1
                    _copy_dir(child, new, rel, depth + 1, uid, max_entries, result)
                    _keep_times(child, new)
                finally:
                    os.close(new)
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(src_fd, dst_fd, name, rel, uid, result)
        else:  # never opened: a FIFO would block, a device could act on being opened
            result.left_out[rel] = LINK if stat.S_ISLNK(st.st_mode) else SPECIAL


def _copy_file(src_dir: int, dst_dir: int, name: str, rel: str, uid: int | None, result: CopyResult) -> None:
    try:
        src = os.open(name, _FILE, dir_fd=src_dir)
    except FileNotFoundError:
        raise SourceGone(rel) from None
    except OSError as exc:  # swapped for a link (ELOOP) or a socket (ENXIO) since the stat; or closed to the server
        why = {errno.ELOOP: LINK, errno.ENXIO: SPECIAL, errno.EACCES: UNREADABLE, errno.EPERM: UNREADABLE}
        if exc.errno not in why:
            raise
        result.left_out[rel] = why[exc.errno]
        return
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO or a device since the stat: O_NONBLOCK did not wait
            result.left_out[rel] = SPECIAL
            return
        os.set_blocking(src, True)
        mode = 0o700 if st.st_mode & stat.S_IXUSR else 0o600
        dst = os.open(name, _NEW_FILE, mode, dir_fd=dst_dir)
        try:
            os.fchmod(dst, mode)
            if uid is not None:
                os.fchown(dst, uid, uid)
            _copy_bytes(src, dst, st.st_size)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
        result.files += 1
        result.bytes += st.st_size
    finally:
        os.close(src)


def _copy_bytes(src: int, dst: int, size: int) -> None:
    """The first ``size`` bytes of ``src`` (its size when it was opened: a file growing meanwhile adds nothing)
    into ``dst``, its holes left holes (SEEK_DATA / SEEK_HOLE, where the file system tells them)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
            end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                break
            if exc.errno != errno.EINVAL:
                raise
            start, end = offset, size  # the file system does not tell holes: all of it is data
        pos = start
        while pos < end:
            chunk = os.pread(src, min(CHUNK, end - pos), pos)
            if not chunk:  # shorter than it was: what is left is zeros (the truncate below)
                break
            view = memoryview(chunk)
            while view:
                written = os.pwrite(dst, view, pos)
                view = view[written:]
                pos += written
        offset = max(end, offset + 1) if pos >= end else size
    os.ftruncate(dst, size)
