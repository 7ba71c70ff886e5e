"""A job's checkpoint directory as a copy of another job's (``Workload.checkpoint_from``), on this host.

The source was written by tenant code and the copy runs with the control plane's privileges (often root), on the
disk of the server's own files, so the source is treated as an attacker's:

- nothing is followed: every entry is opened relative to its parent directory's descriptor with ``O_NOFOLLOW``,
  so a symbolic link, at the top or inside, or a directory swapped for one while the copy runs, is never
  entered, and a link to a file elsewhere is never read;
- only regular files and directories are copied; links, FIFOs, sockets and devices are left out without being
  opened (a file is opened ``O_NONBLOCK`` and checked again with ``fstat``, so a FIFO swapped in for it cannot
  block the copy), as are files the server cannot read and directories deeper than ``MAX_DEPTH``;
- bytes are copied, never hard-linked to the source: the new job writes its files in place and the source stays
  as it was. A file with several names (hard links) is copied once, by its ``(st_dev, st_ino)``: its other names
  become hard links to that copy inside the destination, as they were in the source, so a job that links one
  large file many times costs its size once, not once a name. Holes of sparse files stay holes;
- the copy is the new job's own, as if it had written it: owned by its sandbox uid, directories 0700, files
  0600 (0700 when executable by their owner), modification times kept;
- bounded: at most ``max_entries`` names (files, their links, directories, what is left out:
  ``settings.max_archive_members``, the bound of a job's saved outputs too) and ``max_bytes`` of disk
  (``settings.checkpoint_copy_max_bytes``), else nothing is copied. Bytes are counted as the disk holds them:
  a file's allocated blocks (a sparse file's holes cost nothing), each file once however many names it has,
  and at least what is written. The copy must also leave free on the destination's file system the larger of
  ``FREE_MARGIN_FRACTION`` of it and ``FREE_MARGIN_MIN_BYTES`` (``os.statvfs``; the space available to
  unprivileged users, so the blocks reserved for root are never taken). The source is measured first, so a
  copy past a bound writes nothing; the copy counts again as it writes and stops at the same bounds (the source
  could change in between);
- stoppable: ``stop()`` is asked before each entry and each ``CHUNK`` written, in both passes; when it says so
  the copy ends (``Stopped``) and leaves nothing.

The copy is made in a new hidden directory beside the destination (``.<name>.copy.<random>``, under an
exclusive ``flock`` while its copy runs) and renamed into place, so the destination exists only whole. Two
preparations of one attempt (a deposed leader and its successor) each make their own: under a ``flock`` of the
parent directory, the first to finish renames its copy into place, and the other, finding the destination
there, removes its own and keeps that one, whole since nothing else puts a directory there. The rename happens
only while the hidden path is still the directory this copy made (its ``st_dev``/``st_ino`` against the
descriptor held). A crash leaves its hidden directory unlocked: the next copy into that parent removes it.

Vocabulary: the *source job directory* holds the source's ``checkpoints`` directory; that directory gone
means the job was deleted (``SourceGone``); the checkpoints directory alone missing means it saved none.

``measure_checkpoints`` measures a job's own checkpoints the same way (the first pass alone), for its tenant's
storage quota; ``last_change`` reads when they last changed (the directory's and its entries' modification
times, nothing followed nor opened but the directory), so that a preemption picks the attempt that loses least.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

MAX_DEPTH = 32  # as outputs.MAX_DEPTH: deeper directories are left out, never walked
CHUNK = 1024 * 1024
DEFAULT_MAX_BYTES = 64 * 1024**3  # settings.checkpoint_copy_max_bytes's default
FREE_MARGIN_FRACTION = 0.05  # of the destination's file system, left free after the copy...
FREE_MARGIN_MIN_BYTES = 1024**3  # ...and at least this much
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
LINK, SPECIAL, UNREADABLE, DEEP = "link", "special", "unreadable", "too deep"


class SourceGone(Exception):
    """The source job directory is gone, or vanished while it was copied: the job was deleted."""


class TooManyEntries(Exception):
    """The source holds more than ``max_entries`` names."""


class TooLarge(Exception):
    """The source takes more than ``max_bytes`` of disk."""


class NoRoom(Exception):
    """The copy would leave less than the margin free on the destination's file system."""

    def __init__(self, need: int, available: int, margin: int) -> None:
        super().__init__(f"{need} bytes needed, {available} available, {margin} kept free")
        self.need, self.available, self.margin = need, available, margin


class Stopped(Exception):
    """``stop()`` said so while the copy ran: nothing was left."""


@dataclass
class CopyResult:
    files: int = 0  # regular files, one a name
    linked: int = 0  # of them, names made as hard links to a file copied under another name
    dirs: int = 0
    bytes: int = 0  # disk the files take: allocated blocks (at least what was written), each file once
    left_out: dict[str, str] = field(default_factory=dict)  # relative path -> LINK | SPECIAL | UNREADABLE | DEEP
    source_found: bool = True  # False: the source saved no checkpoints (its directory missing): ``dest`` is empty
    # another preparation of the attempt put its whole copy at ``dest`` first: that one was kept, this one removed
    already_there: bool = False

    @property
    def entries(self) -> int:
        return self.files + self.dirs + len(self.left_out)


def size_text(n: int) -> str:
    """64 GiB, 1.5 MiB, 1000 bytes."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def free_margin(fs: os.statvfs_result) -> int:
    """The bytes a copy must leave free on the file system ``fs``."""
    return max(FREE_MARGIN_MIN_BYTES, int(fs.f_blocks * fs.f_frsize * FREE_MARGIN_FRACTION))


def copy_checkpoints(
    source_job: Path,
    name: str,
    dest: Path,
    uid: int | None,
    max_entries: int,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    stop: Callable[[], bool] | None = None,
) -> CopyResult:
    """Copy ``source_job/name`` to ``dest`` (which must not exist yet; its parent must), owned by ``uid`` (None:
    this process's).

    ``source_job`` is a directory the platform made; ``name`` in it, the tenant's. ``name`` missing, or not a
    directory (a link to one is not followed): ``dest`` is created empty. Raises SourceGone when ``source_job``
    is missing or an entry vanishes while it is copied, TooManyEntries past ``max_entries``, TooLarge past
    ``max_bytes``, NoRoom when the copy would leave less than ``free_margin`` free, Stopped when ``stop()`` says
    so; OSError for what fails on the destination side (a full disk). Nothing is left at ``dest`` unless the
    whole copy succeeded."""
    try:
        job_fd = os.open(source_job, _DIR)
    except (FileNotFoundError, NotADirectoryError):
        raise SourceGone(str(source_job)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link where the platform made a directory: not followed
            raise SourceGone(str(source_job)) from None
        raise
    try:
        src_fd, result = _open_source(job_fd, name)
        try:
            room = None
            if src_fd is not None:  # measured first: a copy past a bound writes nothing
                measure = _Walk(CopyResult(), max_entries, max_bytes, stop)
                measure.walk(src_fd, None, "", 1)
                room = _room(dest.parent, measure.result.bytes)
            copy = _Walk(result, max_entries, max_bytes, stop, room=room, uid=uid)
            return _copy_into_place(source_job, job_fd, src_fd, dest, copy)
        finally:
            if src_fd is not None:
                os.close(src_fd)
    finally:
        os.close(job_fd)


def measure_checkpoints(job_dir: Path, name: str, max_entries: int) -> tuple[int, bool]:
    """(the disk ``job_dir/name`` takes, whether all of it was counted) as the copy measures a source: allocated
    blocks, each file once however many names it has, nothing followed nor opened but directories. Counting
    stops after ``max_entries`` names (False: what was counted by then); missing, or not a directory: (0, True)."""
    try:
        job_fd = os.open(job_dir, _DIR)
    except OSError:
        return 0, True
    try:
        try:
            src_fd, _ = _open_source(job_fd, name)
        except OSError:
            return 0, True
        if src_fd is None:
            return 0, True
        walk = _Walk(CopyResult(), max_entries, sys.maxsize, None)
        try:
            walk.walk(src_fd, None, "", 1)
        except TooManyEntries:
            return walk.result.bytes, False
        except SourceGone:  # removed while it was measured (the job deleted): what was counted
            pass
        finally:
            os.close(src_fd)
        return walk.result.bytes, True
    finally:
        os.close(job_fd)


LAST_CHANGE_MAX_ENTRIES = 256  # the entries of a checkpoint directory ``last_change`` looks at, at the most


def last_change(job_dir: Path, name: str) -> float | None:
    """When ``job_dir/name`` last changed, as a POSIX time: the latest modification time of the directory and of
    its first ``LAST_CHANGE_MAX_ENTRIES`` entries (a new file or directory, one renamed into place, or one
    rewritten where it was). Nothing is followed: a link there, or at the top, counts as its own change only.
    None: no such directory."""
    try:
        job_fd = os.open(job_dir, _DIR)
    except OSError:
        return None
    try:
        src_fd, _ = _open_source(job_fd, name)
        if src_fd is None:
            return None
        try:
            latest = os.fstat(src_fd).st_mtime
            with os.scandir(src_fd) as entries:
                for _, entry in zip(range(LAST_CHANGE_MAX_ENTRIES), entries, strict=False):
                    try:
                        latest = max(latest, entry.stat(follow_symlinks=False).st_mtime)
                    except FileNotFoundError:  # removed while it was listed
                        continue
            return latest
        finally:
            os.close(src_fd)
    except OSError:
        return None
    finally:
        os.close(job_fd)


def _open_source(job_fd: int, name: str) -> tuple[int | None, CopyResult]:
    """The source checkpoint directory's descriptor, or None (missing, or not a directory: said in the result)."""
    result = CopyResult()
    try:
        return os.open(name, _DIR, dir_fd=job_fd), result
    except FileNotFoundError:
        result.source_found = False
    except OSError as exc:  # a link (O_DIRECTORY says ENOTDIR before O_NOFOLLOW says ELOOP) or a file
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        top = os.stat(name, dir_fd=job_fd, follow_symlinks=False)
        result.left_out["."] = LINK if stat.S_ISLNK(top.st_mode) else SPECIAL
    return None, result


def _room(parent: Path, need: int) -> tuple[int, int]:
    """(bytes available, the margin to leave free) on ``parent``'s file system, with room for ``need``; else
    NoRoom."""
    fs = os.statvfs(parent)
    available, margin = fs.f_bavail * fs.f_frsize, free_margin(fs)
    if need > available - margin:
        raise NoRoom(need, available, margin)
    return available, margin


def _copy_into_place(source_job: Path, job_fd: int, src_fd: int | None, dest: Path, w: _Walk) -> CopyResult:
    parent_fd = os.open(dest.parent, _DIR)
    try:
        with _locked(parent_fd):  # no sweep may take a hidden directory made but not yet locked
            _remove_abandoned(parent_fd, f".{dest.name}.copy")
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.copy.", dir=dest.parent))  # 0700, this process's
            tmp_fd = os.open(tmp, _DIR)
            fcntl.flock(tmp_fd, fcntl.LOCK_EX)  # released by close, or by this process's end
        made = os.fstat(tmp_fd)
        try:
            if src_fd is not None:
                w.root_fd = tmp_fd
                w.walk(src_fd, tmp_fd, "", 1)
                _keep_times(src_fd, tmp_fd)
            # the source job deleted while it was copied (its directory removed last): not a copy to start from
            if not _exists(job_fd):
                raise SourceGone(str(source_job))
            # owned by the job's uid only now: until then nothing running as that uid can enter it
            _own_dir(tmp_fd, w.uid)
            with _locked(parent_fd):
                if os.path.lexists(dest):  # another preparation's, renamed into place under this lock: whole
                    w.result.already_there = True
                    _remove_if_same(tmp, made)
                    return w.result
                if not _same(tmp, made):
                    raise OSError(errno.ESTALE, "its temporary directory was replaced while it was made", str(tmp))
                os.rename(tmp, dest)
        except BaseException:
            _remove_if_same(tmp, made)
            raise
        finally:
            os.close(tmp_fd)
    finally:
        os.close(parent_fd)
    return w.result


@contextmanager
def _locked(fd: int) -> Iterator[None]:
    """An exclusive ``flock`` on ``fd`` for the ``with`` block."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _remove_abandoned(parent_fd: int, prefix: str) -> None:
    """Hidden directories of copies cut short (a crash): unlocked, as a copy still running holds its lock."""
    for entry in os.listdir(parent_fd):
        if not entry.startswith(prefix):
            continue
        try:
            fd = os.open(entry, _DIR, dir_fd=parent_fd)
        except OSError:  # gone meanwhile, or not a directory: none of ours
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a copy running
        else:
            shutil.rmtree(entry, dir_fd=parent_fd, ignore_errors=True)
        finally:
            os.close(fd)


def _same(path: Path, made: os.stat_result) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (made.st_dev, made.st_ino)


def _remove_if_same(tmp: Path, made: os.stat_result) -> None:
    """Remove the hidden directory this copy made, never what was put at its path instead."""
    if _same(tmp, made):
        shutil.rmtree(tmp, ignore_errors=True)


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


def _allocated(st: os.stat_result) -> int:
    return st.st_blocks * 512


class _Walk:
    """One pass over the source: the measure (``dst_fd`` None: nothing opened but directories, nothing written)
    or the copy. Both count names and bytes alike and stop at the same bounds."""

    def __init__(
        self,
        result: CopyResult,
        max_entries: int,
        max_bytes: int,
        stop: Callable[[], bool] | None,
        room: tuple[int, int] | None = None,  # (available, margin): the copy's; the measure's is checked after it
        uid: int | None = None,
    ) -> None:
        self.result, self.max_entries, self.max_bytes, self.stop = result, max_entries, max_bytes, stop
        self.room, self.uid = room, uid
        self.root_fd = -1  # the copy's top directory, where ``copied`` paths start
        self.copied: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of a source file -> its copy's path

    def check_stop(self) -> None:
        if self.stop is not None and self.stop():
            raise Stopped()

    def charge(self, n: int) -> None:
        self.result.bytes += n
        if self.result.bytes > self.max_bytes:
            raise TooLarge(str(self.max_bytes))
        if self.room is not None and self.result.bytes > self.room[0] - self.room[1]:  # grew since measured
            raise NoRoom(self.result.bytes, *self.room)

    def walk(self, src_fd: int, dst_fd: int | None, rel_dir: str, depth: int) -> None:
        result = self.result
        try:
            names = sorted(os.listdir(src_fd))
        except PermissionError:
            result.left_out[rel_dir or "."] = UNREADABLE
            return
        for name in names:
            self.check_stop()
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if result.entries >= self.max_entries:
                raise TooManyEntries(str(self.max_entries))
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
                    result.dirs += 1
                    if dst_fd is None:
                        self.walk(child, None, rel, depth + 1)
                        continue
                    os.mkdir(name, 0o700, dir_fd=dst_fd)
                    new = os.open(name, _DIR, dir_fd=dst_fd)
                    try:
                        _own_dir(new, self.uid)
                        self.walk(child, new, rel, depth + 1)
                        _keep_times(child, new)
                    finally:
                        os.close(new)
                finally:
                    os.close(child)
            elif stat.S_ISREG(st.st_mode):
                if dst_fd is None:
                    self._count_file(st, rel)
                else:
                    self._copy_file(src_fd, dst_fd, name, rel)
            else:  # never opened: a FIFO would block, a device could act on being opened
                result.left_out[rel] = LINK if stat.S_ISLNK(st.st_mode) else SPECIAL

    def _count_file(self, st: os.stat_result, rel: str) -> None:
        self.result.files += 1
        key = (st.st_dev, st.st_ino)
        if key in self.copied:
            self.result.linked += 1
            return
        self.copied[key] = rel
        self.charge(_allocated(st))

    def _copy_file(self, src_dir: int, dst_dir: int, name: str, rel: str) -> None:
        result = self.result
        try:
            src = os.open(name, _FILE, dir_fd=src_dir)
        except FileNotFoundError:
            raise SourceGone(rel) from None
        except OSError as exc:  # swapped for a link (ELOOP) or a socket (ENXIO) since the stat; or closed to us
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
            key = (st.st_dev, st.st_ino)
            if key in self.copied and self._link(self.copied[key], dst_dir, name):
                result.files += 1
                result.linked += 1
                return
            os.set_blocking(src, True)
            mode = 0o700 if st.st_mode & stat.S_IXUSR else 0o600
            charged = _allocated(st)
            self.charge(charged)
            dst = os.open(name, _NEW_FILE, mode, dir_fd=dst_dir)
            try:
                os.fchmod(dst, mode)
                if self.uid is not None:
                    os.fchown(dst, self.uid, self.uid)
                _copy_bytes(src, dst, st.st_size, self, charged)
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dst)
            result.files += 1
            self.copied[key] = rel
        finally:
            os.close(src)

    def _link(self, first: str, dst_dir: int, name: str) -> bool:
        """``name`` in ``dst_dir`` as a hard link to the copy at ``first``; False where the file system allows no
        more links to it (the file is then copied again, and counted again)."""
        try:
            os.link(first, name, src_dir_fd=self.root_fd, dst_dir_fd=dst_dir, follow_symlinks=False)
        except OSError as exc:
            if exc.errno != errno.EMLINK:
                raise
            return False
        return True


def _copy_bytes(src: int, dst: int, size: int, w: _Walk, charged: int) -> None:
    """The first ``size`` bytes of ``src`` (its size when it was opened: a file growing meanwhile adds nothing)
    into ``dst``, its holes left holes (SEEK_DATA / SEEK_HOLE, where the file system tells them). Asks
    ``w.check_stop`` before each chunk; what is written beyond the ``charged`` bytes is charged to ``w``."""
    offset = written = 0
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
            w.check_stop()
            chunk = os.pread(src, min(CHUNK, end - pos), pos)
            if not chunk:  # shorter than it was: what is left is zeros (the truncate below)
                break
            over = max(0, written + len(chunk) - charged) - max(0, written - charged)
            if over:
                w.charge(over)
            written += len(chunk)
            view = memoryview(chunk)
            while view:
                n = os.pwrite(dst, view, pos)
                view = view[n:]
                pos += n
        offset = max(end, offset + 1) if pos >= end else size
    os.ftruncate(dst, size)
