"""Job logs: read and follow the attempts' log files without holding a database connection.

Each attempt writes ``output.log`` lines ``<ISO time> <stream> <text>``; ``stream`` is ``stdout``,
``stderr`` or ``system`` in the main section and carries its phase otherwise (``pre:stdout``,
``post:system``): a read may ask for one section. A gang attempt has one output.log per replica; a read
may ask for one replica (``worker-1``; with procs_per_worker also ``worker-1.0``), and lines of several
replicas are interleaved by time, their stream prefixed with the replica (``worker-1/stdout``).
Following polls the files and checks the job's state
with short read transactions; the connection goes back to the pool between checks, so many followers
cost no database connections.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio

from dlcloud.executors.base import replica_log_files
from dlcloud.schemas.jobs import TERMINAL_STATES, JobState, LogSection
from dlcloud.services.auth import Caller
from dlcloud.services.jobs import _get_row
from dlcloud.services.platform import Platform
from dlcloud.store.models import AttemptRow

POLL_SECONDS = 0.25
STATE_CHECK_SECONDS = 1.0


# one log file: (attempt number, replica name or "", path)
LogFile = tuple[int, str, Path]


def _snapshot(platform: Platform, caller: Caller, name: str) -> tuple[str, bool, list[tuple[int, Path]]]:
    from sqlalchemy import select

    with platform.db.read() as s:
        row = _get_row(s, caller, name)
        attempts = s.execute(
            select(AttemptRow.number, AttemptRow.attempt_dir)
            .where(AttemptRow.job_id == row.id)
            .order_by(AttemptRow.number)
        ).all()
        return row.id, JobState(row.state) in TERMINAL_STATES, [(n, Path(d)) for n, d in attempts]


def _files(attempts: list[tuple[int, Path]], replica: str | None) -> list[LogFile]:
    """The log files of the attempts (of ``replica`` only, when given), attempt by attempt."""
    out: list[LogFile] = []
    for number, attempt_dir in attempts:
        for name, path in replica_log_files(attempt_dir).items():
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


def _keeper(section: LogSection) -> Callable[[str], bool]:
    if section == LogSection.ALL:
        return lambda line: True
    return lambda line: line_section(line) == section


def _timestamp(line: str) -> str:
    return line.split(" ", 1)[0]


def _read_all(files: list[LogFile], keep: Callable[[str], bool], label: Callable[[str, str], str]) -> list[str]:
    """Every kept line, attempt after attempt, each attempt's replicas interleaved by time."""
    out: list[str] = []
    by_attempt: dict[int, list[list[str]]] = {}
    for number, replica, path in files:
        lines: list[str] = []
        try:
            with path.open("r", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if keep(line):
                        lines.append(label(line if line.endswith("\n") else line + "\n", replica))
        except FileNotFoundError:
            pass
        by_attempt.setdefault(number, []).append(lines)
    for number in sorted(by_attempt):
        out.extend(heapq.merge(*by_attempt[number], key=_timestamp))
    return out


def _tail_lines(
    files: list[LogFile], n: int, keep: Callable[[str], bool], label: Callable[[str, str], str]
) -> list[str]:
    return list(deque(_read_all(files, keep, label), maxlen=n))


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
        platform, caller, job_id, done, attempts, follow=follow, tail=tail, keep=_keeper(section), replica=replica
    )


async def _stream(
    platform: Platform,
    caller: Caller,
    job_id: str,
    done: bool,
    attempts: list[tuple[int, Path]],
    *,
    follow: bool,
    tail: int | None,
    keep: Callable[[str], bool],
    replica: str | None = None,
) -> AsyncIterator[str]:
    files = _files(attempts, replica)
    label = _labeller(files)
    offsets: dict[Path, int] = {}
    pending: dict[Path, str] = {}
    names = {path: name for _, name, path in files}
    if tail is not None:
        for line in _tail_lines(files, tail, keep, label):
            yield line
        for _, _, path in files:
            try:
                offsets[path] = path.stat().st_size
            except FileNotFoundError:
                offsets[path] = 0

    def read_new() -> list[str]:
        batches: list[list[str]] = []
        for _, name, path in files:
            try:
                with path.open("rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read(4 * 1024 * 1024)
            except FileNotFoundError:
                continue
            if not data:
                continue
            offsets[path] = offsets.get(path, 0) + len(data)
            text = pending.pop(path, "") + data.decode("utf-8", errors="replace")
            parts = text.split("\n")
            if parts[-1]:
                pending[path] = parts[-1]
            batches.append([label(p + "\n", name) for p in parts[:-1] if keep(p)])
        if len(batches) == 1:
            return batches[0]
        return list(heapq.merge(*batches, key=_timestamp))

    def rest() -> list[str]:
        return [label(last + "\n", names.get(path, "")) for path in list(pending) if keep(last := pending.pop(path))]

    loop = asyncio.get_running_loop()
    last_check = loop.time()
    while True:
        for line in read_new():
            yield line
        if not follow:
            break
        if done:
            for line in read_new():
                yield line
            for line in rest():
                yield line
            break
        await asyncio.sleep(POLL_SECONDS)
        if loop.time() - last_check >= STATE_CHECK_SECONDS:
            last_check = loop.time()
            _, done, fresh = await anyio.to_thread.run_sync(_snapshot, platform, caller, job_id)
            known = {n for n, _ in attempts}
            attempts = attempts + [a for a in fresh if a[0] not in known]
        if len(files) < sum(len(replica_log_files(d)) for _, d in attempts):
            # a new attempt, or a gang's replica directories that appeared since
            seen = {path for _, _, path in files}
            files = files + [f for f in _files(attempts, replica) if f[2] not in seen]
            label = _labeller(files)
            names = {path: name for _, name, path in files}
    for line in rest():
        yield line
