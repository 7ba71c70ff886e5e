"""fair-share's turns: a tenant short of its guarantee over a window takes capacity for a bounded turn.

When nothing borrowed is left to catch up from (under contention nearly every GPU runs inside some guarantee), a job
larger than what its tenant's guarantee leaves takes *turns* (``PlanConfig.turn_window_s``): once it waited
``TURN_MIN_WAIT_S`` while its tenant held less than its guarantee over the window (``Limits.recent_gpu_s``,
``TURN_DUE_BELOW``), it may preempt borrowed attempts and attempts of tenants that keep 90 % of theirs over the window
that ends with the turn ("turn"; those that held the most of their guarantee first, then their longest-running
attempts: ``Turns.candidates``). The turn's length (what its tenant needs to reach its guarantee over the window at
the job's size, ``Turns.length``) is granted then (``Plan.turn_grants``, then ``QueuedJob.turn_s``); the job waits for
its victims (a grant it could not use is void once nothing is stopping) and, placed on what they free, runs on its
turn (``Plan.turns``): owed until it ends (``Held.turn_until``), on top of its tenant's guarantee
(``guarantees.owed_split``), then split as any other attempt. A straddling job that reclaims nothing takes turns the
same way, once its tenant held less than ``STRADDLE_TURN_DUE_BELOW`` of its guarantee over the window (a tenant of
8-GPU jobs holding 34 of 40 guaranteed GPUs would otherwise wait for the end of some other tenant's owed job, hours
below 90 % of its guarantee).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime

from dlcloud.scheduler.contract import TURN_MIN_S, TURN_MIN_WAIT_S, Held, QueuedJob, Usage
from dlcloud.scheduler.policies.guarantees import as_reclaim
from dlcloud.scheduler.policies.state import Pass, Tenant
from dlcloud.scheduler.policies.terms import NO_LIMITS, on_turn, when_text
from dlcloud.scheduler.preemption import Candidate, find_victims, lost_gpu_s

FAIR_SHARE_FLOOR = 0.9  # turns: a tenant gives up capacity for another's turn only while it keeps this fraction of
# its guarantee over the window (and a tenant that held this much over it does not chain moves)
TURN_DUE_BELOW = 1.0  # turns: a tenant is due one while it held less than this fraction of its guarantee over it
# turns for a job that straddles its tenant's guarantee: due below this fraction (the tenant holds most of its
# guarantee all along: a turn while it keeps 90 % of it costs other jobs' work and completion times for nothing)
STRADDLE_TURN_DUE_BELOW = FAIR_SHARE_FLOOR
# turns: victims inside guarantees come first from tenants that held the most of their guarantee over the window, in
# steps of this fraction of it (within a step, the longest-running attempts first)
TURN_VICTIM_STEP = 0.25


def held_over_window(tenant: Tenant | None, window: float) -> bool:
    """Whether ``tenant`` held 90 % of its guarantee over the last turn window (known only with turns on)."""
    lim = tenant.lim if tenant is not None else None
    return (
        lim is not None
        and lim.recent_gpu_s is not None
        and window > 0
        and lim.recent_gpu_s >= FAIR_SHARE_FLOOR * lim.guarantee_gpus * window
    )


class Turns:
    """The turns of one fair-share pass: who is due one and for how long, its victims, and the notes for owed
    jobs waiting behind other tenants' turns. ``live``: preemptible attempts not stopping; ``borrowed`` and
    ``reclaimable``: as ``guarantees.owed_split`` splits them; ``queue``: the las queue inside a tenant."""

    def __init__(
        self,
        p: Pass,
        live: list[Held],
        borrowed: set[int],
        reclaimable: list[Candidate],
        queue: Callable[[float], int],
    ) -> None:
        self.p = p
        self.window = p.cfg.turn_window_s
        self.borrowed = borrowed
        self.live = live
        self.reclaimable = reclaimable
        self.queue = queue
        self.on_turn = [h for h in live if on_turn(h, p.now)]
        # per tenant: a note for its owed jobs that wait while other tenants' jobs run on their turns (owed until then)
        self.of_others: dict[str, str] = {}
        if self.on_turn:
            for tid in p.tenants:
                theirs = [h for h in self.on_turn if h.tenant_id != tid]
                if theirs:
                    ends = min(h.turn_until for h in theirs if h.turn_until is not None)
                    gpus = sum(len(h.gpus) for h in theirs)
                    self.of_others[tid] = (
                        f"; {gpus} GPU(s) run other tenants' turns, the first ending {when_text(ends)} (they may not "
                        "be reclaimed before)"
                    )

    def after(self, job: QueuedJob, t: Tenant) -> datetime | None:
        """When owed ``job`` may start by reclaiming what other tenants' turns hold, once they have ended (with what
        is free or reclaimable now): the end of the last turn it needs, plus its victims' grace; None when their
        ends make no room for it. An estimate for its wait only: the reservation, and so backfill, does not use it.
        Asked once a pass at most (for the job that makes the reservation)."""
        p, now = self.p, self.p.now
        theirs = sorted(
            (h for h in self.on_turn if h.tenant_id != t.id and id(h) not in p.victims),
            key=lambda h: h.turn_until or now,
        )
        pool = [c for c in self.reclaimable if c.held.tenant_id != t.id and id(c.held) not in p.victims]
        for i, h in enumerate(theirs):
            if i + 1 < len(theirs) and theirs[i + 1].turn_until == h.turn_until:
                continue  # ending together: tried with the last of them
            ended = [as_reclaim(x, now) for x in theirs[: i + 1]]
            if find_victims(job, p.cluster, ended + pool) is not None:
                return (h.turn_until or now) + p.grace
        return None

    def can_spare(self, tid: str, gpus: int, length: float) -> bool:
        """Whether tenant ``tid`` keeps 90 % of its guarantee over the window that ends when a turn of ``length``
        does, if it loses ``gpus`` more GPUs now: what it held over the window (as if evenly: the part the turn's length
        pushes out goes) plus what it holds then for the turn's length, its attempts stopping and this pass's victims
        gone. Forward-looking, so turns granted earlier (this pass or before) count through what they took."""
        p, window = self.p, self.window
        lim = p.limits.get(tid, NO_LIMITS)
        if lim.recent_gpu_s is None or lim.guarantee_gpus <= 0:
            return False
        gone = p.victim_use.get(tid, Usage()).gpus + p.stopping_use.get(tid, Usage()).gpus
        keeps = p.tenant(tid).use.gpus - gone - gpus
        ahead = lim.recent_gpu_s * (window - length) / window + keeps * length
        return ahead >= FAIR_SHARE_FLOOR * lim.guarantee_gpus * window

    def length(self, job: QueuedJob, t: Tenant, due_below: float) -> float | None:
        """How long a turn ``job`` is due (its tenant below ``due_below`` of its guarantee over the window, the job
        waiting long enough): as long as its tenant needs to reach its guarantee over the window at the job's size,
        at least ``TURN_MIN_S``, at most half the window; None when not due, or when the job is too large for its
        tenant's guarantee over the window (its shortest turn would give the tenant more than that)."""
        lim, window, now = t.lim, self.window, self.p.now
        if window <= 0 or lim.recent_gpu_s is None or lim.guarantee_gpus <= 0 or job.gpus <= 0:
            return None
        if job.gpus * TURN_MIN_S > lim.guarantee_gpus * window:
            return None
        waited = (now - (job.submitted_at or now)).total_seconds()
        span = min(window, waited)
        if span < TURN_MIN_WAIT_S or lim.recent_gpu_s >= due_below * lim.guarantee_gpus * span:
            return None
        return min(window / 2, max(TURN_MIN_S, (lim.guarantee_gpus * window - lim.recent_gpu_s) / job.gpus))

    def candidates(self, t: Tenant, length: float) -> list[Candidate]:
        """Other tenants' borrowed attempts, then attempts inside the guarantees of tenants that can spare one; each
        group by lowest priority, then (inside guarantees) the tenants that held the most of their guarantee over the
        window first (``TURN_VICTIM_STEP``), then highest las queue (as Tiresias: delaying what has run longest costs
        completion times least), then least work lost; never an attempt on its own tenant's turn."""
        p, now, lq = self.p, self.p.now, self.queue
        out = []
        for h in self.live:
            if h.tenant_id == t.id or on_turn(h, now):
                continue
            if id(h) in self.borrowed:
                out.append(Candidate(h, (0, h.priority, 0, -lq(h.attained_gpu_s), lost_gpu_s(h, now)), "turn"))
            elif self.can_spare(h.tenant_id, len(h.gpus), length):
                lim = p.limits[h.tenant_id]  # can_spare: known, with a guarantee and its recent usage
                kept = lim.recent_gpu_s / (lim.guarantee_gpus * self.window)  # type: ignore[operator]
                poorer = -math.floor(kept / TURN_VICTIM_STEP)
                out.append(Candidate(h, (1, h.priority, poorer, -lq(h.attained_gpu_s), lost_gpu_s(h, now)), "turn"))
        out.sort(key=lambda c: c.key)
        return out

    def affordable(self, length: float) -> Callable[[Sequence[Candidate]], bool]:
        """A check of a turn's victims: every tenant that loses attempts inside its guarantee can spare them."""

        def check(chosen: Sequence[Candidate]) -> bool:
            taken: dict[str, int] = {}
            for c in chosen:
                if id(c.held) not in self.borrowed:
                    taken[c.held.tenant_id] = taken.get(c.held.tenant_id, 0) + len(c.held.gpus)
            return all(self.can_spare(tid, n, length) for tid, n in taken.items())

        return check
