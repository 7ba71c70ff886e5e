"""``dlcloud up --api-workers N`` for real (docs/configuration.md#api-workers), on SQLite and PostgreSQL: two API
processes serve the port, each answering while the other is frozen; one control process leads the scheduler and
serves nothing; a job submitted through either is scheduled at once (the wake crosses processes); the rate limits
are one across the processes; kill -9 of a worker loses no request it answered and no job, and a new worker takes
its place; kill -9 of the control process leaves no process holding the port."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dlcloud.client import Client, Credentials
from dlcloud.errors import DlcloudError, RateLimited
from tests.conftest import wait_for
from tests.e2e.conftest import Server, free_port


@pytest.fixture
def workers(tmp_path: Path, db_url: str) -> Iterator[Server]:
    """``dlcloud up --api-workers 2`` on SQLite and on PostgreSQL."""
    env = {"DLCLOUD_API_RATE_LIMIT_PER_KEY_BURST": "1000"}
    s = Server(tmp_path, free_port(), ["--api-workers", "2", "--database-url", db_url], extra_env=env)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _client(s: Server) -> Client:
    """A client with its own connections (a frozen worker holds the ones it accepted)."""
    boot = json.loads((s.data_dir / "bootstrap-admin.json").read_text())
    return Client(Credentials(s.endpoint, boot["access_key"], boot["secret_key"]))


def _children(pid: int) -> set[int]:
    """The API worker processes of the control process ``pid`` (uvicorn spawns them through multiprocessing)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def _two_workers(s: Server, without: int | None = None) -> set[int]:
    """The control process's two API workers, once it has two (and ``without`` is not one of them)."""
    assert s.proc is not None
    parent = s.proc.pid

    def two() -> set[int] | None:
        found = _children(parent)
        return found if len(found) == 2 and without not in found else None

    return wait_for(two, timeout=60, what="two API workers")


def _listed(s: Server) -> float:
    """How many ``GET /api/v1/jobs`` (route ``jobs.list``) answered 200, as ``/metrics`` says (on a connection of
    its own)."""
    text = httpx.get(f"{s.endpoint}/metrics", timeout=10, headers={"Connection": "close"}).text
    wanted = ('route="jobs.list"', 'method="GET"', 'status="200"')
    total = 0.0
    for line in text.splitlines():
        if line.startswith("dlcloud_http_requests_total{") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_each_worker_serves_and_one_process_leads(workers: Server) -> None:
    s = workers
    assert s.proc is not None
    pids = _two_workers(s)
    for frozen in sorted(pids):  # the other answers alone: each of the two serves the port
        os.kill(frozen, signal.SIGSTOP)
        try:
            with _client(s) as c:
                assert c.jobs.list() == []
        finally:
            os.kill(frozen, signal.SIGCONT)
    # /metrics sums the workers' counters: the two lists above, and ten more, whichever worker answers
    for _ in range(10):
        with _client(s) as c:
            c.jobs.list()
    for _ in range(4):
        assert _listed(s) == 12
    leads = [line for line in s.log().splitlines() if "this process leads the scheduler" in line]
    assert len(leads) == 1 and leads[0].endswith(f":{s.proc.pid})"), leads  # the control process, once
    with _client(s) as c:  # a submission through a worker wakes the control process's loop
        c.jobs.submit({"name": "quick", "command": "echo hi"})
        job = wait_for(lambda: (j := c.jobs.get("quick")).state == "SUCCEEDED" and j, timeout=30, what="the job")
        assert [line.text for line in c.jobs.logs("quick") if line.stream == "stdout"] == ["hi"]
        assert len(job.attempts) == 1


def test_the_rate_limit_is_one_across_the_workers(tmp_path: Path) -> None:
    env = {"DLCLOUD_API_RATE_LIMIT_PER_KEY": "0.01", "DLCLOUD_API_RATE_LIMIT_PER_KEY_BURST": "6"}
    s = Server(tmp_path, free_port(), ["--api-workers", "2"], extra_env=env)
    s.start()
    try:
        admitted = refused = 0
        for _ in range(20):  # fresh connections: the kernel hands them to both workers
            with _client(s) as c:
                try:
                    c.jobs.list()
                    admitted += 1
                except RateLimited:
                    refused += 1
        assert (admitted, refused) == (6, 14)  # the burst once, not once per worker
    finally:
        s.stop()


def test_kill_9_of_a_worker_loses_no_answered_request_and_no_job(workers: Server) -> None:
    s = workers
    assert s.proc is not None
    pids = _two_workers(s)
    answered: list[str] = []
    stop = threading.Event()

    def submit() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                with _client(s) as c:
                    answered.append(c.jobs.submit({"name": f"j{threading.get_ident()}-{n}", "command": "true"}).id)
            except (DlcloudError, httpx.TransportError):  # the killed worker's connection: no answer
                continue

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(answered) >= 10, timeout=60, what="submissions before the kill")
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not _alive(victim), what="the worker to die")
        replaced = _two_workers(s, without=victim)
        count = len(answered)
        wait_for(lambda: len(answered) >= count + 10, timeout=60, what="submissions after the kill")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert replaced - pids  # a new process
    with _client(s) as c:

        def ended() -> list | None:
            jobs = c.jobs.list(limit=1000)
            return jobs if all(j.state == "SUCCEEDED" for j in jobs) else None

        jobs = wait_for(ended, timeout=180, what="every job to end")
        stored = {j.id for j in jobs}
        assert set(answered) <= stored  # every answered submission is a job...
        for job_id in answered[:: max(1, len(answered) // 10)]:  # ...run once
            assert len(c.jobs.get(job_id).attempts) == 1


def test_kill_9_of_the_control_process_leaves_no_worker(tmp_path: Path) -> None:
    s = Server(tmp_path, free_port(), ["--api-workers", "2"])
    s.start()
    assert s.proc is not None
    pids = _two_workers(s)
    s.kill9()
    for pid in pids:
        wait_for(lambda pid=pid: not _alive(pid), what=f"worker {pid} to die with the control process")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # nothing listens on the port any more
        try:
            httpx.get(f"{s.endpoint}/healthz", timeout=1)
        except httpx.TransportError:
            return
        time.sleep(0.1)
    pytest.fail("something still answers on the port after the control process was killed")
