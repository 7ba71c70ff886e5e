"""The job state machine. Every job state change goes through ``transition`` in this module.

    QUEUED ──> STARTING ──> RUNNING ──> SUCCEEDED | FAILED | CANCELLED | TIMED_OUT
       │          │  └──────────┴──> RESTARTING ──> STARTING (a new attempt, after the backoff)
       │          └──────────┴──> PREEMPTED ──> QUEUED (its attempt stopped for another job; same place)
       └──────────┴──> CANCELLED      (RESTARTING ──> CANCELLED)
       └──> FAILED                    (RESTARTING ──> FAILED): its environment failed to build

A transition not in ``ALLOWED`` is a programming error (InvalidState). Each change is recorded as a
JobEvent with a human-readable reason.

The rules of how an attempt's end moves its job live here too: ``end_attempt`` (cancelled, timed out,
succeeded or failed, by what the executor reported) and ``fail_or_restart`` (the restart policy: exit codes
that never or only restart, ``max_restarts``, the backoff). The control loop reports; this module decides.

Preemption (docs/scheduling.md): the scheduling pass sets ``preempt_requested`` (``request_preemption``); the
supervision stops the attempt as it stops a cancelled one; when the attempt has ended, ``end_attempt`` moves
the job PREEMPTED and at once QUEUED again (``requeue_preempted``): two events, ``created_at`` kept (its place
in the queue), ``restarts`` untouched, ``preemptions`` + 1. A cancel wins over a preemption: CANCELLED. An
attempt that ends on its own before the stop reaches it (exit 0, not stopped) ends as it would have.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from dlcloud.errors import InvalidState
from dlcloud.scheduler import attempts
from dlcloud.scheduler.attempts import AttemptEnd
from dlcloud.schemas.jobs import TERMINAL_STATES, JobState
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import AttemptRow, JobEventRow, JobRow, utcnow

S = JobState
ALLOWED: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.RESTARTING, S.PREEMPTED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.RESTARTING, S.PREEMPTED}),
    S.PREEMPTED: frozenset({S.QUEUED}),
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
        job.preempt_requested = False
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


def note(s: Session, job: JobRow, reason: str, at: datetime | None = None) -> None:
    """An event that changes no state (its from and to states are the job's current one), for what the job's
    owner must learn, e.g. that its outputs could not be saved."""
    s.add(
        JobEventRow(
            job_id=job.id,
            tenant_id=job.tenant_id,
            time=at or utcnow(),
            from_state=job.state,
            to_state=job.state,
            reason=reason,
            attempt=job.attempt,
        )
    )


def add_events(s: Session, events: list[dict[str, Any]]) -> None:
    """Insert the events that ``transition(..., events=...)`` collected."""
    if events:
        job_store.add_events(s, events)


def fail_or_restart(s: Session, job: JobRow, why: str, now: datetime, code: int | None = None) -> None:
    """An attempt failed (or was lost): RESTARTING after the backoff while restarts are left and the exit
    code allows one, else FAILED."""
    policy = job.spec.get("restart") or {}
    never = policy.get("never_restart_on_exit_codes") or []
    only = policy.get("restart_on_exit_codes") or []
    if code is not None and (code in never or (only and code not in only)):
        listed = "never_restart_on_exit_codes" if code in never else "not in restart_on_exit_codes"
        transition(s, job, S.FAILED, f"{why} (exit code {code}: {listed}, no restart)", at=now)
        return
    if job.restarts < job.max_restarts:
        job.restarts += 1
        job.not_before = now + timedelta(seconds=job.backoff_seconds)
        transition(
            s,
            job,
            S.RESTARTING,
            f"{why}; restart {job.restarts} of {job.max_restarts} after {job.backoff_seconds:g} s",
            at=now,
        )
    else:
        tail = f" (restarts exhausted: {job.restarts} of {job.max_restarts})" if job.max_restarts else ""
        transition(s, job, S.FAILED, why + tail, at=now)


def request_preemption(s: Session, job: JobRow, reason: str, *, at: datetime | None = None) -> bool:
    """Ask for ``job``'s live attempt to be stopped for another job (``reason`` names it); False when it is
    not running, is already being stopped (preempted or cancelled) or may not be preempted."""
    if JobState(job.state) not in (S.STARTING, S.RUNNING):
        return False
    if job.preempt_requested or job.cancel_requested or not job.preemptible:
        return False
    job.preempt_requested = True
    job.preempt_reason = reason
    note(s, job, reason, at=at)
    return True


def requeue_preempted(s: Session, job: JobRow, attempt: AttemptRow, now: datetime, detail: str = "") -> None:
    """The preempted attempt has ended: PREEMPTED, then QUEUED again in its old place (``created_at`` is kept);
    restarts are not counted, preemptions are."""
    attempt.outcome = AttemptEnd.PREEMPTED.value
    why = job.preempt_reason or "preempted"
    transition(s, job, S.PREEMPTED, f"{why}; attempt {job.attempt} stopped{detail}", at=now)
    again = attempts.requeue_after_preemption(job.created_at, job.restarts, job.preemptions)
    job.preempt_requested = False
    job.preemptions = again.preemptions
    job.restarts = again.restarts
    job.not_before = again.not_before
    transition(
        s,
        job,
        S.QUEUED,
        f"queued again after preemption {job.preemptions}, in its place (submitted "
        f"{job.created_at.isoformat(timespec='seconds')}); it resumes from its checkpoint",
        at=now,
    )


def account_attempt(job: JobRow, attempt: AttemptRow, now: datetime) -> None:
    """Add the ended attempt's GPU-seconds to the job's attained service (the las policy reads it)."""
    gpus = len(attempt.gpus or [])
    if gpus and attempt.started_at is not None:
        job.attained_gpu_seconds = (job.attained_gpu_seconds or 0.0) + gpus * max(
            0.0, (now - attempt.started_at).total_seconds()
        )


def end_attempt(
    s: Session,
    job: JobRow,
    attempt: AttemptRow,
    *,
    exit_code: int | None,
    started_at: datetime | None,
    now: datetime,
    stopped: bool,
    timed_out: bool,
    failure: str,
    note: str = "",
) -> None:
    """The attempt ended with ``exit_code``: record its outcome and move the job. ``started_at``: when its
    process started (a job never seen running ran then); ``stopped``: ended by a stop the control plane sent;
    ``failure``: how to say what failed, if it did; ``note``: appended to every reason (what the post command
    did)."""
    if JobState(job.state) == S.STARTING:
        transition(s, job, S.RUNNING, f"attempt {job.attempt} ran", at=started_at)
    account_attempt(job, attempt, now)
    end = attempts.attempt_end(  # the rules the trace simulator replays too
        exit_code=exit_code,
        stopped=stopped,
        timed_out=timed_out,
        cancel_requested=job.cancel_requested,
        preempt_requested=job.preempt_requested,
    )
    attempt.outcome = end.value
    if end is AttemptEnd.PREEMPTED:
        requeue_preempted(s, job, attempt, now, f" (exit code {exit_code}){note}")
    elif end is AttemptEnd.CANCELLED:
        transition(s, job, S.CANCELLED, f"cancelled; exit code {exit_code}{note}", at=now)
    elif end is AttemptEnd.TIMED_OUT:
        limit = f"{job.timeout_seconds:g} s" if job.timeout_seconds else "its limit"
        transition(s, job, S.TIMED_OUT, f"ran longer than the timeout of {limit}{note}", at=now)
    elif end is AttemptEnd.SUCCEEDED:
        transition(s, job, S.SUCCEEDED, f"exit code 0{note}", at=now)
    else:
        fail_or_restart(s, job, failure + note, now, exit_code)
