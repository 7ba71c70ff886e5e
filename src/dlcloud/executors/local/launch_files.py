"""The launcher's files: the code archive it unpacks (never outside the code directory, never a host path in
an error), the tree it gives to the job's uid, and the in-memory files it hands bwrap. Standard library only
(the launcher imports it)."""

from __future__ import annotations

import os
import selectors
import tarfile
from collections.abc import Callable
from typing import Any


class PrepareError(Exception):
    """Preparation failed; the message is written to exit.json."""


def memfd(data: bytes) -> int:
    """An in-memory file holding ``data``, positioned at its start (inherited only where passed)."""
    fd = os.memfd_create("dlcloud-sandbox", 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def chown_tree(path: str, uid: int) -> None:
    """Give ``path`` and everything below it to ``uid`` (links themselves, never what they point to)."""
    os.chown(path, uid, uid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def extract_archive(archive: str, dest: str) -> None:
    """Unpack a tar archive (any compression) into dest, refusing anything that would land outside it."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            if hasattr(tarfile, "data_filter"):  # 3.11.4+ (and 3.8.17+, 3.9.17+, 3.10.12+)
                tar.extractall(dest, filter="data")
            else:
                tar.extractall(dest, members=_safe_members(tar, dest))
    except OSError as exc:  # its reason and the member, never a host path
        member = os.path.relpath(exc.filename, dest) if isinstance(exc.filename, str) else ""
        why = exc.strerror or type(exc).__name__
        raise PrepareError(f"cannot unpack code archive {os.path.basename(archive)}: {why}: {member!r}") from None
    except (tarfile.TarError, PrepareError) as exc:  # PrepareError: ``_safe_members`` refused a member
        raise PrepareError(f"cannot unpack code archive {os.path.basename(archive)}: {exc}") from None


def _safe_members(tar: Any, dest: str) -> Any:
    """What the "data" filter allows, for Pythons before 3.11.4: regular files and directories inside
    ``dest``, links pointing inside it, no devices or FIFOs; modes without set-id bits, group/other write.
    The same rules as ``dlcloud.tarsafe`` (the launcher imports nothing of dlcloud; a test runs both)."""
    root = os.path.realpath(dest)

    def inside(path: str) -> bool:
        return path == root or path.startswith(root + os.sep)

    for member in tar:
        name = member.name.lstrip("/")
        target = os.path.realpath(os.path.join(root, name))
        if os.path.isabs(member.name) or not inside(target):
            raise PrepareError(f"archive member {member.name!r} would land outside the code directory")
        if member.issym() or member.islnk():
            base = root if member.islnk() else os.path.dirname(target)
            if os.path.isabs(member.linkname) or not inside(os.path.realpath(os.path.join(base, member.linkname))):
                raise PrepareError(f"archive link {member.name!r} points outside the code directory")
        elif not (member.isfile() or member.isdir()):
            raise PrepareError(f"archive member {member.name!r} is not a regular file, directory or link")
        member.mode = (member.mode or 0o644) & 0o755
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        yield member


def has_exited(pid: int) -> bool:
    """Whether our child has exited, WITHOUT reaping it (WNOWAIT keeps its pid, and so its pgid, reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class Pipes:
    """A child's stdout and stderr, read without blocking into lines (``emit(stream, line)``; a line longer
    than ``max_line`` is cut in pieces of it), and the launcher's wake-up pipe, drained."""

    def __init__(self, proc: Any, wake_r: int, emit: Callable[[str, bytes], None], max_line: int) -> None:
        self.sel = selectors.DefaultSelector()
        self.files: dict[int, tuple[Any, str, bytearray]] = {}
        self.wake_r, self.emit, self.max_line = wake_r, emit, max_line
        for f, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            if f is not None:
                os.set_blocking(f.fileno(), False)
                self.sel.register(f.fileno(), selectors.EVENT_READ)
                self.files[f.fileno()] = (f, stream, bytearray())
        self.sel.register(wake_r, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        return bool(self.files)

    def select(self, timeout: float) -> None:
        for key, _ in self.sel.select(max(0.0, timeout)):
            if key.fd == self.wake_r:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            elif key.fd in self.files:
                self.pump(key.fd)

    def pump(self, fd: int) -> None:
        _f, stream, buf = self.files[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            self.close(fd)
            return
        buf += data
        while (nl := buf.find(b"\n")) >= 0:
            self.emit(stream, bytes(buf[:nl]))
            del buf[: nl + 1]
        while len(buf) >= self.max_line:
            self.emit(stream, bytes(buf[: self.max_line]))
            del buf[: self.max_line]

    def close(self, fd: int) -> None:
        f, stream, buf = self.files.pop(fd)
        if buf:
            self.emit(stream, bytes(buf))  # a last line without a newline
        self.sel.unregister(fd)
        f.close()

    def close_all(self) -> None:
        for fd in list(self.files):
            self.close(fd)
        self.sel.close()
