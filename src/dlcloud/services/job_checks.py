"""The third phase of ``jobs submit``: a job's draft checked against what the database says of it.

Each function here is pure: it is given the draft (``job_drafts``) or its spec and the facts read in the submit
transaction (``store.jobs.SubmissionFacts``: the tenant, locked; the code; the checkpoint source; the names
taken; the queue's length) and raises the error a submit reports, naming what is allowed. None reads the
database or writes anything, so ``services/jobs.py`` calls them in the order the submit reports what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlcloud.errors import AlreadyExists, InvalidSpec, InvalidState, NotFound, PriorityNotAllowed, QuotaExceeded
from dlcloud.schemas.common import format_memory
from dlcloud.schemas.jobs import TERMINAL_STATES, JobSpec, JobState
from dlcloud.services.job_drafts import JobDraft
from dlcloud.services.platform import Platform
from dlcloud.store.jobs import SubmissionFacts
from dlcloud.store.rows import CodeRow, JobRow, TenantRow


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


def check_code(spec: JobSpec, code: CodeRow | None) -> None:
    """The uploaded code the spec names (``code``: the tenant's upload of that id, None if it has none) exists, and
    is of a kind its command can run (without code, a module comes from the environment itself, e.g. a library's
    CLI module)."""
    if spec.code is None:
        return
    if code is None:
        raise InvalidSpec(f"code {spec.code!r} not found; upload it first (the CLI does this for directories)")
    if spec.module is None and code.kind != "archive":
        raise InvalidSpec(f"code {spec.code} is a {code.kind}; run a package with 'module:', not 'command:'")


def checkpoint_source_id(spec: JobSpec, source: JobRow | None) -> str | None:
    """The id of the job whose checkpoints ``spec.checkpoint_from`` names (``source``: the tenant's job of that
    name or id, None if it has none), for the executor to copy; None when the spec names none, or when that job
    never ran an attempt (it has no checkpoints: this job starts with an empty checkpoint dir). A job of another
    tenant is NotFound, as if it did not exist; one that has not ended is InvalidState: a running job's
    checkpoints are not a state to start from."""
    name = spec.checkpoint_from
    if name is None:
        return None
    if name == spec.name:
        raise InvalidSpec(f"checkpoint_from names this job itself ({name!r}); name a job of yours that has ended")
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


def check_name(draft: JobDraft, facts: SubmissionFacts) -> None:
    """The job's name is free: no job of the tenant has it, and, unless the study driver asks it for a trial, no
    study of the tenant gives its trials that name (another member could otherwise make a trial, or the whole
    study, fail by taking the name of its next job first)."""
    name = draft.spec.name
    if facts.trial_name_taken:
        raise InvalidSpec(
            f"job name {name!r} is kept for the trials of study {draft.trial_study!r} "
            "(<study>-<number>, <study>-<number>-r<n>); choose another name"
        )
    if facts.name_taken:
        raise AlreadyExists(f"job {name!r} already exists; delete it or choose another name")
