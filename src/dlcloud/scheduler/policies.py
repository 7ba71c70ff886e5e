"""The scheduling policies beyond one-host FIFO: priority-backfill, fair-share and las (and FIFO on many nodes).

One ``_Pass`` holds the state of a pass (free capacity by node, each tenant's usage, the reservation, the
attempts being stopped); each policy is one loop over its own order of the queue. docs/scheduling.md explains the
policies; the rules, in short:

- Every policy: a job held above the planner or in its restart backoff waits and blocks nobody; hard caps
  (``Limits.gpus/cpus/memory/max_running_jobs``) always hold; a job that can never fit waits and blocks nobody
  (FIFO excepted: it keeps today's behaviour); placement is node-aware best fit (``placement``).
- fifo: the given order; the first job that does not fit blocks everything behind it.
- priority-backfill: effective priority (priority + aging), then submit time, then id. The first job that does not
  fit gets a reservation (``backfill``); later jobs start only where they cannot delay it. No preemption.
- fair-share: tenants by weighted dominant share (recomputed as the pass places jobs or claims resources for a
  preempting job); inside a tenant by effective priority, then submit time. Usage up to a tenant's guarantee is
  owed, beyond it borrowed (capped by the borrowing limit); a non-preemptible job runs only inside its guarantee.
  A job that does not fit may preempt: borrowed attempts of other tenants when it is inside its guarantee
  ("reclaim"); attempts of its own tenant with a lower priority (its own, not aged: aging orders the queue, it
  does not preempt) ("priority"); borrowed attempts of tenants with a larger share that started after it was
  submitted, when it is the head of the line ("fill": what filled in ahead of it is its first victim). A job held
  back by its tenant's caps (quota, borrowing limit) may preempt its tenant's lower-priority attempts to get under
  them ("priority" too). With ``tenant_las_queues_gpu_s`` (the default) a tenant's jobs of one priority go by its queue
  (least attained service first; ``_tenant_order``), and a job may preempt its own tenant's attempts of the same
  priority in a higher las queue ("las": time-sharing inside the tenant's share, never across tenants). Attempts
  already stopping count as soon-free for a job allowed to preempt, so a later pass picks no new victims while
  they stop. Backfill as in priority-backfill, plus: a preemptible job that would be borrowed may start anyway
  ("preemptible fill"), and a job inside its guarantee may start ahead of a reserved job that is not. With
  ``defragment`` (the default), the job at the head of the line that would get the reservation although enough
  GPUs are free, scattered over nodes, moves single-node preemptible attempts instead ("defrag",
  ``_Pass.defragment``): only when every one of them fits again on the GPUs that stay free, which are held for
  it (``Preemption.move_to``, then ``Held.hold`` / ``QueuedJob.hold``: no other job gets them) until it is placed
  again. An owed or catching-up job whose victims are not where it needs them evicts them and moves other
  tenants' small jobs out of the way too, even those inside their guarantees, but only jobs never preempted
  before (a job is moved for another tenant at most once). Where no GPUs stay free for a moved job, it goes onto
  GPUs of other tenants' borrowed single-node attempts on another node, evicted with it ("chained": what the job
  may take back is scattered over nodes that each hold some owed job), unless its tenant held 90 % of its guarantee
  over the turn window or the declared ends free what the job needs within ``CHAIN_UNLESS_FREE_WITHIN_S``; it
  waits for them while they stop (``QueuedJob.hold_until``).
- las: attained-service queue (``las_queues_gpu_s``), then submit time; jobs that fit start, the others do not
  block (work-conserving); a job may preempt preemptible attempts in a strictly higher queue ("las"), the most
  attained first.

Guarantees are per resource; only the resources with a guarantee above zero are checked ("inside its guarantee":
usage with the job ≤ guarantee for each of them); a tenant without any guarantee borrows everything it uses. Of a
tenant's running attempts, the owed ones are its non-preemptible, then highest-priority, then earliest-started
attempts up to its guarantee; the one after them that takes the tenant from short of its guarantee to beyond it
*straddles* it, if it alone fits the guarantee; the rest are borrowed. Jobs come in sizes, so a tenant holding
40 of 46 guaranteed GPUs with 8-GPU jobs would never get the rest back: a job that straddles its tenant's
guarantee (the tenant short of it, the job alone inside it) counts as owed: it reclaims borrowed attempts, but
not straddling ones. A straddling attempt is taken back only by a job strictly inside its guarantee, after every
borrowed one (so two tenants never take one back and forth). A job larger than its tenant's whole guarantee,
which the tenant is short of, may preempt borrowed attempts of tenants whose share stays larger than its tenant's
with it once their victims (of this pass too) are gone ("share": dominant-resource fairness; a tenant with a small
guarantee and large jobs is not starved under contention, and cannot make the tenants it takes from poorer than
itself).
When nothing borrowed is left to catch up from (under contention nearly every GPU runs inside some guarantee), such
a job takes *turns* (``PlanConfig.turn_window_s``): once it waited ``TURN_MIN_WAIT_S`` while its tenant held less than
its guarantee over the window (``Limits.recent_gpu_s``, ``TURN_DUE_BELOW``), it may preempt borrowed attempts and
attempts of tenants that keep 90 % of theirs over the window that ends with the turn ("turn"; those that held the
most of their guarantee first, then their longest-running attempts: ``turn_candidates``). The turn's length (what its
tenant needs to reach its guarantee over the window at the job's size) is granted then (``Plan.turn_grants``, then
``QueuedJob.turn_s``); the job waits for its victims (a grant it could not use is void once nothing is stopping)
and, placed on what they free, runs on its turn (``Plan.turns``): owed until it ends (``Held.turn_until``), on top of
its tenant's guarantee (``_owed_split``), then split as any other attempt. A straddling job that reclaims nothing
takes turns the same way, once its tenant held less than ``STRADDLE_TURN_DUE_BELOW`` of its guarantee over the window
(a tenant of 8-GPU jobs holding 34 of 40 guaranteed GPUs would otherwise wait for the end of some other tenant's
owed job, hours below 90 % of its guarantee).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dlcloud.scheduler.backfill import Release, Reservation, reserve
from dlcloud.scheduler.contract import (
    PREEMPTION_WHY,
    TURN_MIN_S,
    TURN_MIN_WAIT_S,
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
from dlcloud.scheduler.placement import Cluster, choose, processes
from dlcloud.scheduler.planner import quota_reason
from dlcloud.scheduler.preemption import Candidate, find_victims, lost_gpu_s, moves_away, victims_cost

FAIR_SHARE_FLOOR = 0.9  # turns: a tenant gives up capacity for another's turn only while it keeps this fraction of
# its guarantee over the window (and a tenant that held this much over it does not chain moves)
TURN_DUE_BELOW = 1.0  # turns: a tenant is due one while it held less than this fraction of its guarantee over it
# turns for a job that straddles its tenant's guarantee: due below this fraction (the tenant holds most of its
# guarantee all along: a turn while it keeps 90 % of it costs other jobs' work and completion times for nothing)
STRADDLE_TURN_DUE_BELOW = FAIR_SHARE_FLOOR
# turns: victims inside guarantees come first from tenants that held the most of their guarantee over the window, in
# steps of this fraction of it (within a step, the longest-running attempts first)
TURN_VICTIM_STEP = 0.25
MAX_SEARCHES = 24  # victim searches per pass (each looks at ≤ preemption.MAX_CANDIDATES attempts)
NO_LIMITS = Limits()

_PREEMPTING = {
    "reclaim": "to reclaim its guarantee",
    "share": "of tenants with a larger share (its tenant is short of its guarantee)",
    "priority": "of lower priority in its tenant",
    "fill": "that started ahead of it as borrowed fill",
    "las": "with more attained service (las)",
    "defrag": "to gather whole nodes (they resume at once on GPUs left free)",
    "turn": "for its tenant's turn (short of its guarantee over the turn window)",
}


# an owed job that finds no node to take whole moves small jobs onto GPUs of borrowed attempts evicted elsewhere
# ("chained", ``_Pass.defragment``) only when the declared ends free what it needs no sooner than this (and its
# tenant is short over the turn window): a chain costs the moved jobs' and the extra victims' work and delays them
# (on the Philly window an hour gave fewer tenant-hours below than 15 minutes at the same JCT: docs/scheduling.md)
CHAIN_UNLESS_FREE_WITHIN_S = 3600.0


def effective_priority(job: QueuedJob, now: datetime, cfg: PlanConfig) -> int:
    """Priority plus aging: ``aging_step`` per ``aging_interval_s`` waited since submission, at most ``aging_max``."""
    if cfg.aging_step <= 0 or cfg.aging_interval_s <= 0 or job.submitted_at is None:
        return job.priority
    waited = (now - job.submitted_at).total_seconds()
    if waited <= 0:
        return job.priority
    return job.priority + min(cfg.aging_max, cfg.aging_step * int(waited // cfg.aging_interval_s))


def priority_order(jobs: Iterable[QueuedJob], now: datetime, cfg: PlanConfig) -> list[QueuedJob]:
    """``jobs`` by effective priority (highest first), then submit time, then id.

    Computing every job's aging is most of a pass on a long queue, and it is not needed: inside one priority an
    earlier submit has waited at least as long, so aging never reorders it. Each priority's jobs are sorted by
    (submit time, id) and cut into runs of one effective priority (bisecting, as it only falls along the run);
    only runs of equal effective priority from different priorities are merged."""

    def by_submit(j: QueuedJob) -> tuple[datetime, str]:
        return (j.submitted_at or now, j.id)

    def aged(j: QueuedJob) -> int:
        return -effective_priority(j, now, cfg)

    if cfg.aging_max < 0:  # a negative cap makes aging non-monotone: no shortcut
        return sorted(jobs, key=lambda j: (aged(j), *by_submit(j)))
    levels: dict[int, list[QueuedJob]] = {}
    for j in jobs:
        levels.setdefault(j.priority, []).append(j)
    step, interval = cfg.aging_step, cfg.aging_interval_s
    runs: dict[int, list[list[QueuedJob]]] = {}
    for level in levels.values():
        try:  # attrgetter keeps the key out of Python code; a submit time of None (now) needs by_submit
            level.sort(key=operator.attrgetter("submitted_at", "id"))
        except TypeError:
            level.sort(key=by_submit)
        submits = [j.submitted_at or now for j in level]
        i = 0
        while i < len(level):
            e = aged(level[i])
            bonus = -e - level[i].priority
            if bonus <= 0:
                end = len(level)  # no aging from here on: the rest waited less (aging never goes below 0)
            else:
                # a run of this bonus has waited at least ceil(bonus / step) intervals: guess its end from the
                # submit times, and check it against effective_priority itself (float rounding at a boundary)
                since = now - timedelta(seconds=math.ceil(bonus / step) * interval)
                end = bisect.bisect_right(submits, since, lo=i)
                if not (i < end and aged(level[end - 1]) == e and (end == len(level) or aged(level[end]) != e)):
                    end = bisect.bisect_right(level, e, lo=i, key=aged)
            runs.setdefault(e, []).append(level[i:end])
            i = end
    out: list[QueuedJob] = []
    for e in sorted(runs):
        parts = runs[e]
        out.extend(parts[0] if len(parts) == 1 else sorted(itertools.chain(*parts), key=by_submit))
    return out


def las_queue(attained_gpu_s: float, cfg: PlanConfig) -> int:
    """The las queue of an attained service: 0 below the first boundary, 1 below the second, ..."""
    return bisect.bisect_right(cfg.las_queues_gpu_s, attained_gpu_s)


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _when(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def _within(lim: Limits, gpus: int, cpus: float, memory: int) -> bool:
    """Usage ``gpus/cpus/memory`` inside the guarantee (only resources with a guarantee are checked)."""
    if not lim.guaranteed:
        return False
    return (
        (lim.guarantee_gpus <= 0 or gpus <= lim.guarantee_gpus)
        and (lim.guarantee_cpus <= 0 or cpus <= lim.guarantee_cpus + 1e-9)
        and (lim.guarantee_memory <= 0 or memory <= lim.guarantee_memory)
    )


def _borrow_reason(job: QueuedJob, lim: Limits, use: Usage) -> str | None:
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


@dataclass
class _Tenant:
    id: str
    lim: Limits
    use: Usage
    jobs: list[QueuedJob] = field(default_factory=list)
    next: int = 0  # the next of ``jobs`` to consider
    capped: bool = True  # has hard caps or a borrowing limit (else its quota checks are skipped)
    waiting: list[str] = field(default_factory=list)  # jobs waiting for capacity: their reason gets the share


class _Pass:
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
        self.tenants: dict[str, _Tenant] = {}
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

    def resume(self, job: QueuedJob, t: _Tenant, borrowed: bool) -> bool:
        """Give the GPUs held for moved ``job`` back to the free ones, and place it on them if they suffice and
        nothing holds it back (its restart backoff, environment, quota, borrowing limit, CPUs or memory), whatever
        the order or a reservation: it was moved to resume at once. Else (False) it is decided as any other job, its
        GPUs free for all."""
        c = self.cluster
        held_back = (
            self.not_now(job) is not None
            or quota_reason(job, t.lim, t.use) is not None
            or _borrow_reason(job, t.lim, t.use) is not None
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

    def tenant(self, tid: str) -> _Tenant:
        t = self.tenants.get(tid)
        if t is None:
            t = self.tenants[tid] = _Tenant(tid, self.limits.get(tid, NO_LIMITS), Usage())
        return t

    # -- shares ---------------------------------------------------------------------------------------------------
    def _dominant(self, t: _Tenant, gpus: float, cpus: float, memory: float) -> float:
        """Weighted dominant share of ``t`` holding ``gpus/cpus/memory``."""
        g, c, m = self.total
        return max(gpus / g, cpus / c, memory / m) / (t.lim.weight if t.lim.weight > 0 else 1.0)

    def share(self, t: _Tenant) -> float:
        u = t.use
        return self._dominant(t, u.gpus, u.cpus, u.memory)

    def share_with(self, t: _Tenant, job: QueuedJob) -> float:
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

    def share_text(self, t: _Tenant) -> str:
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
            return f"restart backoff until {_when(job.not_before)}"
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
                    f"{_duration(self.cfg.lend_after_s)} (inside their guarantees)"
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
            self.result.wait_reasons[job.id] = f"waiting for capacity: {shortage}; estimated start {_when(r.at)}"
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
            when = f"estimated start {_when(r.at)}" if r.at is not None else "no estimated start"
            self._behind = f"waiting behind job {r.job_id} (reserved, {when})"
        return self._behind

    def wait_for_stopping(self, job: QueuedJob, tenant: _Tenant | None) -> bool:
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

    def claim(self, job: QueuedJob, chosen: list[Candidate], gpus: tuple[int, ...], tenant: _Tenant | None) -> None:
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
        tenant: _Tenant | None,
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
        kinds = [c.reason for c in chosen]
        for c in chosen:
            self.result.preemptions.append(
                Preemption(
                    c.held.job_id,
                    job.id,
                    c.reason,
                    f"preempted by job {job.id} ({c.reason}): {PREEMPTION_WHY[c.reason]}",
                )
            )
        main = next(k for k in ("reclaim", "share", "priority", "fill", "las", "defrag", "turn") if k in kinds)
        self.result.wait_reasons[job.id] = f"preempting {len(chosen)} job(s) {_PREEMPTING[main]}"
        self.result.estimated_start[job.id] = self.now + self.grace
        return True

    def defragment(
        self,
        job: QueuedJob,
        tenant: _Tenant | None,
        borrowed: set[int],
        reclaim: Callable[[], list[Candidate]] | None = None,
        also: Callable[[Sequence[Candidate]], bool] | None = None,
        memo: tuple = (),
    ) -> bool:
        """Enough GPUs are free for ``job`` but not on the nodes it needs (a gang wants whole nodes; free GPUs are
        scattered where small jobs ended): stop single-node preemptible attempts so that it fits, only where every
        one of them fits again on the GPUs that stay free: they are moved, not evicted, and the GPUs each resumes on
        are held for it from this pass until it is placed (``Preemption.move_to``; no other job gets them). Least
        work lost first; at most ``job``'s GPUs are moved. Only attempts ``job`` could preempt anyway may be moved:
        its own tenant's of at most its priority, and other tenants' borrowed ones (``borrowed``: their ``id()``).

        ``reclaim``: ``job`` is owed (inside or straddling its tenant's guarantee) and these are the victims it may
        evict, but they and the free GPUs are not on the nodes it needs: every node also holds small jobs of other
        tenants running inside their guarantees. Then the victims are evicted (they need not fit again) and those
        small jobs may be moved too, when they were never preempted: a job is moved for another tenant's guarantee
        at most once, so submitting gangs cannot make a tenant lose work again and again, and a moved job keeps its
        guarantee (it resumes at once, on GPUs held for it). Under contention no GPUs stay free for a moved job: it
        then goes onto GPUs of more of those victims on another node (``_chain``), evicted with it, so that what the
        job may take back, scattered over nodes that each hold some owed job, is gathered into the nodes it needs;
        not when ``job`` had better wait (``_chain_needless``)."""
        c = self.cluster
        if not self.cfg.defragment or not c.fits_totals(job) or c.single_node:
            return False
        if reclaim is None and c.nfree < job.gpus:
            return False
        node_of, names = c.node_of, c.names
        memo = ("defrag", reclaim is not None, *memo, job.gpu_type, bool(job.groups))
        if not self.may_search(memo, job):
            return False
        evict = [x for x in reclaim() if id(x.held) not in self.victims] if reclaim is not None else []
        evicting = {id(x.held) for x in evict}
        if reclaim is not None and c.nfree + sum(len(x.held.gpus) for x in evict) < job.gpus:
            self.failed[memo].append((job.gpus, job.cpus, job.memory))
            return False

        def one_node(h: Held) -> bool:
            return all(node_of.get(g) == node_of.get(h.gpus[0]) for g in h.gpus)

        def movable(h: Held) -> bool:
            if h.tenant_id == job.tenant_id:
                may = h.priority <= job.priority
            else:  # never another tenant's attempt on its turn (it is owed until the turn ends)
                may = (id(h) in borrowed or (reclaim is not None and h.preemptions == 0)) and not _on_turn(h, self.now)
            return (
                may
                and id(h) not in evicting
                and h.preemptible
                and not h.stopping
                and 0 < len(h.gpus) < c.max_size
                and id(h) not in self.victims
                and one_node(h)
            )

        def at_most_its_gpus(chosen: Sequence[Candidate]) -> bool:
            moved = sum(len(x.held.gpus) for x in chosen if x.reason == "defrag")
            return moved <= job.gpus and (also is None or also(chosen))

        now = self.now
        moves = sorted(
            (Candidate(h, (2, lost_gpu_s(h, now), len(h.gpus)), "defrag") for h in self.held if movable(h)),
            key=lambda x: x.key,
        )
        found = find_victims(job, c, evict + moves, at_most_its_gpus)
        if found is None or not found[0]:
            self.failed[memo].append((job.gpus, job.cpus, job.memory))
            return False
        chosen, gpus = found
        # every moved attempt must fit again on GPUs free now that ``job`` does not take, or (an owed or catching-up
        # job, chained) on one node with GPUs of borrowed attempts ``job`` may evict anyway, evicted with it: such a
        # victim may stop after the moved job, which then waits for it (``resume``, until ``QueuedJob.hold_until``)
        # instead of starting anywhere, the node ``job`` needs included; its CPUs and memory go with it
        # (``moves_away``)
        free = [list(fl) for fl in c.free]
        for g in gpus:
            fl = free[node_of[g]]
            i = bisect.bisect_left(fl, g)
            if i < len(fl) and fl[i] == g:
                del fl[i]
        free_now = {g for fl in free for g in fl}
        move_to: dict[int, tuple[int, ...]] = {}
        chained: list[Candidate] = []
        # what a chain may evict: other tenants' borrowed attempts on one node (not gangs, not straddling attempts,
        # not the job's own tenant's), among those the job may evict anyway
        taken = {id(y.held) for y in chosen}
        spare = [
            x
            for x in evict
            if id(x.held) not in taken
            and id(x.held) in borrowed
            and x.held.tenant_id != job.tenant_id
            and x.held.gpus
            and one_node(x.held)
        ]
        wait: bool | None = None  # whether ``job`` had better wait than chain (asked once, if needed)
        for x in sorted((x for x in chosen if x.reason == "defrag"), key=lambda x: -len(x.held.gpus)):
            want = names.get(x.held.gpus[0], "").lower()
            k = len(x.held.gpus)
            pick = choose(free, names, [(k, want)])
            if pick is None and spare:
                if wait is None:
                    wait = self._chain_needless(job, tenant)
                more = None if wait else self._chain(k, want, free, spare, gpus)
                if more is not None and (also is None or also([*chosen, *chained, *more])):
                    chained += more
                    spare = [y for y in spare if all(y is not z for z in more)]
                    for y in more:
                        for g in y.held.gpus:
                            if g in node_of and g not in gpus:
                                bisect.insort(free[node_of[g]], g)
                    pick = choose(free, names, [(k, want)])
            if pick is None:  # not remembered in ``failed``: a larger job may leave room elsewhere
                return False
            move_to[id(x.held)] = pick
            for g in pick:
                fl = free[node_of[g]]
                del fl[bisect.bisect_left(fl, g)]
        chosen += chained
        self.claim(job, chosen, gpus, tenant)
        for pick in move_to.values():  # held for the moved jobs from now on (a chained victim's: once it stopped)
            self.cluster.take([g for g in pick if g in free_now], 0, 0)
        for x in chosen:
            self.result.preemptions.append(
                Preemption(
                    x.held.job_id,
                    job.id,
                    x.reason,
                    f"preempted by job {job.id} ({x.reason}): {PREEMPTION_WHY[x.reason]}",
                    move_to.get(id(x.held), ()),
                )
            )
        kinds = {x.reason for x in chosen}
        main = next(k for k in ("reclaim", "share", "priority", "fill", "las", "defrag", "turn") if k in kinds)
        moved = len(move_to)
        moving = f", moving {moved} to gather whole nodes" if main != "defrag" and moved else ""
        self.result.wait_reasons[job.id] = f"preempting {len(chosen)} job(s) {_PREEMPTING[main]}{moving}"
        self.result.estimated_start[job.id] = self.now + self.grace
        return True

    def held_over_window(self, tenant: _Tenant | None) -> bool:
        """Whether ``tenant`` held 90 % of its guarantee over the last turn window (known only with turns on)."""
        lim = tenant.lim if tenant is not None else None
        window = self.cfg.turn_window_s
        return (
            lim is not None
            and lim.recent_gpu_s is not None
            and window > 0
            and lim.recent_gpu_s >= FAIR_SHARE_FLOOR * lim.guarantee_gpus * window
        )

    def _chain_needless(self, job: QueuedJob, tenant: _Tenant | None) -> bool:
        """Whether ``job`` waits rather than chain moves: its tenant held 90 % of its guarantee over the last turn
        window (``held_over_window``: a short gap, the hours count, and a chain costs other jobs' work and completion
        times), or the declared ends free what it needs within ``CHAIN_UNLESS_FREE_WITHIN_S``."""
        if self.held_over_window(tenant):
            return True
        r = reserve(self.cluster, job, list(self.releases.values()))
        return r.at is not None and r.at <= self.now + timedelta(seconds=CHAIN_UNLESS_FREE_WITHIN_S)

    def _chain(
        self, k: int, want: str, free: list[list[int]], spare: list[Candidate], taken: tuple[int, ...]
    ) -> list[Candidate] | None:
        """Victims among ``spare`` (other tenants' borrowed single-node attempts the job may evict, waste order) on one
        node whose GPUs, with those free there (``free``, what the moves so far left), make room for a moved job of
        ``k`` GPUs (of type ``want``), not on the GPUs ``taken`` by the job: the node where they are fewest GPUs,
        then cost least (``find_victims``' rule)."""
        c = self.cluster
        on_node: dict[int, list[tuple[Candidate, int]]] = {}  # each node's victims with their matching GPUs there
        for y in spare:
            if set(y.held.gpus).isdisjoint(taken):
                for n, here in c.held_by_node(y.held, want):  # one node: ``spare`` holds single-node attempts
                    on_node.setdefault(n, []).append((y, here))
        best: list[Candidate] | None = None
        best_cost: tuple = ()
        for n, ys in on_node.items():
            fl = free[n]
            have = len(fl) if not want else sum(1 for g in fl if want in c.names[g])
            picked: list[Candidate] = []
            for y, here in ys:
                if have >= k:
                    break
                picked.append(y)
                have += here
            if have >= k:
                cost = (sum(len(y.held.gpus) for y in picked), victims_cost(picked))
                if best is None or cost < best_cost:
                    best, best_cost = picked, cost
        return best


# -- fifo on many nodes ---------------------------------------------------------------------------------------------
def _fifo(p: _Pass, queue: Iterable[QueuedJob]) -> None:
    for job in queue:
        why = p.not_now(job)
        t = p.tenant(job.tenant_id)
        if why is None:
            why = quota_reason(job, t.lim, t.use)
        if why is not None:
            p.result.wait_reasons[job.id] = why
            continue
        gpus = p.fit_now(job)
        if gpus is None:
            p.result.wait_reasons[job.id] = "waiting for capacity: " + p.shortage(job)
            p.result.blocked_by = job.id
            return
        p.place(job, gpus)


# -- priority-backfill --------------------------------------------------------------------------------------------
def _priority_backfill(p: _Pass, queue: Iterable[QueuedJob]) -> None:
    now, cfg = p.now, p.cfg
    order = priority_order(queue, now, cfg)
    reasons = p.result.wait_reasons

    def decide(job: QueuedJob, t: _Tenant) -> bool:
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


# -- fair-share -----------------------------------------------------------------------------------------------------
def _below(lim: Limits, use: Usage) -> bool:
    """``use`` is short of the guarantee: strictly below it in every guaranteed resource."""
    return (
        lim.guaranteed
        and (lim.guarantee_gpus <= 0 or use.gpus < lim.guarantee_gpus)
        and (lim.guarantee_cpus <= 0 or use.cpus < lim.guarantee_cpus - 1e-9)
        and (lim.guarantee_memory <= 0 or use.memory < lim.guarantee_memory)
    )


def _straddles(lim: Limits, use: Usage, gpus: int, cpus: float, memory: int) -> bool:
    """A job of ``gpus/cpus/memory`` would straddle its tenant's guarantee: the tenant is short of it (``_below``),
    the job alone fits it, but usage with the job exceeds it. Such a job counts as owed (see the module docstring):
    else a tenant whose jobs are as large as what it lacks (8-GPU jobs, 40 of 46 guaranteed GPUs in use) could
    never reclaim the rest."""
    return (
        _below(lim, use)
        and _within(lim, gpus, cpus, memory)
        and not _within(lim, use.gpus + gpus, use.cpus + cpus, use.memory + memory)
    )


def _on_turn(h: Held, now: datetime) -> bool:
    return h.turn_until is not None and h.turn_until > now


def _owed_split(p: _Pass) -> tuple[set[int], set[int]]:
    """id() of the running attempts beyond their tenant's guarantee (borrowed), and of those that straddle it: the
    attempt that takes its tenant from short of its guarantee to beyond it and alone fits the guarantee (at most
    one a tenant; see the module docstring). An attempt larger than the whole guarantee is borrowed."""
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
        rest = [h for h in hs if not _on_turn(h, p.now)]
        for h in sorted(rest, key=lambda h: (h.preemptible, -h.priority, h.started_at or far, h.job_id)):
            if not _within(lim, use.gpus + len(h.gpus), use.cpus + h.cpus, use.memory + h.memory):
                if h.preemptible and _straddles(lim, use, len(h.gpus), h.cpus, h.memory):
                    straddling.add(id(h))
                else:
                    borrowed.add(id(h))
            use.gpus, use.cpus, use.memory = use.gpus + len(h.gpus), use.cpus + h.cpus, use.memory + h.memory
    return borrowed, straddling


def _tenant_order(jobs: list[QueuedJob], now: datetime, cfg: PlanConfig) -> list[QueuedJob]:
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


def _fair_share(p: _Pass, queue: Iterable[QueuedJob]) -> None:
    now, cfg, reasons = p.now, p.cfg, p.result.wait_reasons
    by_tenant: dict[str, list[QueuedJob]] = {}
    for job in queue:
        by_tenant.setdefault(job.tenant_id, []).append(job)
    for tid, jobs in by_tenant.items():  # tenants in order of first appearance, as the heap's ties need
        p.tenant(tid).jobs = jobs
    for t in p.tenants.values():
        lim = t.lim
        t.capped = any(
            x is not None
            for x in (lim.gpus, lim.cpus, lim.memory, lim.max_running_jobs, lim.borrow_gpus, lim.borrow_cpus,
                      lim.borrow_memory)
        )  # fmt: skip
        t.jobs = _tenant_order(t.jobs, now, cfg)
    borrowed, straddling = _owed_split(p)
    live = [h for h in p.held if h.preemptible and not h.stopping]
    # what runs inside guarantees (straddling included) pins its node, as does what no reclaim takes (non-preemptible
    # work beyond a guarantee lowered since it started): best fit gathers it on fewer nodes, and the others stay whole
    # for owed jobs of a node or more (``Cluster.pin``)
    p.pin_owed = True
    for h in p.held:
        if (id(h) not in borrowed or not h.preemptible) and not h.stopping:
            p.cluster.pin(h.gpus)

    def as_reclaim(h: Held) -> Candidate:
        return Candidate(h, (0, h.priority, lost_gpu_s(h, now)), "reclaim")

    reclaimable = sorted(
        (as_reclaim(h) for h in live if id(h) in borrowed),
        key=lambda c: c.key,
    )
    # straddling attempts of other tenants: only a job strictly inside its guarantee takes them back, after every
    # borrowed one (a straddling job reclaims borrowed capacity only, so two tenants never take one back and forth)
    last_resort = sorted(
        (Candidate(h, (1, h.priority, lost_gpu_s(h, now)), "reclaim") for h in live if id(h) in straddling),
        key=lambda c: c.key,
    )
    bounds = cfg.tenant_las_queues_gpu_s

    def lq(attained_gpu_s: float) -> int:
        return bisect.bisect_right(bounds, attained_gpu_s) if bounds else 0

    own: dict[str, list[Candidate]] = {}
    top_q: dict[tuple[str, int], int] = {}  # (tenant, priority): the highest las queue of its live attempts
    for h in live:
        q = lq(h.attained_gpu_s)
        key = (0 if id(h) in borrowed else 1, h.priority, -q, lost_gpu_s(h, now))
        own.setdefault(h.tenant_id, []).append(Candidate(h, key, "priority"))
        top_q[h.tenant_id, h.priority] = max(q, top_q.get((h.tenant_id, h.priority), 0))
    for cs in own.values():
        cs.sort(key=lambda c: c.key)

    lowest = {tid: min(c.held.priority for c in cs) for tid, cs in own.items()}

    def outranks(job: QueuedJob, t: _Tenant) -> bool:
        """``job`` may preempt attempts of its own tenant: some have a lower priority, or (las in the tenant) the
        same priority and more attained service (a higher las queue)."""
        return lowest.get(t.id, job.priority) < job.priority or top_q.get((t.id, job.priority), 0) > lq(
            job.attained_gpu_s
        )

    def own_victims(job: QueuedJob, t: _Tenant) -> list[Candidate]:
        q = lq(job.attained_gpu_s)
        out = []
        for c in own.get(t.id, ()):
            h = c.held
            if h.priority < job.priority:
                out.append(c)
            elif h.priority == job.priority and lq(h.attained_gpu_s) > q:
                out.append(Candidate(h, c.key, "las"))
        return out

    def candidates(job: QueuedJob, t: _Tenant, inside: bool, straddle: bool, catch_up: bool) -> list[Candidate]:
        cands = own_victims(job, t)
        if inside or straddle:
            cands += [c for c in reclaimable if c.held.tenant_id != t.id]
        if inside:
            cands += [c for c in last_resort if c.held.tenant_id != t.id]
        fill = p.reservation is None and not inside and not straddle
        if catch_up or fill:
            mine = p.share_with(t, job)
            since = job.submitted_at or now
            for c in reclaimable:
                h = c.held
                if h.tenant_id == t.id or p.share(p.tenant(h.tenant_id)) <= mine:
                    continue
                if catch_up:
                    # short of its guarantee, a job larger than it takes borrowed capacity of tenants that hold a
                    # larger share than its tenant will, and still do without it (``larger_shares_stay``)
                    cands.append(Candidate(h, c.key, "share"))
                elif h.started_at is not None and h.started_at >= since:
                    # what filled in ahead of it: borrowed attempts of tenants with a larger share, started after it
                    cands.append(Candidate(h, c.key, "fill"))
        cands.sort(key=lambda c: c.key)
        return cands

    def larger_shares_stay(job: QueuedJob, t: _Tenant) -> Callable[[Sequence[Candidate]], bool]:
        """For a catching-up job: every tenant it takes from keeps a share larger than ``t``'s with the job, once
        its victims (of this pass and these) are gone."""
        mine = p.share_with(t, job)

        def check(chosen: Sequence[Candidate]) -> bool:
            others = {x.held.tenant_id for x in chosen if x.reason == "share"}
            return all(p.share_without(tid, chosen) > mine for tid in others)

        return check

    def standing(job: QueuedJob, t: _Tenant) -> tuple[bool, bool]:
        """(inside its tenant's guarantee, straddling it): owed either way (see the module docstring)."""
        inside = _within(t.lim, t.use.gpus + job.gpus, t.use.cpus + job.cpus, t.use.memory + job.memory)
        return inside, not inside and job.preemptible and _straddles(t.lim, t.use, job.gpus, job.cpus, job.memory)

    def over_quota_by_priority(job: QueuedJob, t: _Tenant) -> bool:
        """A job held back by its tenant's caps may preempt its tenant's lower-priority attempts to get under them;
        its tenant's stopping attempts count as gone (no new victims while they stop)."""
        stop = p.stopping_use.get(t.id, Usage())

        def under_caps(chosen: Sequence[Candidate]) -> bool:
            u = Usage(
                t.use.gpus - stop.gpus - sum(len(c.held.gpus) for c in chosen),
                t.use.cpus - stop.cpus - sum(c.held.cpus for c in chosen),
                t.use.memory - stop.memory - sum(c.held.memory for c in chosen),
                t.use.running_jobs - stop.running_jobs - len(chosen),
            )
            return quota_reason(job, t.lim, u) is None and _borrow_reason(job, t.lim, u) is None

        if stop.running_jobs and under_caps([]):
            reasons[job.id] = f"waiting for {stop.running_jobs} stopping job(s) of its tenant to free its quota"
            p.result.estimated_start[job.id] = now + p.grace
            p.changes += 1
            t.use.gpus += job.gpus
            t.use.cpus += job.cpus
            t.use.memory += job.memory
            t.use.running_jobs += 1
            return True

        def cands() -> list[Candidate]:
            return own_victims(job, t)

        memo = ("quota", t.id, job.priority, lq(job.attained_gpu_s), job.gpu_type, bool(job.groups))
        if not p.preempt(job, cands, memo, t, under_caps):
            return False
        reasons[job.id] += " to make room in its quota"
        return True

    window = cfg.turn_window_s
    # per tenant: a note for its owed jobs that wait while other tenants' jobs run on their turns (owed until then)
    turns_of_others: dict[str, str] = {}
    on_turn = [h for h in live if _on_turn(h, now)]
    if on_turn:
        for tid in p.tenants:
            theirs = [h for h in on_turn if h.tenant_id != tid]
            if theirs:
                ends = min(h.turn_until for h in theirs if h.turn_until is not None)
                gpus = sum(len(h.gpus) for h in theirs)
                turns_of_others[tid] = (
                    f"; {gpus} GPU(s) run other tenants' turns, the first ending {_when(ends)} (they may not be "
                    "reclaimed before)"
                )

    def after_turns(job: QueuedJob, t: _Tenant) -> datetime | None:
        """When owed ``job`` may start by reclaiming what other tenants' turns hold, once they have ended (with what
        is free or reclaimable now): the end of the last turn it needs, plus its victims' grace; None when their
        ends make no room for it. An estimate for its wait only: the reservation, and so backfill, does not use it.
        Asked once a pass at most (for the job that makes the reservation)."""
        theirs = sorted(
            (h for h in on_turn if h.tenant_id != t.id and id(h) not in p.victims),
            key=lambda h: h.turn_until or now,
        )
        pool = [c for c in reclaimable if c.held.tenant_id != t.id and id(c.held) not in p.victims]
        for i, h in enumerate(theirs):
            if i + 1 < len(theirs) and theirs[i + 1].turn_until == h.turn_until:
                continue  # ending together: tried with the last of them
            ended = [as_reclaim(x) for x in theirs[: i + 1]]
            if find_victims(job, p.cluster, ended + pool) is not None:
                return (h.turn_until or now) + p.grace
        return None

    def can_spare(tid: str, gpus: int, length: float) -> bool:
        """Whether tenant ``tid`` keeps 90 % of its guarantee over the window that ends when a turn of ``length``
        does, if it loses ``gpus`` more GPUs now: what it held over the window (as if evenly: the part the turn's length
        pushes out goes) plus what it holds then for the turn's length, its attempts stopping and this pass's victims
        gone. Forward-looking, so turns granted earlier (this pass or before) count through what they took."""
        lim = p.limits.get(tid, NO_LIMITS)
        if lim.recent_gpu_s is None or lim.guarantee_gpus <= 0:
            return False
        gone = p.victim_use.get(tid, Usage()).gpus + p.stopping_use.get(tid, Usage()).gpus
        keeps = p.tenant(tid).use.gpus - gone - gpus
        ahead = lim.recent_gpu_s * (window - length) / window + keeps * length
        return ahead >= FAIR_SHARE_FLOOR * lim.guarantee_gpus * window

    def turn_length(job: QueuedJob, t: _Tenant, due_below: float) -> float | None:
        """How long a turn ``job`` is due (its tenant below ``due_below`` of its guarantee over the window, the job
        waiting long enough): as long as its tenant needs to reach its guarantee over the window at the job's size,
        at least ``TURN_MIN_S``, at most half the window; None when not due, or when the job is too large for its
        tenant's guarantee over the window (its shortest turn would give the tenant more than that)."""
        lim = t.lim
        if window <= 0 or lim.recent_gpu_s is None or lim.guarantee_gpus <= 0 or job.gpus <= 0:
            return None
        if job.gpus * TURN_MIN_S > lim.guarantee_gpus * window:
            return None
        waited = (now - (job.submitted_at or now)).total_seconds()
        span = min(window, waited)
        if span < TURN_MIN_WAIT_S or lim.recent_gpu_s >= due_below * lim.guarantee_gpus * span:
            return None
        return min(window / 2, max(TURN_MIN_S, (lim.guarantee_gpus * window - lim.recent_gpu_s) / job.gpus))

    def turn_candidates(job: QueuedJob, t: _Tenant, length: float) -> list[Candidate]:
        """Other tenants' borrowed attempts, then attempts inside the guarantees of tenants that can spare one; each
        group by lowest priority, then (inside guarantees) the tenants that held the most of their guarantee over the
        window first (``TURN_VICTIM_STEP``), then highest las queue (as Tiresias: delaying what has run longest costs
        completion times least), then least work lost; never an attempt on its own tenant's turn."""
        out = []
        for h in live:
            if h.tenant_id == t.id or _on_turn(h, now):
                continue
            if id(h) in borrowed:
                out.append(Candidate(h, (0, h.priority, 0, -lq(h.attained_gpu_s), lost_gpu_s(h, now)), "turn"))
            elif can_spare(h.tenant_id, len(h.gpus), length):
                lim = p.limits[h.tenant_id]  # can_spare: known, with a guarantee and its recent usage
                kept = lim.recent_gpu_s / (lim.guarantee_gpus * window)  # type: ignore[operator]
                poorer = -math.floor(kept / TURN_VICTIM_STEP)
                out.append(Candidate(h, (1, h.priority, poorer, -lq(h.attained_gpu_s), lost_gpu_s(h, now)), "turn"))
        out.sort(key=lambda c: c.key)
        return out

    def turn_affordable(length: float) -> Callable[[Sequence[Candidate]], bool]:
        def check(chosen: Sequence[Candidate]) -> bool:
            taken: dict[str, int] = {}
            for c in chosen:
                if id(c.held) not in borrowed:
                    taken[c.held.tenant_id] = taken.get(c.held.tenant_id, 0) + len(c.held.gpus)
            return all(can_spare(tid, n, length) for tid, n in taken.items())

        return check

    def consider(job: QueuedJob, t: _Tenant) -> bool:
        """Place ``job`` or say why it waits; True when its tenant's usage grew (placed, or resources claimed)."""
        key = (t.id, job.gpus, job.cpus, job.memory, job.gpu_type, job.groups, job.priority,
               lq(job.attained_gpu_s), job.preemptible, p.run_time_term(job), job.turn_s is not None)  # fmt: skip
        if p.repeat(key, job, t.waiting):
            return False  # before the kept GPUs are given back and taken again: most of a long queue repeats
        # idle GPUs kept for tenants' return (``_Pass.keep``): its tenant's own, and every tenant's for a job of a
        # tenant short of its guarantee (owed or catching up), which would otherwise preempt while they idle
        short = any(standing(job, t)) or (job.preemptible and _below(t.lim, t.use))
        with p.kept_for(t.id, short):
            if not p.settled(key, job, lambda: decide(job, t), t.waiting):
                return False
        if job.turn_s is not None and p.result.placements and p.result.placements[-1][0] == job.id:
            # placed on what its turn's victims freed: the turn granted when they were chosen starts now
            p.result.turns[job.id] = now + timedelta(seconds=job.turn_s)
        return True

    def decide(job: QueuedJob, t: _Tenant) -> bool:
        why = p.not_now(job) if job.held_by is not None or job.not_before is not None else None
        if why is None and t.capped:
            why = quota_reason(job, t.lim, t.use) or _borrow_reason(job, t.lim, t.use)
            if why is not None and outranks(job, t) and p.never_fits(job) is None and over_quota_by_priority(job, t):
                return True
        if why is None:
            why = p.never_fits(job)
        if why is not None:
            reasons[job.id] = why
            return False
        inside, straddle = standing(job, t)
        owed = inside or straddle
        # larger than its tenant's guarantee, which the tenant is short of (see ``candidates``)
        catch_up = not owed and job.preemptible and _below(t.lim, t.use)
        # a job granted a turn (its victims are stopping) waits for them, it does not look for more; once nothing is
        # stopping, a grant it could not use (what its victims freed went to a job considered before it) is void
        granted = job.turn_s is not None and bool(p.stopping_use)
        # a job larger than what its tenant lacks takes turns, and so does a straddling one (under contention nothing
        # borrowed is left for it to reclaim, and it would wait for the end of some other tenant's owed job)
        turn = None
        if (catch_up or straddle) and not granted:
            turn = turn_length(job, t, TURN_DUE_BELOW if catch_up else STRADDLE_TURN_DUE_BELOW)
        if not job.preemptible and not inside:
            lim = t.lim
            reasons[job.id] = (
                f"non-preemptible: runs only inside tenant {t.id}'s guarantee "
                f"({t.use.gpus} of {lim.guarantee_gpus} guaranteed GPU(s) in use, needs {job.gpus})"
            )
            return False
        r = p.reservation
        if r is None:
            gpus = p.fit_now(job)
            if gpus is not None:
                p.place(job, gpus, borrowed=not owed)
                return True
        elif job.gpus > p.cluster.nfree + len(r.free_reserved):
            pass  # cannot start now, whatever the rule: straight to preemption (the idle pass's common case)
        elif (
            p.backfill(job, not owed)
            or (owed and not p.reserved_inside and p.place_any(job, False))
            or (job.preemptible and not owed and p.place_any(job, True))
        ):
            return True
        by_priority = outranks(job, t)
        fill = r is None and not owed and bool(reclaimable)
        if (owed or by_priority or granted) and p.wait_for_stopping(job, t):
            return True
        if (inside and (reclaimable or last_resort)) or ((straddle or catch_up) and reclaimable) or by_priority or fill:
            rank = (job.priority, lq(job.attained_gpu_s)) if by_priority else None
            memo = ("fs", inside, straddle, catch_up, t.id if by_priority or catch_up else None, rank, fill)
            cands = lambda: candidates(job, t, inside, straddle, catch_up)  # noqa: E731
            also = larger_shares_stay(job, t) if catch_up else None
            if p.preempt(job, cands, memo + (job.gpu_type, bool(job.groups)), t, also):
                return True
        if (owed or catch_up) and p.defragment(
            job,
            t,
            borrowed,
            reclaim=lambda: candidates(job, t, inside, straddle, catch_up),
            also=larger_shares_stay(job, t) if catch_up else None,
            memo=(inside, straddle, t.id if catch_up else None),
        ):
            return True  # its victims are on other nodes than the free GPUs: evict them, move what is in the way
        if r is None and p.defragment(job, t, borrowed):
            return True
        if turn is not None and p.preempt(
            job, lambda: turn_candidates(job, t, turn), ("turn", t.id, turn, job.gpu_type, bool(job.groups)), t,
            turn_affordable(turn),
        ):  # fmt: skip
            p.result.turn_grants[job.id] = turn
            return True
        # what it would reclaim may be another tenant's turn: say until when, and (the job at the head of the line,
        # on the GPUs free before its reservation takes them) when it may start once they have ended
        behind_turns = owed and t.id in turns_of_others
        when = after_turns(job, t) if behind_turns and r is None else None
        after = False
        if r is None:
            after = p.make_reservation(job, p.shortage(job), sooner=when)
            p.reserved_inside = owed
        else:
            reasons[job.id] = p.behind(job)
        if behind_turns:
            reasons[job.id] += turns_of_others[t.id]
            if after and when is not None:
                reasons[job.id] += f": estimated start {_when(when)}, once the turns it needs have ended"
        t.waiting.append(job.id)
        return False

    def rank(t: _Tenant) -> tuple[int, float]:
        """Owed work first: a tenant whose next job runs inside its guarantee goes before every tenant that
        would borrow (as Kueue admits within nominal quota before borrowing), then by dominant share. Else,
        once a reclaim's victims have stopped and both shares are back to equal, the victim's older job would
        take the GPUs again and be preempted again, round after round."""
        inside, straddle = standing(t.jobs[t.next], t)
        return (0 if inside or straddle else 1, p.share(t))

    # Jobs an earlier pass preempted for go first: what their victims free is theirs (as Kueue's nominated
    # workloads). Stateless, the next pass gave it to whoever came first in the order, and the job, still owed,
    # preempted again, round after round (docs/scheduling.md, "Results").
    # GPUs held for moved jobs (an earlier pass's defrag) are theirs: out of the free ones until each is considered
    first = sorted(
        (j for t in p.tenants.values() for j in t.jobs if j.reclaiming or j.hold),
        key=lambda j: (j.submitted_at or now, j.id),
    )
    holds = {h.job_id: h.hold for h in p.held if h.hold and h.stopping}
    holds.update((j.id, j.hold) for j in first if j.hold)
    if holds:
        p.hold(holds, {j.id: j.hold_until for j in first if j.hold and j.hold_until is not None})
    done = {j.id for j in first}
    for job in first:
        t = p.tenants[job.tenant_id]
        if job.hold and p.resume(job, t, borrowed=not any(standing(job, t))):
            continue
        consider(job, t)
    # then idle GPUs are kept for tenants' return: not what the victims of the jobs above freed for them
    for tid, lim in p.limits.items():
        if lim.recent_peak_gpus:
            p.keep(tid)

    def remaining(t: _Tenant) -> bool:
        """Skip the jobs considered first; True while ``t`` has jobs left."""
        while t.next < len(t.jobs) and t.jobs[t.next].id in done:
            t.next += 1
        return t.next < len(t.jobs)

    counter = itertools.count()
    heap = [(*rank(t), next(counter), t.id) for t in p.tenants.values() if remaining(t)]
    heapq.heapify(heap)
    while heap:
        *_, tid = heapq.heappop(heap)
        t = p.tenants[tid]
        while remaining(t):
            job = t.jobs[t.next]
            t.next += 1
            if consider(job, t):
                if remaining(t):
                    heapq.heappush(heap, (*rank(t), next(counter), tid))
                break
    _add_share_positions(p)


def _add_share_positions(p: _Pass) -> None:
    waiting = sorted((t for t in p.tenants.values() if t.waiting), key=lambda t: (p.share(t), t.id))
    reasons = p.result.wait_reasons
    for rank, t in enumerate(waiting):
        ahead = [a.id for a in waiting[:rank]]
        if ahead:
            names = ", ".join(ahead[:3]) + (f" and {len(ahead) - 3} more" if len(ahead) > 3 else "")
            pos = f"behind tenant(s) {names} with a smaller share"
        else:
            pos = "first in line among tenants with waiting jobs"
        text = f"; fair share: {p.share_text(t)}, {pos}"
        joined: dict[str, str] = {}  # most of a tenant's jobs wait for one reason: one text for them all
        for jid in t.waiting:
            base = reasons[jid]
            full = joined.get(base)
            if full is None:
                full = joined[base] = base + text
            reasons[jid] = full


# -- las --------------------------------------------------------------------------------------------------------------
def _las(p: _Pass, queue: Iterable[QueuedJob]) -> None:
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

    def decide(job: QueuedJob, t: _Tenant, q: int) -> bool:
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


_POLICIES: dict[Policy, Callable[[_Pass, Iterable[QueuedJob]], None]] = {
    Policy.FIFO: _fifo,
    Policy.PRIORITY_BACKFILL: _priority_backfill,
    Policy.FAIR_SHARE: _fair_share,
    Policy.LAS: _las,
}


def run(
    queue: Iterable[QueuedJob],
    held: Iterable[Held],
    limits: dict[str, Limits],
    inventory: Inventory,
    now: datetime,
    config: PlanConfig,
) -> Plan:
    p = _Pass(held, limits, inventory, now, config)
    _POLICIES[config.policy](p, queue)
    return p.result
