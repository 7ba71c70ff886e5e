"""What the planner weighs besides the queue, as the scheduling pass gives it: its configuration from the server's
settings (``plan_config``), what every live attempt holds (``read_held``), each tenant's quota and fair-share terms
(``read_limits``) and what each tenant's attempts held lately (``recent_usage``). The rows come from
store/scheduling.py; the rules that turn them into the planner's types are ``scheduler/pass_core.py``'s, which the
trace simulator applies too. This module reads and converts, and decides nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from dlcloud.scheduler.pass_core import (
    AttemptSpan,
    RecentUsage,
    TenantTerms,
    held_attempt,
    needs_recent_usage,
    tenant_limits,
)
from dlcloud.scheduler.pass_core import recent_usage as pass_core_recent_usage
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
    """What every live attempt holds, with what the policies weigh (``pass_core.held_attempt``). Its last checkpoint is
    ``job_attempts.checkpoint_at``, as the executor saw it."""
    held = []
    for r in store.live_attempts(conn):
        held.append(
            held_attempt(
                r.tenant_id,
                tuple(r.gpus),
                r.cpus,
                r.memory,
                now=now,
                job_id=r.job_id,
                started_at=r.started_at,
                running_s=(now - r.started_at).total_seconds() if r.started_at is not None else 0.0,
                checkpoint_at=r.checkpoint_at,
                attained_before_gpu_s=r.attained_gpu_seconds or 0.0,
                priority=r.priority or 0,
                submitted_at=r.created_at,
                max_run_time_s=r.max_run_time_seconds,
                # a job deleted under a live attempt (no row) cannot be a victim
                preemptible=bool(r.preemptible) if r.preemptible is not None else False,
                cancel_requested=bool(r.cancel_requested),
                preempt_requested=bool(r.preempt_requested),
                hold_gpus=r.hold_gpus or (),
                hold_until=r.hold_until,
                preemptions=r.preemptions or 0,
                turn_until=r.turn_until,
            )
        )
    return held


def recent_usage(conn: Connection, now: datetime, turn_window_s: float, lend_after_s: float) -> RecentUsage:
    """``pass_core.recent_usage`` over the live attempts and those that ended (or whose turn ended) within the longer
    of the two windows, on the POSIX clock."""
    if turn_window_s <= 0 and lend_after_s <= 0:
        return RecentUsage()
    since = now - timedelta(seconds=max(turn_window_s, lend_after_s))
    spans = (
        AttemptSpan(
            tenant_id,
            gpus,
            started_at.timestamp(),
            None if finished_at is None else finished_at.timestamp(),
            None if turn_until is None else turn_until.timestamp(),
        )
        for tenant_id, gpus, started_at, finished_at, turn_until in store.read_recent_attempts(conn, since)
        if gpus and started_at is not None
    )
    return pass_core_recent_usage(spans, now.timestamp(), turn_window_s, lend_after_s)


def read_limits(conn: Connection, now: datetime, config: PlanConfig) -> dict[str, Limits]:
    """Every tenant's quota (hard caps) and fair-share terms (``pass_core.tenant_limits``), with its recent usage when
    the policy weighs it (``pass_core.needs_recent_usage``)."""
    recent = recent_usage(conn, now, config.turn_window_s, config.lend_after_s) if needs_recent_usage(config) else None
    return tenant_limits((TenantTerms(**r._mapping) for r in store.tenant_limits(conn)), recent)
