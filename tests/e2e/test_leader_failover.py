"""Two ``dlcloud up`` on one PostgreSQL database: when the leader's lock session is terminated, the other
takes over, and the deposed one stops leading and writes nothing more — no attempt handled twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from dlcloud.client import Client, Credentials
from dlcloud.control.leader import ADVISORY_LOCK_ID
from tests.conftest import wait_for
from tests.e2e.conftest import Server, free_port
from tests.job_files import touch_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.serial]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
RESTARTS = 6


def _leader(engine: Engine) -> tuple[int, int] | None:
    """(epoch, server pid) of the current leader."""
    with engine.connect() as conn:
        row = conn.execute(text("SELECT epoch, holder FROM leadership")).first()
    return (row.epoch, int(row.holder.rsplit(":", 1)[1])) if row else None


def _terminate_lock_session(engine: Engine) -> None:
    with engine.connect() as conn:
        pid = conn.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
                " AND classid::bigint = :hi AND objid::bigint = :lo"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ),
            {"hi": ADVISORY_LOCK_ID >> 32, "lo": ADVISORY_LOCK_ID & 0xFFFFFFFF},
        ).scalar_one()
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()


def _log(server: Server) -> str:
    return (server.root / "server.log").read_text(errors="replace")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_deposed_leader_stops_and_the_other_server_takes_over(tmp_path: Path, db_url: str):
    a = Server(tmp_path / "a", free_port(), ["--database-url", db_url])
    b = Server(tmp_path / "b", free_port(), ["--database-url", db_url])
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        a.start()
        b.data_dir.mkdir(parents=True, mode=0o700)
        shutil.copy2(a.data_dir / "server.key", b.data_dir / "server.key")  # one key for all API processes
        b.start()
        servers = {a.proc.pid: a, b.proc.pid: b}  # type: ignore[union-attr]
        epoch, pid = wait_for(lambda: _leader(engine), what="a leader")
        assert pid in servers

        boot = json.loads((a.data_dir / "bootstrap-admin.json").read_text())
        with Client(Credentials(b.endpoint, boot["access_key"], boot["secret_key"])) as c:
            # it runs until told: a file in its own outputs directory (the one host path a sandboxed job sees)
            waits = 'while [ ! -e "$DLCLOUD_OUTPUT_DIR/go" ]; do sleep 0.1; done'
            long_id = c.jobs.submit({"name": "long", "command": waits}).id
            restart = {"max_restarts": RESTARTS, "backoff_seconds": 0.2}
            c.jobs.submit({"name": "flaky", "command": "sleep 0.5; exit 3", "restart": restart})
            wait_for(lambda: c.jobs.get("long").state == "RUNNING", what="the long job to run")

            for _ in range(2):  # hand over from one server to the other, and back
                old = servers[pid]
                os.kill(pid, signal.SIGSTOP)  # it cannot notice in time: it still thinks it leads
                try:
                    _terminate_lock_session(engine)
                    epoch, pid = wait_for(
                        lambda e=epoch: (got := _leader(engine)) and got[0] > e and got,
                        timeout=30,
                        what="the other server to take over",
                    )
                    assert servers[pid] is not old
                finally:
                    os.kill(old.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
                wait_for(
                    lambda o=old: "stopped leading the scheduler" in _log(o),
                    timeout=30,
                    what="the deposed server to stop leading",
                )
                assert _leader(engine) == (epoch, pid)  # it did not take the lock back

            assert c.jobs.get("long").state == "RUNNING"
            outputs = next(o for s in (a, b) for o in s.data_dir.glob(f"runs/*/{long_id}/outputs"))
            touch_for_job(outputs / "go")
            jobs = {
                n: wait_for(lambda n=n: (j := c.jobs.get(n)).state in TERMINAL and j, timeout=120, what=n)
                for n in ("long", "flaky")
            }
        long, flaky = jobs["long"], jobs["flaky"]
        assert long.state == "SUCCEEDED" and len(long.attempts) == 1  # it ran through both handovers
        assert (flaky.state, flaky.restarts) == ("FAILED", RESTARTS), flaky.reason
        assert [(x.number, x.outcome, x.exit_code) for x in flaky.attempts] == [
            (n, "failed", 3) for n in range(1, RESTARTS + 2)
        ]
        restarts = [e.reason for e in flaky.events if e.to_state == "RESTARTING"]
        assert restarts == [
            f"attempt {n} failed with exit code 3; restart {n} of {RESTARTS} after 0.2 s"
            for n in range(1, RESTARTS + 1)
        ]
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)
            s.stop()
        engine.dispose()
    assert a.proc is not None and a.proc.returncode == 0, _log(a)[-3000:]
    assert b.proc is not None and b.proc.returncode == 0, _log(b)[-3000:]
