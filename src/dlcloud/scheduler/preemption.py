"""Choosing victims: the fewest, cheapest running attempts whose resources, with the free ones, fit a waiting job.

Invariants:
- A victim is a whole attempt (a gang with all its replicas); never a non-preemptible one, never one already
  stopping (callers leave those out of the candidates).
- Victims are only chosen when the job then actually fits, node-aware: its processes on the free GPUs plus the
  victims' GPUs, its CPU and memory on the free ones plus the victims'.
- Waste order: candidates come sorted by their ``key`` (smaller: cheaper to preempt); for a single-process job each
  node is tried with its cheapest candidates, and the node whose victims cost least wins; then victims that turn
  out not to be needed are dropped (most expensive first).
- Bounded: at most ``MAX_CANDIDATES`` candidates are looked at per search, and callers cap searches per pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from dlcloud.scheduler.contract import Held, QueuedJob
from dlcloud.scheduler.placement import Cluster, choose, processes

MAX_CANDIDATES = 256


@dataclass
class Candidate:
    held: Held
    key: tuple  # waste order: smaller is preempted first
    reason: str = ""  # "reclaim", "share", "priority", "las", "fill", "defrag"; "" for a stopping attempt (none)


def moves_away(c: Candidate) -> bool:
    """A victim whose CPUs and memory are not freed for the job it makes room for: a job moved (reason "defrag",
    or already stopping after such a move: ``Held.hold``) takes them with it to the GPUs it resumes on. It frees
    only its GPUs."""
    return c.reason == "defrag" or (c.held.stopping and bool(c.held.hold))


def lost_gpu_s(h: Held, now: datetime) -> float:
    """Work lost by stopping ``h`` now: time since its last checkpoint (else its start) × its GPUs."""
    since = h.progress_at or h.started_at
    secs = max((now - since).total_seconds(), 0.0) if since is not None else 0.0
    return secs * max(len(h.gpus), 1)


def victims_cost(chosen: Sequence[Candidate]) -> tuple:
    # the most expensive victim first, then the next...; fewer victims win a tie
    return tuple(sorted((c.key for c in chosen), reverse=True))


def find_victims(
    job: QueuedJob,
    cluster: Cluster,
    cands: Sequence[Candidate],
    also: Callable[[Sequence[Candidate]], bool] | None = None,
) -> tuple[list[Candidate], tuple[int, ...]] | None:
    """The victims to stop so that ``job`` fits (and ``also(victims)`` holds, e.g. its tenant's quota), and the
    GPUs it would get; None when even all candidates do not suffice."""
    cands = cands[:MAX_CANDIDATES]
    procs = processes(job)

    def fit(chosen: Sequence[Candidate]) -> tuple[int, ...] | None:
        if also is not None and not also(chosen):
            return None
        cpus = cluster.cpus + sum(c.held.cpus for c in chosen if not moves_away(c))
        memory = cluster.memory + sum(c.held.memory for c in chosen if not moves_away(c))
        if job.cpus > cpus + 1e-9 or job.memory > memory:
            return None
        free: list[list[int]] = list(cluster.free)
        copied: set[int] = set()
        for c in chosen:
            for g in c.held.gpus:
                n = cluster.node_of.get(g)
                if n is None:
                    continue
                if n not in copied:
                    free[n] = list(free[n])
                    copied.add(n)
                bisect.insort(free[n], g)
        return choose(free, cluster.names, procs)

    chosen: list[Candidate] = []
    if len(procs) == 1 and len(cluster.free) > 1:
        k, want = procs[0]
        # each node's candidates (waste order) with the matching GPUs they hold there
        on_node: dict[int, list[tuple[Candidate, int]]] = {}
        for c in cands:
            for n, held_here in cluster.held_by_node(c.held, want):
                on_node.setdefault(n, []).append((c, held_here))
        best: list[Candidate] | None = None
        best_cost: tuple = ()
        for n, fl in enumerate(cluster.free):
            have = len(fl) if not want else sum(1 for x in fl if want in cluster.names[x])
            picked: list[Candidate] = []
            for c, held_here in on_node.get(n, ()):
                if have >= k:
                    break
                picked.append(c)
                have += held_here
            if have >= k:
                cost = victims_cost(picked)
                if best is None or cost < best_cost:
                    best, best_cost = picked, cost
        if best is None:
            return None
        chosen = list(best)
    # add victims in waste order until the job fits (CPU / memory, or gangs and single-node clusters: GPUs too)
    got = fit(chosen)
    if got is None:
        ids = {id(c) for c in chosen}
        for c in cands:
            if id(c) in ids:
                continue
            chosen.append(c)
            got = fit(chosen)
            if got is not None:
                break
        else:
            return None
    # drop victims not needed, the most expensive first
    for c in sorted(chosen, key=lambda c: c.key, reverse=True):
        trial = [x for x in chosen if x is not c]
        again = fit(trial)
        if again is not None:
            chosen, got = trial, again
    assert got is not None
    return sorted(chosen, key=lambda c: c.key), got
