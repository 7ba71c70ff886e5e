"""One scheduling pass as a pure function: queued jobs + held attempts + limits + free capacity -> a Plan.

``plan`` dispatches on ``PlanConfig.policy``: FIFO on one host (today's behaviour: priority then submit order as
given, the first job that does not fit blocks the rest; ``policies.fifo.fifo_one_node``), the rest through
``policies.run`` (every policy's module is in ``scheduler.policies``). The contract types live in
``scheduler.contract`` and are re-exported here. Node-aware placement: ``scheduler.placement``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from dlcloud.scheduler import policies
from dlcloud.scheduler.contract import (
    PREEMPTION_WHY,
    GroupDemand,
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

__all__ = [
    "PREEMPTION_WHY",
    "GroupDemand",
    "Held",
    "Limits",
    "Plan",
    "PlanConfig",
    "Policy",
    "Preemption",
    "QueuedJob",
    "Usage",
    "plan",
]


def plan(
    queue: Iterable[QueuedJob],
    held: Iterable[Held],
    limits: dict[str, Limits],
    inventory: Inventory,
    now: datetime,
    config: PlanConfig = PlanConfig(),
) -> Plan:
    """Decide which queued jobs start now (and, for some policies, which running attempts to preempt).

    ``queue`` comes in the database's order (priority, created_at, id): FIFO keeps it and reads it lazily, stopping
    at the first job that does not fit; the other policies read it whole and order it themselves."""
    if config.policy != Policy.FIFO or len({g.node for g in inventory.gpus}) > 1:
        return policies.run(queue, held, limits, inventory, now, config)
    return policies.fifo_one_node(queue, held, limits, inventory, now)
