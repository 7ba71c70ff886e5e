"""Reading a capped log file pair (output.log.1, output.log) as the local launcher writes it: the end read
backwards, then followed forwards across rotations (``FileLogReader``, the ``LogReader`` of the local
executor, also used on the copies of archived logs).

A log is capped on disk by keeping its end (``executors/base.py``): once it reaches half its cap the launcher
renames output.log to output.log.1 and starts a new output.log with a ``system`` line ``log truncated: N
earlier bytes dropped``. One *log* here is that pair, read output.log.1 first.

Invariants:
- The end is found reading blocks backwards from the end of the files, so memory is bounded by the lines
  taken, not by the size of the log; a run longer than ``MAX_LINE_BYTES`` without a newline is cut.
- A follower keeps its file open, so a rotated file is read to its end before the new output.log, and
  nothing is lost unless it falls more than a whole half of the cap behind; then a ``log truncated`` line says
  how many bytes it missed. A line still being written is left out until its newline comes (``rest`` once
  nothing more will come).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dlcloud.errors import NotFound
from dlcloud.executors.base import LOG_TRUNCATED, LogReader, log_segments

BLOCK_BYTES = 64 * 1024  # reading backwards, block by block
MAX_LINE_BYTES = 1024 * 1024  # reading backwards, a longer run without a newline is cut (the launcher never writes one)
OPEN_RETRIES = 50  # opening a log while the launcher rotates it: tries, 1 ms apart

_MARKER = re.compile(rb"^(\S+) system " + re.escape(LOG_TRUNCATED.encode()) + rb"(\d+) ")


def marker_line(time: str, text: str) -> str:
    """A ``system`` line at ``time`` saying that lines were left out, and why (``text``)."""
    return f"{time} system {LOG_TRUNCATED}{text}\n"


def log_time_now() -> str:
    """Now, as a log line's time."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace") + "\n"


@dataclass
class _Segment:
    """One open file of a log. The descriptor stays valid when the launcher renames or drops the file."""

    fd: int
    ino: int
    size: int  # when opened
    start: int  # bytes of the log before this file: its truncation marker's N (0 without one)
    marker_end: int  # the length of its leading truncation marker line (0 without one)
    marker_time: str  # the time on that line
    offset: int = 0  # following: the next byte to read

    def close(self) -> None:
        os.close(self.fd)


def _open_segment(path: Path) -> _Segment | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 512, 0)
    except OSError:
        os.close(fd)
        raise
    m = _MARKER.match(head)
    if m and b"\n" in head:
        return _Segment(fd, st.st_ino, st.st_size, int(m[2]), head.index(b"\n") + 1, m[1].decode())
    return _Segment(fd, st.st_ino, st.st_size, 0, 0, "")


def _open_log(log: Path) -> tuple[_Segment | None, _Segment | None]:
    """(output.log.1, output.log) of a log, opened with no rotation between the two (retried while the
    launcher is in the middle of one)."""
    older_path, path = log_segments(log)
    older: _Segment | None = None
    cur: _Segment | None = None
    for attempt in range(OPEN_RETRIES):
        if attempt:
            for seg in (older, cur):
                if seg is not None:
                    seg.close()
            time.sleep(0.001)  # a rotation takes microseconds; this runs in a worker thread
        cur = _open_segment(path)
        older = _open_segment(older_path)
        try:
            ino: int | None = os.stat(path).st_ino
        except FileNotFoundError:
            ino = None
        if cur is None and older is None and ino is None:
            return None, None  # no log yet
        if cur is not None and ino == cur.ino and (older is None or cur.size > 0):
            return older, cur  # (an empty output.log beside an output.log.1 still lacks its marker line)
    return older, cur


def _complete_end(seg: _Segment, size: int) -> int:
    """The end of the last complete line in the first ``size`` bytes (a line being written is left out)."""
    pos = size
    while pos > 0:
        n = min(BLOCK_BYTES, pos)
        i = os.pread(seg.fd, n, pos - n).rfind(b"\n")
        if i >= 0:
            return pos - n + i + 1
        pos -= n
    return 0


def _lines_backwards(seg: _Segment, stop: int, end: int) -> Iterator[str]:
    """The lines of ``seg`` in bytes [stop, end) (``end`` just after a newline), last first."""
    if end <= stop:
        return
    pos = end - 1  # leave out the last newline: what follows it is not a line
    buf = b""
    while pos > stop:
        n = min(BLOCK_BYTES, pos - stop)
        pos -= n
        parts = (os.pread(seg.fd, n, pos) + buf).split(b"\n")
        buf = parts[0]
        for raw in reversed(parts[1:]):
            yield _decode(raw)
        if len(buf) > MAX_LINE_BYTES:
            yield _decode(buf)
            buf = b""
    yield _decode(buf)


class FileLogReader(LogReader):
    """One log (output.log.1 and output.log) in files of this host: its end read backwards once, then
    followed forwards across rotations."""

    def __init__(self, path: Path) -> None:
        self.path = path  # output.log
        self.seg: _Segment | None = None  # the file followed, None until there is one
        self.older: _Segment | None = None  # output.log.1 while its end is read backwards
        self.pending = b""  # an incomplete last line

    def exists(self) -> bool:
        return any(p.exists() for p in log_segments(self.path))

    def open_end(self) -> Iterator[str]:
        """The marker at the top of output.log is left out while output.log.1 is there (it is true only of
        output.log.1's own start)."""
        older, cur = _open_log(self.path)
        if cur is None:
            cur, older = older, None  # only an output.log.1: the launcher is between its two steps
        self.older, self.seg = older, cur
        if cur is not None:
            cur.offset = _complete_end(cur, cur.size)
        return self._backwards()

    def _backwards(self) -> Iterator[str]:
        if self.seg is not None:
            yield from _lines_backwards(self.seg, self.seg.marker_end if self.older else 0, self.seg.offset)
        if self.older is not None:
            yield from _lines_backwards(self.older, 0, self.older.size)

    def tail_done(self) -> None:
        if self.older is not None:
            self.older.close()
            self.older = None

    def read(self, limit: int) -> tuple[list[str], bool]:
        """Goes on into the next file when the one followed was rotated away."""
        if self.seg is None:
            older, cur = _open_log(self.path)
            if older is not None and cur is not None:
                cur.close()
            self.seg = older or cur  # from the beginning of what is kept
            if self.seg is None:
                return [], False
        out: list[str] = []
        budget = limit
        while budget > 0:
            data = os.pread(self.seg.fd, budget, self.seg.offset)
            if data:
                self.seg.offset += len(data)
                budget -= len(data)
                out += self._split(data)
                continue
            nxt = self._successor(self.seg)
            if nxt is None:
                return out, False
            if os.pread(self.seg.fd, 1, self.seg.offset):  # written before the rotation, after our last read
                nxt.close()
                continue
            out += self._switch(nxt)
        return out, True

    def _split(self, data: bytes) -> list[str]:
        *lines, self.pending = (self.pending + data).split(b"\n")
        return [_decode(raw) for raw in lines]

    def _switch(self, nxt: _Segment) -> list[str]:
        """Follow ``nxt`` from here on; the file followed so far has been read to its end."""
        seg = self.seg
        assert seg is not None
        out = self.rest()
        missed = nxt.start - (seg.start + seg.offset)
        if missed > 0:
            text = f"{missed} bytes dropped while this reader was behind"
            out.append(marker_line(nxt.marker_time or log_time_now(), text))
        nxt.offset = nxt.marker_end  # its marker counts bytes this reader has seen
        seg.close()
        self.seg = nxt
        return out

    def _successor(self, seg: _Segment) -> _Segment | None:
        """The file written after ``seg``, complete with its marker line; None while ``seg`` is current."""
        older_path, path = log_segments(self.path)
        cur = _open_segment(path)
        if cur is None:
            return None
        if cur.ino == seg.ino or cur.marker_end == 0:
            cur.close()  # not rotated, or the new file's marker line is not written yet
            return None
        older = _open_segment(older_path)
        if older is not None and older.ino not in (seg.ino, cur.ino):
            cur.close()  # rotated twice since: the file in between comes first
            return older
        if older is not None:
            older.close()
        return cur

    def rest(self) -> list[str]:
        out = [_decode(self.pending)] if self.pending else []
        self.pending = b""
        return out

    def close(self) -> None:
        self.tail_done()
        if self.seg is not None:
            self.seg.close()
            self.seg = None


def open_file_log(logs: dict[str, Path], replica: str) -> FileLogReader:
    """The reader of ``replica``'s log among ``logs`` (output.log files by replica name); NotFound for a
    replica that is not among them (never a path made from the name)."""
    if replica not in logs:
        raise NotFound(f"this attempt has no log of replica {replica!r}")
    return FileLogReader(logs[replica])
