"""A tenant's terms as plain predicates over usage: hard caps (quota), the borrowing limit, the guarantee.

Guarantees are per resource; only the resources with a guarantee above zero are checked ("inside its guarantee":
usage with the job ≤ guarantee for each of them); a tenant without any guarantee borrows everything it uses. A job
*straddles* its tenant's guarantee when the tenant is short of it (``below``), the job alone fits it, but usage with
the job exceeds it (``straddles``). Every policy reads the hard caps; the rest is fair-share's.
"""

from __future__ import annotations

from datetime import datetime

from dlcloud.scheduler.contract import Held, Limits, QueuedJob, Usage

NO_LIMITS = Limits()


def quota_reason(job: QueuedJob, lim: Limits, use: Usage) -> str | None:
    """Why ``job`` would take its tenant over a hard cap (``Limits.gpus/cpus/memory/max_running_jobs``), else None."""
    if lim.max_running_jobs is not None and use.running_jobs + 1 > lim.max_running_jobs:
        return f"tenant quota: {use.running_jobs} of {lim.max_running_jobs} running jobs in use"
    if lim.gpus is not None and use.gpus + job.gpus > lim.gpus:
        return f"tenant quota: needs {job.gpus} GPU(s), {use.gpus} of {lim.gpus} in use"
    if lim.cpus is not None and use.cpus + job.cpus > lim.cpus + 1e-9:
        return f"tenant quota: needs {job.cpus:g} CPU(s), {use.cpus:g} of {lim.cpus:g} in use"
    if lim.memory is not None and use.memory + job.memory > lim.memory:
        return f"tenant quota: needs {job.memory} bytes of memory, {use.memory} of {lim.memory} in use"
    return None


def borrow_reason(job: QueuedJob, lim: Limits, use: Usage) -> str | None:
    """Borrowing: why ``job`` would take its tenant beyond its guarantee plus its borrowing limit
    (``Limits.borrow_*``, per resource), else None. Without a borrowing limit a tenant borrows what is idle."""
    if lim.borrow_gpus is None and lim.borrow_cpus is None and lim.borrow_memory is None:
        return None
    for what, g, b, used, need in (
        ("GPU(s)", lim.guarantee_gpus, lim.borrow_gpus, use.gpus, job.gpus),
        ("CPU(s)", lim.guarantee_cpus, lim.borrow_cpus, use.cpus, job.cpus),
        ("bytes of memory", lim.guarantee_memory, lim.borrow_memory, use.memory, job.memory),
    ):
        if b is not None and used + need > g + b + 1e-9:
            return f"borrowing limit: needs {need:g} {what}, {used:g} in use of guarantee {g:g} + borrowing limit {b:g}"
    return None


def within(lim: Limits, gpus: int, cpus: float, memory: int) -> bool:
    """Usage ``gpus/cpus/memory`` inside the guarantee (only resources with a guarantee are checked)."""
    if not lim.guaranteed:
        return False
    return (
        (lim.guarantee_gpus <= 0 or gpus <= lim.guarantee_gpus)
        and (lim.guarantee_cpus <= 0 or cpus <= lim.guarantee_cpus + 1e-9)
        and (lim.guarantee_memory <= 0 or memory <= lim.guarantee_memory)
    )


def below(lim: Limits, use: Usage) -> bool:
    """``use`` is short of the guarantee: strictly below it in every guaranteed resource."""
    return (
        lim.guaranteed
        and (lim.guarantee_gpus <= 0 or use.gpus < lim.guarantee_gpus)
        and (lim.guarantee_cpus <= 0 or use.cpus < lim.guarantee_cpus - 1e-9)
        and (lim.guarantee_memory <= 0 or use.memory < lim.guarantee_memory)
    )


def straddles(lim: Limits, use: Usage, gpus: int, cpus: float, memory: int) -> bool:
    """A job of ``gpus/cpus/memory`` would straddle its tenant's guarantee: the tenant is short of it (``below``),
    the job alone fits it, but usage with the job exceeds it. Such a job counts as owed (``policies.guarantees``):
    else a tenant whose jobs are as large as what it lacks (8-GPU jobs, 40 of 46 guaranteed GPUs in use) could
    never reclaim the rest."""
    return (
        below(lim, use)
        and within(lim, gpus, cpus, memory)
        and not within(lim, use.gpus + gpus, use.cpus + cpus, use.memory + memory)
    )


def on_turn(h: Held, now: datetime) -> bool:
    """``h`` runs on its tenant's turn (fair-share): owed, not reclaimable, until the turn ends."""
    return h.turn_until is not None and h.turn_until > now


def duration_text(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def when_text(t: datetime) -> str:
    return t.isoformat(timespec="seconds")
