"""Jobs as users see them: submit, list, describe, cancel, delete.

State changes go through ``job_states.transition``; running attempts are driven by ``control/loop.py``.

A submit (``create_job_row``, for ``submit_job`` and the study driver's trials) runs four phases, each once,
top to bottom: plan the spec alone (``job_drafts``), read what the database says of it
(``store.jobs.submission_facts``), check the draft against that (``job_checks``, with the environment and the
datasets resolved by their own services), write the row (``store.jobs.add_job``, then
``job_states.record_created``).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from dlcloud.errors import DlcloudError, InvalidState, NotFound
from dlcloud.schemas.jobs import (
    SECRET_MASK,
    TERMINAL_STATES,
    Job,
    JobAttempt,
    JobDatasetVersion,
    JobDetail,
    JobEvent,
    JobPlatformState,
    JobReplica,
    JobResolved,
    JobSpec,
    JobState,
    QueueEntry,
    ResolvedDataset,
)
from dlcloud.services import admission, datasets, environments, job_checks, job_drafts, job_states
from dlcloud.services.auth import Caller
from dlcloud.services.isolation import require_isolation
from dlcloud.services.job_drafts import JobDraft
from dlcloud.services.job_keys import job_prefix
from dlcloud.services.platform import Platform
from dlcloud.store import jobs as job_store
from dlcloud.store import tenants as tenant_store
from dlcloud.store.ids import new_id
from dlcloud.store.jobs import SubmissionFacts
from dlcloud.store.rows import JobRow, utcnow
from dlcloud.templates import catalog

log = logging.getLogger(__name__)
QUEUE_STATES = (JobState.QUEUED.value, JobState.RESTARTING.value)


def _job_model(row: JobRow, tenant: str, user: str) -> Job:
    return Job(**_job_fields(row, tenant, user))


# columns of the jobs table that the read models show under their own names: ``Job`` and ``QueueEntry`` both,
# then ``Job`` alone
_SHOWN_COLUMNS = ("id", "name", "priority", "priority_class", "gpus", "cpus", "memory", "preemptible", "preemptions")
_JOB_COLUMNS = ("reason", "attempt", "restarts", "exit_code", "created_at", "started_at", "finished_at", "command")


def _job_fields(row: Any, tenant: str, user: str) -> dict[str, Any]:
    """The fields of ``Job`` from a JobRow or a Core row of the jobs table."""
    fields = _shown_fields(row) | {c: getattr(row, c) for c in _JOB_COLUMNS}
    return fields | {"tenant": tenant, "user": user, "code": row.code_id, "environment": row.environment or "default"}


def _shown_fields(row: Any) -> dict[str, Any]:
    """The fields ``Job`` and ``QueueEntry`` both show, from a JobRow or a Core row of the jobs table."""
    return {"state": JobState(row.state)} | {c: getattr(row, c) for c in _SHOWN_COLUMNS}


def _wait_reason(reason: str | None, position: int) -> str:
    """Why a queued job at ``position`` waits: what the scheduling pass recorded, else its place in the queue."""
    if reason:
        return reason
    if position == 1:
        return "waiting for the scheduler"
    return f"waiting behind {position - 1} earlier job(s) in the queue"


def public_spec(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored spec as reads show it: ``secret_env`` names only, each value SECRET_MASK."""
    shown = dict(stored)
    if secret := stored.get("secret_env"):
        shown["secret_env"] = dict.fromkeys(secret, SECRET_MASK)
    return shown


def public_state(state: JobPlatformState) -> JobResolved:
    """A job's platform state as reads show it: its datasets without where they are stored."""
    return JobResolved(
        datasets=[
            JobDatasetVersion(**d.model_dump(include=set(JobDatasetVersion.model_fields))) for d in state.datasets
        ],
        checkpoint_from_id=state.checkpoint_from_id,
        env=dict(state.env),
        register_model=state.register_model,
    )


def job_env(platform: Platform, job: JobRow) -> dict[str, str]:
    """The variables a job's processes get from its spec and its platform state: ``env``, ``secret_env``
    decrypted, and what the platform gave it at submit (a trial's DLCLOUD_* variables).

    A secret the server key cannot decrypt (the key file was replaced) is left out and logged by name,
    so one broken row cannot stop the scheduling pass that places it."""
    env = dict(job.spec.get("env") or {})
    for key, token in (job.spec.get("secret_env") or {}).items():
        try:
            env[key] = platform.box.decrypt(str(token).encode())
        except ValueError:
            log.error(
                "job %s: secret_env %s cannot be decrypted with the server key; the job runs without it", job.id, key
            )
    env.update(job.platform_state.env)
    return env


def hparams_env(spec: dict[str, Any]) -> str | None:
    """``DLCLOUD_HPARAMS`` of a stored spec: a template's every hyperparameter (defaults filled in), else the
    spec's ``hparams`` as given; None for a job with neither."""
    hparams = spec.get("hparams") or {}
    template = spec.get("template")
    if template:
        hparams = catalog.get_template(str(template["name"])).resolve(hparams)
    return json.dumps(hparams, sort_keys=True) if hparams or template else None


def resolve_checkpoint_from(s: Session, caller: Caller, spec: JobSpec) -> str | None:
    """``spec.checkpoint_from`` resolved in the caller's tenant and checked (``job_checks.checkpoint_source_id``):
    for a check outside a job's submit, as a study's at its own submit."""
    name = spec.checkpoint_from
    source = job_store.get_job(s, caller.tenant_id, name) if name is not None else None
    return job_checks.checkpoint_source_id(spec, source)


def submit_job(platform: Platform, caller: Caller, spec: JobSpec) -> Job:
    require_isolation(platform, caller, "running jobs")
    with platform.db.write() as s:
        row = create_job_row(s, platform, caller, spec)
        job = _job_model(row, caller.tenant, caller.user)
    platform.wake()
    return job


@dataclass(frozen=True)
class Decisions:
    """What a submit decided of a draft against the database: the values its row keeps beside the draft's."""

    priority: int
    priority_class: str | None
    environment: str | None
    environment_hash: str | None
    datasets: tuple[ResolvedDataset, ...]
    checkpoint_from_id: str | None


def create_job_row(
    s: Session, platform: Platform, caller: Caller, spec: JobSpec, *, trial_env: dict[str, str] | None = None
) -> JobRow:
    """Check ``spec`` and add its QUEUED job row in the caller's transaction ``s`` (a study records a trial and
    its job in one). ``trial_env``: given by the study driver alone, the DLCLOUD_* variables it gives a trial's
    job (DLCLOUD_HPARAMS, DLCLOUD_STUDY, ...), which a user's spec may not set; a job given them may take a
    trial's name. The row keeps the spec as given and what is decided here (datasets resolved to versions,
    ``checkpoint_from`` resolved and checked, ``trial_env``) in its ``platform_state``. The caller checks
    isolation and wakes the loop.

    Four phases, each once and in this order: plan the spec alone (``job_drafts.plan``, no database); read what
    the database says of it (``submission_facts``, the tenant locked); check the draft against that
    (``_admit``); write the row, the datasets it reads and its first event. A refusal raises before the row is
    added (the caller's transaction, rolled back, drops what checking may have added: a build request)."""
    draft = job_drafts.plan(platform, spec)
    facts = job_store.submission_facts(
        s,
        caller.tenant_id,
        spec.name,
        code_id=spec.code,
        checkpoint_from=spec.checkpoint_from,
        trial_study=draft.trial_study if trial_env is None else None,  # the driver names its own trials
    )
    if facts is None:
        raise NotFound("your tenant no longer exists")
    decided = _admit(s, platform, caller, draft, facts)
    row = _new_row(caller, draft, decided, trial_env or {})
    job_store.add_job(s, row, [d.version_id for d in decided.datasets])
    job_states.record_created(s, row, f"submitted by {caller.user}")
    return row


def _admit(s: Session, platform: Platform, caller: Caller, draft: JobDraft, facts: SubmissionFacts) -> Decisions:
    """The draft checked against the facts, in the order a submit reports what is wrong: the tenant's limits
    (resources, priority, guarantee), the environment, the code, the datasets, the checkpoint source, the name,
    the queue's room. The environment and the datasets are resolved by their own services at their place in
    that order (each reads and refuses in one step); all else is ``job_checks``' pure checks. Writes nothing
    but a built-in environment's first build request."""
    spec, tenant = draft.spec, facts.tenant
    job_checks.check_fits(platform, tenant, spec)
    priority, priority_class = job_checks.resolve_priority(platform, tenant, spec)
    job_checks.check_non_preemptible(platform, tenant, spec)
    environment, environment_hash = environments.resolve_for_job(platform, s, caller, spec.environment)
    job_checks.check_code(spec, facts.code)
    resolved = datasets.resolve_for_job(s, caller, list(draft.dataset_refs))
    checkpoint_from_id = job_checks.checkpoint_source_id(spec, facts.checkpoint_source)
    job_checks.check_name(draft, facts)
    admission.check_queue_room(platform.settings, tenant, facts.queued)
    return Decisions(priority, priority_class, environment, environment_hash, tuple(resolved), checkpoint_from_id)


def _new_row(caller: Caller, draft: JobDraft, decided: Decisions, trial_env: dict[str, str]) -> JobRow:
    """The QUEUED row of an admitted draft."""
    spec = draft.spec
    return JobRow(
        id=new_id("j-"),
        tenant_id=caller.tenant_id,
        user_id=caller.user_id,
        name=spec.name,
        spec=draft.stored,
        platform_state=JobPlatformState(
            datasets=decided.datasets,
            checkpoint_from_id=decided.checkpoint_from_id,
            env=dict(trial_env),
            register_model=draft.register_model,
        ),
        command=draft.command,
        code_id=spec.code,
        state=JobState.QUEUED.value,
        reason="submitted",
        priority=decided.priority,
        priority_class=decided.priority_class,
        preemptible=spec.preemptible,
        max_run_time_seconds=draft.max_run_time_seconds,
        preempt_requested=False,
        preemptions=0,
        attained_gpu_seconds=0.0,
        gpus=draft.gpus,
        cpus=draft.cpus,
        memory=draft.memory,
        gpu_type=spec.resources.gpu_type,
        replica_groups=draft.replica_groups,
        timeout_seconds=spec.timeout,
        max_restarts=spec.restart.max_restarts,
        backoff_seconds=spec.restart.backoff_seconds,
        attempt=0,
        restarts=0,
        cancel_requested=False,
        environment=decided.environment,
        environment_hash=decided.environment_hash,
        created_at=utcnow(),
    )


def get_row(s: Session, caller: Caller, name_or_id: str, *, for_update: bool = False) -> JobRow:
    """The caller's tenant's job by name or id; NotFound otherwise."""
    row = job_store.get_job(s, caller.tenant_id, name_or_id, for_update=for_update)
    if row is None:
        raise NotFound(f"job {name_or_id!r} not found")
    return row


def list_jobs(
    platform: Platform, caller: Caller, *, states: list[JobState] | None = None, limit: int = 100, offset: int = 0
) -> list[Job]:
    with platform.db.read() as s:
        rows = job_store.list_jobs(s, caller.tenant_id, [st.value for st in states or []], limit, offset)
        return [_job_model(j, caller.tenant, u or j.user_id) for j, u in rows]


def get_job(platform: Platform, caller: Caller, name_or_id: str) -> Job:
    with platform.db.read() as s:
        row = get_row(s, caller, name_or_id)
        return _job_model(row, caller.tenant, tenant_store.user_name(s, row.user_id))


def queue_position(conn: Connection, caller: Caller, job_id: str, priority: int, created_at: datetime) -> int:
    """1 + the queued jobs before this one in the queue's order (priority, then submission order), counted as
    ``list_queue`` shows them: a platform admin's among every tenant's, anyone else's among its tenant's only
    (another tenant's queue length is not theirs to learn, docs/isolation.md)."""
    tenant = None if caller.is_platform_admin else caller.tenant_id
    return job_store.jobs_ahead(conn, tenant, job_id, priority, created_at) + 1


def describe_job(platform: Platform, caller: Caller, name_or_id: str) -> JobDetail:
    with platform.db.read_connection() as conn:
        row = job_store.describe_row(conn, caller.tenant_id, name_or_id)
        if row is None:
            raise NotFound(f"job {name_or_id!r} not found")
        events = job_store.describe_events(conn, row.id)
        # no attempt yet (the counter grows with every attempt row): spare queued jobs the query
        attempts = job_store.describe_attempts(conn, row.id) if row.attempt else []
        replicas: dict[int, list[JobReplica]] = {}
        if row.attempt and row.replica_groups:
            for r in job_store.describe_replicas(conn, row.id):
                fields = r._asdict()
                replicas.setdefault(fields.pop("attempt"), []).append(JobReplica(**fields))
        publishing = row.state == JobState.RUNNING.value and bool((row.spec or {}).get("publish"))
        handle = job_store.live_handle(conn, row.id) if publishing else None
        position = None
        wait = None
        if row.state in QUEUE_STATES:
            position = queue_position(conn, caller, row.id, row.priority, row.created_at)
            wait = _wait_reason(row.wait_reason, position)
    endpoints: dict[str, str] = {}
    if handle is not None and platform.executor is not None:  # read outside the database connection
        endpoints = {str(p): at for p, at in sorted(platform.executor.endpoints(handle).items())}
    # the selected columns carry the read models' field names
    return JobDetail(
        **_job_fields(row, caller.tenant, row.user_name or row.user_id),
        spec=public_spec(row.spec),
        resolved=public_state(row.platform_state),
        environment_hash=row.environment_hash,
        queue_position=position,
        wait_reason=wait,
        estimated_start=row.estimated_start if position is not None else None,
        max_run_time=row.max_run_time_seconds,
        preempt_requested=row.preempt_requested,
        preempt_reason=row.preempt_reason if row.preempt_requested else None,
        events=[JobEvent(**e._asdict()) for e in events],
        attempts=[
            JobAttempt(**{**a._asdict(), "ports": a.ports or []}, replicas=replicas.get(a.number, [])) for a in attempts
        ],
        endpoints=endpoints,
    )


def list_queue(platform: Platform, caller: Caller, *, limit: int = 1000) -> list[QueueEntry]:
    """The waiting jobs in the queue's order (priority, then submit time): a platform admin sees every tenant's,
    anyone else their own tenant's. Positions count the jobs shown."""
    now = utcnow()
    with platform.db.read_connection() as conn:
        rows = job_store.queue_rows(conn, None if caller.is_platform_admin else caller.tenant_id, limit)
    entries = []
    for i, r in enumerate(rows, start=1):
        entries.append(
            QueueEntry(
                **_shown_fields(r),
                position=i,
                tenant=r.tenant_name,
                user=r.user_name or r.user_id,
                submitted_at=r.created_at,
                wait_seconds=max(0.0, (now - r.created_at).total_seconds()),
                wait_reason=_wait_reason(r.wait_reason, i),
                estimated_start=r.estimated_start,
            )
        )
    return entries


@dataclass
class TenantQueueFigures:
    """What /metrics says of one tenant's scheduling (``scheduling_figures``)."""

    queued: int = 0
    wait_max_s: float = 0.0
    wait_sum_s: float = 0.0
    gpus: int = 0
    preemptions: int = 0


def scheduling_figures(platform: Platform) -> dict[str, TenantQueueFigures]:
    """Per tenant name: queued jobs and their waits since submit, GPUs held by live attempts, preemptions."""
    now = utcnow()
    with platform.db.read_connection() as conn:
        raw = job_store.scheduling_figures(conn)
    out = {}
    for tenant, r in raw.items():
        waits = [max(0.0, (now - created).total_seconds()) for created in r["waits"]]
        out[tenant] = TenantQueueFigures(len(waits), max(waits, default=0.0), sum(waits), r["gpus"], r["preemptions"])
    return out


def cancel_job(platform: Platform, caller: Caller, name_or_id: str) -> Job:
    with platform.db.write() as s:
        row = get_row(s, caller, name_or_id, for_update=True)
        caller.require_owner_or_admin("job", row.user_id, row.name, "cancel")
        state = JobState(row.state)
        if state in TERMINAL_STATES:
            raise InvalidState(f"job {row.name!r} already ended ({state.value}); nothing to cancel")
        request_cancel(s, row, caller.user)
        job = _job_model(row, caller.tenant, tenant_store.user_name(s, row.user_id))
    platform.wake()
    return job


def request_cancel(s: Session, row: JobRow, by: str) -> None:
    """Cancel a job that has not ended (``row`` locked in ``s``): a queued one at once; a running one's attempt
    is stopped by the control loop (SIGTERM, then SIGKILL after its grace period)."""
    state = JobState(row.state)
    if state in TERMINAL_STATES:
        return
    if state in (JobState.QUEUED, JobState.RESTARTING):
        job_states.transition(s, row, JobState.CANCELLED, f"cancelled by {by} while {state.value}")
    else:
        row.cancel_requested = True
        row.reason = f"cancellation requested by {by}"


def delete_job(platform: Platform, caller: Caller, name_or_id: str) -> None:
    with platform.db.write() as s:
        row = get_row(s, caller, name_or_id, for_update=True)
        caller.require_owner_or_admin("job", row.user_id, row.name, "delete")
        if JobState(row.state) not in TERMINAL_STATES:
            raise InvalidState(f"job {row.name!r} is {row.state}; cancel it first (dlcloud jobs cancel {row.name})")
        tenant_id, job_id = row.tenant_id, row.id
        s.delete(row)
    if platform.executor is not None:
        platform.executor.remove_job(tenant_id, job_id)
    shutil.rmtree(platform.settings.data_dir / "cache" / "logs" / job_prefix(tenant_id, job_id), ignore_errors=True)
    try:
        platform.objects.delete_prefix(job_prefix(tenant_id, job_id))
    except DlcloudError as exc:  # the row is gone: what is left is unreachable, and swept by no one else
        log.error("job %s deleted but its saved outputs and logs could not be removed: %s", job_id, exc.message)
