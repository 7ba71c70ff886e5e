"""Job metric queries. Reads take the job's id, found beforehand through its tenant (services/metrics.py).

Points are upserted: storing a (job, attempt, replica, metric, step) again overwrites its value and time, so
a retried push never adds rows. The dialect's own ``INSERT ... ON CONFLICT DO UPDATE`` does it on SQLite and
PostgreSQL alike, in one executemany.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from dlcloud.store.rows import AttemptRow, JobMetricRow, JobRow, ReplicaRow, TenantRow

_KEY = ("job_id", "attempt", "replica", "metric", "step")


def reading_attempts(
    s: Session, *, ids: Sequence[int] | None = None, ended_since: datetime | None = None
) -> list[tuple[int, str, str, str, int, datetime, int | None, float, datetime | None]]:
    """(attempt id, handle, job id, tenant id, number, started at, the tenant's sandbox slot, cpus, finished at) of
    the attempts whose event files are read, their jobs still there: every attempt that has not ended (no
    argument), those of ``ids`` whether ended or not, or those that ended after ``ended_since``."""
    q = (
        select(
            AttemptRow.id,
            AttemptRow.handle,
            AttemptRow.job_id,
            AttemptRow.tenant_id,
            AttemptRow.number,
            AttemptRow.started_at,
            TenantRow.sandbox_slot,
            AttemptRow.cpus,
            AttemptRow.finished_at,
        )
        .join(JobRow, JobRow.id == AttemptRow.job_id)
        .join(TenantRow, TenantRow.id == AttemptRow.tenant_id)
        .order_by(AttemptRow.id)
    )
    if ids is not None:
        rows = []
        for i in range(0, len(ids), 500):  # bounded IN lists
            rows += [tuple(r) for r in s.execute(q.where(AttemptRow.id.in_(list(ids[i : i + 500]))))]
        return rows  # type: ignore[return-value]
    if ended_since is not None:
        q = q.where(AttemptRow.finished_at > ended_since)
    else:
        q = q.where(AttemptRow.finished_at.is_(None))
    return [tuple(r) for r in s.execute(q)]  # type: ignore[misc]


def replica_names(s: Session, attempts: Sequence[tuple[str, int]]) -> dict[tuple[str, int], list[str]]:
    """The names of the replicas of each (job id, attempt) that is a gang's (an attempt of one process has none)."""
    wanted = set(attempts)
    out: dict[tuple[str, int], list[str]] = {}
    jobs = sorted({job for job, _ in wanted})
    for i in range(0, len(jobs), 500):  # bounded IN lists
        r = ReplicaRow
        q = select(r.job_id, r.attempt, r.name).where(r.job_id.in_(jobs[i : i + 500]))
        for job_id, attempt, name in s.execute(q):
            if (job_id, attempt) in wanted:
                out.setdefault((job_id, attempt), []).append(name)
    return out


def attempt_end(s: Session, tenant_id: str, job_id: str, attempt: int) -> tuple[bool, datetime | None]:
    """(whether the job exists in the tenant with that attempt, when the attempt ended: None while it runs)."""
    q = (
        select(AttemptRow.finished_at)
        .join(JobRow, JobRow.id == AttemptRow.job_id)
        .where(
            AttemptRow.job_id == job_id,
            AttemptRow.number == attempt,
            JobRow.tenant_id == tenant_id,
            AttemptRow.tenant_id == tenant_id,
        )
    )
    found = s.execute(q).first()
    return (False, None) if found is None else (True, found[0])


def upsert_points(s: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Store ``rows`` (JobMetricRow's columns each; no two with the same key), overwriting earlier values."""
    if not rows:
        return
    dialect = s.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(JobMetricRow)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(_KEY), set_={"value": stmt.excluded.value, "time": stmt.excluded.time}
    )
    s.execute(stmt, list(rows))


def read_points(
    s: Session, job_id: str, metrics: Sequence[str], attempt: int | None, replica: str | None
) -> list[tuple[str, int, str, int, float, datetime]]:
    """(metric, attempt, replica, step, value, time) of a job's points, ordered by series then step."""
    m = JobMetricRow
    q = select(m.metric, m.attempt, m.replica, m.step, m.value, m.time).where(m.job_id == job_id)
    if metrics:
        q = q.where(m.metric.in_(list(metrics)))
    if attempt is not None:
        q = q.where(m.attempt == attempt)
    if replica is not None:
        q = q.where(m.replica == replica)
    rows = s.execute(q.order_by(m.metric, m.attempt, m.replica, m.step))
    return [(r.metric, r.attempt, r.replica, r.step, r.value, r.time) for r in rows]
