"""Node-aware GPU placement: which free GPUs a job gets, or why none fit.

Invariants:
- A process's GPUs are all on one node (``Gpu.node``); a gang's replicas each on one node, replicas may span nodes.
- Best fit: a process goes to the node with the fewest free (matching) GPUs that still fits it, the earlier node
  (inventory order) on a tie, and gets that node's lowest free indices. Less fragmentation for later, bigger jobs.
  A job of one process and no GPU type (``Cluster.choose``'s fast path: nearly every job of a trace) goes on a tie
  to the node with the most *pinned* GPUs first (``Cluster.pin``: under fair-share, those of attempts inside their
  tenants' guarantees or straddling them, which a reclaim takes last or never, and of non-preemptible ones): what
  runs inside guarantees gathers on fewer nodes, and the others can be taken back whole (an owed 8-GPU job needs a
  node without any).
- CPUs and memory are cluster-wide totals (as the inventory declares them).
- A GPU index is handed out once: ``take`` removes it from the free lists.

Vocabulary: a "process" is one (GPUs, GPU type) unit that must sit on one node: a single-process job is one, a gang
has one per replica.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from dlcloud.scheduler.contract import Held, QueuedJob
from dlcloud.scheduler.inventory import Inventory

Process = tuple[int, str]  # (GPUs, lower-cased GPU type or "")


def processes(job: QueuedJob) -> list[Process]:
    """The job's processes that need GPUs, in replica order."""
    if not job.groups:
        return [(job.gpus, (job.gpu_type or "").lower())] if job.gpus else []
    out: list[Process] = []
    for g in job.groups:
        if g.gpus:
            want = (g.gpu_type or job.gpu_type or "").lower()
            out.extend([(g.gpus, want)] * g.count)
    return out


def choose(free: Sequence[Sequence[int]], names: dict[int, str], procs: Sequence[Process]) -> tuple[int, ...] | None:
    """Best-fit GPUs for ``procs`` on the per-node free lists (sorted), in replica order, or None. Pure."""
    if not procs:
        return ()
    used: dict[int, set[int]] = {}
    picks: list[list[int] | None] = [None] * len(procs)
    # biggest processes first (first-fit decreasing packs better), results written back in replica order
    for i in sorted(range(len(procs)), key=lambda i: -procs[i][0]):
        k, want = procs[i]
        best_n, best_avail = -1, None
        for n, fl in enumerate(free):
            if len(fl) < k:
                continue
            u = used.get(n)
            if want or u:
                avail = [x for x in fl if (not u or x not in u) and (not want or want in names[x])]
                count = len(avail)
            else:
                avail, count = None, len(fl)
            if count >= k and (best_avail is None or count < len(best_avail)):
                best_n, best_avail = n, avail if avail is not None else list(fl)
                if count == k:
                    break
        if best_avail is None:
            return None
        pick = best_avail[:k]
        used.setdefault(best_n, set()).update(pick)
        picks[i] = pick
    return tuple(x for p in picks if p is not None for x in p)


class Cluster:
    """Free GPUs by node (sorted index lists) and free CPUs / memory; mutated as a pass places jobs."""

    def __init__(self, inventory: Inventory, held: Iterable[Held]) -> None:
        self.names: dict[int, str] = {}
        self.node_of: dict[int, int] = {}
        ordinal: dict[str, int] = {}
        for g in inventory.gpus:
            self.names[g.index] = g.name.lower()
            self.node_of[g.index] = ordinal.setdefault(g.node, len(ordinal))
        self.size = [0] * len(ordinal)  # GPUs per node
        for n in self.node_of.values():
            self.size[n] += 1
        used: set[int] = set()
        self.cpus = inventory.cpus
        self.memory = inventory.memory
        for h in held:
            used.update(h.gpus)
            self.cpus -= h.cpus
            self.memory -= h.memory
        self.free: list[list[int]] = [[] for _ in ordinal]
        for i in sorted(self.node_of):
            if i not in used:
                self.free[self.node_of[i]].append(i)
        self.nfree = sum(len(f) for f in self.free)
        self.max_size = max(self.size, default=0)
        # nodes by free count, for the untyped single-process fast path
        self.buckets: list[set[int]] = [set() for _ in range(self.max_size + 1)]
        for n, fl in enumerate(self.free):
            self.buckets[len(fl)].add(n)
        self._held_nodes: dict[tuple[int, str], list[tuple[int, int]]] = {}
        self.pinned = [0] * len(ordinal)  # per node: GPUs a reclaim takes last or never (``pin``)

    def pin(self, gpus: Iterable[int]) -> None:
        """Count ``gpus`` as pinned: held by an attempt inside or straddling its tenant's guarantee, or not
        preemptible (fair-share). Best fit then prefers, among equally fitting nodes, those with the most pinned."""
        for g in gpus:
            n = self.node_of.get(g)
            if n is not None:
                self.pinned[n] += 1

    def held_by_node(self, held: Held, want: str) -> list[tuple[int, int]]:
        """(node, how many of its matching GPUs) for a running attempt; a pass's victim searches ask for the same
        attempts again and again, and GPUs never change nodes, so the answer is kept."""
        key = (id(held), want)
        got = self._held_nodes.get(key)
        if got is None:
            counts: dict[int, int] = {}
            for g in held.gpus:
                n = self.node_of.get(g)
                if n is not None and (not want or want in self.names[g]):
                    counts[n] = counts.get(n, 0) + 1
            got = self._held_nodes[key] = list(counts.items())
        return got

    @property
    def single_node(self) -> bool:
        return len(self.free) <= 1

    def _move(self, n: int, old: int) -> None:
        self.buckets[old].discard(n)
        self.buckets[len(self.free[n])].add(n)

    def take(self, gpus: Iterable[int], cpus: float, memory: int) -> None:
        for g in gpus:
            n = self.node_of[g]
            fl = self.free[n]
            old = len(fl)
            del fl[bisect.bisect_left(fl, g)]
            self._move(n, old)
            self.nfree -= 1
        self.cpus -= cpus
        self.memory -= memory

    def give(self, gpus: Iterable[int], cpus: float, memory: int) -> None:
        for g in gpus:
            n = self.node_of[g]
            fl = self.free[n]
            old = len(fl)
            bisect.insort(fl, g)
            self._move(n, old)
            self.nfree += 1
        self.cpus += cpus
        self.memory += memory

    def choose(self, job: QueuedJob) -> tuple[int, ...] | None:
        """Best-fit GPUs for ``job`` on the free ones, or None (CPU and memory are checked apart: ``fits_totals``)."""
        if not job.groups and not job.gpu_type:
            k = job.gpus
            if not k:
                return ()
            if k > self.nfree:
                return None
            for c in range(k, self.max_size + 1):
                b = self.buckets[c]
                if b:
                    pinned = self.pinned
                    return tuple(self.free[max(b, key=lambda n: (pinned[n], -n))][:k])
            return None
        procs = processes(job)
        if sum(k for k, _ in procs) > self.nfree:
            return None
        return choose(self.free, self.names, procs)

    def fits_totals(self, job: QueuedJob) -> bool:
        return job.cpus <= self.cpus + 1e-9 and job.memory <= self.memory

    def never_fits(self, job: QueuedJob) -> str | None:
        """Why ``job`` cannot fit even on an empty cluster, or None."""
        empty = [[g for g in sorted(self.node_of) if self.node_of[g] == n] for n in range(len(self.free))]
        if choose(empty, self.names, processes(job)) is None:
            return f"never fits: {_gpu_need(job)}, larger than any node of this cluster can hold"
        return None

    def shortage(self, job: QueuedJob) -> str:
        """Why ``job`` does not fit the free capacity now: every shortage, "; "-joined."""
        short = []
        procs = processes(job)
        if choose(self.free, self.names, procs) is None:
            short.append(self._gpu_shortage(job, procs))
        tail = f" for {_count(job)}" if job.groups else ""
        if job.cpus > self.cpus + 1e-9:
            short.append(f"needs {job.cpus:g} CPU(s){tail}, {max(self.cpus, 0):g} free")
        if job.memory > self.memory:
            short.append(f"needs {job.memory} bytes of memory{tail}, {max(self.memory, 0)} free")
        return "; ".join(short)

    def _gpu_shortage(self, job: QueuedJob, procs: list[Process]) -> str:
        def matching(want: str) -> list[int]:
            return [x for fl in self.free for x in fl if not want or want in self.names[x]]

        if job.groups:
            available = set(matching(""))
            for g in job.groups:
                need = g.gpus * g.count
                if not need:
                    continue
                want = (g.gpu_type or job.gpu_type or "").lower()
                pool = [x for x in available if not want or want in self.names[x]]
                if len(pool) < need:
                    kind = f" {g.gpu_type or job.gpu_type}" if want else ""
                    return f"needs {need}{kind} GPU(s) for {g.count} {g.role}(s), {len(pool)} free"
                available.difference_update(sorted(pool)[:need])
            per = ", ".join(f"{g.count} {g.role}(s) of {g.gpus} GPU(s)" for g in job.groups if g.gpus)
            return f"needs {per}, each replica on one node; the {self.nfree} free GPU(s) are spread too thin"
        want = procs[0][1]
        pool = matching(want)
        kind = f" {job.gpu_type}" if want else ""
        if len(pool) < job.gpus:
            return f"needs {job.gpus}{kind} GPU(s), {len(pool)} free"
        most = max(sum(1 for x in fl if not want or want in self.names[x]) for fl in self.free)
        return f"needs {job.gpus}{kind} GPU(s) on one node, at most {most} free on a node ({len(pool)} free in all)"


def _count(job: QueuedJob) -> str:
    return " + ".join(f"{g.count} {g.role}(s)" for g in job.groups)


def _gpu_need(job: QueuedJob) -> str:
    if job.groups:
        return ", ".join(f"{g.count} {g.role}(s) of {g.gpus} GPU(s)" for g in job.groups if g.gpus)
    return f"{job.gpus}{' ' + job.gpu_type if job.gpu_type else ''} GPU(s) on one node"
