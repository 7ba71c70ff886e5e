"""Small hand-built scheduling scenarios: a cluster of nodes, queued jobs, running attempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.planner import GroupDemand, Held, Plan, QueuedJob

NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
GiB = 1024**3


def nodes(count: int, per_node: int, cpus: float = 1000, memory: int = 10_000 * GiB, name: str = "H100") -> Inventory:
    """``count`` nodes of ``per_node`` GPUs; GPU i is on node ``n{i // per_node}``."""
    gpus = tuple(Gpu(i, name, 0, f"n{i // per_node}") for i in range(count * per_node))
    return Inventory("h", gpus, cpus, memory)


def job(id: str, tenant: str = "a", gpus: int = 1, cpus: float = 1.0, memory: int = GiB, **kw: object) -> QueuedJob:
    kw.setdefault("submitted_at", NOW - timedelta(minutes=1))
    return QueuedJob(id, tenant, gpus, cpus, memory, **kw)  # type: ignore[arg-type]


def gang(id: str, tenant: str, replicas: int, gpus_each: int, **kw: object) -> QueuedJob:
    kw.setdefault("submitted_at", NOW - timedelta(minutes=1))
    groups = (GroupDemand("worker", replicas, gpus_each),)
    return QueuedJob(id, tenant, replicas * gpus_each, float(replicas), replicas * GiB, groups=groups, **kw)  # type: ignore[arg-type]


def running(
    job_id: str,
    tenant: str,
    gpus: tuple[int, ...],
    *,
    cpus: float = 1.0,
    memory: int = GiB,
    minutes: float = 10,
    **kw: object,
) -> Held:
    """An attempt started ``minutes`` ago (no checkpoint: all of it is lost if preempted)."""
    kw.setdefault("started_at", NOW - timedelta(minutes=minutes))
    return Held(tenant, gpus, cpus, memory, job_id=job_id, **kw)  # type: ignore[arg-type]


def placed(p: Plan) -> list[str]:
    return [jid for jid, _ in p.placements]


def victims(p: Plan) -> list[str]:
    return [x.job_id for x in p.preemptions]
