"""fair-share inside a tenant: its queue's order, and which of its own attempts a job of it may preempt.

With ``PlanConfig.tenant_las_queues_gpu_s`` (the default) a tenant's jobs of one priority go by their las queue
(least attained service first; ``tenant_order``), and a job may preempt its own tenant's attempts of the same
priority in a higher las queue ("las": time-sharing inside the tenant's share, never across tenants). Whatever the
las queues, a job may preempt its own tenant's attempts of a lower priority (its own, not aged: aging orders the
queue, it does not preempt) ("priority"; ``OwnAttempts``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import datetime

from dlcloud.scheduler.contract import Held, PlanConfig, QueuedJob
from dlcloud.scheduler.policies.order import effective_priority, priority_order
from dlcloud.scheduler.preemption import Candidate, lost_gpu_s


def tenant_las_queue(bounds: Sequence[float], attained_gpu_s: float) -> int:
    """The las queue inside a tenant of an attained service (0 without boundaries)."""
    return bisect.bisect_right(bounds, attained_gpu_s) if bounds else 0


def tenant_order(jobs: list[QueuedJob], now: datetime, cfg: PlanConfig) -> list[QueuedJob]:
    """A tenant's queue in fair-share: by effective priority, then submit time. With ``tenant_las_queues_gpu_s`` and
    some job back from preemption after long service (beyond its first boundary): by priority level, then las
    queue, then submit time, where aging lifts a job to the highest priority level of the tenant's queue that its
    effective priority reaches (aging still lets nothing starve behind a higher priority; inside one level the
    least attained service goes first, so a long job that was preempted waits behind its tenant's fresh ones)."""
    order = priority_order(jobs, now, cfg)
    bounds = cfg.tenant_las_queues_gpu_s
    if not bounds:
        return order
    first = bounds[0]
    if all(j.attained_gpu_s < first for j in order):
        return order  # the common case: nothing to reorder
    levels = sorted({j.priority for j in order})

    def level(j: QueuedJob) -> int:
        return levels[bisect.bisect_right(levels, effective_priority(j, now, cfg)) - 1]

    return sorted(
        order, key=lambda j: (-level(j), bisect.bisect_right(bounds, j.attained_gpu_s), j.submitted_at or now, j.id)
    )


class OwnAttempts:
    """A pass's live attempts by tenant, as victims of their own tenant's jobs: those of a lower priority
    ("priority"), and (las inside tenants) those of the same priority in a higher las queue ("las"); borrowed ones
    first, then lowest priority, then highest las queue, then least work lost."""

    def __init__(self, live: Iterable[Held], borrowed: set[int], bounds: Sequence[float], now: datetime) -> None:
        self.bounds = bounds
        self.own: dict[str, list[Candidate]] = {}
        self.top_q: dict[tuple[str, int], int] = {}  # (tenant, priority): the highest las queue of its live attempts
        for h in live:
            q = self.queue(h.attained_gpu_s)
            key = (0 if id(h) in borrowed else 1, h.priority, -q, lost_gpu_s(h, now))
            self.own.setdefault(h.tenant_id, []).append(Candidate(h, key, "priority"))
            self.top_q[h.tenant_id, h.priority] = max(q, self.top_q.get((h.tenant_id, h.priority), 0))
        for cs in self.own.values():
            cs.sort(key=lambda c: c.key)
        self.lowest = {tid: min(c.held.priority for c in cs) for tid, cs in self.own.items()}

    def queue(self, attained_gpu_s: float) -> int:
        """The las queue inside a tenant of an attained service."""
        return tenant_las_queue(self.bounds, attained_gpu_s)

    def outranks(self, job: QueuedJob, tid: str) -> bool:
        """``job`` may preempt attempts of its own tenant ``tid``: some have a lower priority, or (las in the
        tenant) the same priority and more attained service (a higher las queue)."""
        return self.lowest.get(tid, job.priority) < job.priority or self.top_q.get((tid, job.priority), 0) > self.queue(
            job.attained_gpu_s
        )

    def victims(self, job: QueuedJob, tid: str) -> list[Candidate]:
        """The attempts of tenant ``tid`` that ``job`` may preempt: lower priority ("priority"), or the same priority
        in a higher las queue ("las")."""
        q = self.queue(job.attained_gpu_s)
        out = []
        for c in self.own.get(tid, ()):
            h = c.held
            if h.priority < job.priority:
                out.append(c)
            elif h.priority == job.priority and self.queue(h.attained_gpu_s) > q:
                out.append(Candidate(h, c.key, "las"))
        return out
