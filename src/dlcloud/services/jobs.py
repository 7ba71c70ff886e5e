"""Jobs as users see them: submit, list, describe, cancel, delete.

State changes go through ``job_states.transition``; running attempts are driven by ``control/loop.py``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from dlcloud.errors import (
    AlreadyExists,
    DlcloudError,
    InvalidSpec,
    InvalidState,
    NotFound,
    PermissionDenied,
    PriorityNotAllowed,
    QuotaExceeded,
)
from dlcloud.schemas.common import format_memory
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
)
from dlcloud.schemas.models import FORMATS, format_from_name
from dlcloud.services import admission, datasets, environments, job_states, recipes
from dlcloud.services.auth import Caller
from dlcloud.services.isolation import require_isolation
from dlcloud.services.job_keys import job_prefix
from dlcloud.services.model_signatures import check_signature
from dlcloud.services.platform import Platform
from dlcloud.store import jobs as job_store
from dlcloud.store import studies as study_store
from dlcloud.store import tenants as tenant_store
from dlcloud.store.ids import looks_like_id, new_id, reserved_name_message
from dlcloud.store.rows import CodeRow, JobRow, TenantRow, UserRow, utcnow
from dlcloud.templates import catalog

log = logging.getLogger(__name__)
QUEUE_STATES = (JobState.QUEUED.value, JobState.RESTARTING.value)


def _job_model(row: JobRow, tenant: str, user: str) -> Job:
    return Job(**_job_fields(row, tenant, user))


def _job_fields(row: Any, tenant: str, user: str) -> dict[str, Any]:
    """The fields of ``Job`` from a JobRow or a Core row of the jobs table."""
    return dict(
        id=row.id,
        name=row.name,
        tenant=tenant,
        user=user,
        state=JobState(row.state),
        reason=row.reason,
        priority=row.priority,
        gpus=row.gpus,
        cpus=row.cpus,
        memory=row.memory,
        attempt=row.attempt,
        restarts=row.restarts,
        exit_code=row.exit_code,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        code=row.code_id,
        command=row.command,
        environment=row.environment or "default",
        priority_class=row.priority_class,
        preemptible=row.preemptible,
        preemptions=row.preemptions,
    )


def _stored_spec(platform: Platform, spec: JobSpec) -> dict[str, Any]:
    """The spec as the job row keeps it: each ``secret_env`` value encrypted with the server key."""
    stored = spec.model_dump(mode="json")
    stored["secret_env"] = {k: platform.box.encrypt(v).decode() for k, v in spec.secret_env.items()}
    return stored


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


def check_fits(platform: Platform, tenant: TenantRow, spec: JobSpec) -> None:
    """Refuse a job that could never start, instead of letting it wait forever. A gang is counted whole."""
    inv = platform.inventory
    groups = spec.groups()
    gang = spec.process_count() > 1
    for group, count in groups.items():
        r = spec.group_resources(group)
        matching = inv.gpus_matching(r.gpu_type)
        if r.gpu_type and r.gpus and not matching:
            names = sorted({g.name for g in inv.gpus}) or ["none"]
            raise InvalidSpec(f"no GPU of type {r.gpu_type!r} exists; GPU types here: {', '.join(names)}")
        if r.gpus * count > len(matching):
            what = f"{count} {group}(s) x {r.gpus} GPU(s)" if gang else f"resources.gpus is {r.gpus}"
            raise InvalidSpec(f"{what} but this platform has {len(matching)} matching GPU(s)")
    gpus, cpus, memory = spec.total_resources()
    prefix = "the gang's total " if gang else "resources."
    if cpus > inv.cpus:
        raise InvalidSpec(f"{prefix}cpu is {cpus:g} but this platform has {inv.cpus:g} CPU(s)")
    if memory > inv.memory:
        raise InvalidSpec(
            f"{prefix}memory is {format_memory(memory)} but this platform has {format_memory(inv.memory)}"
        )
    q = tenant
    checks: list[tuple[str, float, float | None, Callable[[Any], str]]] = [
        ("gpus", gpus, q.quota_gpus, str),
        ("cpu", cpus, q.quota_cpus, lambda v: f"{v:g}"),
        ("memory", memory, q.quota_memory, format_memory),
    ]
    for what, want, limit, fmt in checks:
        if limit is not None and want > limit:
            raise QuotaExceeded(
                f"{prefix}{what} is {fmt(want)} but tenant {tenant.name!r} may use at most {fmt(limit)}",
                details={"resource": what, "limit": limit, "requested": want},
            )
    if q.quota_max_running_jobs == 0:
        raise QuotaExceeded(f"tenant {tenant.name!r} may not run jobs (max_running_jobs is 0)")


def resolve_priority(platform: Platform, tenant: TenantRow, spec: JobSpec) -> tuple[int, str | None]:
    """(priority, class) of a job: its own ``priority``, else its class's value (the default class when it gives
    neither); PriorityNotAllowed for an unknown class or a priority outside the tenant's allowed range."""
    settings = platform.settings
    classes = settings.priority_classes
    name = None
    if spec.priority is not None:
        value = spec.priority
    else:
        name = spec.priority_class or settings.default_priority_class
        if name not in classes:
            known = ", ".join(f"{k} ({v})" for k, v in sorted(classes.items(), key=lambda kv: kv[1]))
            raise PriorityNotAllowed(
                f"unknown priority_class {name!r}; the classes are: {known}",
                details={"priority_class": name, "classes": dict(classes)},
            )
        value = classes[name]
    if not tenant.priority_min <= value <= tenant.priority_max:
        what = f"priority_class {name!r} has priority {value}" if name else f"priority {value}"
        raise PriorityNotAllowed(
            f"{what}, but tenant {tenant.name!r} may only use priorities {tenant.priority_min}..{tenant.priority_max}",
            details={"priority": value, "min": tenant.priority_min, "max": tenant.priority_max},
        )
    return value, name


def check_non_preemptible(platform: Platform, tenant: TenantRow, spec: JobSpec) -> None:
    """Under fair share a non-preemptible job runs only inside its tenant's guarantee: refuse one that could never
    fit inside it, instead of letting it wait forever."""
    if spec.preemptible or platform.settings.scheduling_policy != "fair-share":
        return
    gpus, cpus, memory = spec.total_resources()
    checks: list[tuple[str, float, float, Callable[[Any], str]]] = [
        ("gpus", gpus, tenant.guarantee_gpus, str),
        ("cpu", cpus, tenant.guarantee_cpus, lambda v: f"{v:g}"),
        ("memory", memory, tenant.guarantee_memory, format_memory),
    ]
    for what, want, guaranteed, fmt in checks:
        if want > guaranteed:
            raise InvalidSpec(
                f"a non-preemptible job runs only inside its tenant's guarantee: it needs {fmt(want)} {what}, "
                f"tenant {tenant.name!r} is guaranteed {fmt(guaranteed)}; submit it preemptible or ask an "
                "administrator for a guarantee (dlcloud tenants update --guarantee-...)",
                details={"resource": what, "guarantee": guaranteed, "requested": want},
            )


def _check_template(spec: JobSpec) -> None:
    """A template job's template and hyperparameters, against the catalog (400 naming what is allowed)."""
    if spec.template is None:
        return
    try:
        catalog.get_template(spec.template.name).resolve(spec.hparams)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


def hparams_env(spec: dict[str, Any]) -> str | None:
    """``DLCLOUD_HPARAMS`` of a stored spec: a template's every hyperparameter (defaults filled in), else the
    spec's ``hparams`` as given; None for a job with neither."""
    hparams = spec.get("hparams") or {}
    template = spec.get("template")
    if template:
        hparams = catalog.get_template(str(template["name"])).resolve(hparams)
    return json.dumps(hparams, sort_keys=True) if hparams or template else None


def _register_model_spec(spec: JobSpec) -> dict[str, Any] | None:
    """``register_model`` as stored: path and format filled in (a template's export; else the path's suffix)."""
    r = spec.register_model
    if r is None:
        return None
    path = r.path or catalog.EXPORT_DIR
    fmt = r.format.value if r.format is not None else None
    if fmt is None:
        fmt = catalog.EXPORT_FORMAT if spec.template is not None and r.path is None else format_from_name(path)
    if fmt is None:
        raise InvalidSpec(
            f"register_model.format is needed: the format of {path!r} cannot be told from its name; "
            f"give one of {', '.join(FORMATS)}"
        )
    signature = check_signature(r.signature) if r.signature is not None else None
    return {"name": r.name, "path": path, "format": fmt, "signature": signature, "description": r.description}


def resolve_checkpoint_from(s: Session, caller: Caller, spec: JobSpec) -> str | None:
    """The id of the job whose checkpoints ``spec.checkpoint_from`` names, for the executor to copy; None when
    the spec names none, or when that job never ran an attempt (it has no checkpoints: this job starts with an
    empty checkpoint dir). The job must be of the caller's tenant (NotFound otherwise, as if it did not exist)
    and have ended (InvalidState): a running job's checkpoints are not a state to start from."""
    name = spec.checkpoint_from
    if name is None:
        return None
    if name == spec.name:
        raise InvalidSpec(f"checkpoint_from names this job itself ({name!r}); name a job of yours that has ended")
    source = job_store.get_job(s, caller.tenant_id, name)
    if source is None:
        raise NotFound(f"checkpoint_from: job {name!r} not found", details={"checkpoint_from": name})
    state = JobState(source.state)
    if state not in TERMINAL_STATES:
        ended = ", ".join(sorted(st.value for st in TERMINAL_STATES))
        raise InvalidState(
            f"checkpoint_from: job {source.name!r} is {state.value}; checkpoint_from takes a job that has ended "
            f"({ended}): wait for it to end, or cancel it",
            details={"checkpoint_from": name, "state": state.value},
        )
    return source.id if source.attempt > 0 else None


def submit_job(platform: Platform, caller: Caller, spec: JobSpec) -> Job:
    require_isolation(platform, caller, "running jobs")
    with platform.db.write() as s:
        row = create_job_row(s, platform, caller, spec)
        job = _job_model(row, caller.tenant, caller.user)
    platform.wake()
    return job


# the names of a study's trial jobs: <study>-<number>, a resumed one <study>-<number>-r<j> (services/studies.py)
TRIAL_JOB_NAME = re.compile(r"^(?P<study>.+)-(?P<number>[0-9]+)(?:-r[0-9]+)?$")


def _check_not_a_trial_name(s: Session, tenant_id: str, name: str) -> None:
    """A user's job may not take a name a study of the tenant gives its trials: another member could otherwise
    make a trial (or the whole study) fail by taking the name of its next job first."""
    m = TRIAL_JOB_NAME.match(name)
    if m is not None and study_store.name_taken(s, tenant_id, m.group("study")):
        raise InvalidSpec(
            f"job name {name!r} is kept for the trials of study {m.group('study')!r} "
            "(<study>-<number>, <study>-<number>-r<n>); choose another name"
        )


def _check_publish(platform: Platform, spec: JobSpec) -> None:
    """A job may not publish the port at which it reaches the API on its own loopback (that would put the API,
    through the job, on ``job_publish_address``)."""
    api = urlsplit(platform.settings.resolved_job_api_url)
    if api.port in spec.publish:
        raise InvalidSpec(
            f"publish names port {api.port}, where jobs reach the platform's API inside their network; "
            "serve on another port"
        )


def _check_spec_alone(platform: Platform, spec: JobSpec) -> tuple[dict[str, Any] | None, list[str]]:
    """What can be checked of ``spec`` without the database: names that look like ids, the template, published
    ports, env given twice. Returns its register_model section and the datasets it reads (a template's data
    among them)."""
    if looks_like_id(spec.name):
        raise InvalidSpec(reserved_name_message("job", spec.name))
    _check_template(spec)
    _check_publish(platform, spec)
    register = _register_model_spec(spec)
    if register is not None and looks_like_id(register["name"]):
        raise InvalidSpec(reserved_name_message("model", register["name"]))
    refs = list(spec.datasets)
    template_data = spec.template.data if spec.template is not None else None
    if template_data is not None and catalog.dataset_name(template_data) not in {catalog.dataset_name(r) for r in refs}:
        refs.append(template_data)
    both = sorted(set(spec.env) & set(spec.secret_env))
    if both:
        raise InvalidSpec(f"{', '.join(both)} given in both env and secret_env; give each variable in one of them")
    return register, refs


def _check_code(s: Session, caller: Caller, spec: JobSpec) -> None:
    """The uploaded code the spec names is the caller's tenant's, and of a kind its command can run (without code,
    a module comes from the environment itself, e.g. a library's CLI module)."""
    if spec.code is None:
        return
    code = s.get(CodeRow, spec.code)
    if code is None or code.tenant_id != caller.tenant_id:
        raise InvalidSpec(f"code {spec.code!r} not found; upload it first (the CLI does this for directories)")
    if spec.module is None and code.kind != "archive":
        raise InvalidSpec(f"code {spec.code} is a {code.kind}; run a package with 'module:', not 'command:'")


def create_job_row(
    s: Session, platform: Platform, caller: Caller, spec: JobSpec, *, trial_env: dict[str, str] | None = None
) -> JobRow:
    """Check ``spec`` and add its QUEUED job row in the caller's transaction ``s`` (a study records a trial and
    its job in one). ``trial_env``: given by the study driver alone, the DLCLOUD_* variables it gives a trial's
    job (DLCLOUD_HPARAMS, DLCLOUD_STUDY, ...), which a user's spec may not set; a job given them may take a
    trial's name. The row keeps the spec as given and what is decided here (datasets resolved to versions,
    ``checkpoint_from`` resolved and checked by ``resolve_checkpoint_from``, ``trial_env``) in its
    ``platform_state``. The caller checks isolation and wakes the loop."""
    register, refs = _check_spec_alone(platform, spec)
    tenant = tenant_store.get_tenant(s, caller.tenant_id, for_update=True)
    if tenant is None:
        raise NotFound("your tenant no longer exists")
    check_fits(platform, tenant, spec)
    priority, priority_class = resolve_priority(platform, tenant, spec)
    check_non_preemptible(platform, tenant, spec)
    environment, environment_hash = environments.resolve_for_job(platform, s, caller, spec.environment)
    _check_code(s, caller, spec)
    resolved = datasets.resolve_for_job(s, caller, refs)
    checkpoint_from_id = resolve_checkpoint_from(s, caller, spec)
    if trial_env is None:  # not the study driver's trial
        _check_not_a_trial_name(s, tenant.id, spec.name)
    if job_store.name_taken(s, tenant.id, spec.name):
        raise AlreadyExists(f"job {spec.name!r} already exists; delete it or choose another name")
    admission.check_queue_room(platform.settings, s, tenant)
    gpus, cpus, memory = spec.total_resources()
    groups = spec.groups()
    stored = _stored_spec(platform, spec)
    stored["register_model"] = register
    replica_groups = None
    if spec.process_count() > 1:
        replica_groups = recipes.replica_groups(stored, groups, {g: spec.group_resources(g) for g in groups})
    row = JobRow(
        id=new_id("j-"),
        tenant_id=tenant.id,
        user_id=caller.user_id,
        name=spec.name,
        spec=stored,
        platform_state=JobPlatformState(
            datasets=tuple(resolved), checkpoint_from_id=checkpoint_from_id, env=dict(trial_env or {})
        ),
        command=recipes.shell_command(spec),
        code_id=spec.code,
        state=JobState.QUEUED.value,
        reason="submitted",
        priority=priority,
        priority_class=priority_class,
        preemptible=spec.preemptible,
        # what the scheduler plans with: the declaration, else the enforced timeout, the smaller of both
        max_run_time_seconds=min((t for t in (spec.max_run_time, spec.timeout) if t is not None), default=None),
        preempt_requested=False,
        preemptions=0,
        attained_gpu_seconds=0.0,
        gpus=gpus,
        cpus=cpus,
        memory=memory,
        gpu_type=spec.resources.gpu_type,
        replica_groups=replica_groups,
        timeout_seconds=spec.timeout,
        max_restarts=spec.restart.max_restarts,
        backoff_seconds=spec.restart.backoff_seconds,
        attempt=0,
        restarts=0,
        cancel_requested=False,
        environment=environment,
        environment_hash=environment_hash,
        created_at=utcnow(),
    )
    s.add(row)
    s.flush()
    datasets.record_readers(s, row.id, resolved)
    job_states.record_created(s, row, f"submitted by {caller.user}")
    return row


def get_row(s: Session, caller: Caller, name_or_id: str, *, for_update: bool = False) -> JobRow:
    """The caller's tenant's job by name or id; NotFound otherwise."""
    row = job_store.get_job(s, caller.tenant_id, name_or_id, for_update=for_update)
    if row is None:
        raise NotFound(f"job {name_or_id!r} not found")
    return row


def _user_name(s: Session, user_id: str) -> str:
    u = s.get(UserRow, user_id)
    return u.name if u else user_id


def list_jobs(
    platform: Platform, caller: Caller, *, states: list[JobState] | None = None, limit: int = 100, offset: int = 0
) -> list[Job]:
    with platform.db.read() as s:
        rows = job_store.list_jobs(s, caller.tenant_id, [st.value for st in states or []], limit, offset)
        return [_job_model(j, caller.tenant, u or j.user_id) for j, u in rows]


def get_job(platform: Platform, caller: Caller, name_or_id: str) -> Job:
    with platform.db.read() as s:
        row = get_row(s, caller, name_or_id)
        return _job_model(row, caller.tenant, _user_name(s, row.user_id))


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
            wait = row.wait_reason or (
                "waiting for the scheduler"
                if position == 1
                else f"waiting behind {position - 1} earlier job(s) in the queue"
            )
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
                position=i,
                id=r.id,
                name=r.name,
                tenant=r.tenant_name,
                user=r.user_name or r.user_id,
                state=JobState(r.state),
                priority=r.priority,
                priority_class=r.priority_class,
                gpus=r.gpus,
                cpus=r.cpus,
                memory=r.memory,
                preemptible=r.preemptible,
                preemptions=r.preemptions,
                submitted_at=r.created_at,
                wait_seconds=max(0.0, (now - r.created_at).total_seconds()),
                wait_reason=r.wait_reason
                or ("waiting for the scheduler" if i == 1 else f"waiting behind {i - 1} earlier job(s) in the queue"),
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


def _require_owner_or_admin(caller: Caller, row: JobRow, what: str) -> None:
    if row.user_id != caller.user_id and not caller.is_tenant_admin:
        raise PermissionDenied(f"only the job's owner or a tenant admin can {what} job {row.name!r}")


def cancel_job(platform: Platform, caller: Caller, name_or_id: str) -> Job:
    with platform.db.write() as s:
        row = get_row(s, caller, name_or_id, for_update=True)
        _require_owner_or_admin(caller, row, "cancel")
        state = JobState(row.state)
        if state in TERMINAL_STATES:
            raise InvalidState(f"job {row.name!r} already ended ({state.value}); nothing to cancel")
        request_cancel(s, row, caller.user)
        job = _job_model(row, caller.tenant, _user_name(s, row.user_id))
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
        _require_owner_or_admin(caller, row, "delete")
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
