"""priority-backfill: effective priority (priority + aging), then submit time, then id, with backfill.

The first job that does not fit gets a reservation (``scheduler.backfill``); later jobs start only where they cannot
delay it. No preemption.
"""

from __future__ import annotations

from collections.abc import Iterable

from dlcloud.scheduler.contract import QueuedJob
from dlcloud.scheduler.policies.order import priority_order
from dlcloud.scheduler.policies.state import Pass, Tenant
from dlcloud.scheduler.policies.terms import quota_reason


def priority_backfill(p: Pass, queue: Iterable[QueuedJob]) -> None:
    """The priority-backfill pass over ``queue`` (any order): its decisions go into ``p.result``."""
    now, cfg = p.now, p.cfg
    order = priority_order(queue, now, cfg)
    reasons = p.result.wait_reasons

    def decide(job: QueuedJob, t: Tenant) -> bool:
        why = p.not_now(job) or quota_reason(job, t.lim, t.use) or p.never_fits(job)
        if why is not None:
            reasons[job.id] = why
            return False
        r = p.reservation
        if r is None:
            gpus = p.fit_now(job)
            if gpus is not None:
                p.place(job, gpus)
                return True
            p.make_reservation(job, p.shortage(job))
        elif job.gpus <= p.cluster.nfree + len(r.free_reserved) and p.backfill(job, False):
            return True
        else:
            reasons[job.id] = p.behind(job)
        return False

    for job in order:
        t = p.tenant(job.tenant_id)
        key = (t.id, job.gpus, job.cpus, job.memory, job.gpu_type, job.groups, p.run_time_term(job))
        p.settled(key, job, lambda: decide(job, t))  # noqa: B023 (called at once)
