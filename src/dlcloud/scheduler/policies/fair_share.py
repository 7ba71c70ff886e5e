"""fair-share: weighted dominant-resource fairness across tenants, with guarantees, borrowing and preemption.

Tenants go by weighted dominant share (recomputed as the pass places jobs or claims resources for a preempting job),
owed work first (``FairShare.rank``); inside a tenant by ``tenant_las.tenant_order``. Usage up to a tenant's
guarantee is owed, beyond it borrowed (capped by the borrowing limit, ``terms.borrow_reason``); a non-preemptible job
runs only inside its guarantee (``guarantees``). A job that does not fit may preempt (``FairShare.preempt_for``):

- "reclaim": borrowed attempts of other tenants when it is inside (or straddles) its guarantee, straddling ones
  after them when it is strictly inside (``FairShare.reclaim_victims``);
- "priority" / "las": attempts of its own tenant with a lower priority, or of the same priority in a higher las
  queue (``tenant_las.OwnAttempts``); a job held back by its tenant's caps (quota, borrowing limit) may preempt its
  tenant's lower-priority attempts to get under them (``FairShare.over_quota_by_priority``);
- "share" (catching up): a job larger than its tenant's whole guarantee, which the tenant is short of, takes
  borrowed attempts of tenants whose share stays larger than its tenant's with it once their victims (of this pass
  too) are gone (``FairShare.share_victims``, ``FairShare.larger_shares_stay``): a tenant with a small guarantee and
  large jobs is not starved under contention, and cannot make the tenants it takes from poorer than itself;
- "fill": borrowed attempts of tenants with a larger share that started after it was submitted, when it is the head
  of the line (what filled in ahead of it is its first victim; ``FairShare.fill_victims``);
- "defrag" and chains (``defrag``), and "turn" (``turns``).

Attempts already stopping count as soon-free for a job allowed to preempt, so a later pass picks no new victims
while they stop. Backfill as in priority-backfill, plus: a preemptible job that would be borrowed may start anyway
("preemptible fill"), and a job inside its guarantee may start ahead of a reserved job that is not
(``FairShare.start_now``). Jobs an earlier pass preempted for, or moved, go first (``FairShare.run``). Idle
guaranteed GPUs are kept for their tenant's return (``Pass.keep``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from dlcloud.scheduler.contract import Held, QueuedJob, Usage
from dlcloud.scheduler.policies.defrag import defragment
from dlcloud.scheduler.policies.guarantees import as_reclaim, owed_split, standing
from dlcloud.scheduler.policies.state import Pass, Tenant
from dlcloud.scheduler.policies.tenant_las import OwnAttempts, tenant_order
from dlcloud.scheduler.policies.terms import below, borrow_reason, quota_reason, when_text
from dlcloud.scheduler.policies.turns import STRADDLE_TURN_DUE_BELOW, TURN_DUE_BELOW, Turns
from dlcloud.scheduler.preemption import Candidate, lost_gpu_s


@dataclass(frozen=True)
class Standing:
    """Where a job stands against its tenant's guarantee, as the pass decides it."""

    inside: bool  # usage with it stays inside the guarantee
    straddle: bool  # the tenant is short of it, the job alone fits it, usage with it goes beyond (owed too)
    catch_up: bool  # not owed, preemptible, its tenant short of its guarantee: larger than what the tenant lacks
    granted: bool  # granted a turn by an earlier pass whose victims are still stopping: it waits for them
    turn: float | None  # the turn it is due now (catching up or straddling, not granted), else None

    @property
    def owed(self) -> bool:
        """Inside or straddling: the job reclaims, goes first in ``FairShare.rank``, and is placed unborrowed."""
        return self.inside or self.straddle


def fair_share(p: Pass, queue: Iterable[QueuedJob]) -> None:
    """The fair-share pass over ``queue`` (any order): its decisions go into ``p.result``."""
    FairShare(p, queue).run()


class FairShare:
    """The state one fair-share pass shares between its rules: the queue by tenant, the owed/borrowed split of the
    running attempts, the victims each rule may take, and the turns."""

    def __init__(self, p: Pass, queue: Iterable[QueuedJob]) -> None:
        self.p = p
        self.now = p.now
        self.reasons = p.result.wait_reasons
        self._tenants(queue)
        self.borrowed, self.straddling = owed_split(p)
        self.live = [h for h in p.held if h.preemptible and not h.stopping]
        # what runs inside guarantees (straddling included) pins its node, as does what no reclaim takes
        # (non-preemptible work beyond a guarantee lowered since it started): best fit gathers it on fewer nodes, and
        # the others stay whole for owed jobs of a node or more (``Cluster.pin``)
        p.pin_owed = True
        for h in p.held:
            if (id(h) not in self.borrowed or not h.preemptible) and not h.stopping:
                p.cluster.pin(h.gpus)
        self.reclaimable = sorted(
            (as_reclaim(h, self.now) for h in self.live if id(h) in self.borrowed), key=lambda c: c.key
        )
        # straddling attempts of other tenants: only a job strictly inside its guarantee takes them back, after every
        # borrowed one (a straddling job reclaims borrowed capacity only, so two tenants never take one back and forth)
        now, straddling = self.now, self.straddling
        self.last_resort = sorted(
            (Candidate(h, (1, h.priority, lost_gpu_s(h, now)), "reclaim") for h in self.live if id(h) in straddling),
            key=lambda c: c.key,
        )
        self.own = OwnAttempts(self.live, self.borrowed, p.cfg.tenant_las_queues_gpu_s, self.now)
        self.lq = self.own.queue
        self.turns = Turns(p, self.live, self.borrowed, self.reclaimable, self.lq)

    def _tenants(self, queue: Iterable[QueuedJob]) -> None:
        """Each tenant's queued jobs in its order, and whether it has caps to check."""
        p = self.p
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
            t.jobs = tenant_order(t.jobs, self.now, p.cfg)

    # -- the order ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Jobs an earlier pass preempted for go first: what their victims free is theirs (as Kueue's nominated
        workloads). Stateless, the next pass gave it to whoever came first in the order, and the job, still owed,
        preempted again, round after round (docs/scheduling.md, "Results"). GPUs held for moved jobs (an earlier
        pass's defrag) are theirs: out of the free ones until each is considered. Then idle GPUs are kept for
        tenants' return (not what the victims of the jobs above freed for them), and the rest go by ``rank``."""
        p, now = self.p, self.now
        first = sorted(
            (j for t in p.tenants.values() for j in t.jobs if j.reclaiming or j.hold),
            key=lambda j: (j.submitted_at or now, j.id),
        )
        holds = {h.job_id: h.hold for h in p.held if h.hold and h.stopping}
        holds.update((j.id, j.hold) for j in first if j.hold)
        if holds:
            p.hold(holds, {j.id: j.hold_until for j in first if j.hold and j.hold_until is not None})
        for job in first:
            t = p.tenants[job.tenant_id]
            if job.hold and p.resume(job, t, borrowed=not any(standing(job, t))):
                continue
            self.consider(job, t)
        for tid, lim in p.limits.items():
            if lim.recent_peak_gpus:
                p.keep(tid)
        self._by_rank({j.id for j in first})
        _add_share_positions(p)

    def _by_rank(self, done: set[str]) -> None:
        """Tenants by ``rank``, one job at a time: after a tenant's usage grows, it goes back in line."""
        p = self.p

        def remaining(t: Tenant) -> bool:
            """Skip the jobs considered first; True while ``t`` has jobs left."""
            while t.next < len(t.jobs) and t.jobs[t.next].id in done:
                t.next += 1
            return t.next < len(t.jobs)

        counter = itertools.count()
        heap = [(*self.rank(t), next(counter), t.id) for t in p.tenants.values() if remaining(t)]
        heapq.heapify(heap)
        while heap:
            *_, tid = heapq.heappop(heap)
            t = p.tenants[tid]
            while remaining(t):
                job = t.jobs[t.next]
                t.next += 1
                if self.consider(job, t):
                    if remaining(t):
                        heapq.heappush(heap, (*self.rank(t), next(counter), tid))
                    break

    def rank(self, t: Tenant) -> tuple[int, float]:
        """Owed work first: a tenant whose next job runs inside its guarantee goes before every tenant that
        would borrow (as Kueue admits within nominal quota before borrowing), then by dominant share. Else,
        once a reclaim's victims have stopped and both shares are back to equal, the victim's older job would
        take the GPUs again and be preempted again, round after round."""
        inside, straddle = standing(t.jobs[t.next], t)
        return (0 if inside or straddle else 1, self.p.share(t))

    # -- one job --------------------------------------------------------------------------------------------------
    def consider(self, job: QueuedJob, t: Tenant) -> bool:
        """Place ``job`` or say why it waits; True when its tenant's usage grew (placed, or resources claimed)."""
        p = self.p
        key = (t.id, job.gpus, job.cpus, job.memory, job.gpu_type, job.groups, job.priority,
               self.lq(job.attained_gpu_s), job.preemptible, p.run_time_term(job), job.turn_s is not None)  # fmt: skip
        if p.repeat(key, job, t.waiting):
            return False  # before the kept GPUs are given back and taken again: most of a long queue repeats
        # idle GPUs kept for tenants' return (``Pass.keep``): its tenant's own, and every tenant's for a job of a
        # tenant short of its guarantee (owed or catching up), which would otherwise preempt while they idle
        short = any(standing(job, t)) or (job.preemptible and below(t.lim, t.use))
        with p.kept_for(t.id, short):
            if not p.settled(key, job, lambda: self.decide(job, t), t.waiting):
                return False
        if job.turn_s is not None and p.result.placements and p.result.placements[-1][0] == job.id:
            # placed on what its turn's victims freed: the turn granted when they were chosen starts now
            p.result.turns[job.id] = self.now + timedelta(seconds=job.turn_s)
        return True

    def decide(self, job: QueuedJob, t: Tenant) -> bool:
        """Start ``job`` now, or preempt for it, or say why it waits (and reserve for it at the head of the line);
        True when its tenant's usage grew."""
        p = self.p
        why = p.not_now(job) if job.held_by is not None or job.not_before is not None else None
        if why is None and t.capped:
            why = quota_reason(job, t.lim, t.use) or borrow_reason(job, t.lim, t.use)
            if (
                why is not None
                and self.own.outranks(job, t.id)
                and p.never_fits(job) is None
                and self.over_quota_by_priority(job, t)
            ):
                return True
        if why is None:
            why = p.never_fits(job)
        if why is not None:
            self.reasons[job.id] = why
            return False
        s = self.standing(job, t)
        if not job.preemptible and not s.inside:
            self.reasons[job.id] = (
                f"non-preemptible: runs only inside tenant {t.id}'s guarantee "
                f"({t.use.gpus} of {t.lim.guarantee_gpus} guaranteed GPU(s) in use, needs {job.gpus})"
            )
            return False
        if self.start_now(job, s.owed) or self.preempt_for(job, t, s):
            return True
        self.wait(job, t, s.owed)
        return False

    def standing(self, job: QueuedJob, t: Tenant) -> Standing:
        """``job``'s ``Standing``: owed (inside or straddling), catching up (larger than what its tenant lacks), its
        turn granted, or the turn it is due: a job larger than what its tenant lacks takes turns, and so does a
        straddling one (under contention nothing borrowed is left for it to reclaim, and it would wait for the end
        of some other tenant's owed job); once nothing is stopping, a grant it could not use (what its victims freed
        went to a job considered before it) is void."""
        inside, straddle = standing(job, t)
        catch_up = not (inside or straddle) and job.preemptible and below(t.lim, t.use)
        granted = job.turn_s is not None and bool(self.p.stopping_use)
        turn = None
        if (catch_up or straddle) and not granted:
            turn = self.turns.length(job, t, TURN_DUE_BELOW if catch_up else STRADDLE_TURN_DUE_BELOW)
        return Standing(inside, straddle, catch_up, granted, turn)

    def start_now(self, job: QueuedJob, owed: bool) -> bool:
        """Place ``job`` on free GPUs: at once with no reservation; else behind it where it cannot delay it
        (``Pass.backfill``), ahead of it where ``job`` is owed and the reserved job is not, or anywhere as
        preemptible fill that would be borrowed (the reserved job may preempt it)."""
        p = self.p
        r = p.reservation
        if r is None:
            gpus = p.fit_now(job)
            if gpus is not None:
                p.place(job, gpus, borrowed=not owed)
                return True
            return False
        if job.gpus > p.cluster.nfree + len(r.free_reserved):
            return False  # cannot start now, whatever the rule: straight to preemption (the idle pass's common case)
        return (
            p.backfill(job, not owed)
            or (owed and not p.reserved_inside and p.place_any(job, False))
            or (job.preemptible and not owed and p.place_any(job, True))
        )

    def preempt_for(self, job: QueuedJob, t: Tenant, s: Standing) -> bool:
        """Wait for attempts already stopping, or preempt for ``job`` by the rules its standing allows (reclaim,
        priority, las, share, fill), then move jobs to gather whole nodes (``defrag``), then take a turn; True when
        resources were claimed for it."""
        p = self.p
        at_head = p.reservation is None
        by_priority = self.own.outranks(job, t.id)
        fill = at_head and not s.owed and bool(self.reclaimable)
        if (s.owed or by_priority or s.granted) and p.wait_for_stopping(job, t):
            return True
        inside, straddle, catch_up = s.inside, s.straddle, s.catch_up
        if (
            (inside and (self.reclaimable or self.last_resort))
            or ((straddle or catch_up) and self.reclaimable)
            or by_priority
            or fill
        ):
            rank = (job.priority, self.lq(job.attained_gpu_s)) if by_priority else None
            memo = ("fs", inside, straddle, catch_up, t.id if by_priority or catch_up else None, rank, fill)
            cands = lambda: self.candidates(job, t, inside, straddle, catch_up)  # noqa: E731
            also = self.larger_shares_stay(job, t) if catch_up else None
            if p.preempt(job, cands, memo + (job.gpu_type, bool(job.groups)), t, also):
                return True
        if (s.owed or catch_up) and defragment(
            p,
            job,
            t,
            self.borrowed,
            reclaim=lambda: self.candidates(job, t, inside, straddle, catch_up),
            also=self.larger_shares_stay(job, t) if catch_up else None,
            memo=(inside, straddle, t.id if catch_up else None),
        ):
            return True  # its victims are on other nodes than the free GPUs: evict them, move what is in the way
        if at_head and defragment(p, job, t, self.borrowed):
            return True
        turn = s.turn
        if turn is not None and p.preempt(
            job, lambda: self.turns.candidates(t, turn), ("turn", t.id, turn, job.gpu_type, bool(job.groups)), t,
            self.turns.affordable(turn),
        ):  # fmt: skip
            p.result.turn_grants[job.id] = turn
            return True
        return False

    def wait(self, job: QueuedJob, t: Tenant, owed: bool) -> None:
        """``job`` waits: the head of the line gets the reservation, the others wait behind it. What an owed job
        would reclaim may be another tenant's turn: say until when, and (the job at the head of the line, on the GPUs
        free before its reservation takes them) when it may start once they have ended."""
        p = self.p
        behind_turns = owed and t.id in self.turns.of_others
        at_head = p.reservation is None
        when = self.turns.after(job, t) if behind_turns and at_head else None
        after = False
        if at_head:
            after = p.make_reservation(job, p.shortage(job), sooner=when)
            p.reserved_inside = owed
        else:
            self.reasons[job.id] = p.behind(job)
        if behind_turns:
            self.reasons[job.id] += self.turns.of_others[t.id]
            if after and when is not None:
                self.reasons[job.id] += f": estimated start {when_text(when)}, once the turns it needs have ended"
        t.waiting.append(job.id)

    # -- victims --------------------------------------------------------------------------------------------------
    def candidates(self, job: QueuedJob, t: Tenant, inside: bool, straddle: bool, catch_up: bool) -> list[Candidate]:
        """Every attempt ``job`` may preempt by its standing, in waste order: its own tenant's (``OwnAttempts``),
        reclaimable ones (owed), those of tenants with a larger share (catching up), or fill (the head of the line)."""
        cands = self.own.victims(job, t.id)
        if inside or straddle:
            cands += self.reclaim_victims(t, inside)
        if catch_up:
            cands += self.share_victims(job, t)
        elif self.p.reservation is None and not inside and not straddle:
            cands += self.fill_victims(job, t)
        cands.sort(key=lambda c: c.key)
        return cands

    def reclaim_victims(self, t: Tenant, inside: bool) -> list[Candidate]:
        """Reclaim: other tenants' borrowed attempts, then (a job strictly ``inside`` its guarantee) their
        straddling ones."""
        out = [c for c in self.reclaimable if c.held.tenant_id != t.id]
        if inside:
            out += [c for c in self.last_resort if c.held.tenant_id != t.id]
        return out

    def _larger_share(self, h: Held, t: Tenant, mine: float) -> bool:
        """``h`` is another tenant's, whose share now is larger than ``mine`` (``t``'s with the job)."""
        return h.tenant_id != t.id and self.p.share(self.p.tenant(h.tenant_id)) > mine

    def share_victims(self, job: QueuedJob, t: Tenant) -> list[Candidate]:
        """Catching up: short of its guarantee, a job larger than it takes borrowed capacity of tenants that hold a
        larger share than its tenant will (with ``larger_shares_stay``: and still do without it)."""
        mine = self.p.share_with(t, job)
        return [Candidate(c.held, c.key, "share") for c in self.reclaimable if self._larger_share(c.held, t, mine)]

    def fill_victims(self, job: QueuedJob, t: Tenant) -> list[Candidate]:
        """Fill: what filled in ahead of ``job``: borrowed attempts of tenants with a larger share than its tenant's
        with it, started after it was submitted."""
        mine = self.p.share_with(t, job)
        since = job.submitted_at or self.now
        return [
            Candidate(c.held, c.key, "fill")
            for c in self.reclaimable
            if self._larger_share(c.held, t, mine) and c.held.started_at is not None and c.held.started_at >= since
        ]

    def larger_shares_stay(self, job: QueuedJob, t: Tenant) -> Callable[[Sequence[Candidate]], bool]:
        """For a catching-up job: every tenant it takes from keeps a share larger than ``t``'s with the job, once
        its victims (of this pass and these) are gone."""
        p = self.p
        mine = p.share_with(t, job)

        def check(chosen: Sequence[Candidate]) -> bool:
            others = {x.held.tenant_id for x in chosen if x.reason == "share"}
            return all(p.share_without(tid, chosen) > mine for tid in others)

        return check

    def over_quota_by_priority(self, job: QueuedJob, t: Tenant) -> bool:
        """A job held back by its tenant's caps may preempt its tenant's lower-priority attempts to get under them;
        its tenant's stopping attempts count as gone (no new victims while they stop)."""
        p = self.p
        stop = p.stopping_use.get(t.id, Usage())

        def under_caps(chosen: Sequence[Candidate]) -> bool:
            u = Usage(
                t.use.gpus - stop.gpus - sum(len(c.held.gpus) for c in chosen),
                t.use.cpus - stop.cpus - sum(c.held.cpus for c in chosen),
                t.use.memory - stop.memory - sum(c.held.memory for c in chosen),
                t.use.running_jobs - stop.running_jobs - len(chosen),
            )
            return quota_reason(job, t.lim, u) is None and borrow_reason(job, t.lim, u) is None

        if stop.running_jobs and under_caps([]):
            self.reasons[job.id] = f"waiting for {stop.running_jobs} stopping job(s) of its tenant to free its quota"
            p.result.estimated_start[job.id] = self.now + p.grace
            p.changes += 1
            t.use.gpus += job.gpus
            t.use.cpus += job.cpus
            t.use.memory += job.memory
            t.use.running_jobs += 1
            return True
        memo = ("quota", t.id, job.priority, self.lq(job.attained_gpu_s), job.gpu_type, bool(job.groups))
        if not p.preempt(job, lambda: self.own.victims(job, t.id), memo, t, under_caps):
            return False
        self.reasons[job.id] += " to make room in its quota"
        return True


def _add_share_positions(p: Pass) -> None:
    """Each waiting job's reason gets its tenant's share and its place among the tenants with waiting jobs."""
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
