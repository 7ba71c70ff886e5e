"""The scheduling pass's pure core: from what the pass read to what it decided, one code path for the control plane
and the trace simulator.

The control plane (``control/scheduling.py``, ``control/planner_inputs.py``) reads its inputs from the database and
writes the decisions back; the simulator (``scheduler/simulator.py``) feeds the same functions from its simulated
attempts and clock and applies the decisions to its records. Neither builds a ``Limits``, a ``Held`` or a moved job's
hold another way, so the figures the simulator publishes are those of the pass that runs.

The core, in the order a pass uses it:
- ``tenant_limits``: each tenant's ``Limits`` from its stored terms (``TenantTerms``: quota and fair-share columns)
  and, for fair-share, what its attempts held lately (``recent_usage`` over ``AttemptSpan``s, when
  ``needs_recent_usage``);
- ``held_attempt``: a live attempt as the planner weighs it (work lost since its last checkpoint, attained service,
  the GPUs held for a moved job while it stops);
- ``decide``: the planner's call (``planner.plan``) on the queue, the held attempts, the limits and the inventory;
- ``moved``: what a "defrag" preemption leaves on its victim for the passes after (``Marks``: considered first, on
  the GPUs held for it, until the hold ends).

Clocks: ``recent_usage`` takes seconds on any one clock (the control plane's POSIX timestamps, the simulator's trace
seconds); everything else takes the planner's ``datetime``s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from dlcloud.scheduler.attempts import gpu_seconds_in_window, peak_gpus
from dlcloud.scheduler.contract import HOLD_MARGIN_S, Held, Limits, Plan, PlanConfig, Policy, Preemption, QueuedJob
from dlcloud.scheduler.inventory import Inventory
from dlcloud.scheduler.planner import plan

Planner = Callable[[Iterable[QueuedJob], Iterable[Held], dict[str, Limits], Inventory, datetime, PlanConfig], Plan]


@dataclass(frozen=True)
class TenantTerms:
    """A tenant's quota (hard caps) and fair-share terms as stored: the tenant row's columns (None: unset)."""

    id: str
    quota_gpus: int | None = None
    quota_cpus: float | None = None
    quota_memory: int | None = None
    quota_max_running_jobs: int | None = None
    guarantee_gpus: int | None = None
    guarantee_cpus: float | None = None
    guarantee_memory: int | None = None
    borrow_gpus: int | None = None
    borrow_cpus: float | None = None
    borrow_memory: int | None = None
    weight: float | None = None


@dataclass(frozen=True)
class AttemptSpan:
    """An attempt as recent usage counts it: its tenant, GPUs, start and end (None: still running) and the end of
    the turn it was placed for, in seconds on the clock ``recent_usage`` is given."""

    tenant_id: str
    gpus: int
    started: float
    ended: float | None = None
    turn_until: float | None = None


@dataclass
class RecentUsage:
    """What each tenant's attempts held lately (``recent_usage``): None where the pass does not need it."""

    gpu_s: dict[str, float] | None = None  # GPU-seconds over the turn window (``Limits.recent_gpu_s``)
    peak_gpus: dict[str, int] | None = None  # the most GPUs at once over ``lend_after_s`` (``Limits.recent_peak_gpus``)


@dataclass(frozen=True)
class Marks:
    """What a pass leaves on a queued job for the passes after it: the control plane's ``reclaiming``, ``hold_gpus``,
    ``hold_until`` columns, the simulator's ``QueuedJob`` fields of the same names."""

    reclaiming: bool
    hold: tuple[int, ...]
    hold_until: datetime | None


def needs_recent_usage(config: PlanConfig) -> bool:
    """Fair-share with turns or idle guaranteed GPUs kept unlent weighs what each tenant held lately; nothing else
    does (``Limits.recent_gpu_s`` and ``recent_peak_gpus`` stay None)."""
    return config.policy == Policy.FAIR_SHARE and (config.turn_window_s > 0 or config.lend_after_s > 0)


def recent_usage(attempts: Iterable[AttemptSpan], now: float, turn_window_s: float, lend_after_s: float) -> RecentUsage:
    """Each tenant's GPU-seconds over the last ``turn_window_s`` (each attempt counted from its start or the window's,
    an attempt placed for a turn through the turn's end) and the most GPUs its attempts held at once over the last
    ``lend_after_s`` (``attempts.peak_gpus``), from its live attempts and those that ended within the window. An
    attempt ended ``lend_after_s`` ago or more is not kept for (``end + lend_after_s > now``, not ``end > now -
    lend_after_s``, which may round the other way: the pass asked for at ``end + lend_after_s`` must lend its GPUs).
    An attempt without GPUs counts for nothing. Each tenant's sum adds its attempts in the order given."""
    turns, lend = turn_window_s, lend_after_s
    if turns <= 0 and lend <= 0:
        return RecentUsage()
    since, peak_since = now - turns, now - lend
    used: dict[str, float] = {}
    spans: dict[str, list[tuple[int, float, float | None]]] = {}
    for a in attempts:
        if not a.gpus:
            continue
        if turns > 0:
            seconds = gpu_seconds_in_window(a.gpus, a.started, a.ended, a.turn_until, since, now)
            used[a.tenant_id] = used.get(a.tenant_id, 0.0) + seconds
        if lend > 0 and (a.ended is None or a.ended + lend > now):
            spans.setdefault(a.tenant_id, []).append((a.gpus, a.started, a.ended))
    return RecentUsage(
        used if turns > 0 else None,
        {tid: peak_gpus(xs, peak_since, now) for tid, xs in spans.items()} if lend > 0 else None,
    )


def tenant_limits(tenants: Iterable[TenantTerms], recent: RecentUsage | None = None) -> dict[str, Limits]:
    """Every tenant's ``Limits``: its caps and terms as stored (no guarantee: 0; no weight: 1) with ``recent`` usage
    (None: none, so no turns and nothing kept unlent)."""
    gpu_s, peaks = (recent.gpu_s, recent.peak_gpus) if recent is not None else (None, None)
    return {
        t.id: Limits(
            t.quota_gpus,
            t.quota_cpus,
            t.quota_memory,
            t.quota_max_running_jobs,
            guarantee_gpus=t.guarantee_gpus or 0,
            guarantee_cpus=t.guarantee_cpus or 0.0,
            guarantee_memory=t.guarantee_memory or 0,
            borrow_gpus=t.borrow_gpus,
            borrow_cpus=t.borrow_cpus,
            borrow_memory=t.borrow_memory,
            weight=t.weight or 1.0,
            recent_gpu_s=None if gpu_s is None else gpu_s.get(t.id, 0.0),
            recent_peak_gpus=None if peaks is None else peaks.get(t.id, 0),
        )
        for t in tenants
    }


def held_attempt(
    tenant_id: str,
    gpus: tuple[int, ...],
    cpus: float,
    memory: int,
    *,
    now: datetime,
    job_id: str,
    started_at: datetime | None,
    running_s: float,
    checkpoint_at: datetime | None = None,
    attained_before_gpu_s: float = 0.0,
    priority: int = 0,
    submitted_at: datetime | None = None,
    max_run_time_s: float | None = None,
    preemptible: bool = True,
    cancel_requested: bool = False,
    preempt_requested: bool = False,
    hold_gpus: Iterable[int] = (),
    hold_until: datetime | None = None,
    preemptions: int = 0,
    turn_until: datetime | None = None,
) -> Held:
    """A live attempt (a gang's replicas together: preempted whole) as the planner weighs it, ``running_s`` seconds
    after it started:
    - a preemption loses the work since its last checkpoint (``checkpoint_at``, as the executor saw it), else since
      its start;
    - its attained service is its job's earlier attempts' and its GPUs over ``running_s``;
    - it is stopping once asked to stop (cancel or preemption): it frees its resources soon and is no victim;
    - a moved job's next GPUs (``hold_gpus``) are held while it stops, until ``hold_until`` (a cancelled one's are
      not: it does not come back): a job that takes a longer grace period keeps no GPUs idle past the hold."""
    moving = preempt_requested and not cancel_requested and hold_until is not None and hold_until > now
    return Held(
        tenant_id,
        gpus,
        cpus,
        memory,
        job_id=job_id,
        priority=priority,
        submitted_at=submitted_at,
        started_at=started_at,
        progress_at=checkpoint_at or started_at,
        max_run_time_s=max_run_time_s,
        preemptible=preemptible,
        attained_gpu_s=attained_before_gpu_s + len(gpus) * max(0.0, running_s),
        stopping=cancel_requested or preempt_requested,
        hold=tuple(hold_gpus) if moving else (),
        preemptions=preemptions,
        turn_until=turn_until,
    )


def decide(
    queue: Iterable[QueuedJob],
    held: Iterable[Held],
    limits: dict[str, Limits],
    inventory: Inventory,
    now: datetime,
    config: PlanConfig,
    planner: Planner = plan,
) -> Plan:
    """The pass's decisions: which queued jobs start where, which attempts are preempted for whom, why the others
    wait. ``queue`` in the control plane's order (priority, submit time, id); ``planner``: the production planner
    (a test may give one with a known answer)."""
    return planner(queue, held, limits, inventory, now, config)


def moved(p: Preemption, now: datetime, grace_s: float) -> Marks | None:
    """A "defrag" victim is moved, not evicted: once queued again it is considered first, on the GPUs the plan chose
    for it (``p.move_to``), held until the grace period and a tick (``HOLD_MARGIN_S``) have passed. Any other victim:
    None (nothing is left on it)."""
    if p.reason != "defrag":
        return None
    return Marks(True, p.move_to, now + timedelta(seconds=grace_s + HOLD_MARGIN_S))
