"""Job queries. Every lookup of a job takes its tenant's id: another tenant's job is never found.

``describe`` statements are built once at import (the API's most frequent read): executing a constant
statement skips query construction, and they run on a Core connection without ORM loading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.orm import Session

from dlcloud.schemas.jobs import JobState
from dlcloud.store import studies, tenants, waits
from dlcloud.store.ids import looks_like_id
from dlcloud.store.rows import (
    AttemptRow,
    CodeRow,
    JobDatasetRow,
    JobEventRow,
    JobRow,
    ReplicaRow,
    TenantRow,
    UserRow,
)

QUEUE_STATES = (JobState.QUEUED.value, JobState.RESTARTING.value)


def job_ref(name_or_id: str) -> Any:
    """The condition finding a job by ``name_or_id``: its id when the value has a job id's shape (no name
    may, see services.jobs.submit_job), else its name. Never both, so one value names at most one job."""
    return JobRow.id == name_or_id if looks_like_id(name_or_id, "j-") else JobRow.name == name_or_id


def get_job(s: Session, tenant_id: str, name_or_id: str, *, for_update: bool = False) -> JobRow | None:
    q = select(JobRow).where(JobRow.tenant_id == tenant_id, job_ref(name_or_id))
    if for_update:
        q = q.with_for_update()
    return s.scalars(q).first()


def name_taken(s: Session, tenant_id: str, name: str) -> bool:
    return s.scalar(select(JobRow.id).where(JobRow.tenant_id == tenant_id, JobRow.name == name)) is not None


def count_queued(s: Session, tenant_id: str) -> int:
    q = select(func.count()).select_from(JobRow).where(JobRow.tenant_id == tenant_id, JobRow.state.in_(QUEUE_STATES))
    return int(s.scalar(q) or 0)


@dataclass(frozen=True)
class SubmissionFacts:
    """What the database says of a job about to be submitted, read at once in its submit transaction."""

    tenant: TenantRow  # locked until the transaction ends: its quotas and its queue hold still meanwhile
    code: CodeRow | None  # the upload the job names, if it is the tenant's
    checkpoint_source: JobRow | None  # the tenant's job that ``checkpoint_from`` names, if any
    name_taken: bool  # a job of the tenant has the name
    trial_name_taken: bool  # the study asked about is one of the tenant's: the name is its trials'
    queued: int  # the tenant's jobs waiting in the queue


def submission_facts(
    s: Session,
    tenant_id: str,
    name: str,
    *,
    code_id: str | None,
    checkpoint_from: str | None,
    trial_study: str | None,
) -> SubmissionFacts | None:
    """The facts a submit checks its job against, the tenant locked (FOR UPDATE) first; None when the tenant
    no longer exists. ``trial_study``: the study whose trials' names ``name`` has the form of (None: ask none)."""
    tenant = tenants.get_tenant(s, tenant_id, for_update=True)
    if tenant is None:
        return None
    code = s.scalar(select(CodeRow).where(CodeRow.id == code_id, CodeRow.tenant_id == tenant_id)) if code_id else None
    return SubmissionFacts(
        tenant=tenant,
        code=code,
        checkpoint_source=get_job(s, tenant_id, checkpoint_from) if checkpoint_from is not None else None,
        name_taken=name_taken(s, tenant_id, name),
        trial_name_taken=trial_study is not None and studies.name_taken(s, tenant_id, trial_study),
        queued=count_queued(s, tenant_id),
    )


def add_job(s: Session, row: JobRow, dataset_version_ids: Sequence[str]) -> None:
    """Add a new job's row and the dataset versions it reads (which cannot be deleted while it has not ended)."""
    s.add(row)
    s.flush()
    for version_id in dataset_version_ids:
        s.add(JobDatasetRow(job_id=row.id, version_id=version_id))


def list_jobs(
    s: Session, tenant_id: str, states: list[str] | None, limit: int, offset: int
) -> list[tuple[JobRow, str | None]]:
    """The tenant's jobs, newest first, with their submitter's user name."""
    q = (
        select(JobRow, UserRow.name)
        .outerjoin(UserRow, UserRow.id == JobRow.user_id)
        .where(JobRow.tenant_id == tenant_id)
    )
    if states:
        q = q.where(JobRow.state.in_(states))
    q = q.order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(limit).offset(offset)
    return [(j, u) for j, u in s.execute(q)]


def live_attempts(s: Session, tenant_id: str) -> list[tuple[list[int], float, int]]:
    """(gpus, cpus, memory) of the tenant's attempts that have not ended."""
    q = select(AttemptRow.gpus, AttemptRow.cpus, AttemptRow.memory).where(
        AttemptRow.tenant_id == tenant_id, AttemptRow.finished_at.is_(None)
    )
    return [(list(g), float(c), int(m)) for g, c, m in s.execute(q)]


def unfinished_attempts(s: Session) -> list[tuple[int, str, str, int, str, str, bool, bool]]:
    """Every attempt that has not ended, any tenant's, with what supervision needs of its job: (attempt id, handle,
    tenant id, number, job id, job state, cancel requested, preempt requested)."""
    q = (
        select(
            AttemptRow.id,
            AttemptRow.handle,
            AttemptRow.tenant_id,
            AttemptRow.number,
            JobRow.id,
            JobRow.state,
            JobRow.cancel_requested,
            JobRow.preempt_requested,
        )
        .join(JobRow, JobRow.id == AttemptRow.job_id)
        .where(AttemptRow.finished_at.is_(None))
    )
    return [(a, h, t, n, j, st, bool(c), bool(p)) for a, h, t, n, j, st, c, p in s.execute(q)]


def ended_attempts(s: Session, job_id: str) -> list[int]:
    """The numbers of a job's attempts that have ended, in order."""
    q = select(AttemptRow.number).where(AttemptRow.job_id == job_id, AttemptRow.finished_at.is_not(None))
    return [int(n) for (n,) in s.execute(q.order_by(AttemptRow.number))]


def attempt_handles(s: Session, job_id: str) -> list[tuple[int, str, bool]]:
    """(number, executor handle, whether it ended) of a job's attempts, in order."""
    q = select(AttemptRow.number, AttemptRow.handle, AttemptRow.finished_at).where(AttemptRow.job_id == job_id)
    return [(int(n), str(d), f is not None) for n, d, f in s.execute(q.order_by(AttemptRow.number))]


def attempt_replicas(s: Session, job_id: str, attempt: int) -> list[ReplicaRow]:
    """The replica records of one attempt of a job, in the order they were placed."""
    q = select(ReplicaRow).where(ReplicaRow.job_id == job_id, ReplicaRow.attempt == attempt).order_by(ReplicaRow.id)
    return list(s.scalars(q))


def add_events(s: Session, events: list[dict[str, Any]]) -> None:
    """Insert job events (``JobEventRow`` columns) in one executemany."""
    s.execute(insert(JobEventRow), events)


def record_checkpoint(s: Session, attempt_id: int, at: datetime) -> None:
    """The attempt's last change to its checkpoint directory is ``at``, unless a later one is recorded."""
    s.execute(
        update(AttemptRow)
        .where(AttemptRow.id == attempt_id, or_(AttemptRow.checkpoint_at.is_(None), AttemptRow.checkpoint_at < at))
        .values(checkpoint_at=at)
    )


def live_handle(conn: Connection, job_id: str) -> str | None:
    """The executor handle of the job's attempt that has not ended, if one has not."""
    q = select(AttemptRow.handle).where(AttemptRow.job_id == job_id, AttemptRow.finished_at.is_(None))
    handle = conn.execute(q.order_by(AttemptRow.number.desc()).limit(1)).scalar()
    return str(handle) if handle is not None else None


_jobs, _users = JobRow.__table__, UserRow.__table__
_events, _attempts, _replicas = JobEventRow.__table__, AttemptRow.__table__, ReplicaRow.__table__
_DESCRIBE_JOB = (
    select(_jobs, _users.c.name.label("user_name"), waits.WAIT_REASON, waits.ESTIMATED_START)
    .select_from(waits.with_waits(_jobs.outerjoin(_users, _users.c.id == _jobs.c.user_id)))
    .where(_jobs.c.tenant_id == bindparam("tenant_id"))
)
_DESCRIBE_JOB_BY_NAME = _DESCRIBE_JOB.where(_jobs.c.name == bindparam("name_or_id"))
_DESCRIBE_JOB_BY_ID = _DESCRIBE_JOB.where(_jobs.c.id == bindparam("name_or_id"))  # see job_ref
_DESCRIBE_EVENTS = (
    select(_events.c.time, _events.c.from_state, _events.c.to_state, _events.c.reason, _events.c.attempt)
    .where(_events.c.job_id == bindparam("job_id"))
    .order_by(_events.c.id)
)
_DESCRIBE_ATTEMPTS = (
    select(
        _attempts.c.number,
        _attempts.c.host,
        _attempts.c.gpus,
        _attempts.c.cpus,
        _attempts.c.memory,
        _attempts.c.started_at,
        _attempts.c.finished_at,
        _attempts.c.exit_code,
        _attempts.c.outcome,
        _attempts.c.ports,
        _attempts.c.checkpoint_at,
    )
    .where(_attempts.c.job_id == bindparam("job_id"))
    .order_by(_attempts.c.number)
)
_DESCRIBE_REPLICAS = (
    select(
        _replicas.c.attempt,
        _replicas.c.name,
        _replicas.c.role,
        _replicas.c.index,
        _replicas.c.host,
        _replicas.c.gpus,
        _replicas.c.cpus,
        _replicas.c.memory,
        _replicas.c.ports,
        _replicas.c.state,
        _replicas.c.exit_code,
    )
    .where(_replicas.c.job_id == bindparam("job_id"))
    .order_by(_replicas.c.attempt, _replicas.c.id)
)
_JOBS_AHEAD = (
    select(func.count())
    .select_from(_jobs)
    .where(
        _jobs.c.state.in_(QUEUE_STATES),
        or_(
            _jobs.c.priority > bindparam("priority"),
            and_(
                _jobs.c.priority == bindparam("priority"),
                or_(
                    _jobs.c.created_at < bindparam("created_at"),
                    and_(_jobs.c.created_at == bindparam("created_at"), _jobs.c.id < bindparam("job_id")),
                ),
            ),
        ),
    )
)


def describe_row(conn: Connection, tenant_id: str, name_or_id: str) -> Row[Any] | None:
    """The job (with ``user_name``) for describe."""
    by = _DESCRIBE_JOB_BY_ID if looks_like_id(name_or_id, "j-") else _DESCRIBE_JOB_BY_NAME
    return conn.execute(by, {"tenant_id": tenant_id, "name_or_id": name_or_id}).first()


def describe_events(conn: Connection, job_id: str) -> list[Row[Any]]:
    return [*conn.execute(_DESCRIBE_EVENTS, {"job_id": job_id})]


def describe_attempts(conn: Connection, job_id: str) -> list[Row[Any]]:
    return [*conn.execute(_DESCRIBE_ATTEMPTS, {"job_id": job_id})]


def describe_replicas(conn: Connection, job_id: str) -> list[Row[Any]]:
    return [*conn.execute(_DESCRIBE_REPLICAS, {"job_id": job_id})]


def jobs_ahead(conn: Connection, tenant_id: str | None, job_id: str, priority: int, created_at: Any) -> int:
    """Queued jobs of ``tenant_id`` (None: of every tenant) before this one in the queue's order: priority, then
    submission order."""
    q = _JOBS_AHEAD if tenant_id is None else _JOBS_AHEAD.where(_jobs.c.tenant_id == tenant_id)
    ahead = conn.execute(q, {"priority": priority, "created_at": created_at, "job_id": job_id}).scalar()
    return int(ahead or 0)


_tenants = TenantRow.__table__
_QUEUE = (
    select(
        _jobs.c.id,
        _jobs.c.name,
        _jobs.c.user_id,
        _jobs.c.state,
        _jobs.c.priority,
        _jobs.c.priority_class,
        _jobs.c.gpus,
        _jobs.c.cpus,
        _jobs.c.memory,
        _jobs.c.preemptible,
        _jobs.c.preemptions,
        _jobs.c.created_at,
        waits.WAIT_REASON,
        waits.ESTIMATED_START,
        _tenants.c.name.label("tenant_name"),
        _users.c.name.label("user_name"),
    )
    .select_from(
        waits.with_waits(
            _jobs.join(_tenants, _tenants.c.id == _jobs.c.tenant_id).outerjoin(_users, _users.c.id == _jobs.c.user_id)
        )
    )
    .where(_jobs.c.state.in_(QUEUE_STATES))
    .order_by(_jobs.c.priority.desc(), _jobs.c.created_at, _jobs.c.id)
)


def queue_rows(conn: Connection, tenant_id: str | None, limit: int) -> list[Row[Any]]:
    """Waiting jobs in the queue's order, of one tenant (None: every tenant's), with tenant and user names."""
    q = _QUEUE if tenant_id is None else _QUEUE.where(_jobs.c.tenant_id == tenant_id)
    return [*conn.execute(q.limit(limit))]


def scheduling_figures(conn: Connection) -> dict[str, dict[str, Any]]:
    """Per tenant name: ``waits`` (the submit times of its queued jobs), ``gpus`` (held by its live attempts) and
    ``preemptions`` (of its jobs not deleted); for /metrics."""
    names = dict(conn.execute(select(TenantRow.id, TenantRow.name)).all())
    out: dict[str, dict[str, Any]] = {}

    def of(tenant_id: str) -> dict[str, Any]:
        return out.setdefault(names.get(tenant_id, tenant_id), {"waits": [], "gpus": 0, "preemptions": 0})

    queued = select(JobRow.tenant_id, JobRow.created_at).where(JobRow.state.in_(QUEUE_STATES))
    for tid, created in conn.execute(queued):
        of(tid)["waits"].append(created)
    live = select(AttemptRow.tenant_id, AttemptRow.gpus).where(AttemptRow.finished_at.is_(None))
    for tid, held in conn.execute(live):
        of(tid)["gpus"] += len(held or [])
    for tid, n in conn.execute(select(JobRow.tenant_id, func.sum(JobRow.preemptions)).group_by(JobRow.tenant_id)):
        of(tid)["preemptions"] += int(n or 0)  # every tenant with jobs: a counter that is there from the start
    return out
