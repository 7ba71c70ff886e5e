"""The scheduling policies: fifo, priority-backfill, las and fair-share, one module each; ``run()`` is the entry.

One ``state.Pass`` holds the state of a pass (free capacity by node, each tenant's usage, the reservation, the
attempts being stopped); each policy is one loop over its own order of the queue. docs/scheduling.md explains the
policies; the rules, in short (each module's docstring has its own in full):

- Every policy: a job held above the planner or in its restart backoff waits and blocks nobody; hard caps
  (``Limits.gpus/cpus/memory/max_running_jobs``, ``terms.quota_reason``) always hold; a job that can never fit waits
  and blocks nobody (FIFO excepted: it keeps today's behaviour); placement is node-aware best fit (``placement``).
- ``fifo``: the given order; the first job that does not fit blocks everything behind it (``fifo_one_node`` on one
  host, ``planner.plan``'s default; ``fifo`` on many nodes).
- ``priority_backfill``: effective priority (priority + aging, ``order``), then submit time, then id. The first job
  that does not fit gets a reservation (``scheduler.backfill``); later jobs start only where they cannot delay it.
  No preemption.
- ``las``: attained-service queue, then submit time; work-conserving; preempts attempts in a higher queue.
- ``fair_share``: weighted dominant share across tenants, owed work first; guarantees and borrowing
  (``guarantees``: owed, straddling and borrowed attempts), reclaim, priority, share (catching up) and fill
  preemption, backfill; las inside tenants (``tenant_las``); turns for tenants short of their guarantee over a
  window (``turns``); defragmentation and chains (``defrag``); idle guaranteed GPUs kept for their tenant's return
  (``state.Pass.keep``).

Modules depend downwards: ``terms`` and ``order`` (plain functions) <- ``state`` <- ``guarantees``, ``tenant_las``
<- ``turns`` <- ``defrag`` <- ``fair_share``; ``fifo``, ``priority_backfill`` and ``las`` read ``state`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from dlcloud.scheduler.contract import Held, Limits, Plan, PlanConfig, Policy, QueuedJob
from dlcloud.scheduler.inventory import Inventory
from dlcloud.scheduler.policies.fair_share import fair_share
from dlcloud.scheduler.policies.fifo import fifo, fifo_one_node
from dlcloud.scheduler.policies.las import las
from dlcloud.scheduler.policies.order import effective_priority, las_queue, priority_order
from dlcloud.scheduler.policies.priority_backfill import priority_backfill
from dlcloud.scheduler.policies.state import MAX_SEARCHES, Pass

__all__ = ["MAX_SEARCHES", "effective_priority", "fifo_one_node", "las_queue", "priority_order", "run"]

POLICIES: dict[Policy, Callable[[Pass, Iterable[QueuedJob]], None]] = {
    Policy.FIFO: fifo,
    Policy.PRIORITY_BACKFILL: priority_backfill,
    Policy.FAIR_SHARE: fair_share,
    Policy.LAS: las,
}


def run(
    queue: Iterable[QueuedJob],
    held: Iterable[Held],
    limits: dict[str, Limits],
    inventory: Inventory,
    now: datetime,
    config: PlanConfig,
) -> Plan:
    """One pass of ``config.policy`` over a node-aware ``Pass``: the Plan it decides."""
    p = Pass(held, limits, inventory, now, config)
    POLICIES[config.policy](p, queue)
    return p.result
