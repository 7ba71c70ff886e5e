"""Reading an attempt's logs through the executor (``Executor.log_replicas``, ``Executor.open_log``): the end,
then following it, with no host path in sight. On the local executor the logs are written by the real
launcher's writer, capped and rotated; on the simulated one they are lines in memory."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

from dlcloud.errors import NotFound
from dlcloud.executors.base import LOG_TRUNCATED, LogReader, Replica, Workload
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.local.launcher import Launcher
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.settings import Settings
from dlcloud.storage.stores import open_object_store

CAP = 16 * 1024  # halves of 8 KiB: about 76 lines of the ones below (107 bytes each)


def _bound(ex: LocalExecutor | SimulatedExecutor, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    settings.data_dir.mkdir()
    objects = open_object_store(settings)
    ex.bind(settings, objects, ex.environments(settings, objects))


@pytest.fixture
def local(tmp_path: Path) -> LocalExecutor:
    ex = LocalExecutor()
    _bound(ex, tmp_path)
    return ex


def _writer(log_dir: Path) -> Launcher:
    """The launcher's log writer on ``log_dir``/output.log, capped at CAP."""
    log_dir.mkdir(parents=True)
    (log_dir / "workload.json").write_text(json.dumps({"log_max_bytes": CAP}))
    launcher = Launcher(str(log_dir))
    launcher.open_log()
    return launcher


@pytest.fixture
def attempt(local: LocalExecutor) -> Iterator[tuple[str, Launcher]]:
    """A one-process attempt's handle and the writer of its log."""
    handle = local.handle("t1", "job1", 1)
    writer = _writer(local.attempt_dir(handle))
    yield handle, writer
    assert writer.log is not None
    writer.log.close()
    os.close(writer.wake_r)
    os.close(writer.wake_w)


def _write(w: Launcher, first: int, count: int) -> None:
    for i in range(first, first + count):
        w.write_line("stdout", f"line {i:05d} " + "x" * 60)


def _numbers(lines: list[str]) -> list[int]:
    return [int(line.split()[3]) for line in lines if " line " in line]


def _drain(r: LogReader) -> list[str]:
    out: list[str] = []
    while True:
        lines, more = r.read(4096)
        out += lines
        if not more:
            return out


def test_local_tail_reads_the_end_across_a_rotation(local: LocalExecutor, attempt: tuple[str, Launcher]) -> None:
    handle, writer = attempt
    assert local.log_replicas(handle) == [""]
    assert not local.open_log(local.handle("t1", "job2", 1), "").exists()  # an attempt that wrote nothing
    reader = local.open_log(handle, "")
    _write(writer, 0, 200)  # past half the cap: output.log.1 and a new output.log
    assert reader.exists()
    newest_first = list(islice(reader.open_end(), 100))
    reader.tail_done()
    assert _numbers(newest_first) == list(range(199, 99, -1))
    assert not any(LOG_TRUNCATED in line for line in newest_first)  # the marker inside the log is left out
    _write(writer, 200, 3)
    assert _numbers(_drain(reader)) == [200, 201, 202]  # following from the end the tail found
    reader.close()


def test_local_follow_loses_no_line_across_rotations(local: LocalExecutor, attempt: tuple[str, Launcher]) -> None:
    handle, writer = attempt
    reader = local.open_log(handle, "")
    assert list(reader.open_end()) == []
    got: list[str] = []
    first = 0
    for count in (5, 80, 7, 150, 1, 110, 3):  # rotations between reads, one and two at a time
        _write(writer, first, count)
        first += count
        got += _drain(reader)
    reader.close()
    assert _numbers(got) == list(range(first))
    assert reader.rest() == []


def test_local_replicas_are_named_and_an_unknown_one_is_not_found(local: LocalExecutor) -> None:
    handle = local.handle("t1", "gang", 1)
    writers = [_writer(local.attempt_dir(handle) / "replicas" / name) for name in ("worker-0", "worker-1")]
    writers[1].write_line("stderr", "hello from worker-1")
    assert local.log_replicas(handle) == ["worker-0", "worker-1"]
    reader = local.open_log(handle, "worker-1")
    assert [line.split(" ", 1)[1] for line in reader.open_end()] == ["stderr hello from worker-1\n"]
    reader.close()
    for name in ("", "worker-2", "../../t1", "worker-1/../worker-0"):
        with pytest.raises(NotFound):
            local.open_log(handle, name)
    with pytest.raises(ValueError):
        local.log_replicas("/somewhere/else")  # not a handle of this executor
    for w in writers:
        assert w.log is not None
        w.log.close()
        os.close(w.wake_r)
        os.close(w.wake_w)


@pytest.fixture
def simulated(tmp_path: Path) -> SimulatedExecutor:
    ex = SimulatedExecutor()
    _bound(ex, tmp_path)
    return ex


def test_simulated_tail_and_follow_lines_in_memory(simulated: SimulatedExecutor) -> None:
    simulated.start("h1", Workload(job_id="j1", tenant_id="t1", attempt=1, command="true"))
    assert simulated.log_replicas("h1") == [""]
    reader = simulated.open_log("h1", "")
    assert not reader.exists()
    for i in range(5):
        simulated.write_log("h1", f"line {i:05d}")
    assert reader.exists()
    assert _numbers(list(islice(reader.open_end(), 2))) == [4, 3]
    reader.tail_done()
    simulated.write_log("h1", "line 00005", stream="stderr")
    simulated.write_log("h1", "line 00006")
    lines, more = reader.read(1)  # about ``limit`` bytes: one line, and more waiting
    assert (_numbers(lines), more) == ([5], True)
    assert _numbers(_drain(reader)) == [6]
    assert lines[0].split()[1] == "stderr"
    reader.close()


def test_simulated_unknown_replicas_and_attempts_are_not_found(simulated: SimulatedExecutor) -> None:
    gang = (Replica("worker-0", "worker", 0), Replica("worker-1", "worker", 1))
    simulated.start("h1", Workload(job_id="j1", tenant_id="t1", attempt=1, command="true", replicas=gang))
    assert simulated.log_replicas("h1") == ["worker-0", "worker-1"]
    assert simulated.log_replicas("unknown") == []
    for handle, name in (("h1", ""), ("h1", "worker-2"), ("unknown", "")):
        with pytest.raises(NotFound):
            simulated.open_log(handle, name)
        with pytest.raises(NotFound):
            simulated.write_log(handle, "x", replica=name)
    # follow from the start without a tail
    simulated.write_log("h1", "line 00000", replica="worker-1")
    reader = simulated.open_log("h1", "worker-1")
    assert _numbers(_drain(reader)) == [0]
    reader.close()
