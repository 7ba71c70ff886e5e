"""The state of one scheduling pass (``Pass``) and the steps every policy shares.

A ``Pass`` holds the free capacity by node (``placement.Cluster``), each tenant's usage (``Tenant``), the
reservation of the job at the head of the line (``backfill``), the attempts already stopping and this pass's
victims, and the ``Plan`` being built. Each policy (``fifo``, ``priority_backfill``, ``las``, ``fair_share``) is
one loop over its own order of the queue that calls these steps: check the job's terms (``not_now``,
``never_fits``), place it (``fit_now``, ``place``, ``backfill``, ``place_any``), reserve for it
(``make_reservation``), wait for stopping attempts (``wait_for_stopping``), or preempt (``preempt``). A job that
repeats one that could not start since the pass last changed anything waits for the same reason (``settled``).
Fair-share also holds GPUs for moved jobs (``hold``, ``resume``) and keeps idle guaranteed GPUs for their
tenant's return (``keep``, ``kept_for``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dlcloud.scheduler.backfill import Release, Reservation, reserve
from dlcloud.scheduler.contract import PREEMPTION_WHY, Held, Limits, Plan, PlanConfig, Preemption, QueuedJob, Usage
from dlcloud.scheduler.inventory import Inventory
from dlcloud.scheduler.placement import Cluster, choose, processes
from dlcloud.scheduler.policies.terms import NO_LIMITS, borrow_reason, duration_text, quota_reason, when_text
from dlcloud.scheduler.preemption import Candidate, find_victims, moves_away

MAX_SEARCHES = 24  # victim searches per pass (each looks at ≤ preemption.MAX_CANDIDATES attempts)

# a job's wait while its victims stop, by the first of its victims' reasons in this order
PREEMPTING = {
    "reclaim": "to reclaim its guarantee",
    "share": "of tenants with a larger share (its tenant is short of its guarantee)",
    "priority": "of lower priority in its tenant",
    "fill": "that started ahead of it as borrowed fill",
    "las": "with more attained service (las)",
    "defrag": "to gather whole nodes (they resume at once on GPUs left free)",
    "turn": "for its tenant's turn (short of its guarantee over the turn window)",
}


def main_reason(chosen: Iterable[Candidate]) -> str:
    """The reason a job's wait names for its victims: the first of ``PREEMPTING``'s that any of them has."""
    kinds = {c.reason for c in chosen}
    return next(k for k in PREEMPTING if k in kinds)


def preemption(c: Candidate, by: str, move_to: tuple[int, ...] = ()) -> Preemption:
    """The ``Preemption`` of victim ``c`` for job ``by``, with the message its events show."""
    return Preemption(
        c.held.job_id, by, c.reason, f"preempted by job {by} ({c.reason}): {PREEMPTION_WHY[c.reason]}", move_to
    )


@dataclass
class Tenant:
    """A tenant in a pass: its terms, its usage (growing as the pass places and claims), its queued jobs."""

    id: str
    lim: Limits
    use: Usage
    jobs: list[QueuedJob] = field(default_factory=list)
    next: int = 0  # the next of ``jobs`` to consider
    capped: bool = True  # has hard caps or a borrowing limit (else its quota checks are skipped)
    waiting: list[str] = field(default_factory=list)  # jobs waiting for capacity: their reason gets the share


class Pass:
    """One pass's state: free capacity, usage, reservation, stopping attempts and victims, and the Plan it builds."""

    def __init__(
        self,
        held: Iterable[Held],
        limits: dict[str, Limits],
        inventory: Inventory,
        now: datetime,
        config: PlanConfig,
    ) -> None:
        self.held = list(held)
        self.now = now
        self.cfg = config
        self.limits = limits
        self.cluster = Cluster(inventory, self.held)
        self.total = (max(len(inventory.gpus), 1), max(inventory.cpus, 1e-9), max(inventory.memory, 1))
        self.tenants: dict[str, Tenant] = {}
        for h in self.held:
            u = self.tenant(h.tenant_id).use
            u.gpus += len(h.gpus)
            u.cpus += h.cpus
            u.memory += h.memory
            u.running_jobs += 1
        self.result = Plan()
        self.reservation: Reservation | None = None
        self.reserved_inside = False  # the reserved job runs inside its tenant's guarantee
        self.grace = timedelta(seconds=config.preemption_grace_s)
        # expected ends of running attempts (stopping ones: after the grace period); victims are dropped
        self.releases: dict[int, Release] = {}
        self.stopping: list[Candidate] = []
        self.stopping_use: dict[str, Usage] = {}  # per tenant: what its stopping attempts still hold
        for h in self.held:
            if h.stopping:
                su = self.stopping_use.setdefault(h.tenant_id, Usage())
                su.gpus += len(h.gpus)
                su.cpus += h.cpus
                su.memory += h.memory
                su.running_jobs += 1
                self.releases[id(h)] = (now + self.grace, h.gpus, h.cpus, h.memory)
                self.stopping.append(Candidate(h, (0,)))
            elif h.started_at is not None and h.max_run_time_s is not None:
                end = max(h.started_at + timedelta(seconds=h.max_run_time_s), now)
                self.releases[id(h)] = (end, h.gpus, h.cpus, h.memory)
        self.victims: set[int] = set()  # id() of held attempts chosen as victims in this pass
        self.victim_use: dict[str, Usage] = {}  # per tenant: what its victims of this pass hold
        self.inv_cpus, self.inv_memory = inventory.cpus, inventory.memory
        self.searches = 0
        self._shortages: dict[tuple, str] = {}
        self._never: dict[tuple, str | None] = {}
        self._behind = ""
        self._shortage_at: tuple[int, float, int, int] = (-1, 0.0, 0, 0)
        self.failed: dict[tuple, list[tuple[int, float, int]]] = {}
        # bumped whenever the pass places, claims or reserves: until then, a job that could not start leaves an
        # identical one (same tenant, shape and rank) nothing new to find (see ``settled``)
        self.changes = 0
        self._settled: dict[tuple, tuple[str, bool]] = {}
        self._settled_at = 0
        self.holding: dict[str, list[int]] = {}  # moved jobs: the GPUs held for them (``hold``), out of ``cluster``
        # moved jobs: the GPUs of their hold that an attempt still stopping holds (moved onto a victim's, chained)
        self.pending: dict[str, list[int]] = {}
        self.kept: dict[str, list[int]] = {}  # tenants: idle GPUs kept for their return (``keep``), out of ``cluster``
        self.counted: set[str] = set()  # jobs placed or claimed for in this pass: in their tenant's usage
        self.pin_owed = False  # fair-share: jobs placed inside their tenants' guarantees pin their GPUs (``place``)

    def hold(self, holds: dict[str, tuple[int, ...]], until: dict[str, datetime]) -> None:
        """Take the GPUs held for moved jobs (by job id) out of the free capacity: only each job itself gets them
        (``resume``). They were free when the job was moved (``defragment``) and nobody got them since, or (a chain)
        a victim's evicted with it: a queued moved job whose hold has not ended (``until``: ``QueuedJob.hold_until``)
        has those an attempt still stopping holds promised: that attempt frees them for nobody else (no job waits
        for it, no reservation counts it). One that is neither (an inventory that changed) is not held."""
        c = self.cluster
        stopping = {g for x in self.stopping for g in x.held.gpus}
        for job_id, gpus in holds.items():
            mine = sorted({g for g in gpus if g in c.node_of and g in c.free[c.node_of[g]]})
            if mine:
                c.take(mine, 0, 0)
                self.holding[job_id] = mine
            pending = [g for g in gpus if g in stopping]
            if pending and job_id in until and self.now < until[job_id]:
                self.pending[job_id] = pending
        if self.pending:
            promised = {g for gs in self.pending.values() for g in gs}
            for x in self.stopping:
                if not promised.isdisjoint(x.held.gpus):
                    self.releases.pop(id(x.held), None)
            self.stopping = [x for x in self.stopping if promised.isdisjoint(x.held.gpus)]

    def resume(self, job: QueuedJob, t: Tenant, borrowed: bool) -> bool:
        """Give the GPUs held for moved ``job`` back to the free ones, and place it on them if they suffice and
        nothing holds it back (its restart backoff, environment, quota, borrowing limit, CPUs or memory), whatever
        the order or a reservation: it was moved to resume at once. Else (False) it is decided as any other job, its
        GPUs free for all."""
        c = self.cluster
        held_back = (
            self.not_now(job) is not None
            or quota_reason(job, t.lim, t.use) is not None
            or borrow_reason(job, t.lim, t.use) is not None
        )
        pending = self.pending.get(job.id)
        if pending and not held_back and job.cpus <= c.cpus + 1e-9 and job.memory <= c.memory:
            # moved onto GPUs of a victim evicted with it, which is still stopping: it waits for them (the free ones
            # of its hold stay held), rather than start elsewhere (the node it was moved off, say), until its hold
            # ends (``hold``); its CPUs and memory are claimed for it, and it counts towards its tenant's usage
            self.claim(job, [], (), t)
            self.result.wait_reasons[job.id] = (
                f"moved: waiting for {len(pending)} GPU(s) held for it that a stopping job still holds"
            )
            self.result.estimated_start[job.id] = self.now + self.grace
            return True
        mine = self.holding.pop(job.id, None)
        if not mine:
            return False
        c.give(mine, 0, 0)
        self.changes += 1
        if held_back or not c.fits_totals(job):
            return False
        held = set(mine)
        gpus = choose([[g for g in fl if g in held] for fl in c.free], c.names, processes(job))
        if gpus is None:
            return False
        self.place(job, gpus, borrowed)
        return True

    def keep(self, tid: str) -> None:
        """Take idle GPUs out of the free ones for tenant ``tid``'s return: as many as the most it held at once over
        the last ``PlanConfig.lend_after_s`` (``Limits.recent_peak_gpus``), up to its guarantee, less what it holds
        now. Only its own jobs and jobs of other tenants short of their guarantees get them (``kept_for``): no
        tenant borrows them."""
        lim = self.limits.get(tid)
        if lim is None or not lim.recent_peak_gpus or self.cfg.lend_after_s <= 0:
            return
        t = self.tenants.get(tid)
        c = self.cluster
        # what it holds, and what is coming to its jobs an earlier pass preempted for or moved (stopping victims'
        # GPUs, held ones)
        coming = (j.gpus for j in t.jobs if (j.reclaiming or j.hold) and j.id not in self.counted) if t else ()
        has = (t.use.gpus if t else 0) + sum(coming)
        k = min(min(lim.guarantee_gpus, lim.recent_peak_gpus) - has, c.nfree)
        if k <= 0:
            return
        # best fit on one node (a job as large as the peak fits them), else nodes with the fewest free GPUs first:
        # whole free nodes stay whole for others' large jobs
        one_node = choose(c.free, c.names, [(k, "")]) if k <= c.max_size else None
        gpus = list(one_node or ())
        if not gpus:
            for fl in sorted((fl for fl in c.free if fl), key=len):
                gpus.extend(fl[: k - len(gpus)])
                if len(gpus) == k:
                    break
        c.take(gpus, 0, 0)
        self.kept[tid] = gpus

    @contextlib.contextmanager
    def kept_for(self, tid: str, short: bool) -> Iterator[None]:
        """While tenant ``tid``'s job is decided, the GPUs kept for its tenant are free, and for a job of a tenant
        ``short`` of its guarantee (owed or catching up) those kept for every tenant: only borrowing waits for them
        (the guarantees fit the cluster; the job would preempt borrowed GPUs instead while these idle). Then what
        each may still keep is kept again."""
        tids = list(self.kept) if short else [tid] if tid in self.kept else []
        for x in tids:
            self.cluster.give(self.kept.pop(x), 0, 0)
        try:
            yield
        finally:
            for x in tids:
                self.keep(x)

    def tenant(self, tid: str) -> Tenant:
        t = self.tenants.get(tid)
        if t is None:
            t = self.tenants[tid] = Tenant(tid, self.limits.get(tid, NO_LIMITS), Usage())
        return t

    # -- shares ---------------------------------------------------------------------------------------------------
    def _dominant(self, t: Tenant, gpus: float, cpus: float, memory: float) -> float:
        """Weighted dominant share of ``t`` holding ``gpus/cpus/memory``."""
        g, c, m = self.total
        return max(gpus / g, cpus / c, memory / m) / (t.lim.weight if t.lim.weight > 0 else 1.0)

    def share(self, t: Tenant) -> float:
        u = t.use
        return self._dominant(t, u.gpus, u.cpus, u.memory)

    def share_with(self, t: Tenant, job: QueuedJob) -> float:
        """``t``'s share if ``job`` ran too."""
        u = t.use
        return self._dominant(t, u.gpus + job.gpus, u.cpus + job.cpus, u.memory + job.memory)

    def share_without(self, tid: str, chosen: Sequence[Candidate]) -> float:
        """Tenant ``tid``'s share once its victims of this pass and those of ``chosen`` are gone."""
        t = self.tenant(tid)
        u, v = t.use, self.victim_use.get(tid, Usage())
        gone = [x.held for x in chosen if x.held.tenant_id == tid]
        return self._dominant(
            t,
            u.gpus - v.gpus - sum(len(h.gpus) for h in gone),
            u.cpus - v.cpus - sum(h.cpus for h in gone),
            u.memory - v.memory - sum(h.memory for h in gone),
        )

    def share_text(self, t: Tenant) -> str:
        u, (g, c, m) = t.use, self.total
        parts = {"GPUs": u.gpus / g, "CPUs": u.cpus / c, "memory": u.memory / m}
        dominant = max(parts, key=lambda k: parts[k])
        weight = f", weight {t.lim.weight:g}" if t.lim.weight != 1 else ""
        return f"tenant {t.id} uses {parts[dominant]:.0%} (dominant: {dominant}{weight})"

    # -- the steps every policy shares ------------------------------------------------------------------------------
    def not_now(self, job: QueuedJob) -> str | None:
        if job.held_by is not None:
            return job.held_by
        if job.not_before is not None and job.not_before > self.now:
            return f"restart backoff until {when_text(job.not_before)}"
        return None

    def never_fits(self, job: QueuedJob) -> str | None:
        c = self.cluster
        plain = not job.groups and not job.gpu_type and job.gpus <= c.max_size
        if plain and job.cpus <= self.inv_cpus + 1e-9 and job.memory <= self.inv_memory:
            return None  # the common case, without building a key
        key = (job.gpus, job.cpus, job.memory, job.gpu_type, job.groups)
        if key not in self._never:
            why = self.cluster.never_fits(job)
            if why is None and (job.cpus > self.inv_cpus + 1e-9 or job.memory > self.inv_memory):
                why = (
                    f"never fits: needs {job.cpus:g} CPU(s) and {job.memory} bytes of memory, more than the cluster has"
                )
            self._never[key] = why
        return self._never[key]

    def shortage(self, job: QueuedJob) -> str:
        """``Cluster.shortage``, remembered per job shape while the free capacity does not change."""
        c = self.cluster
        version = (c.nfree, c.cpus, c.memory, sum(map(len, self.kept.values())))
        if version != self._shortage_at:
            self._shortages, self._shortage_at = {}, version
        key = (job.gpus, job.cpus, job.memory, job.gpu_type, job.groups)
        text = self._shortages.get(key)
        if text is None:
            text = c.shortage(job)
            kept = sum(len(gs) for gs in self.kept.values())  # the job's own tenant's are free while it is decided
            if kept:
                text += (
                    f"; {kept} idle GPU(s) kept for the return of tenants that used them within the last "
                    f"{duration_text(self.cfg.lend_after_s)} (inside their guarantees)"
                )
            self._shortages[key] = text
        return text

    def fit_now(self, job: QueuedJob) -> tuple[int, ...] | None:
        if not self.cluster.fits_totals(job):
            return None
        return self.cluster.choose(job)

    def place(self, job: QueuedJob, gpus: tuple[int, ...], borrowed: bool = False) -> None:
        self.changes += 1
        self.cluster.take(gpus, job.cpus, job.memory)
        u = self.tenant(job.tenant_id).use
        u.gpus += job.gpus
        u.cpus += job.cpus
        u.memory += job.memory
        u.running_jobs += 1
        self.result.placements.append((job.id, gpus))
        self.counted.add(job.id)
        if self.pin_owed and not borrowed:
            self.cluster.pin(gpus)
        if borrowed:
            self.result.borrowing.add(job.id)
        if job.max_run_time_s is not None:
            self.releases[id(job)] = (self.now + timedelta(seconds=job.max_run_time_s), gpus, job.cpus, job.memory)

    def place_any(self, job: QueuedJob, borrowed: bool) -> bool:
        """Place ``job`` on any free GPUs, the reserved ones included (it may delay the reservation)."""
        r = self.reservation
        c = self.cluster
        if job.gpus > c.nfree + (len(r.free_reserved) if r else 0) or not c.fits_totals(job):
            return False
        if r is not None and r.free_reserved:
            self.cluster.give(r.free_reserved, 0, 0)
        gpus = self.fit_now(job)
        if gpus is not None:
            self.place(job, gpus, borrowed)
        if r is not None and r.free_reserved:
            taken = set(gpus or ())
            r.free_reserved = [g for g in r.free_reserved if g not in taken]
            self.cluster.take(r.free_reserved, 0, 0)
        return gpus is not None

    def backfill(self, job: QueuedJob, borrowed: bool) -> bool:
        """Start ``job`` behind the reservation where it cannot delay it (rules (a) and (b) of ``backfill``)."""
        r = self.reservation
        assert r is not None
        if r.leftover_fits(job):
            gpus = self.fit_now(job)  # the cluster holds the free reserved GPUs apart
            if gpus is not None:
                r.cpus_left -= job.cpus
                r.memory_left -= job.memory
                self.place(job, gpus, borrowed)
                return True
        return r.ends_in_time(job, self.now) and self.place_any(job, borrowed)

    def make_reservation(self, job: QueuedJob, shortage: str, sooner: datetime | None = None) -> bool:
        """Reserve for ``job`` what it needs at the earliest declared ends (``reserve``), and say so in its wait.
        ``sooner``: a start the job may expect before that (the end of other tenants' turns, ``after_turns``); where
        it is earlier, it is the job's estimated start and the wait names no other (True: the caller says why). The
        reservation, which backfill keeps to, stays at the declared ends."""
        self.changes += 1
        r = self.reservation = reserve(self.cluster, job, list(self.releases.values()))
        self.result.blocked_by = job.id
        earlier = False
        if sooner is not None and (r.at is None or sooner < r.at):
            earlier = True
            self.result.estimated_start[job.id] = sooner
            self.result.wait_reasons[job.id] = f"waiting for capacity: {shortage}"
        elif r.at is None:
            why = "a running job declares no maximum run time"
            if any(self.kept.values()):  # their return is not an end the reservation can count on
                why = "it needs idle GPUs kept for their tenants' return, or a running job declares no maximum run time"
            self.result.wait_reasons[job.id] = f"waiting for capacity: {shortage}; no estimated start ({why})"
        else:
            self.result.estimated_start[job.id] = r.at
            self.result.wait_reasons[job.id] = f"waiting for capacity: {shortage}; estimated start {when_text(r.at)}"
        if r.at is None:
            return earlier
        free = self.cluster.free
        node_of = self.cluster.node_of
        r.free_reserved = sorted(g for g in r.gpus if g in free[node_of[g]])
        self.cluster.take(r.free_reserved, 0, 0)
        return earlier

    def behind(self, job: QueuedJob) -> str:
        if not self._behind:
            r = self.reservation
            assert r is not None
            when = f"estimated start {when_text(r.at)}" if r.at is not None else "no estimated start"
            self._behind = f"waiting behind job {r.job_id} (reserved, {when})"
        return self._behind

    def wait_for_stopping(self, job: QueuedJob, tenant: Tenant | None) -> bool:
        """Whether ``job`` fits once attempts already stopping are gone: it then waits for them, no new victims."""
        if not self.stopping or not self.may_search(("stopping", job.gpu_type, bool(job.groups)), job):
            return False
        pool = [c for c in self.stopping if id(c.held) not in self.victims]
        self.stopping = pool
        found = find_victims(job, self.cluster, pool) if pool else None
        if found is None:
            self.failed[("stopping", job.gpu_type, bool(job.groups))].append((job.gpus, job.cpus, job.memory))
            return False
        chosen, gpus = found
        self.claim(job, chosen, gpus, tenant)
        n = len(chosen)
        if n:
            self.result.wait_reasons[job.id] = f"waiting for {n} stopping job(s) to free their resources"
        else:
            self.result.wait_reasons[job.id] = "waiting for the resources of stopping jobs"
        self.result.estimated_start[job.id] = self.now + self.grace
        return True

    def claim(self, job: QueuedJob, chosen: list[Candidate], gpus: tuple[int, ...], tenant: Tenant | None) -> None:
        """Hold the victims' resources and the free ones ``job`` needs for it: nobody else gets them this pass."""
        self.changes += 1
        theirs: set[int] = set()
        cpus = memory = 0.0
        for c in chosen:
            self.victims.add(id(c.held))
            self.releases.pop(id(c.held), None)
            if c.reason:  # a preemption (not an attempt already stopping): its tenant's share shrinks
                vu = self.victim_use.setdefault(c.held.tenant_id, Usage())
                vu.gpus += len(c.held.gpus)
                vu.cpus += c.held.cpus
                vu.memory += c.held.memory
            theirs.update(c.held.gpus)
            if not moves_away(c):
                cpus += c.held.cpus
                memory += c.held.memory
        free = [g for g in gpus if g not in theirs]
        self.cluster.take(free, max(job.cpus - cpus, 0.0), int(max(job.memory - memory, 0)))
        if tenant is not None:
            u = tenant.use
            u.gpus += job.gpus
            u.cpus += job.cpus
            u.memory += job.memory
            u.running_jobs += 1
            self.counted.add(job.id)

    def repeat(self, key: tuple, job: QueuedJob, waiting: list[str] | None = None) -> bool:
        """``job`` repeats a job with the same ``key`` that could not start since the pass last changed anything
        (``settled``): it waits for the same reason (True)."""
        if job.held_by is not None or job.not_before is not None:
            return False
        if self._settled_at != self.changes:
            self._settled, self._settled_at = {}, self.changes
        known = self._settled.get(key)
        if known is None:
            return False
        self.result.wait_reasons[job.id] = known[0]
        if known[1]:
            assert waiting is not None
            waiting.append(job.id)
        return True

    def settled(self, key: tuple, job: QueuedJob, decide: Callable[[], bool], waiting: list[str] | None = None) -> bool:
        """``decide()`` for ``job``, unless a job with the same ``key`` (its tenant, shape and whatever else the
        policy decides by) could not start since the pass last changed anything: then ``job`` waits for the same
        reason, without the checks, searches and texts (on a long queue most jobs are such repeats). A search
        that failed fails again (``may_search``), so the decisions are those of ``decide()``. ``waiting``: the
        list ``decide()`` may append ``job``'s id to; a repeat is appended when the job it repeats was."""
        if job.held_by is not None or job.not_before is not None:
            return decide()  # their reasons are their own
        if self.repeat(key, job, waiting):
            return False
        before = self.changes
        if decide():
            return True
        if self.changes == before and job.id not in self.result.estimated_start:
            waits = waiting is not None and bool(waiting) and waiting[-1] == job.id
            self._settled[key] = (self.result.wait_reasons[job.id], waits)
        return False

    def run_time_term(self, job: QueuedJob) -> float | None:
        """``job``'s declared run time where backfill may read it, for ``settled`` keys: where too few GPUs are free
        to start it beside the reservation no rule applies, and jobs differing only in it are decided alike."""
        r = self.reservation
        if r is not None and job.gpus > self.cluster.nfree + len(r.free_reserved):
            return None
        return job.max_run_time_s

    def may_search(self, memo: tuple, job: QueuedJob) -> bool:
        """Whether a victim search for ``job`` is worth it: within the pass's budget, and no job at most as big
        found too few among the same candidates (they only shrink during a pass)."""
        if self.searches >= MAX_SEARCHES:
            return False
        failed = self.failed.setdefault(memo, [])
        if any(job.gpus >= f[0] and job.cpus >= f[1] and job.memory >= f[2] for f in failed):
            return False
        self.searches += 1
        return True

    def preempt(
        self,
        job: QueuedJob,
        candidates: Callable[[], list[Candidate]],
        memo: tuple,
        tenant: Tenant | None,
        also: Callable[[Sequence[Candidate]], bool] | None = None,
    ) -> bool:
        """Find victims among ``candidates()`` (waste order) so that ``job`` fits; record the preemptions."""
        if not self.may_search(memo, job):
            return False
        cands = [c for c in candidates() if id(c.held) not in self.victims]
        found = find_victims(job, self.cluster, cands, also) if cands else None
        if found is None or not found[0]:  # no victims: it fits on what the reservation leaves, which said no
            self.failed[memo].append((job.gpus, job.cpus, job.memory))
            return False
        chosen, gpus = found
        self.claim(job, chosen, gpus, tenant)
        self.result.preemptions.extend(preemption(c, job.id) for c in chosen)
        self.result.wait_reasons[job.id] = f"preempting {len(chosen)} job(s) {PREEMPTING[main_reason(chosen)]}"
        self.result.estimated_start[job.id] = self.now + self.grace
        return True
