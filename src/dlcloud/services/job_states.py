"""The job state machine. Every job state change goes through ``transition`` in this module.

    QUEUED ──> STARTING ──> RUNNING ──> SUCCEEDED | FAILED | CANCELLED | TIMED_OUT
       │          │  └──────────┴──> RESTARTING ──> STARTING (a new attempt, after the backoff)
       └──────────┴──> CANCELLED      (RESTARTING ──> CANCELLED)
       └──> FAILED                    (RESTARTING ──> FAILED): its environment failed to build

A transition not in ``ALLOWED`` is a programming error (InvalidState). Each change is recorded as a
JobEvent with a human-readable reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from dlcloud.errors import InvalidState
from dlcloud.schemas.jobs import TERMINAL_STATES, JobState
from dlcloud.store.rows import JobEventRow, JobRow, utcnow

S = JobState
ALLOWED: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.RESTARTING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.RESTARTING}),
    S.RESTARTING: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}


def record_created(s: Session, job: JobRow, reason: str) -> None:
    s.add(
        JobEventRow(
            job_id=job.id,
            tenant_id=job.tenant_id,
            time=job.created_at,
            from_state=None,
            to_state=job.state,
            reason=reason,
            attempt=job.attempt,
        )
    )


def transition(
    s: Session,
    job: JobRow,
    to: JobState,
    reason: str,
    *,
    at: datetime | None = None,
    events: list[dict[str, Any]] | None = None,
) -> None:
    """Move ``job`` to ``to`` and record the JobEvent. With ``events`` the event is appended there as a
    row for ``add_events`` instead of being added to the session: the scheduler records hundreds of
    transitions in one pass, and one bulk insert beats one INSERT ... RETURNING per event on SQLite."""
    current = JobState(job.state)
    if to not in ALLOWED[current]:
        raise InvalidState(f"job {job.name} cannot go from {current} to {to}")
    now = at or utcnow()
    job.state = to.value
    job.reason = reason
    if to == S.RUNNING and job.started_at is None:
        job.started_at = now
    if to in TERMINAL_STATES:
        job.finished_at = now
        job.wait_reason = None
    if to in (S.STARTING, S.RUNNING):
        job.wait_reason = None
    event = {
        "job_id": job.id,
        "tenant_id": job.tenant_id,
        "time": now,
        "from_state": current.value,
        "to_state": to.value,
        "reason": reason,
        "attempt": job.attempt,
    }
    if events is None:
        s.add(JobEventRow(**event))
    else:
        events.append(event)


def add_events(s: Session, events: list[dict[str, Any]]) -> None:
    """Insert the events that ``transition(..., events=...)`` collected."""
    if events:
        s.execute(insert(JobEventRow), events)
