"""las: least attained service first (Tiresias-style), work-conserving, with preemption by las queue.

Jobs go by attained-service queue (``PlanConfig.las_queues_gpu_s``, ``order.las_queue``), then submit time; jobs that
fit start, the others do not block (no reservation); a job may preempt preemptible attempts in a strictly higher
queue ("las"), the most attained first. It needs no run-time estimates.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from dlcloud.scheduler.contract import QueuedJob
from dlcloud.scheduler.policies.order import las_queue
from dlcloud.scheduler.policies.state import Pass, Tenant
from dlcloud.scheduler.policies.terms import quota_reason
from dlcloud.scheduler.preemption import Candidate, lost_gpu_s


def las(p: Pass, queue: Iterable[QueuedJob]) -> None:
    """The las pass over ``queue`` (any order): its decisions go into ``p.result``."""
    now, cfg, reasons = p.now, p.cfg, p.result.wait_reasons
    order = sorted((las_queue(j.attained_gpu_s, cfg), j.submitted_at or now, j.id, j) for j in queue)
    live = sorted(
        (
            Candidate(h, (-las_queue(h.attained_gpu_s, cfg), -h.attained_gpu_s, lost_gpu_s(h, now)), "las")
            for h in p.held
            if h.preemptible and not h.stopping
        ),
        key=lambda c: c.key,
    )
    waits: dict[tuple[str, int], str] = {}

    def decide(job: QueuedJob, t: Tenant, q: int) -> bool:
        why = p.not_now(job) or quota_reason(job, t.lim, t.use) or p.never_fits(job)
        if why is not None:
            reasons[job.id] = why
            return False
        gpus = p.fit_now(job)
        if gpus is not None:
            p.place(job, gpus)
            return True
        if p.wait_for_stopping(job, t):  # the first in las order gets what stopping attempts free
            return True
        if live and -live[0].key[0] > q:
            cands = lambda: list(itertools.takewhile(lambda c: -c.key[0] > q, live))  # noqa: E731
            if p.preempt(job, cands, ("las", q, job.gpu_type, bool(job.groups)), t):
                return True
        short = p.shortage(job)
        text = waits.get((short, q))
        if text is None:
            text = waits[short, q] = f"waiting for capacity: {short} (las queue {q})"
        reasons[job.id] = text
        return False

    for q, _, _, job in order:
        t = p.tenant(job.tenant_id)
        key = (t.id, q, job.gpus, job.cpus, job.memory, job.gpu_type, job.groups)
        p.settled(key, job, lambda: decide(job, t, q))  # noqa: B023 (called at once)
