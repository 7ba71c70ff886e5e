"""EASY-style backfill: the reservation of the first job that does not fit, and which later jobs may start anyway.

Invariants (why backfill never delays the reserved job, given that jobs run at most their declared time):
- The reservation's time ``at`` is the earliest time at which the job fits, replaying the expected ends of the
  running attempts (``started_at + max_run_time_s``; without one, never) over the free capacity; ``gpus`` are the
  GPUs it would take then.
- A later job may start only (a) if it ends by ``at`` (now + its own ``max_run_time_s``), or (b) on GPUs that are
  not the reserved ones and on CPU / memory left over at ``at`` once the reservation has taken its share (the
  leftover shrinks as such jobs start). So at ``at`` the reserved GPUs, CPUs and memory are free.
- No estimate (some needed attempt never ends for the estimate): nothing can be proven, nothing backfills.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dlcloud.scheduler.contract import QueuedJob
from dlcloud.scheduler.placement import Cluster, choose, processes

Release = tuple[datetime, tuple[int, ...], float, int]  # (when, GPUs, CPUs, memory) an attempt frees


@dataclass
class Reservation:
    job_id: str
    at: datetime | None  # None: no estimate
    gpus: frozenset[int] = frozenset()
    cpus_left: float = 0.0  # CPU / memory free at ``at`` beyond what the reservation takes
    memory_left: int = 0
    free_reserved: list[int] = field(default_factory=list)  # reserved GPUs free now, kept out of the cluster

    def ends_in_time(self, job: QueuedJob, now: datetime) -> bool:
        """Rule (a): ``job`` ends by the reservation's start."""
        return (
            self.at is not None
            and job.max_run_time_s is not None
            and now + timedelta(seconds=job.max_run_time_s) <= self.at
        )

    def leftover_fits(self, job: QueuedJob) -> bool:
        """Rule (b)'s CPU and memory part (its GPUs come from the cluster without the reserved ones)."""
        return self.at is not None and job.cpus <= self.cpus_left + 1e-9 and job.memory <= self.memory_left


def reserve(cluster: Cluster, job: QueuedJob, releases: list[Release]) -> Reservation:
    """When ``job`` fits at the earliest, replaying ``releases`` over the cluster's free capacity."""
    free = [list(fl) for fl in cluster.free]
    cpus, memory, nfree = cluster.cpus, cluster.memory, cluster.nfree
    procs = processes(job)
    need = sum(k for k, _ in procs)
    releases = sorted(releases, key=lambda r: r[0])
    i = 0
    while i < len(releases):
        at = releases[i][0]
        while i < len(releases) and releases[i][0] == at:
            _, gpus, c, m = releases[i]
            for g in gpus:
                n = cluster.node_of.get(g)
                if n is not None:  # a GPU the inventory no longer lists frees nothing
                    bisect.insort(free[n], g)
                    nfree += 1
            cpus += c
            memory += m
            i += 1
        if nfree < need or job.cpus > cpus + 1e-9 or job.memory > memory:
            continue
        got = choose(free, cluster.names, procs)
        if got is not None:
            return Reservation(job.id, at, frozenset(got), cpus - job.cpus, memory - job.memory)
    return Reservation(job.id, None)
