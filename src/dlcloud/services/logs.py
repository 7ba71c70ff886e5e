"""Job logs: read and follow the attempts' log files without holding a database connection.

Each attempt writes ``output.log`` lines ``<ISO time> <stream> <text>``; ``stream`` is ``stdout``,
``stderr`` or ``system`` in the main section and carries its phase otherwise (``pre:stdout``,
``post:system``): a read may ask for one section. Following polls the files and checks the job's state
with short read transactions; the connection goes back to the pool between checks, so many followers
cost no database connections.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio

from dlcloud.schemas.jobs import TERMINAL_STATES, JobState, LogSection
from dlcloud.services.auth import Caller
from dlcloud.services.jobs import _get_row
from dlcloud.services.platform import Platform
from dlcloud.store.models import AttemptRow

POLL_SECONDS = 0.25
STATE_CHECK_SECONDS = 1.0


def _snapshot(platform: Platform, caller: Caller, name: str) -> tuple[str, bool, list[tuple[int, Path]]]:
    from sqlalchemy import select

    with platform.db.read() as s:
        row = _get_row(s, caller, name)
        attempts = s.execute(
            select(AttemptRow.number, AttemptRow.attempt_dir)
            .where(AttemptRow.job_id == row.id)
            .order_by(AttemptRow.number)
        ).all()
        return row.id, JobState(row.state) in TERMINAL_STATES, [(n, Path(d) / "output.log") for n, d in attempts]


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


def _tail_lines(paths: list[tuple[int, Path]], n: int, keep: Callable[[str], bool]) -> list[str]:
    out: deque[str] = deque(maxlen=n)
    for _, path in paths:
        try:
            with path.open("r", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if keep(line):
                        out.append(line if line.endswith("\n") else line + "\n")
        except FileNotFoundError:
            continue
    return list(out)


async def open_log_stream(
    platform: Platform,
    caller: Caller,
    name: str,
    *,
    follow: bool,
    tail: int | None,
    section: LogSection = LogSection.ALL,
) -> AsyncIterator[str]:
    """Validate access now (raises NotFound), then return an iterator of log lines (of ``section``)."""
    job_id, done, attempts = await anyio.to_thread.run_sync(_snapshot, platform, caller, name)
    return _stream(platform, caller, job_id, done, attempts, follow=follow, tail=tail, keep=_keeper(section))


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
) -> AsyncIterator[str]:
    offsets: dict[int, int] = {}
    pending: dict[int, str] = {}
    if tail is not None:
        for line in _tail_lines(attempts, tail, keep):
            yield line
        for number, path in attempts:
            try:
                offsets[number] = path.stat().st_size
            except FileNotFoundError:
                offsets[number] = 0

    def read_new() -> list[str]:
        lines: list[str] = []
        for number, path in attempts:
            try:
                with path.open("rb") as f:
                    f.seek(offsets.get(number, 0))
                    data = f.read(4 * 1024 * 1024)
            except FileNotFoundError:
                continue
            if not data:
                continue
            offsets[number] = offsets.get(number, 0) + len(data)
            text = pending.pop(number, "") + data.decode("utf-8", errors="replace")
            parts = text.split("\n")
            if parts[-1]:
                pending[number] = parts[-1]
            lines.extend(p + "\n" for p in parts[:-1] if keep(p))
        return lines

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
            for number in list(pending):
                if keep(last := pending.pop(number)):
                    yield last + "\n"
            break
        await asyncio.sleep(POLL_SECONDS)
        if loop.time() - last_check >= STATE_CHECK_SECONDS:
            last_check = loop.time()
            _, done, fresh = await anyio.to_thread.run_sync(_snapshot, platform, caller, job_id)
            known = {n for n, _ in attempts}
            attempts = attempts + [a for a in fresh if a[0] not in known]
    for number in list(pending):
        if keep(last := pending.pop(number)):
            yield last + "\n"
