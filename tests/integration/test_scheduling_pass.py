"""The scheduling pass's writes, on SQLite and PostgreSQL: a placing pass costs the same statements whether it
places 3 jobs or 30 (no query, flush or UPDATE per placed job), and the wait reasons of many queued jobs are
written in one go."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm.exc import StaleDataError

from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import AttemptRow, JobEventRow, JobRow, utcnow
from tests.conftest import Env, build_env, make_settings
from tests.integration.test_quotas import enqueue

GiB = 1024**3


@pytest.fixture
def roomy_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """A control loop over a SimulatedExecutor on a host with room for 64 one-CPU jobs."""
    settings = make_settings(tmp_path, db_url, cpu_capacity=64, memory_capacity_bytes=128 * GiB)
    e = build_env(settings, SimulatedExecutor())
    with e.http:
        yield e
    e.platform.db.dispose()


def _statements_of_a_pass(env: Env) -> tuple[int, int]:
    """(jobs placed, statements sent to the database: an executemany counts once) of one scheduling pass."""
    sent: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        sent.append(statement)

    engine = env.platform.db.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        assert env.control is not None
        placed = env.control.schedule()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return placed, len(sent)


def test_a_placing_pass_sends_as_many_statements_for_30_jobs_as_for_3(roomy_env: Env) -> None:
    for tenant in ("small", "large"):
        roomy_env.new_tenant_user(tenant, "alice")
    enqueue(roomy_env, "small", "alice", 3, gpus=0)
    placed_3, statements_3 = _statements_of_a_pass(roomy_env)
    enqueue(roomy_env, "large", "alice", 30, gpus=0)
    placed_30, statements_30 = _statements_of_a_pass(roomy_env)

    assert (placed_3, placed_30) == (3, 30)
    assert statements_30 == statements_3
    with roomy_env.platform.db.read() as s:
        states = s.scalars(select(JobRow.state)).all()
        attempts = s.scalar(select(AttemptRow.id).order_by(AttemptRow.id.desc()).limit(1))
        placed_events = s.scalars(select(JobEventRow.reason).where(JobEventRow.to_state == "STARTING")).all()
    assert states == ["STARTING"] * 33
    assert attempts == 33
    assert len(placed_events) == 33 and all("attempt 1 placed on testhost" in r for r in placed_events)


def test_wait_reasons_of_many_jobs_are_set_and_a_vanished_job_fails_the_write(env: Env) -> None:
    env.new_tenant_user("lab", "alice")
    enqueue(env, "lab", "alice", 300, gpus=0)
    db = env.platform.db
    with db.read() as s:
        ids = s.scalars(select(JobRow.id).order_by(JobRow.created_at)).all()
    now = utcnow().replace(microsecond=123456)
    waits = [
        (job_id, f"waiting {i}" if i % 3 else None, now + timedelta(seconds=i) if i % 2 else None)
        for i, job_id in enumerate(ids)
    ]
    with db.write() as s:
        job_store.set_wait_reasons(s.connection(), waits)
    with db.read() as s:
        rows = s.execute(select(JobRow.id, JobRow.wait_reason, JobRow.estimated_start)).all()
    stored = {job_id: (job_id, reason, start) for job_id, reason, start in rows}
    assert [stored[job_id] for job_id in ids] == waits

    with pytest.raises(StaleDataError, match="expected 2 row"), db.write() as s:
        job_store.set_wait_reasons(s.connection(), [(ids[0], "again", None), ("j-0000000000000000", "gone", None)])
    with db.read() as s:  # rolled back whole
        assert s.scalar(select(JobRow.wait_reason).where(JobRow.id == ids[0])) is None
