"""What the planner weighs besides the queue, as the scheduling pass gives it: its configuration from the server's
settings (``plan_config``), what every live attempt holds (``read_held``), each tenant's quota and fair-share terms
(``read_limits``) and what each tenant's attempts held lately (``recent_usage``). The rows come from
store/scheduling.py; this module turns them into the planner's types and reads nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from dlcloud.scheduler.attempts import gpu_seconds_in_window, peak_gpus
from dlcloud.scheduler.planner import Held, Limits, PlanConfig, Policy
from dlcloud.settings import Settings
from dlcloud.store import scheduling as store


def plan_config(settings: Settings) -> PlanConfig:
    """The planner's configuration from the server's settings (docs/scheduling.md)."""
    return PlanConfig(
        policy=Policy(settings.scheduling_policy),
        aging_interval_s=settings.scheduling_aging_interval_seconds,
        aging_step=settings.scheduling_aging_step,
        aging_max=settings.scheduling_aging_max,
        las_queues_gpu_s=tuple(settings.scheduling_las_queues_gpu_seconds),
        tenant_las_queues_gpu_s=tuple(settings.scheduling_tenant_las_queues_gpu_seconds),
        defragment=settings.scheduling_defragment,
        turn_window_s=settings.scheduling_turn_window_seconds,
        lend_after_s=settings.scheduling_lend_after_seconds,
        preemption_grace_s=settings.stop_grace_seconds,
    )


def read_held(conn: Connection, now: datetime) -> list[Held]:
    """What every live attempt holds, with what the policies weigh (a gang is one ``Held``: preempted whole).
    ``progress_at`` is the attempt's last checkpoint as the executor saw it (``job_attempts.checkpoint_at``), else
    its start: a preemption loses the work since."""
    held = []
    for r in store.live_attempts(conn):
        gpus = tuple(r.gpus)
        running_s = max(0.0, (now - r.started_at).total_seconds()) if r.started_at is not None else 0.0
        stopping = bool(r.cancel_requested or r.preempt_requested)
        # a moved job's next GPUs are held while it stops (a cancelled one's are not: it does not come back), for
        # at most the server's grace period and a tick (``_preempt``): a job that sets a longer grace period and
        # takes it keeps no GPUs idle
        moving = r.preempt_requested and not r.cancel_requested and r.hold_until is not None and r.hold_until > now
        hold = tuple(r.hold_gpus or ()) if moving else ()
        held.append(
            Held(
                r.tenant_id,
                gpus,
                r.cpus,
                r.memory,
                job_id=r.job_id,
                priority=r.priority or 0,
                submitted_at=r.created_at,
                started_at=r.started_at,
                progress_at=r.checkpoint_at or r.started_at,
                max_run_time_s=r.max_run_time_seconds,
                # a job deleted under a live attempt (no row) cannot be a victim
                preemptible=bool(r.preemptible) if r.preemptible is not None else False,
                attained_gpu_s=(r.attained_gpu_seconds or 0.0) + len(gpus) * running_s,
                stopping=stopping,
                hold=hold,
                preemptions=r.preemptions or 0,
                turn_until=r.turn_until,
            )
        )
    return held


@dataclass
class RecentUsage:
    """What each tenant's attempts held lately (``recent_usage``): None where the pass does not need it."""

    gpu_s: dict[str, float] | None = None  # GPU-seconds over the turn window (``Limits.recent_gpu_s``)
    peak_gpus: dict[str, int] | None = None  # the most GPUs at once over ``lend_after_s`` (``Limits.recent_peak_gpus``)


def recent_usage(conn: Connection, now: datetime, turn_window_s: float, lend_after_s: float) -> RecentUsage:
    """From the live attempts and those that ended within the longer window (0: not needed): each tenant's
    GPU-seconds over the last ``turn_window_s``, each attempt counted from its start or the window's, and the most
    GPUs its attempts held at once over the last ``lend_after_s``."""
    if turn_window_s <= 0 and lend_after_s <= 0:
        return RecentUsage()
    t1 = now.timestamp()
    t0, p0 = t1 - turn_window_s, t1 - lend_after_s
    used: dict[str, float] = {}
    spans: dict[str, list[tuple[int, float, float | None]]] = {}
    for tenant_id, gpus, started_at, finished_at, turn_until in store.read_recent_attempts(
        conn, now - timedelta(seconds=max(turn_window_s, lend_after_s))
    ):
        if gpus and started_at is not None:
            ended = None if finished_at is None else finished_at.timestamp()
            if turn_window_s > 0:
                turn = None if turn_until is None else turn_until.timestamp()
                seconds = gpu_seconds_in_window(gpus, started_at.timestamp(), ended, turn, t0, t1)
                used[tenant_id] = used.get(tenant_id, 0.0) + seconds
            if lend_after_s > 0:
                spans.setdefault(tenant_id, []).append((gpus, started_at.timestamp(), ended))
    return RecentUsage(
        used if turn_window_s > 0 else None,
        {tid: peak_gpus(xs, p0, t1) for tid, xs in spans.items()} if lend_after_s > 0 else None,
    )


def read_limits(conn: Connection, recent: RecentUsage | None = None) -> dict[str, Limits]:
    """Every tenant's quota (hard caps) and fair-share terms with ``recent_usage`` (None: none, no turns)."""
    gpu_s, peaks = (recent.gpu_s, recent.peak_gpus) if recent is not None else (None, None)
    return {
        r.id: Limits(
            r.quota_gpus,
            r.quota_cpus,
            r.quota_memory,
            r.quota_max_running_jobs,
            guarantee_gpus=r.guarantee_gpus or 0,
            guarantee_cpus=r.guarantee_cpus or 0.0,
            guarantee_memory=r.guarantee_memory or 0,
            borrow_gpus=r.borrow_gpus,
            borrow_cpus=r.borrow_cpus,
            borrow_memory=r.borrow_memory,
            weight=r.weight or 1.0,
            recent_gpu_s=None if gpu_s is None else gpu_s.get(r.id, 0.0),
            recent_peak_gpus=None if peaks is None else peaks.get(r.id, 0),
        )
        for r in store.tenant_limits(conn)
    }
