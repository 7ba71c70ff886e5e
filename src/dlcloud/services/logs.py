"""Job logs: read and follow the attempts' log files without holding a database connection or blocking the
event loop.

Each attempt writes ``output.log`` lines ``<ISO time> <stream> <text>``; ``stream`` is ``stdout``,
``stderr`` or ``system`` in the main section and carries its phase otherwise (``pre:stdout``,
``post:system``): a read may ask for one section. A gang attempt has one output.log per replica; a read
may ask for one replica (``worker-1``; with procs_per_worker also ``worker-1.0``), and lines of several
replicas are interleaved by time, their stream prefixed with the replica (``worker-1/stdout``).

A log is capped on disk by keeping its end (``executors/base.py``): once it reaches half its cap the launcher
renames output.log to output.log.1 and starts a new output.log with a ``system`` line ``log truncated: N
earlier bytes dropped``. One *log* here is that pair, read output.log.1 first.

Invariants:
- No file is read on the event loop: reads run in worker threads, a bounded amount per call.
- A read without ``follow`` returns the END of the log: the last ``tail`` lines (all of them when no tail
  is given) and never more than ``max_bytes``; when lines are left out for that, the first line says so
  (a ``system`` line ``log truncated: ...``). The lines are found reading blocks backwards from the end of
  the files, so memory is bounded by what is returned, not by the size of the log.
- Following reads forwards through every file of the log, from the end of the tail (from the start without
  one), and across rotations: a follower keeps its file open, so a rotated file is read to its end before
  the new output.log, and nothing is lost unless it falls more than a whole half of the cap behind; then a
  ``log truncated`` line says how many bytes it missed. Truncation lines are kept whatever the section.
- Following polls the files and checks the job's state with short read transactions; the connection goes
  back to the pool between checks, so many followers cost no database connections.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio

from dlcloud.executors.base import LOG_TRUNCATED, MAIN_LOG, log_segments, replica_sort_key
from dlcloud.schemas.jobs import TERMINAL_STATES, JobState, LogSection
from dlcloud.services.auth import Caller
from dlcloud.services.job_keys import logs_key
from dlcloud.services.jobs import get_row
from dlcloud.services.platform import Platform
from dlcloud.storage.objects import ObjectMissing
from dlcloud.store import jobs as job_store

POLL_SECONDS = 0.25
STATE_CHECK_SECONDS = 1.0
FOLLOW_READ_BYTES = 1024 * 1024  # read per log file and poll while following
BLOCK_BYTES = 64 * 1024  # reading backwards, block by block
MAX_LINE_BYTES = 1024 * 1024  # reading backwards, a longer run without a newline is cut (the launcher never writes one)
OPEN_RETRIES = 50  # opening a log while the launcher rotates it: tries, 1 ms apart

# one log file: (attempt number, replica name or "", path of its output.log)
LogFile = tuple[int, str, Path]
LOG_CACHE = ("cache", "logs")  # below the data dir: archived logs fetched to be read here
# one attempt: (number, executor handle, the key of its archived logs once it ended, else None)
Attempt = tuple[int, str, str | None]

_MARKER = re.compile(rb"^(\S+) system " + re.escape(LOG_TRUNCATED.encode()) + rb"(\d+) ")


def _snapshot(platform: Platform, caller: Caller, name: str) -> tuple[str, bool, list[Attempt]]:
    with platform.db.read() as s:
        row = get_row(s, caller, name)
        attempts = [
            (n, handle, logs_key(row.tenant_id, row.id, n) if ended else None)
            for n, handle, ended in job_store.attempt_handles(s, row.id)
        ]
        return row.id, JobState(row.state) in TERMINAL_STATES, attempts


def _archived(platform: Platform, key: str) -> dict[str, Path]:
    """An ended attempt's logs from their archive in the object store (the executor no longer has them: the
    host that ran it is gone, or its files were removed), fetched once into this host's cache of logs."""
    local = platform.objects.tree_local_path(key)
    if local is None:
        local = platform.settings.data_dir.joinpath(*LOG_CACHE) / key
        if not local.is_dir():
            local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = local.with_name(f".{local.name}.{os.getpid()}.{threading.get_ident()}")
            try:
                platform.objects.get_tree(key, tmp)
            except ObjectMissing:
                return {}
            try:
                os.rename(tmp, local)
            except OSError:  # another reader fetched it first
                shutil.rmtree(tmp, ignore_errors=True)
    if not local.is_dir():  # nothing archived: the attempt ended before it wrote a log (a launch that failed)
        return {}
    names = sorted((d.name for d in local.iterdir() if d.is_dir()), key=replica_sort_key)
    return {("" if n == MAIN_LOG else n): local / n / "output.log" for n in names}


def _files(platform: Platform, attempts: list[Attempt], replica: str | None) -> list[LogFile]:
    """The log files of the attempts (of ``replica`` only, when given), attempt by attempt, as the executor
    that ran them keeps them, or else from their archive once they ended."""
    out: list[LogFile] = []
    for number, handle, archive in attempts:
        try:
            files = platform.executor.log_files(handle) if platform.executor is not None else {}
        except ValueError:  # a handle this executor does not know (recorded by another kind): the archive then
            files = {}
        if archive is not None and not any(p.exists() for p in files.values()):
            files = _archived(platform, archive)
        for name, path in files.items():
            if replica is None or name == replica or name.startswith(replica + "."):
                out.append((number, name, path))
    return out


def _labeller(files: list[LogFile]) -> Callable[[str, str], str]:
    """Prefixes a line's stream with its replica when lines of several replicas of an attempt are read."""
    per_attempt: dict[int, int] = {}
    for number, _, _ in files:
        per_attempt[number] = per_attempt.get(number, 0) + 1
    several = any(n > 1 for n in per_attempt.values())

    def label(line: str, replica: str) -> str:
        if not several or not replica:
            return line
        parts = line.split(" ", 2)
        if len(parts) < 2:
            return line
        parts[1] = f"{replica}/{parts[1]}"
        return " ".join(parts)

    return label


def line_section(line: str) -> LogSection:
    """The section of an output.log line: the phase its stream names (``post:stdout``), else main."""
    parts = line.split(" ", 2)
    if len(parts) >= 2:
        phase, sep, _ = parts[1].partition(":")
        if sep and phase in (LogSection.PRE, LogSection.POST):
            return LogSection(phase)
    return LogSection.MAIN


def is_truncation_marker(line: str) -> bool:
    """Whether a log line says that lines were left out (only the launcher and this module write system lines)."""
    parts = line.split(" ", 2)
    return len(parts) == 3 and parts[1].rpartition(":")[2] == "system" and parts[2].startswith(LOG_TRUNCATED)


def _keeper(section: LogSection) -> Callable[[str], bool]:
    if section == LogSection.ALL:
        return lambda line: True
    return lambda line: line_section(line) == section or is_truncation_marker(line)


def _timestamp(line: str) -> str:
    return line.split(" ", 1)[0]


def _marker_line(time: str, text: str) -> str:
    return f"{time} system {LOG_TRUNCATED}{text}\n"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace") + "\n"


# -- the files of one log -----------------------------------------------------------------------------------


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


class _LogReader:
    """One log (output.log.1 and output.log) of one attempt or replica: its end read backwards once, then
    followed forwards across rotations. Not thread-safe; each call runs in a worker thread, one at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seg: _Segment | None = None  # the file followed, None until there is one
        self.older: _Segment | None = None  # output.log.1 while its end is read backwards
        self.pending = b""  # an incomplete last line

    def open_end(self) -> Iterator[str]:
        """Position following at the end of the log now; return its lines, newest first (the marker at the
        top of output.log left out while output.log.1 is there)."""
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

    def drop_older(self) -> None:
        if self.older is not None:
            self.older.close()
            self.older = None

    def read(self, limit: int) -> tuple[list[str], bool]:
        """The complete lines written since the last read (about ``limit`` bytes at most), and whether more
        are waiting. Goes on into the next file when the one followed was rotated away."""
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
            out.append(_marker_line(nxt.marker_time or _now(), f"{missed} bytes dropped while this reader was behind"))
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
        """The incomplete last line, once nothing more will be written."""
        out = [_decode(self.pending)] if self.pending else []
        self.pending = b""
        return out

    def close(self) -> None:
        self.drop_older()
        if self.seg is not None:
            self.seg.close()
            self.seg = None


# -- reading a job's logs ------------------------------------------------------------------------------------

Readers = list[tuple[int, str, _LogReader]]


def _kept(
    lines: Iterator[str], keep: Callable[[str], bool], label: Callable[[str, str], str], name: str
) -> Iterator[str]:
    return (label(line, name) for line in lines if keep(line))


def read_tail(
    readers: Readers,
    n: int | None,
    keep: Callable[[str], bool],
    label: Callable[[str, str], str],
    max_bytes: int,
) -> list[str]:
    """The last ``n`` kept lines (all when None) of the logs, at most ``max_bytes`` of them, oldest first;
    attempt after attempt, each attempt's replicas interleaved by time. Reads the files backwards, so time
    and memory grow with what is returned, not with the size of the logs. Leaves every reader positioned
    to follow after what it read."""
    by_attempt: dict[int, list[Iterator[str]]] = {}
    for number, name, reader in readers:  # every reader is positioned, however few lines are wanted
        by_attempt.setdefault(number, []).append(_kept(reader.open_end(), keep, label, name))
    newest: list[str] = []
    used = 0
    cut = False
    try:
        for number in sorted(by_attempt, reverse=True):
            for line in heapq.merge(*by_attempt[number], key=_timestamp, reverse=True):
                if n is not None and len(newest) >= n:
                    break
                size = len(line.encode("utf-8", errors="replace"))
                if used + size > max_bytes:
                    cut = True
                    break
                newest.append(line)
                used += size
            if cut or (n is not None and len(newest) >= n):
                break
    finally:
        for _, _, reader in readers:
            reader.drop_older()
    newest.reverse()
    if cut:
        time = _timestamp(newest[0]) if newest else _now()
        newest.insert(
            0,
            _marker_line(
                time,
                f"earlier lines not shown: a read returns at most the last {_format_bytes(max_bytes)} of a log "
                "(--follow streams all of it)",
            ),
        )
    return newest


def _read_new(
    readers: Readers, keep: Callable[[str], bool], label: Callable[[str, str], str]
) -> tuple[list[str], bool]:
    """Lines written since the last read (a bounded amount per log), and whether more are waiting."""
    batches: list[list[str]] = []
    more = False
    for _, name, reader in readers:
        lines, pending = reader.read(FOLLOW_READ_BYTES)
        more = more or pending
        kept = [label(line, name) for line in lines if keep(line)]
        if kept:
            batches.append(kept)
    if len(batches) <= 1:
        return (batches[0] if batches else []), more
    return list(heapq.merge(*batches, key=_timestamp)), more


def _rest(readers: Readers, keep: Callable[[str], bool], label: Callable[[str, str], str]) -> list[str]:
    return [label(line, name) for _, name, reader in readers for line in reader.rest() if keep(line)]


def _check(
    platform: Platform,
    caller: Caller,
    job_id: str,
    attempts: list[Attempt],
    replica: str | None,
    known: set[Path],
) -> tuple[bool, list[Attempt], list[LogFile]]:
    """Whether the job has ended, its attempts, and the log files not ``known`` yet: of a new attempt, or a
    gang's replica directories that appeared since."""
    _, done, fresh = _snapshot(platform, caller, job_id)
    numbers = {n for n, _, _ in attempts}
    attempts = attempts + [a for a in fresh if a[0] not in numbers]
    return done, attempts, [f for f in _files(platform, attempts, replica) if f[2] not in known]


async def open_log_stream(
    platform: Platform,
    caller: Caller,
    name: str,
    *,
    follow: bool,
    tail: int | None,
    section: LogSection = LogSection.ALL,
    replica: str | None = None,
) -> AsyncIterator[str]:
    """Validate access now (raises NotFound), then return an iterator of log lines (of ``section``, of
    ``replica``)."""
    job_id, done, attempts = await anyio.to_thread.run_sync(_snapshot, platform, caller, name)
    return _stream(
        platform,
        caller,
        job_id,
        done,
        attempts,
        follow=follow,
        tail=tail,
        keep=_keeper(section),
        replica=replica,
        max_bytes=platform.settings.job_log_response_max_bytes,
    )


async def _stream(
    platform: Platform,
    caller: Caller,
    job_id: str,
    done: bool,
    attempts: list[Attempt],
    *,
    follow: bool,
    tail: int | None,
    keep: Callable[[str], bool],
    replica: str | None = None,
    max_bytes: int,
) -> AsyncIterator[str]:
    files = await anyio.to_thread.run_sync(_files, platform, attempts, replica)
    readers: Readers = [(number, name, _LogReader(path)) for number, name, path in files]
    label = _labeller(files)
    try:
        if tail is not None or not follow:
            for line in await anyio.to_thread.run_sync(read_tail, readers, tail, keep, label, max_bytes):
                yield line
            if not follow:
                return
        loop = asyncio.get_running_loop()
        last_check = loop.time()
        while True:
            lines, more = await anyio.to_thread.run_sync(_read_new, readers, keep, label)
            for line in lines:
                yield line
            if more:
                continue
            if done:  # every file read to its end after the job ended: nothing more will come
                for line in _rest(readers, keep, label):
                    yield line
                return
            await asyncio.sleep(POLL_SECONDS)
            if loop.time() - last_check < STATE_CHECK_SECONDS:
                continue
            last_check = loop.time()
            done, attempts, added = await anyio.to_thread.run_sync(
                _check, platform, caller, job_id, attempts, replica, {f[2] for f in files}
            )
            if added:
                files = files + added
                readers = readers + [(number, name, _LogReader(path)) for number, name, path in added]
                label = _labeller(files)
    finally:
        for _, _, reader in readers:
            reader.close()
