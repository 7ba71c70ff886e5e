"""One scheduling pass as a pure function: queued jobs + held attempts + limits + free capacity -> a Plan.

``plan`` dispatches on ``PlanConfig.policy``: FIFO here (today's behaviour: priority then submit order as given,
the first job that does not fit blocks the rest), the others in ``scheduler.policies``. The contract types live in
``scheduler.contract`` and are re-exported here. Node-aware placement: ``scheduler.placement``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from dlcloud.scheduler.contract import (
    PREEMPTION_WHY,
    GroupDemand,
    Held,
    Limits,
    Plan,
    PlanConfig,
    Policy,
    Preemption,
    QueuedJob,
    Usage,
)
from dlcloud.scheduler.inventory import Inventory

__all__ = [
    "PREEMPTION_WHY",
    "GroupDemand",
    "Held",
    "Limits",
    "Plan",
    "PlanConfig",
    "Policy",
    "Preemption",
    "QueuedJob",
    "Usage",
    "plan",
]


def quota_reason(job: QueuedJob, lim: Limits, use: Usage) -> str | None:
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
    """Decide which queued jobs start now (and, for some policies, which running attempts to preempt).

    ``queue`` comes in the database's order (priority, created_at, id): FIFO keeps it and reads it lazily, stopping
    at the first job that does not fit; the other policies read it whole and order it themselves."""
    if config.policy != Policy.FIFO or len({g.node for g in inventory.gpus}) > 1:
        from dlcloud.scheduler import policies

        return policies.run(queue, held, limits, inventory, now, config)
    return _fifo_one_node(queue, held, limits, inventory, now)


def _fifo_one_node(
    queue: Iterable[QueuedJob], held: Iterable[Held], limits: dict[str, Limits], inventory: Inventory, now: datetime
) -> Plan:
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
        reason = quota_reason(job, limits.get(job.tenant_id, no_limits), use)
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
