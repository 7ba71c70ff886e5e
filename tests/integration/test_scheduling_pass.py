"""The scheduling pass, on SQLite and PostgreSQL. Its writes: a placing pass costs the same statements whether it
places 3 jobs or 30 (no query, flush or UPDATE per placed job), the wait reasons of many queued jobs are written in
one go, and an idle pass over an unchanged queue writes nothing. What it reads: the queued jobs it keeps from pass to
pass (``QueueCache``) are those of the queue as it is now: a job whose row changed is planned as it is now, a hold
is that of its environment's build now, and jobs that left the queue are dropped."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select, update
from sqlalchemy.orm.exc import StaleDataError

from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import AttemptRow, EnvironmentBuildRow, JobEventRow, JobRow, utcnow
from tests.conftest import Env, build_env, make_settings
from tests.integration.test_quotas import enqueue, finish, running_names, spec

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
    placed, sent = _sent_by_a_pass(env)
    return placed, len(sent)


def _sent_by_a_pass(env: Env) -> tuple[int, list[str]]:
    """(jobs placed, the statements sent to the database) of one scheduling pass."""
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
    return placed, sent


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


@pytest.fixture
def sim_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """The API plus a control loop over a SimulatedExecutor (fair-share, 2 GPUs), driven by the test."""
    e = build_env(make_settings(tmp_path, db_url), SimulatedExecutor())
    with e.http:
        yield e
    e.platform.db.dispose()


def _update_job(env: Env, name: str, **values: Any) -> None:
    with env.platform.db.write() as s:
        s.execute(update(JobRow).where(JobRow.name == name).values(**values))


def _queued(env: Env) -> int:
    with env.platform.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.state == "QUEUED")) or 0)


def _hog_the_host(env: Env) -> None:
    """Another tenant's job takes both GPUs: what is queued next waits."""
    assert env.control is not None
    env.new_tenant_user("other", "olga").jobs.submit(spec("hog", gpus=2))
    assert env.control.schedule() == 1


@pytest.mark.parametrize(
    ("name", "values"),
    [
        pytest.param("newer", {"priority": 5}, id="priority"),
        pytest.param("newer", {"reclaiming": True}, id="reclaiming"),  # an earlier pass preempted for it
        pytest.param("older", {"not_before": timedelta(hours=1)}, id="restart-backoff"),
        pytest.param("older", {"attained_gpu_seconds": 1e6}, id="attained-service"),  # back after long service
    ],
)
def test_a_queued_job_whose_row_changed_is_planned_as_it_is_now(
    sim_env: Env, name: str, values: dict[str, Any]
) -> None:
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    env.admin.jobs.submit(spec("older", gpus=2))
    env.admin.jobs.submit(spec("newer", gpus=2))
    assert control.schedule() == 0  # both wait, as the pass has read them
    assert len(control.scheduling.queue) == 2

    now = utcnow()
    _update_job(env, name, **{k: now + v if isinstance(v, timedelta) else v for k, v in values.items()})
    finish(env, "hog")
    assert control.schedule() == 1
    assert running_names(env) == ["newer"]


def test_a_queued_jobs_hold_is_its_environment_build_as_it_is_now(sim_env: Env) -> None:
    """The job's row does not change, its environment's build does: held while it builds, failed when it fails."""
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    env.admin.jobs.submit(spec("trainer", gpus=2))
    _update_job(env, "trainer", environment="torch", environment_hash="h-torch")
    with env.platform.db.write() as s:
        s.execute(
            insert(EnvironmentBuildRow),
            [{"spec_hash": "h-torch", "state": "READY", "spec": {}, "error": None, "created_at": utcnow()}],
        )
    assert control.schedule() == 0
    assert env.admin.jobs.get("trainer")["wait_reason"].startswith("waiting for capacity")

    def build(state: str, error: str | None = None) -> None:
        with env.platform.db.write() as s:
            s.execute(
                update(EnvironmentBuildRow)
                .where(EnvironmentBuildRow.spec_hash == "h-torch")
                .values(state=state, error=error)
            )

    build("BUILDING")  # rebuilt (a new version of a package it pins, say)
    assert control.schedule() == 0
    assert env.admin.jobs.get("trainer")["wait_reason"] == "environment 'torch' is building"
    build("READY")
    assert control.schedule() == 0
    assert env.admin.jobs.get("trainer")["wait_reason"].startswith("waiting for capacity")
    build("FAILED", "no matching distribution for torch==9.9")
    assert control.schedule() == 0
    job = env.admin.jobs.get("trainer")
    assert job["state"] == "FAILED"
    assert "environment 'torch' failed to build: no matching distribution" in job["reason"]
    assert len(control.scheduling.queue) == 0


def test_the_pass_keeps_the_queued_jobs_and_no_others(sim_env: Env) -> None:
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    enqueue(env, "default", "admin", 20, gpus=1)
    assert control.schedule() == 0
    assert len(control.scheduling.queue) == _queued(env) == 20
    for i in range(5):
        env.admin.jobs.cancel(f"bulk-{i}")
    finish(env, "hog")
    assert control.schedule() == 2
    assert len(control.scheduling.queue) == _queued(env) == 13
    for _ in range(3):
        finish(env, *running_names(env))
        assert control.schedule() == 2
    assert len(control.scheduling.queue) == _queued(env) == 7


def test_an_idle_pass_over_an_unchanged_queue_writes_nothing(sim_env: Env) -> None:
    """Every GPU is busy, jobs wait (one holds the reservation): once their reasons are written, a pass reads and
    plans, and sends no UPDATE or INSERT."""
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    for name in ("big", "small-1", "small-2"):
        env.admin.jobs.submit(spec(name, gpus=2 if name == "big" else 1))
    control.schedule()
    control.schedule()  # the reasons settle
    assert env.admin.jobs.get("big")["wait_reason"].startswith("waiting for capacity")
    placed, sent = _sent_by_a_pass(env)
    assert placed == 0
    writes = [st for st in sent if st.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    assert writes == []
