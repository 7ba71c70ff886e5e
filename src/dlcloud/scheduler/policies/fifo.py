"""fifo: priority, then submit order as given (the database's order); the first job that does not fit blocks the
rest (no backfill), so large jobs are never starved by a stream of small ones.

Two forms with the same decisions: ``fifo_one_node`` on one host (``planner.plan``'s default: it reads the queue
lazily and stops at the first job that does not fit), and ``fifo`` on a ``Pass`` (many nodes: node-aware placement).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from dlcloud.scheduler.contract import Held, Limits, Plan, QueuedJob, Usage
from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.policies.state import Pass
from dlcloud.scheduler.policies.terms import NO_LIMITS, quota_reason


def fifo(p: Pass, queue: Iterable[QueuedJob]) -> None:
    """FIFO on many nodes: the given order; the first job that does not fit blocks everything behind it."""
    for job in queue:
        why = p.not_now(job)
        t = p.tenant(job.tenant_id)
        if why is None:
            why = quota_reason(job, t.lim, t.use)
        if why is not None:
            p.result.wait_reasons[job.id] = why
            continue
        gpus = p.fit_now(job)
        if gpus is None:
            p.result.wait_reasons[job.id] = "waiting for capacity: " + p.shortage(job)
            p.result.blocked_by = job.id
            return
        p.place(job, gpus)


@dataclass
class _Free:
    """What one host has free: GPUs (in inventory order), CPUs, memory."""

    gpus: list[Gpu]
    cpus: float
    memory: int


def fifo_one_node(
    queue: Iterable[QueuedJob], held: Iterable[Held], limits: dict[str, Limits], inventory: Inventory, now: datetime
) -> Plan:
    """FIFO on one host: jobs in the given order take the first free GPUs; a job held above the planner, in its
    restart backoff or over its tenant's quota waits and blocks nobody; the first that does not fit blocks the rest."""
    usage: dict[str, Usage] = {}
    used_gpus: set[int] = set()
    free = _Free([], inventory.cpus, inventory.memory)
    for h in held:
        u = usage.setdefault(h.tenant_id, Usage())
        u.gpus += len(h.gpus)
        u.cpus += h.cpus
        u.memory += h.memory
        u.running_jobs += 1
        used_gpus.update(h.gpus)
        free.cpus -= h.cpus
        free.memory -= h.memory
    free.gpus = [g for g in inventory.gpus if g.index not in used_gpus]
    result = Plan()
    for job in queue:
        if job.held_by is not None:
            result.wait_reasons[job.id] = job.held_by
            continue
        if job.not_before is not None and job.not_before > now:
            result.wait_reasons[job.id] = f"restart backoff until {job.not_before.isoformat(timespec='seconds')}"
            continue
        use = usage.setdefault(job.tenant_id, Usage())
        reason = quota_reason(job, limits.get(job.tenant_id, NO_LIMITS), use)
        if reason:
            result.wait_reasons[job.id] = reason
            continue
        gpus, short = _gang_fit(job, free) if job.groups else _process_fit(job, free)
        if gpus is None:
            result.wait_reasons[job.id] = "waiting for capacity: " + "; ".join(short)
            result.blocked_by = job.id
            break
        free.cpus -= job.cpus
        free.memory -= job.memory
        use.gpus += job.gpus
        use.cpus += job.cpus
        use.memory += job.memory
        use.running_jobs += 1
        result.placements.append((job.id, gpus))
    return result


def _gang_fit(job: QueuedJob, free: _Free) -> tuple[tuple[int, ...] | None, list[str]]:
    """A gang's GPUs taken from ``free.gpus``, or (None, what it is short of)."""
    gang, why = _gang_gpus(job, free.gpus)
    short = [why] if why else []
    if job.cpus > free.cpus + 1e-9:
        short.append(f"needs {job.cpus:g} CPU(s) for {_count(job)}, {max(free.cpus, 0):g} free")
    if job.memory > free.memory:
        short.append(f"needs {job.memory} bytes of memory for {_count(job)}, {max(free.memory, 0)} free")
    if short or gang is None:
        return None, short
    if gang:
        gang_set = set(gang)
        free.gpus = [g for g in free.gpus if g.index not in gang_set]
    return gang, []


def _process_fit(job: QueuedJob, free: _Free) -> tuple[tuple[int, ...] | None, list[str]]:
    """One process's GPUs (of its type, if set) taken from ``free.gpus``, or (None, what it is short of)."""
    if not job.gpus:
        candidates = []
    elif job.gpu_type:
        want = job.gpu_type.lower()
        candidates = [g for g in free.gpus if want in g.name.lower()]
    else:
        candidates = free.gpus  # any type: no copy (a pass may place hundreds of jobs on 1,000s of GPUs)
    short = []
    if len(candidates) < job.gpus:
        kind = f" {job.gpu_type}" if job.gpu_type else ""
        short.append(f"needs {job.gpus}{kind} GPU(s), {len(candidates)} free")
    if job.cpus > free.cpus + 1e-9:
        short.append(f"needs {job.cpus:g} CPU(s), {max(free.cpus, 0):g} free")
    if job.memory > free.memory:
        short.append(f"needs {job.memory} bytes of memory, {max(free.memory, 0)} free")
    if short:
        return None, short
    chosen = tuple(sorted(g.index for g in candidates[: job.gpus]))
    if candidates is free.gpus:
        free.gpus = free.gpus[job.gpus :]
    elif chosen:
        chosen_set = set(chosen)
        free.gpus = [g for g in free.gpus if g.index not in chosen_set]
    return chosen, []


def _gang_gpus(job: QueuedJob, free_gpus: list[Gpu]) -> tuple[tuple[int, ...] | None, str | None]:
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
