"""One scheduling pass as a pure function: queued jobs + usage + free capacity -> placements."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from dlcloud.scheduler.inventory import Inventory


@dataclass(frozen=True)
class GroupDemand:
    """A replica group of a gang: ``count`` replicas of ``gpus`` GPUs each (of ``gpu_type`` when set)."""

    role: str
    count: int
    gpus: int
    gpu_type: str | None = None


class Policy(StrEnum):
    """How a pass orders and places jobs (``PlanConfig.policy``); docs/scheduling.md explains each."""

    FIFO = "fifo"  # priority, then submit time, across tenants; the first job that does not fit blocks the rest
    PRIORITY_BACKFILL = "priority-backfill"  # priority with aging; jobs behind a blocked one may backfill
    FAIR_SHARE = "fair-share"  # weighted DRF across tenants, guarantees + borrowing, preemption, backfill, aging
    LAS = "las"  # least attained service (GPU-seconds) first, Tiresias-style; needs no run-time estimates


@dataclass(frozen=True)
class PlanConfig:
    policy: Policy = Policy.FIFO
    # aging: a queued job's effective priority grows by ``aging_step`` per ``aging_interval_s`` waited (from its
    # original submit time), up to ``aging_max`` above its own; 0 turns aging off
    aging_interval_s: float = 3600.0
    aging_step: int = 1
    aging_max: int = 100
    # las: attained-service boundaries (GPU-seconds) of its priority queues, lowest first
    las_queues_gpu_s: tuple[float, ...] = (3600.0, 36_000.0)


@dataclass(frozen=True)
class QueuedJob:
    id: str
    tenant_id: str
    gpus: int
    cpus: float
    memory: int
    gpu_type: str | None = None
    not_before: datetime | None = None
    held_by: str | None = None  # decided above the planner: why it cannot start yet (e.g. its environment)
    # a gang: its replica groups (gpus / cpus / memory above are then the gang's totals); empty: one process
    groups: tuple[GroupDemand, ...] = ()
    priority: int = 0  # within its tenant's allowed range (a priority class's value or the job's own)
    submitted_at: datetime | None = None  # the original submit time, kept across preemptions (None: ``now``)
    max_run_time_s: float | None = None  # declared maximum run time of an attempt (backfill, estimates)
    preemptible: bool = True  # False: placed only inside its tenant's guarantee, and never chosen as a victim
    attained_gpu_s: float = 0.0  # GPU-seconds its earlier attempts used (las)


@dataclass(frozen=True)
class Limits:
    """A tenant's quota (hard caps) and fair-share terms. ``None`` caps are unlimited."""

    gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None
    max_running_jobs: int | None = None
    # fair share: what the tenant is guaranteed (it may preempt borrowers to get it back) ...
    guarantee_gpus: int = 0
    guarantee_cpus: float = 0.0
    guarantee_memory: int = 0
    # ... how much more it may borrow from idle capacity (None: as much as is idle) ...
    borrow_gpus: int | None = None
    borrow_cpus: float | None = None
    borrow_memory: int | None = None
    # ... and its weight in dominant-resource fairness
    weight: float = 1.0


@dataclass
class Usage:
    gpus: int = 0
    cpus: float = 0.0
    memory: int = 0
    running_jobs: int = 0


@dataclass(frozen=True)
class Held:
    """Resources held by one live attempt (all replicas of a gang: a gang is preempted whole)."""

    tenant_id: str
    gpus: tuple[int, ...]
    cpus: float
    memory: int
    job_id: str = ""
    priority: int = 0
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    progress_at: datetime | None = None  # its last checkpoint (else its start): preempting loses the work since
    max_run_time_s: float | None = None  # expected end: ``started_at`` + this
    preemptible: bool = True
    attained_gpu_s: float = 0.0  # GPU-seconds over all its attempts up to ``now``
    stopping: bool = False  # already being stopped (preempted, cancelled): frees its resources soon, no victim


@dataclass(frozen=True)
class Preemption:
    """Stop ``job_id``'s attempt (SIGTERM, grace period, whole gang) and queue it again, for ``by``."""

    job_id: str
    by: str
    reason: str  # "reclaim" (a tenant takes back its guarantee), "priority", "las", "fill"
    message: str  # for the victim's events: who preempted it and why


@dataclass
class Plan:
    # (job id, GPUs): a gang's GPUs are in replica order, each replica's ``gpus`` in a row
    placements: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    wait_reasons: dict[str, str] = field(default_factory=dict)
    blocked_by: str | None = None  # the job at the head of the line that did not fit
    preemptions: list[Preemption] = field(default_factory=list)
    borrowing: set[str] = field(default_factory=set)  # placed jobs that run beyond their tenant's guarantee
    estimated_start: dict[str, datetime] = field(default_factory=dict)  # waiting jobs, where computable


def _quota_reason(job: QueuedJob, lim: Limits, use: Usage) -> str | None:
    if lim.max_running_jobs is not None and use.running_jobs + 1 > lim.max_running_jobs:
        return f"tenant quota: {use.running_jobs} of {lim.max_running_jobs} running jobs in use"
    if lim.gpus is not None and use.gpus + job.gpus > lim.gpus:
        return f"tenant quota: needs {job.gpus} GPU(s), {use.gpus} of {lim.gpus} in use"
    if lim.cpus is not None and use.cpus + job.cpus > lim.cpus + 1e-9:
        return f"tenant quota: needs {job.cpus:g} CPU(s), {use.cpus:g} of {lim.cpus:g} in use"
    if lim.memory is not None and use.memory + job.memory > lim.memory:
        return f"tenant quota: needs {job.memory} bytes of memory, {use.memory} of {lim.memory} in use"
    return None


def _gang_gpus(job: QueuedJob, free_gpus: list) -> tuple[tuple[int, ...] | None, str | None]:
    """All the GPUs of a gang, replica after replica, or (None, why not): all or nothing."""
    available = list(free_gpus)
    chosen: list[int] = []
    for g in job.groups:
        need = g.gpus * g.count
        if not need:
            continue
        want = (g.gpu_type or job.gpu_type or "").lower()
        pool = [x for x in available if want in x.name.lower()] if want else available
        if len(pool) < need:
            kind = f" {g.gpu_type or job.gpu_type}" if want else ""
            return None, f"needs {need}{kind} GPU(s) for {g.count} {g.role}(s), {len(pool)} free"
        taken = pool[:need]
        for r in range(g.count):
            chosen.extend(sorted(x.index for x in taken[r * g.gpus : (r + 1) * g.gpus]))
        taken_set = {x.index for x in taken}
        available = [x for x in available if x.index not in taken_set]
    return tuple(chosen), None


def _count(job: QueuedJob) -> str:
    return " + ".join(f"{g.count} {g.role}(s)" for g in job.groups)


def plan(
    queue: Iterable[QueuedJob],
    held: Iterable[Held],
    limits: dict[str, Limits],
    inventory: Inventory,
    now: datetime,
    config: PlanConfig = PlanConfig(),
) -> Plan:
    """Decide which queued jobs start now. ``queue`` must already be in priority/FIFO order."""
    usage: dict[str, Usage] = {}
    used_gpus: set[int] = set()
    free_cpus = inventory.cpus
    free_mem = inventory.memory
    for h in held:
        u = usage.setdefault(h.tenant_id, Usage())
        u.gpus += len(h.gpus)
        u.cpus += h.cpus
        u.memory += h.memory
        u.running_jobs += 1
        used_gpus.update(h.gpus)
        free_cpus -= h.cpus
        free_mem -= h.memory
    free_gpus = [g for g in inventory.gpus if g.index not in used_gpus]
    no_limits = Limits()
    result = Plan()
    for job in queue:
        if job.held_by is not None:
            result.wait_reasons[job.id] = job.held_by
            continue
        if job.not_before is not None and job.not_before > now:
            result.wait_reasons[job.id] = f"restart backoff until {job.not_before.isoformat(timespec='seconds')}"
            continue
        use = usage.setdefault(job.tenant_id, Usage())
        reason = _quota_reason(job, limits.get(job.tenant_id, no_limits), use)
        if reason:
            result.wait_reasons[job.id] = reason
            continue
        if job.groups:
            gang, why = _gang_gpus(job, free_gpus)
            short = [why] if why else []
            if job.cpus > free_cpus + 1e-9:
                short.append(f"needs {job.cpus:g} CPU(s) for {_count(job)}, {max(free_cpus, 0):g} free")
            if job.memory > free_mem:
                short.append(f"needs {job.memory} bytes of memory for {_count(job)}, {max(free_mem, 0)} free")
            if short or gang is None:
                result.wait_reasons[job.id] = "waiting for capacity: " + "; ".join(short)
                result.blocked_by = job.id
                break
            if gang:
                gang_set = set(gang)
                free_gpus = [g for g in free_gpus if g.index not in gang_set]
            free_cpus -= job.cpus
            free_mem -= job.memory
            use.gpus += job.gpus
            use.cpus += job.cpus
            use.memory += job.memory
            use.running_jobs += 1
            result.placements.append((job.id, gang))
            continue
        if not job.gpus:
            candidates = []
        elif job.gpu_type:
            want = job.gpu_type.lower()
            candidates = [g for g in free_gpus if want in g.name.lower()]
        else:
            candidates = free_gpus  # any type: no copy (a pass may place hundreds of jobs on 1,000s of GPUs)
        short = []
        if len(candidates) < job.gpus:
            kind = f" {job.gpu_type}" if job.gpu_type else ""
            short.append(f"needs {job.gpus}{kind} GPU(s), {len(candidates)} free")
        if job.cpus > free_cpus + 1e-9:
            short.append(f"needs {job.cpus:g} CPU(s), {max(free_cpus, 0):g} free")
        if job.memory > free_mem:
            short.append(f"needs {job.memory} bytes of memory, {max(free_mem, 0)} free")
        if short:
            result.wait_reasons[job.id] = "waiting for capacity: " + "; ".join(short)
            result.blocked_by = job.id
            break
        chosen = tuple(sorted(g.index for g in candidates[: job.gpus]))
        if candidates is free_gpus:
            free_gpus = free_gpus[job.gpus :]
        elif chosen:
            chosen_set = set(chosen)
            free_gpus = [g for g in free_gpus if g.index not in chosen_set]
        free_cpus -= job.cpus
        free_mem -= job.memory
        use.gpus += job.gpus
        use.cpus += job.cpus
        use.memory += job.memory
        use.running_jobs += 1
        result.placements.append((job.id, chosen))
    return result
