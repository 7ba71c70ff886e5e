"""Safe tar extraction on every supported Python: the ``"data"`` filter where the running Python has it
(3.11.4+), else the same rules checked member by member (3.11.0-3.11.3, Debian 12's 3.11.2 among them).

Imports nothing else of dlcloud. The job launcher (``executors/local/launcher.py``), which must stand
alone, carries the same rules in ``_safe_members``; tests/unit/test_tarsafe.py runs both on the same archives.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator


class UnsafeMember(tarfile.TarError):
    """A member that would land outside the destination, or is neither file, directory nor inside link."""


def extractall(tar: tarfile.TarFile, dest: str | os.PathLike[str]) -> None:
    """Unpack ``tar`` into ``dest``; raises ``tarfile.TarError`` (``UnsafeMember``) for what the data filter
    refuses: absolute or escaping paths, links pointing outside, devices and FIFOs."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest, members=safe_members(tar, os.fspath(dest)))


def safe_members(tar: tarfile.TarFile, dest: str) -> Iterator[tarfile.TarInfo]:
    """The members of ``tar``, checked as the data filter would, modes made safe (no set-id bits, no
    group/other write), ownership dropped."""
    root = os.path.realpath(dest)

    def inside(path: str) -> bool:
        return path == root or path.startswith(root + os.sep)

    for member in tar:
        target = os.path.realpath(os.path.join(root, member.name))
        if os.path.isabs(member.name) or not inside(target):
            raise UnsafeMember(f"member {member.name!r} would land outside the destination")
        if member.issym() or member.islnk():
            base = root if member.islnk() else os.path.dirname(target)
            if os.path.isabs(member.linkname) or not inside(os.path.realpath(os.path.join(base, member.linkname))):
                raise UnsafeMember(f"link {member.name!r} points outside the destination")
        elif not (member.isfile() or member.isdir()):
            raise UnsafeMember(f"member {member.name!r} is not a regular file, directory or link")
        member.mode = (member.mode or 0o644) & 0o755
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        yield member
