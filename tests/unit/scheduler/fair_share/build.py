"""Small fair-share passes for the rule tests: a ``FairShare`` over hand-built queues, attempts and limits."""

from __future__ import annotations

from collections.abc import Iterable

from dlcloud.scheduler.contract import Held, Limits, PlanConfig, Policy, QueuedJob
from dlcloud.scheduler.inventory import Inventory
from dlcloud.scheduler.policies.fair_share import FairShare
from dlcloud.scheduler.policies.state import Pass
from tests.unit.scheduler.scenarios import NOW

FS = PlanConfig(policy=Policy.FAIR_SHARE, aging_step=0)


def fair_share(
    queue: Iterable[QueuedJob],
    held: Iterable[Held],
    limits: dict[str, Limits],
    inventory: Inventory,
    config: PlanConfig = FS,
) -> FairShare:
    """A fair-share pass set up over these inputs (nothing decided yet)."""
    return FairShare(Pass(held, limits, inventory, NOW, config), queue)


def ids(cands: Iterable) -> list[str]:
    """The job ids of candidates (``Candidate``) in their order."""
    return [c.held.job_id for c in cands]
