"""What the scheduling pass reads and writes besides the queue (store/queue.py): live attempts, recent usage,
tenants' limits and names, the jobs it changes (locked), and the attempts and replicas it records.

Every read is one query (or one per chunk of ids); the pass runs them inside its one write transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, insert, or_, select, text
from sqlalchemy.engine import Connection, Result, Row
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from dlcloud.store.rows import AttemptRow, CodeRow, JobRow, ReplicaRow, TenantRow

SCHEDULE_LOCK_ID = 0x646C636C6F7565  # PostgreSQL advisory lock: one scheduling pass at a time
_CHUNK = 500  # ids in one query's IN list where rows are loaded into the session

_LIVE_ATTEMPTS = select(
    AttemptRow.tenant_id,
    AttemptRow.gpus,
    AttemptRow.cpus,
    AttemptRow.memory,
    AttemptRow.job_id,
    AttemptRow.started_at,
    AttemptRow.checkpoint_at,
    JobRow.priority,
    JobRow.created_at,
    JobRow.preemptible,
    JobRow.max_run_time_seconds,
    JobRow.attained_gpu_seconds,
    JobRow.cancel_requested,
    JobRow.preempt_requested,
    JobRow.preemptions,
    JobRow.hold_gpus,
    JobRow.hold_until,
    AttemptRow.turn_until,
).outerjoin(JobRow, JobRow.id == AttemptRow.job_id)

_TENANT_LIMITS = select(
    TenantRow.id,
    TenantRow.quota_gpus,
    TenantRow.quota_cpus,
    TenantRow.quota_memory,
    TenantRow.quota_max_running_jobs,
    TenantRow.guarantee_gpus,
    TenantRow.guarantee_cpus,
    TenantRow.guarantee_memory,
    TenantRow.borrow_gpus,
    TenantRow.borrow_cpus,
    TenantRow.borrow_memory,
    TenantRow.weight,
)


def lock_pass(s: Session) -> None:
    """Passes must not interleave (two would place the same job); SQLite's BEGIN IMMEDIATE already serialises
    them, PostgreSQL needs this transaction-scoped lock. Call it on PostgreSQL only."""
    s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEDULE_LOCK_ID})


def live_attempts(conn: Connection) -> Iterable[Row[Any]]:
    """Every live attempt with its job's columns the policies weigh (None where the job row is gone)."""
    return conn.execute(_LIVE_ATTEMPTS.where(AttemptRow.finished_at.is_(None)))


def recent_attempts(since: datetime) -> Select[str, int, datetime, datetime | None, datetime | None]:
    """The attempts that count towards usage since ``since``: live, ended since, or placed for a turn that ends
    since. Each term has its index (ix_attempts_live, ix_attempts_turns), so the read does not grow with the
    attempts history; the database counts the GPUs (not Python, from each row's JSON list)."""
    a = AttemptRow
    return select(a.tenant_id, func.json_array_length(a.gpus), a.started_at, a.finished_at, a.turn_until).where(
        or_(a.finished_at.is_(None), a.finished_at > since, a.turn_until > since)
    )


def read_recent_attempts(
    conn: Connection, since: datetime
) -> Result[str, int, datetime, datetime | None, datetime | None]:
    """(tenant id, GPU count, started at, finished at, turn until) of ``recent_attempts(since)``."""
    return conn.execute(recent_attempts(since))


def tenant_limits(conn: Connection) -> Iterable[Row[Any]]:
    """Every tenant's quota and fair-share terms (``_TENANT_LIMITS``'s columns)."""
    return conn.execute(_TENANT_LIMITS)


def job_tenant_and_name(conn: Connection, job_id: str) -> tuple[str, str] | None:
    row = conn.execute(select(JobRow.tenant_id, JobRow.name).where(JobRow.id == job_id)).first()
    return (row.tenant_id, row.name) if row is not None else None


def tenant_names(conn: Connection) -> dict[str, str]:
    return dict(conn.execute(select(TenantRow.id, TenantRow.name)).all())


def lock_jobs(s: Session, job_ids: Sequence[str]) -> dict[str, JobRow]:
    """The jobs ``job_ids`` that still exist, locked, by id."""
    jobs: dict[str, JobRow] = {}
    for lo in range(0, len(job_ids), _CHUNK):
        q = select(JobRow).where(JobRow.id.in_(job_ids[lo : lo + _CHUNK])).with_for_update()
        jobs.update((j.id, j) for j in s.scalars(q))
    return jobs


def load_tenants_and_code(s: Session, jobs: Iterable[JobRow]) -> list[object]:
    """The tenant and code rows of ``jobs``, loaded into the session's identity map (the caller holds the list:
    the map references rows weakly)."""
    jobs = list(jobs)
    tenant_ids = sorted({j.tenant_id for j in jobs})
    rows: list[object] = []
    rows.extend(s.scalars(select(TenantRow).where(TenantRow.id.in_(tenant_ids))))
    code_ids = sorted({j.code_id for j in jobs if j.code_id})
    for lo in range(0, len(code_ids), _CHUNK):
        rows.extend(s.scalars(select(CodeRow).where(CodeRow.id.in_(code_ids[lo : lo + _CHUNK]))))
    return rows


def insert_attempts(s: Session, attempts: list[dict[str, Any]], replicas: list[dict[str, Any]]) -> None:
    """The attempts and replicas a pass recorded: one bulk insert each (none when there are none)."""
    if attempts:
        s.execute(insert(AttemptRow), attempts)
    if replicas:
        s.execute(insert(ReplicaRow), replicas)


def write_columns(job: JobRow, columns: Iterable[str]) -> None:
    """Have the flush write ``columns`` of the job whether they changed or not (so that alike UPDATEs batch)."""
    for column in columns:
        flag_modified(job, column)
