"""The planner's contract: what a scheduling pass is given (queue, held attempts, limits, config) and what it
decides (a Plan). Plain frozen values; ``planner.plan`` and the policies read them, the control plane builds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

# the bounds and defaults shared with the server's settings are defined there (the bottom layer); re-exported
from dlcloud.settings import LAS_QUEUES_GPU_S, LEND_AFTER_S, TENANT_LAS_QUEUES_GPU_S
from dlcloud.settings import MAX_LEND_AFTER_S as MAX_LEND_AFTER_S
from dlcloud.settings import MIN_TURN_WINDOW_S as MIN_TURN_WINDOW_S
from dlcloud.settings import TURN_MIN_S as TURN_MIN_S


@dataclass(frozen=True)
class GroupDemand:
    """A replica group of a gang: ``count`` replicas of ``gpus`` GPUs each (of ``gpu_type`` when set)."""

    role: str
    count: int
    gpus: int
    gpu_type: str | None = None


class Policy(StrEnum):
    """How a pass orders and places jobs (``PlanConfig.policy``); docs/scheduling.md explains each."""

    FIFO = "fifo"  # priority, then submit time, across tenants; the first job that does not fit blocks the rest
    PRIORITY_BACKFILL = "priority-backfill"  # priority with aging; jobs behind a blocked one may backfill
    FAIR_SHARE = "fair-share"  # weighted DRF across tenants, guarantees + borrowing, preemption, backfill, aging
    LAS = "las"  # least attained service (GPU-seconds) first, Tiresias-style; needs no run-time estimates


TURN_MIN_WAIT_S = 900.0  # fair-share turns: a job waits this long before its tenant takes a turn for it
# how much longer than the grace period GPUs stay held for a moved job that is stopping (``Held.hold``), and it waits
# for those of its hold a victim still stopping holds (``QueuedJob.hold_until``): the supervision's SIGKILL comes at
# the end of the grace period, its next pass (a tick) sees the attempt ended
HOLD_MARGIN_S = 60.0


@dataclass(frozen=True)
class PlanConfig:
    policy: Policy = Policy.FIFO
    # aging: a queued job's effective priority grows by ``aging_step`` per ``aging_interval_s`` waited (from its
    # original submit time), up to ``aging_max`` above its own; 0 turns aging off
    aging_interval_s: float = 3600.0
    aging_step: int = 1
    aging_max: int = 100
    # las: attained-service boundaries (GPU-seconds) of its priority queues, lowest first
    las_queues_gpu_s: tuple[float, ...] = LAS_QUEUES_GPU_S
    # fair-share inside a tenant: jobs of one priority by the queue of these attained-service boundaries
    # (GPU-seconds; least attained service first), then submit time, and a job may preempt its own tenant's
    # attempts of the same priority in a higher queue (Tiresias-style time sharing inside the tenant's share);
    # empty: by effective priority, then submit time, no such preemption. Coarser than las's own queues. On the
    # Philly window, replayed at three ticks, (7200, 72000) gave avg JCT 0.39 x FIFO where (14400, 144000) gave 0.41
    # and (10800, 108000) 0.43, for a third more preemptions (docs/scheduling.md, "Results")
    tenant_las_queues_gpu_s: tuple[float, ...] = TENANT_LAS_QUEUES_GPU_S
    # fair-share: when enough GPUs are free for the job at the head of the line but scattered over nodes, move
    # single-node preemptible attempts (stop them; they resume on the GPUs left free) so that it fits
    defragment: bool = True
    # how long a stopping (preempted) attempt is expected to take to free its resources: the grace period; used
    # only for estimated starts
    preemption_grace_s: float = 60.0
    # fair-share turns: a tenant below its guarantee over the last ``turn_window_s`` (``Limits.recent_gpu_s``) whose
    # next job is larger than what its guarantee leaves may run it for a bounded turn, taking owed capacity of
    # tenants above their guarantee over that window; 0: no turns, else at least ``MIN_TURN_WINDOW_S``
    turn_window_s: float = 3600.0
    # fair-share: guaranteed GPUs a tenant stopped using are lent to other tenants only after this long (the most it
    # held at once over the last ``lend_after_s`` in attempts that still run or ran shorter than that,
    # ``Limits.recent_peak_gpus`` (``attempts.peak_gpus``), up to its guarantee, stays free for
    # its jobs and other tenants' owed ones): a tenant of short jobs gets its next one started at once instead of
    # after a reclaim's grace period, and no borrower loses work to a reclaim minutes after it started; 0: idle
    # guaranteed GPUs are lent at once
    lend_after_s: float = LEND_AFTER_S


@dataclass(frozen=True)
class QueuedJob:
    id: str
    tenant_id: str
    gpus: int
    cpus: float
    memory: int
    gpu_type: str | None = None
    not_before: datetime | None = None
    held_by: str | None = None  # decided above the planner: why it cannot start yet (e.g. its environment)
    # a gang: its replica groups (gpus / cpus / memory above are then the gang's totals); empty: one process
    groups: tuple[GroupDemand, ...] = ()
    priority: int = 0  # within its tenant's allowed range (a priority class's value or the job's own)
    submitted_at: datetime | None = None  # the original submit time, kept across preemptions (None: ``now``)
    max_run_time_s: float | None = None  # declared maximum run time of an attempt (backfill, estimates)
    preemptible: bool = True  # False: placed only inside its tenant's guarantee, and never chosen as a victim
    attained_gpu_s: float = 0.0  # GPU-seconds its earlier attempts used (las)
    # an earlier pass preempted attempts for it (fair-share): what they free is its own, it is considered first
    reclaiming: bool = False
    # moved (a "defrag" preemption): the GPUs an earlier pass chose for its next attempt, held for it (no other job
    # gets them) until it is placed
    hold: tuple[int, ...] = ()
    # moved onto GPUs of a victim evicted with it (``Preemption.move_to``): until then, while such a victim is still
    # stopping on them, it waits for them rather than starting elsewhere
    hold_until: datetime | None = None
    # an earlier pass preempted for it for its tenant's turn (fair-share): the turn's length, given when it is placed
    turn_s: float | None = None


@dataclass(frozen=True)
class Limits:
    """A tenant's quota (hard caps) and fair-share terms. ``None`` caps are unlimited."""

    gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None
    max_running_jobs: int | None = None
    # fair share: what the tenant is guaranteed (it may preempt borrowers to get it back) ...
    guarantee_gpus: int = 0
    guarantee_cpus: float = 0.0
    guarantee_memory: int = 0
    # ... how much more it may borrow from idle capacity (None: as much as is idle) ...
    borrow_gpus: int | None = None
    borrow_cpus: float | None = None
    borrow_memory: int | None = None
    # ... and its weight in dominant-resource fairness
    weight: float = 1.0
    # GPU-seconds its attempts held over the last ``PlanConfig.turn_window_s`` (None: unknown, no turns)
    recent_gpu_s: float | None = None
    # the most GPUs its attempts held at once over the last ``PlanConfig.lend_after_s`` (None: unknown, all lent)
    recent_peak_gpus: int | None = None

    @property
    def guaranteed(self) -> bool:
        """The tenant is guaranteed something: without a guarantee, all it runs is borrowed."""
        return self.guarantee_gpus > 0 or self.guarantee_cpus > 0 or self.guarantee_memory > 0


@dataclass
class Usage:
    gpus: int = 0
    cpus: float = 0.0
    memory: int = 0
    running_jobs: int = 0


@dataclass(frozen=True)
class Held:
    """Resources held by one live attempt (all replicas of a gang: a gang is preempted whole)."""

    tenant_id: str
    gpus: tuple[int, ...]
    cpus: float
    memory: int
    job_id: str = ""
    priority: int = 0
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    progress_at: datetime | None = None  # its last checkpoint (else its start): preempting loses the work since
    max_run_time_s: float | None = None  # expected end: ``started_at`` + this
    preemptible: bool = True
    attained_gpu_s: float = 0.0  # GPU-seconds over all its attempts up to ``now``
    stopping: bool = False  # already being stopped (preempted, cancelled): frees its resources soon, no victim
    # being moved (stopping after a "defrag" preemption): the GPUs held for its next attempt (``QueuedJob.hold``)
    hold: tuple[int, ...] = ()
    preemptions: int = 0  # how often the job was preempted before (any reason)
    turn_until: datetime | None = None  # placed for its tenant's turn: owed (not reclaimable) until then


@dataclass(frozen=True)
class Preemption:
    """Stop ``job_id``'s attempt (SIGTERM, grace period, whole gang) and queue it again, for ``by``."""

    job_id: str
    by: str
    reason: str  # "reclaim" (a tenant takes back its guarantee), "share", "priority", "las", "fill", "defrag"
    message: str  # for the victim's events: who preempted it and why (``by`` and PREEMPTION_WHY[reason])
    # "defrag": the GPUs its next attempt gets, held for it from now on (``Held.hold``, then ``QueuedJob.hold``):
    # free ones, or those of a borrowed attempt preempted in the same pass to make room for it on another node
    move_to: tuple[int, ...] = ()


# why a victim gives way, by Preemption.reason (the victim's events say it; the planner's message too)
PREEMPTION_WHY = {
    "reclaim": "its tenant reclaims its guarantee",
    "share": "its tenant, short of its guarantee, holds a smaller share than this job's tenant",
    "priority": "it has a higher priority in the same tenant",
    "fill": "this job ran as borrowed fill ahead of it",
    "las": "it has attained less service (las)",
    "defrag": (
        "it needs whole nodes; this job resumes on GPUs held for it elsewhere (at once, or once a job evicted there "
        "has stopped)"
    ),
    "turn": "its tenant held more than 90 % of its guarantee over the turn window; this job's tenant, short of its "
    "own, takes a turn",
}


@dataclass
class Plan:
    # (job id, GPUs): a gang's GPUs are in replica order, each replica's ``gpus`` in a row
    placements: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    wait_reasons: dict[str, str] = field(default_factory=dict)
    blocked_by: str | None = None  # the job at the head of the line that did not fit
    preemptions: list[Preemption] = field(default_factory=list)
    borrowing: set[str] = field(default_factory=set)  # placed jobs that run beyond their tenant's guarantee
    estimated_start: dict[str, datetime] = field(default_factory=dict)  # waiting jobs, where computable
    turns: dict[str, datetime] = field(default_factory=dict)  # placed jobs on their tenant's turn: its end
    # jobs that preempted for their tenant's turn: its length (``QueuedJob.turn_s`` until they are placed)
    turn_grants: dict[str, float] = field(default_factory=dict)
