"""Many log followers do not starve the API of database connections; SIGTERM stops the server cleanly."""

from __future__ import annotations

import json
import threading

import pytest

from dlcloud.client import Client, Credentials
from tests.conftest import WAIT_FOR_GO, release, wait_for
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e
FOLLOWERS = 40  # more than the database pool's base size (20)


def test_many_followers_then_sigterm(server: Server):
    boot = json.loads((server.data_dir / "bootstrap-admin.json").read_text())
    creds = Credentials(server.endpoint, boot["access_key"], boot["secret_key"])
    with Client(creds) as c:
        c.jobs.submit({"name": "chatty", "command": f"echo hello; {WAIT_FOR_GO}; echo bye"})
        wait_for(lambda: c.jobs.get("chatty").state == "RUNNING", what="RUNNING")
        job_id = c.jobs.get("chatty").id

    results: list[list[str]] = []
    lock = threading.Lock()
    opened = threading.Semaphore(0)

    def follow() -> None:
        with Client(creds, timeout=120) as fc:
            lines = []
            for line in fc.jobs.logs("chatty", follow=True):
                if line.text == "hello":
                    opened.release()
                lines.append(line.text)
        with lock:
            results.append(lines)

    threads = [threading.Thread(target=follow, daemon=True) for _ in range(FOLLOWERS)]
    for t in threads:
        t.start()
    for _ in range(FOLLOWERS):
        assert opened.acquire(timeout=60), "a follower did not receive the first line"
    # while every follower is attached, ordinary signed calls still succeed
    with Client(creds, timeout=30) as c:
        for _ in range(20):
            assert c.jobs.get("chatty").state == "RUNNING"
            assert c.accounting.quota().usage.running_jobs == 1
    release(server.data_dir, job_id)
    for t in threads:
        t.join(timeout=60)
    assert len(results) == FOLLOWERS
    assert all("hello" in r and "bye" in r for r in results)

    assert server.proc is not None
    server.stop()
    assert server.proc.returncode == 0
    assert "control plane stopped" in server.log()
