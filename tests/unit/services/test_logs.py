"""Reading job logs (services/logs.py) written by the real launcher's writer, capped and rotated: the end from
the end, bounded reads, and followers that keep every line across rotations."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlcloud.executors.local.launcher import Launcher
from dlcloud.executors.local.runner import ProcessRunner
from dlcloud.executors.local.sandbox import Sandbox
from dlcloud.executors.log_reading import FileLogReader
from dlcloud.schemas.jobs import LogSection
from dlcloud.services import logs

CAP = 16 * 1024  # halves of 8 KiB: about 76 lines of the ones below (107 bytes each)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Launcher]:
    """The launcher's log writer on <tmp>/attempt/output.log, capped at CAP."""
    d = tmp_path / "attempt"
    d.mkdir()
    (d / "workload.json").write_text(json.dumps({"log_max_bytes": CAP}))
    launcher = Launcher(str(d))
    launcher.open_log()
    yield launcher
    assert launcher.log is not None
    launcher.log.close()
    os.close(launcher.wake_r)
    os.close(launcher.wake_w)


def write(w: Launcher, first: int, count: int, stream: str = "stdout") -> None:
    for i in range(first, first + count):
        w.write_line(stream, f"line {i:05d} " + "x" * 60)


def numbers(lines: list[str]) -> list[int]:
    return [int(line.split()[3]) for line in lines if " line " in line]


def is_marker(line: str) -> bool:
    return logs.is_truncation_marker(line)


def reader(w: Launcher) -> FileLogReader:
    return FileLogReader(Path(w.dir) / "output.log")


def tail(w: Launcher, n: int | None, max_bytes: int = 1 << 20, keep=lambda line: True) -> list[str]:
    return logs.read_tail([(1, "", reader(w))], n, keep, lambda line, _: line, max_bytes)


def drain(r: FileLogReader) -> list[str]:
    out: list[str] = []
    while True:
        lines, more = r.read(4096)
        out += lines
        if not more:
            return out


def test_tail_reads_the_last_lines_across_both_files(writer: Launcher):
    write(writer, 0, 1000)
    assert (Path(writer.dir) / "output.log.1").exists()
    assert numbers(tail(writer, 3)) == [997, 998, 999]
    everything = tail(writer, None)
    # one log: the marker of output.log.1 first, then every kept line without a gap; the marker at the top
    # of output.log (true only once it is output.log.1) is left out
    assert is_marker(everything[0]) and "earlier bytes dropped (cap 16 KiB)" in everything[0]
    assert sum(map(is_marker, everything)) == 1
    kept = numbers(everything)
    assert kept == list(range(kept[0], 1000)) and kept[0] > 800


def test_a_read_returns_the_end_of_the_log_within_max_bytes_and_says_so(writer: Launcher):
    write(writer, 0, 1000)
    lines = tail(writer, None, max_bytes=2048)
    assert is_marker(lines[0]) and "earlier lines not shown" in lines[0] and "2 KiB" in lines[0]
    assert sum(len(line.encode()) for line in lines[1:]) <= 2048
    assert numbers(lines) == list(range(1000 - len(lines) + 1, 1000))
    assert lines[0].split()[0] == lines[1].split()[0]  # the marker sorts where it stands
    # a tail that fits is not marked
    assert not any(map(is_marker, tail(writer, 5, max_bytes=2048)))


def test_following_across_rotations_loses_no_line(writer: Launcher):
    r = reader(writer)
    got: list[str] = []
    assert logs.read_tail([(1, "", r)], 0, lambda line: True, lambda line, _: line, 1 << 20) == []
    first = 0
    # between two reads: a little, one rotation, and two (the follower keeps the file it reads open, so a
    # rotated and then dropped file is still read to its end; only a third rotation would lose lines)
    for count in (5, 80, 7, 150, 1, 110, 150, 3):
        write(writer, first, count)
        first += count
        got += drain(r)
    r.close()
    assert numbers(got) == list(range(first))
    assert not any(map(is_marker, got))


def test_a_follower_left_far_behind_is_told_how_much_it_missed(writer: Launcher):
    r = reader(writer)
    logs.read_tail([(1, "", r)], 0, lambda line: True, lambda line, _: line, 1 << 20)
    write(writer, 0, 50)
    got = drain(r)
    write(writer, 50, 1000)  # ten rotations while it does not read
    got += drain(r)
    r.close()
    markers = [line for line in got if is_marker(line)]
    assert len(markers) == 1 and "bytes dropped while this reader was behind" in markers[0]
    missed = int(markers[0].split()[4])
    before, after = numbers(got[: got.index(markers[0])]), numbers(got[got.index(markers[0]) + 1 :])
    assert before == list(range(len(before))) and len(before) >= 50  # it finished the file it had open
    assert after == list(range(after[0], 1050))
    assert 100 * (after[0] - len(before)) <= missed <= 110 * (after[0] - len(before))  # ~107 bytes a line


def test_following_from_the_start_begins_with_what_is_kept(writer: Launcher):
    write(writer, 0, 400)
    r = reader(writer)
    got = drain(r)
    write(writer, 400, 140)
    got += drain(r)
    r.close()
    assert is_marker(got[0]) and "earlier bytes dropped" in got[0]
    assert sum(map(is_marker, got)) == 1
    kept = numbers(got)
    assert kept == list(range(kept[0], 540))


def test_a_section_keeps_the_truncation_markers(writer: Launcher):
    write(writer, 0, 300, stream="stdout")
    write(writer, 300, 5, stream="post:stdout")
    keep = logs._keeper(LogSection.POST)
    lines = tail(writer, None, keep=keep)
    assert is_marker(lines[0])
    assert numbers(lines) == [300, 301, 302, 303, 304]


def test_replicas_are_interleaved_by_time_from_the_end(tmp_path: Path):
    writers = []
    for name in ("worker-0", "worker-1"):
        d = tmp_path / "replicas" / name
        d.mkdir(parents=True)
        (d / "workload.json").write_text(json.dumps({"log_max_bytes": CAP}))
        w = Launcher(str(d))
        w.open_log()
        writers.append(w)
    for i in range(600):
        writers[i % 2].write_line("stdout", f"line {i:05d} " + "x" * 60)
    # the local executor's process layer reads an attempt's logs by its directory
    platform = SimpleNamespace(executor=ProcessRunner(sandbox=Sandbox(False, "not needed to read logs")))
    readers = logs._open_logs(platform, [(1, str(tmp_path), None)], None)  # type: ignore[arg-type]
    lines = logs.read_tail(readers, 4, lambda line: True, logs._labeller(readers), 1 << 20)
    assert numbers(lines) == [596, 597, 598, 599]
    assert [line.split()[1] for line in lines] == ["worker-0/stdout", "worker-1/stdout"] * 2
    for _, _, r in readers:
        r.close()


async def test_following_a_finished_job_streams_all_of_a_large_log(tmp_path: Path):
    """Past the size of one read (the old follower stopped after 8 MiB of a finished job)."""
    d = tmp_path / "attempt"
    d.mkdir()
    line = "2024-01-01T00:00:00.000000Z stdout " + "y" * 1000 + "\n"
    with open(d / "output.log", "w") as f:
        for _ in range(3 * logs.FOLLOW_READ_BYTES // len(line) + 10):
            f.write(line)
        f.write("2024-01-01T00:00:01.000000Z stdout the end\n")
    lines: list[str] = []
    platform = SimpleNamespace(executor=ProcessRunner(sandbox=Sandbox(False, "not needed to read logs")))
    stream = logs._stream(
        platform,  # type: ignore[arg-type]  # a finished job: no state check
        None,  # type: ignore[arg-type]
        "job",
        True,
        [(1, str(d), None)],
        follow=True,
        tail=None,
        keep=lambda line: True,
        max_bytes=1024,
    )
    async for got in stream:
        lines.append(got)
    assert len(lines) == 3 * logs.FOLLOW_READ_BYTES // len(line) + 11
    assert lines[-1].endswith("stdout the end\n")
