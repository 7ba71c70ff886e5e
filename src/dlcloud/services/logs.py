"""Job logs: read and follow the attempts' logs without holding a database connection or blocking the
event loop.

Each attempt writes log lines ``<ISO time> <stream> <text>``; ``stream`` is ``stdout``, ``stderr`` or
``system`` in the main section and carries its phase otherwise (``pre:stdout``, ``post:system``): a read may
ask for one section. A gang attempt has one log per replica; a read may ask for one replica (``worker-1``;
with procs_per_worker also ``worker-1.0``), and lines of several replicas are interleaved by time, their
stream prefixed with the replica (``worker-1/stdout``).

The logs are read through the executor (``Executor.log_replicas``, ``Executor.open_log``: a ``LogReader`` per
log, its end then following it), never as files of this host: how they are kept, capped and rotated is the
executor's (``executors/log_reading.py`` for files). An ended attempt's logs the executor no longer has are
read from their archive in the object store, fetched once into this host's cache and read by the same code.
This module decides what is read and how it is put together.

Invariants:
- Nothing is read on the event loop: reads run in worker threads, a bounded amount per call.
- A read without ``follow`` returns the END of the log: the last ``tail`` lines (all of them when no tail
  is given) and never more than ``max_bytes``; when lines are left out for that, the first line says so
  (a ``system`` line ``log truncated: ...``). The readers give the lines newest first, lazily, so memory is
  bounded by what is returned, not by the size of the log.
- Following reads forwards, from the end of the tail (from the start without one), across the executor's
  rotations; where a follower missed lines a ``log truncated`` line says so. Truncation lines are kept
  whatever the section.
- Following polls the readers and checks the job's state with short read transactions; the connection goes
  back to the pool between checks, so many followers cost no database connections.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from pathlib import Path

import anyio

from dlcloud.errors import NotFound
from dlcloud.executors.base import LOG_TRUNCATED, MAIN_LOG, LogReader, replica_sort_key
from dlcloud.executors.log_reading import FileLogReader, log_time_now, marker_line
from dlcloud.schemas.jobs import TERMINAL_STATES, JobState, LogSection
from dlcloud.services.auth import Caller
from dlcloud.services.job_keys import logs_key
from dlcloud.services.jobs import get_row
from dlcloud.services.platform import Platform
from dlcloud.storage.objects import ObjectMissing
from dlcloud.store import jobs as job_store

POLL_SECONDS = 0.25
STATE_CHECK_SECONDS = 1.0
FOLLOW_READ_BYTES = 1024 * 1024  # read per log and poll while following

# the logs read: (attempt number, replica name or "", its reader)
Readers = list[tuple[int, str, LogReader]]
LOG_CACHE = ("cache", "logs")  # below the data dir: archived logs fetched to be read here
# one attempt: (number, executor handle, the key of its archived logs once it ended, else None)
Attempt = tuple[int, str, str | None]


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


def _executor_logs(platform: Platform, handle: str) -> dict[str, LogReader]:
    """The attempt's logs as the executor that ran it keeps them (none for a handle it does not know, recorded
    by another kind of executor, or for a job removed meanwhile)."""
    if platform.executor is None:
        return {}
    try:
        return {name: platform.executor.open_log(handle, name) for name in platform.executor.log_replicas(handle)}
    except (ValueError, NotFound):
        return {}


def _open_logs(
    platform: Platform, attempts: list[Attempt], replica: str | None, known: Collection[tuple[int, str]] = ()
) -> Readers:
    """Readers of the attempts' logs (of ``replica`` only, when given) but the ``known`` (attempt number,
    replica) ones, attempt by attempt, as the executor that ran them keeps them, or else from their archive
    once they ended."""
    out: Readers = []
    for number, handle, archive in attempts:
        logs = _executor_logs(platform, handle)
        if archive is not None and not any(r.exists() for r in logs.values()):
            logs = {name: FileLogReader(path) for name, path in _archived(platform, archive).items()}
        for name, reader in logs.items():
            if (number, name) not in known and (replica is None or name == replica or name.startswith(replica + ".")):
                out.append((number, name, reader))
            else:
                reader.close()
    return out


def _labeller(readers: Readers) -> Callable[[str, str], str]:
    """Prefixes a line's stream with its replica when lines of several replicas of an attempt are read."""
    per_attempt: dict[int, int] = {}
    for number, _, _ in readers:
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


def _format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


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
    attempt after attempt, each attempt's replicas interleaved by time. Takes the lines from the end, so time
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
            reader.tail_done()
    newest.reverse()
    if cut:
        time = _timestamp(newest[0]) if newest else log_time_now()
        newest.insert(
            0,
            marker_line(
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
    known: set[tuple[int, str]],
) -> tuple[bool, list[Attempt], Readers]:
    """Whether the job has ended, its attempts, and readers of the logs not ``known`` yet: of a new attempt, or
    a gang's replicas that appeared since."""
    _, done, fresh = _snapshot(platform, caller, job_id)
    numbers = {n for n, _, _ in attempts}
    attempts = attempts + [a for a in fresh if a[0] not in numbers]
    return done, attempts, _open_logs(platform, attempts, replica, known)


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
    readers = await anyio.to_thread.run_sync(_open_logs, platform, attempts, replica)
    label = _labeller(readers)
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
            if done:  # every log read to its end after the job ended: nothing more will come
                for line in _rest(readers, keep, label):
                    yield line
                return
            await asyncio.sleep(POLL_SECONDS)
            if loop.time() - last_check < STATE_CHECK_SECONDS:
                continue
            last_check = loop.time()
            known = {(number, name) for number, name, _ in readers}
            done, attempts, added = await anyio.to_thread.run_sync(
                _check, platform, caller, job_id, attempts, replica, known
            )
            if added:
                readers = readers + added
                label = _labeller(readers)
    finally:
        for _, _, reader in readers:
            reader.close()
