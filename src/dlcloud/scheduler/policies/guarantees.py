"""fair-share's guarantees: which running attempts are owed, which straddle, which are borrowed; a job's standing.

Of a tenant's running attempts, the owed ones are its non-preemptible, then highest-priority, then earliest-started
attempts up to its guarantee; the one after them that takes the tenant from short of its guarantee to beyond it
*straddles* it, if it alone fits the guarantee; the rest are borrowed (``owed_split``). Jobs come in sizes, so a
tenant holding 40 of 46 guaranteed GPUs with 8-GPU jobs would never get the rest back: a job that straddles its
tenant's guarantee (the tenant short of it, the job alone inside it) counts as owed (``standing``): it reclaims
borrowed attempts, but not straddling ones. A straddling attempt is taken back only by a job strictly inside its
guarantee, after every borrowed one (so two tenants never take one back and forth). An attempt on its tenant's turn
is owed until the turn ends, on top of its tenant's guarantee.
"""

from __future__ import annotations

from datetime import datetime

from dlcloud.scheduler.contract import Held, QueuedJob, Usage
from dlcloud.scheduler.policies.state import Pass, Tenant
from dlcloud.scheduler.policies.terms import NO_LIMITS, on_turn, straddles, within
from dlcloud.scheduler.preemption import Candidate, lost_gpu_s


def owed_split(p: Pass) -> tuple[set[int], set[int]]:
    """id() of the running attempts beyond their tenant's guarantee (borrowed), and of those that straddle it: the
    attempt that takes its tenant from short of its guarantee to beyond it and alone fits the guarantee (at most
    one a tenant). An attempt larger than the whole guarantee is borrowed; a tenant without a guarantee borrows all
    it runs."""
    by_tenant: dict[str, list[Held]] = {}
    for h in p.held:
        by_tenant.setdefault(h.tenant_id, []).append(h)
    far = datetime.max.replace(tzinfo=p.now.tzinfo)
    borrowed: set[int] = set()
    straddling: set[int] = set()
    for tid, hs in by_tenant.items():
        lim = p.limits.get(tid, NO_LIMITS)
        if not lim.guaranteed:
            borrowed.update(id(h) for h in hs)
            continue
        # on its tenant's turn: owed until it ends, on top of the guarantee (the rest are split as if it were not
        # there: else the tenant's other jobs went beyond the guarantee for the turn's length, and the turn's victims,
        # back inside their own guarantees, took one of them back at once: the turn swapped one job for another)
        use = Usage()
        rest = [h for h in hs if not on_turn(h, p.now)]
        for h in sorted(rest, key=lambda h: (h.preemptible, -h.priority, h.started_at or far, h.job_id)):
            if not within(lim, use.gpus + len(h.gpus), use.cpus + h.cpus, use.memory + h.memory):
                if h.preemptible and straddles(lim, use, len(h.gpus), h.cpus, h.memory):
                    straddling.add(id(h))
                else:
                    borrowed.add(id(h))
            use.gpus, use.cpus, use.memory = use.gpus + len(h.gpus), use.cpus + h.cpus, use.memory + h.memory
    return borrowed, straddling


def standing(job: QueuedJob, t: Tenant) -> tuple[bool, bool]:
    """(inside its tenant's guarantee, straddling it): owed either way. Only a preemptible job straddles."""
    inside = within(t.lim, t.use.gpus + job.gpus, t.use.cpus + job.cpus, t.use.memory + job.memory)
    return inside, not inside and job.preemptible and straddles(t.lim, t.use, job.gpus, job.cpus, job.memory)


def as_reclaim(h: Held, now: datetime) -> Candidate:
    """``h`` as a victim of a job that reclaims its tenant's guarantee: lowest priority, then least work lost."""
    return Candidate(h, (0, h.priority, lost_gpu_s(h, now)), "reclaim")
