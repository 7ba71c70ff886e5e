"""plan() with gangs: all replicas placed at once or none, in queue order, with the reason a gang waits."""

from __future__ import annotations

from datetime import UTC, datetime

from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.planner import GroupDemand, Held, Limits, QueuedJob, plan

NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
GiB = 1024**3


def inv(names: list[str], cpus: float = 32) -> Inventory:
    return Inventory("h", tuple(Gpu(i, n) for i, n in enumerate(names)), cpus, 256 * GiB)


def gang(id: str, workers: int, gpus_each: int, tenant: str = "t1", gpu_type: str | None = None) -> QueuedJob:
    groups = (GroupDemand("worker", workers, gpus_each, gpu_type),)
    return QueuedJob(id, tenant, workers * gpus_each, float(workers), workers * GiB, gpu_type, groups=groups)


def test_a_gang_is_placed_whole_with_each_replicas_gpus_in_a_row() -> None:
    p = plan([gang("g", 2, 2)], [], {}, inv(["H100"] * 4), NOW)
    assert p.placements == [("g", (0, 1, 2, 3))]


def test_a_gang_that_does_not_fit_holds_nothing_and_says_why() -> None:
    held = [Held("t0", (0, 1), 1, GiB)]
    p = plan([gang("g", 2, 2), QueuedJob("small", "t1", 1, 1, GiB)], held, {}, inv(["H100"] * 4), NOW)
    assert p.placements == []  # no partial start, and the job behind does not jump the gang
    assert p.blocked_by == "g"
    assert p.wait_reasons["g"] == "waiting for capacity: needs 4 GPU(s) for 2 worker(s), 2 free"


def test_two_gangs_for_the_same_gpus_cannot_deadlock() -> None:
    # each needs 3 of 4 GPUs: placing replicas one by one could leave both half-placed forever
    gpus = inv(["H100"] * 4)
    first = plan([gang("a", 3, 1), gang("b", 3, 1)], [], {}, gpus, NOW)
    assert [j for j, _ in first.placements] == ["a"] and first.blocked_by == "b"
    # when a ends, b gets all it needs at once
    second = plan([gang("b", 3, 1)], [], {}, gpus, NOW)
    assert second.placements == [("b", (0, 1, 2))]


def test_gpu_type_per_group_matches_the_inventory_names() -> None:
    gpus = inv(["NVIDIA A100", "NVIDIA H100 80GB", "NVIDIA H100 80GB"])
    job = QueuedJob(
        "g",
        "t1",
        3,
        2.0,
        2 * GiB,
        groups=(GroupDemand("chief", 1, 1, "a100"), GroupDemand("worker", 1, 2, "h100")),
    )
    assert plan([job], [], {}, gpus, NOW).placements == [("g", (0, 1, 2))]
    p = plan([gang("h", 2, 2, gpu_type="h100")], [], {}, gpus, NOW)
    assert p.wait_reasons["h"] == "waiting for capacity: needs 4 h100 GPU(s) for 2 worker(s), 2 free"


def test_quotas_count_the_whole_gang() -> None:
    p = plan([gang("g", 2, 1)], [], {"t1": Limits(gpus=1)}, inv(["H100"] * 4), NOW)
    assert p.placements == []
    assert p.wait_reasons["g"] == "tenant quota: needs 2 GPU(s), 0 of 1 in use"
