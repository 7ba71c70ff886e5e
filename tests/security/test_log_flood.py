"""A job flooding its log: the disk keeps at most the cap, and the end of the log (where the error is); reading
the end of a huge log costs memory for what is returned, not for the log."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlcloud.executors.local.runner import ProcessRunner
from dlcloud.executors.local.sandbox import Sandbox
from dlcloud.services import logs
from tests.conftest import wait_for
from tests.e2e.conftest import Server, free_port
from tests.security.conftest import add_member

CAP = 64 * 1024
LINE = "2024-05-06T07:08:09.123456Z stdout " + "flood " * 15  # ~125 bytes with its number


def _flood_file(path: Path, size: int) -> int:
    """A log file of about ``size`` bytes of numbered lines; returns the number of the last."""
    n = 0
    with open(path, "w") as f:
        while f.tell() < size:
            f.write("".join(f"{LINE}{i:08d}\n" for i in range(n, n + 10_000)))
            n += 10_000
    return n - 1


def _traced(fn):  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_end_of_a_50_mb_log_is_read_from_the_end(tmp_path: Path):
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    last = _flood_file(attempt / "output.log", 50 * 1024 * 1024)
    # the local executor's process layer reads an attempt's logs by its directory
    platform = SimpleNamespace(executor=ProcessRunner(sandbox=Sandbox(False, "not needed to read logs")))

    def read(n: int | None, max_bytes: int = 4 * 1024 * 1024) -> list[str]:
        readers = logs._open_logs(platform, [(1, str(attempt), None)], None)  # type: ignore[arg-type]
        try:
            return logs.read_tail(readers, n, lambda line: True, logs._labeller(readers), max_bytes)
        finally:
            for _, _, r in readers:
                r.close()

    lines, peak = _traced(lambda: read(1))
    assert lines == [f"{LINE}{last:08d}\n"]
    assert peak < 512 * 1024, peak  # a few 64 KiB blocks, not 50 MB

    lines, peak = _traced(lambda: read(1000))
    assert [int(line.rsplit(" ", 1)[1]) for line in lines] == list(range(last - 999, last + 1))
    assert peak < 2 * 1024 * 1024, peak

    # without a tail: the last 4 MiB, marked, never the whole file
    lines, peak = _traced(lambda: read(None))
    assert logs.is_truncation_marker(lines[0]) and "earlier lines not shown" in lines[0]
    assert lines[-1] == f"{LINE}{last:08d}\n"
    assert 4 * 1024 * 1024 - 200 < sum(len(line) for line in lines[1:]) <= 4 * 1024 * 1024
    assert peak < 16 * 1024 * 1024, peak


@pytest.fixture
def capped_server(tmp_path: Path) -> Iterator[Server]:
    """A real ``dlcloud up`` whose job logs are capped at 64 KiB, with a member ``mallory`` of tenant attacker."""
    server = Server(tmp_path, free_port(), extra_env={"DLCLOUD_JOB_LOG_MAX_BYTES": str(CAP)})
    server.start()
    try:
        add_member(server, "attacker", "mallory", cpus="2", max_running_jobs="1")
        yield server
    finally:
        server.stop()


@pytest.mark.e2e
def test_a_job_flooding_its_log_keeps_the_end_within_the_cap(capped_server: Server, tmp_path: Path):
    code = tmp_path / "flood"
    code.mkdir()
    (code / "flood.py").write_text(
        "import sys\n"
        "for i in range(40_000):\n"
        "    sys.stdout.write(f'flood {i:06d} ' + 'z' * 100 + '\\n')\n"
        "sys.stdout.write('x' * 20_000 + '\\n')\n"  # a long line
        "print('the error is here', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    mallory = ("--profile", "mallory")
    capped_server.cli(
        *mallory, "jobs", "submit", "--name", "flood", "--code", str(code), "--command", "python flood.py"
    )
    wait_for(
        lambda: capped_server.cli_json(*mallory, "jobs", "describe", "flood")["state"] == "FAILED",  # type: ignore[index]
        timeout=120,
        interval=0.5,
        what="the flood to end",
    )
    # on disk: at most the cap, whatever the job wrote (4.5 MB)
    data = capped_server.data_dir / "runs"
    logs_on_disk = [p for p in data.rglob("output.log*") if p.is_file()]
    assert {p.name for p in logs_on_disk} == {"output.log", "output.log.1"}
    assert sum(p.stat().st_size for p in logs_on_disk) <= CAP

    # read back: the end, with the error, and a marker where the rest was dropped
    tail = capped_server.cli(*mallory, "jobs", "logs", "flood", "--tail", "2")
    assert tail.stderr.splitlines()[-2:] == ["the error is here", "[dlcloud] command exited with code 3"]
    full = capped_server.cli(*mallory, "jobs", "logs", "flood")
    assert full.stderr.startswith("[dlcloud] log truncated: ")
    assert "earlier bytes dropped (cap 64 KiB)" in full.stderr.splitlines()[0]
    assert full.stdout.splitlines()[-1] == "x" * 20_000
    assert "flood 039999" in full.stdout and "flood 000000" not in full.stdout
    assert os.path.getsize(next(p for p in logs_on_disk if p.name == "output.log")) <= CAP // 2
