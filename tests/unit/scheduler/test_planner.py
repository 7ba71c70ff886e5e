"""plan(): one scheduling pass over plain values (order, quotas, capacity, GPU types, backoff)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.planner import Held, Limits, QueuedJob, plan

NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
GiB = 1024**3


def inventory(gpus: int = 4, name: str = "NVIDIA H100 80GB HBM3", cpus: float = 32, memory: int = 256 * GiB):
    return Inventory(host="h", gpus=tuple(Gpu(i, name) for i in range(gpus)), cpus=cpus, memory=memory)


def job(id: str, tenant: str = "t1", gpus: int = 0, cpus: float = 1.0, memory: int = GiB, **kw: object) -> QueuedJob:
    return QueuedJob(id, tenant, gpus, cpus, memory, **kw)  # type: ignore[arg-type]


def placed(p) -> list[str]:  # type: ignore[no-untyped-def]
    return [jid for jid, _ in p.placements]


def test_places_in_the_given_priority_fifo_order() -> None:
    queue = [job("high"), job("a"), job("b"), job("c")]
    p = plan(queue, [], {}, inventory(), NOW)
    assert placed(p) == ["high", "a", "b", "c"]
    assert p.wait_reasons == {} and p.blocked_by is None


def test_empty_queue_places_nothing() -> None:
    p = plan([], [Held("t1", (0,), 1, GiB)], {}, inventory(), NOW)
    assert p.placements == [] and p.wait_reasons == {} and p.blocked_by is None


@pytest.mark.parametrize(
    ("limits", "blocked", "expect"),
    [
        (Limits(gpus=1), job("q", gpus=1), "needs 1 GPU(s), 1 of 1 in use"),
        (Limits(cpus=2), job("q", cpus=1.5), "needs 1.5 CPU(s), 1 of 2 in use"),
        (Limits(memory=2 * GiB), job("q", memory=int(1.5 * GiB)), f"{GiB} of {2 * GiB} in use"),
        (Limits(max_running_jobs=1), job("q"), "1 of 1 running jobs in use"),
    ],
    ids=["gpus", "cpus", "memory", "max_running_jobs"],
)
def test_quota_blocked_job_is_skipped_with_a_reason(limits: Limits, blocked: QueuedJob, expect: str) -> None:
    held = [Held("t1", (0,), 1.0, GiB)]
    queue = [blocked, job("other-tenant", tenant="t2", gpus=1), job("t1-small", gpus=0, cpus=0.5, memory=GiB // 2)]
    p = plan(queue, held, {"t1": limits}, inventory(), NOW)
    assert "q" not in placed(p)
    assert p.wait_reasons["q"].startswith("tenant quota: ")
    assert expect in p.wait_reasons["q"]
    # a quota wait does not hold up the line: the other tenant starts, and so does a job of the same
    # tenant that still fits its quota (except where the running-jobs limit is the one reached)
    assert "other-tenant" in placed(p)
    assert p.blocked_by is None
    if limits.max_running_jobs is None:
        assert "t1-small" in placed(p)


def test_quota_counts_jobs_placed_earlier_in_the_same_pass() -> None:
    queue = [job(f"j{i}", gpus=1) for i in range(4)]
    p = plan(queue, [], {"t1": Limits(gpus=2, max_running_jobs=5)}, inventory(), NOW)
    assert placed(p) == ["j0", "j1"]
    assert set(p.wait_reasons) == {"j2", "j3"}
    assert "2 of 2 in use" in p.wait_reasons["j3"]


def test_max_running_jobs_counts_held_attempts() -> None:
    held = [Held("t1", (), 1.0, GiB), Held("t1", (), 1.0, GiB)]
    p = plan([job("a"), job("b", tenant="t2")], held, {"t1": Limits(max_running_jobs=2)}, inventory(), NOW)
    assert placed(p) == ["b"]
    assert p.wait_reasons["a"] == "tenant quota: 2 of 2 running jobs in use"


def test_limits_of_another_tenant_do_not_apply() -> None:
    p = plan([job("a", gpus=2)], [], {"t2": Limits(gpus=0)}, inventory(), NOW)
    assert placed(p) == ["a"]


@pytest.mark.parametrize(
    ("big", "short"),
    [
        (job("big", gpus=3), "needs 3 GPU(s), 2 free"),
        (job("big", cpus=31.5), "needs 31.5 CPU(s), 29 free"),
        (job("big", memory=255 * GiB), f"needs {255 * GiB} bytes of memory, {253 * GiB} free"),
    ],
    ids=["gpus", "cpus", "memory"],
)
def test_capacity_blocked_job_blocks_everything_behind_it(big: QueuedJob, short: str) -> None:
    held = [Held("t9", (0, 1), 2.0, 2 * GiB)]
    queue = [job("first"), big, job("small-same-tenant"), job("small-other", tenant="t2")]
    p = plan(queue, held, {}, inventory(), NOW)
    assert placed(p) == ["first"]
    assert p.blocked_by == "big"
    assert p.wait_reasons["big"] == f"waiting for capacity: {short}"
    # no backfill: the small jobs behind it fit but wait, with no reason of their own
    assert "small-same-tenant" not in p.wait_reasons and "small-other" not in p.wait_reasons


def test_capacity_reason_lists_every_shortage() -> None:
    inv = inventory(gpus=1, cpus=2, memory=4 * GiB)
    p = plan([job("big", gpus=2, cpus=4, memory=8 * GiB)], [], {}, inv, NOW)
    reason = p.wait_reasons["big"]
    assert reason.startswith("waiting for capacity: ")
    assert "needs 2 GPU(s), 1 free" in reason
    assert "needs 4 CPU(s), 2 free" in reason
    assert f"needs {8 * GiB} bytes of memory, {4 * GiB} free" in reason


def test_quota_wait_in_front_does_not_block_but_capacity_wait_does() -> None:
    queue = [job("over-quota", gpus=1), job("fits", tenant="t2", gpus=2), job("too-big", tenant="t3", gpus=4)]
    queue.append(job("behind", tenant="t4"))
    p = plan(queue, [], {"t1": Limits(gpus=0)}, inventory(), NOW)
    assert placed(p) == ["fits"]
    assert p.blocked_by == "too-big"
    assert set(p.wait_reasons) == {"over-quota", "too-big"}


def test_gpu_type_matching() -> None:
    gpus = (Gpu(0, "NVIDIA A100-SXM4-40GB"), Gpu(1, "NVIDIA H100 80GB HBM3"), Gpu(2, "NVIDIA H100 80GB HBM3"))
    inv = Inventory(host="h", gpus=gpus, cpus=32, memory=256 * GiB)
    queue = [job("h100", gpus=2, gpu_type="h100"), job("a100", gpus=1, gpu_type="A100"), job("any", gpus=0)]
    p = plan(queue, [], {}, inv, NOW)
    assert p.placements == [("h100", (1, 2)), ("a100", (0,)), ("any", ())]


def test_gpu_type_shortage_blocks_with_the_type_in_the_reason() -> None:
    gpus = (Gpu(0, "NVIDIA A100-SXM4-40GB"), Gpu(1, "NVIDIA H100 80GB HBM3"))
    inv = Inventory(host="h", gpus=gpus, cpus=32, memory=256 * GiB)
    p = plan([job("two-h100", gpus=2, gpu_type="H100"), job("a100", gpus=1)], [], {}, inv, NOW)
    assert p.placements == []
    assert p.blocked_by == "two-h100"
    assert p.wait_reasons["two-h100"] == "waiting for capacity: needs 2 H100 GPU(s), 1 free"


def test_gpu_indices_are_exclusive_and_never_double_assigned() -> None:
    held = [Held("t1", (1, 4), 1.0, GiB), Held("t2", (6,), 1.0, GiB)]
    queue = [job(f"j{i}", tenant=f"t{i % 3}", gpus=1 + i % 3) for i in range(10)]
    p = plan(queue, held, {}, inventory(gpus=8), NOW)
    assigned = [g for _, gs in p.placements for g in gs]
    assert len(assigned) == len(set(assigned))
    assert not set(assigned) & {1, 4, 6}
    assert set(assigned) <= set(range(8))
    for jid, gs in p.placements:
        want = next(j for j in queue if j.id == jid).gpus
        assert len(gs) == want and list(gs) == sorted(gs)
    # 5 GPUs were free: j0 (1) + j1 (2) fill 3, j2 (3) does not fit and blocks the rest
    assert placed(p) == ["j0", "j1"]
    assert p.blocked_by == "j2"
    assert p.wait_reasons["j2"] == "waiting for capacity: needs 3 GPU(s), 2 free"


def test_held_resources_reduce_free_capacity() -> None:
    held = [Held("t1", (0, 1, 2), 30.0, 250 * GiB)]
    p = plan([job("cpu-job", cpus=2, memory=6 * GiB), job("gpu-job", gpus=1)], held, {}, inventory(), NOW)
    assert p.placements == [("cpu-job", ())]
    assert p.wait_reasons["gpu-job"].startswith("waiting for capacity: ")
    assert "needs 1 CPU(s), 0 free" in p.wait_reasons["gpu-job"]


def test_backoff_job_is_skipped_without_blocking() -> None:
    later = NOW + timedelta(seconds=30)
    queue = [job("restarting", gpus=4, not_before=later), job("next", gpus=4)]
    p = plan(queue, [], {}, inventory(), NOW)
    assert placed(p) == ["next"]
    assert p.wait_reasons["restarting"] == f"restart backoff until {later.isoformat(timespec='seconds')}"
    assert p.blocked_by is None


def test_backoff_over_is_placed() -> None:
    queue = [job("restarting", gpus=1, not_before=NOW), job("old", gpus=1, not_before=NOW - timedelta(seconds=1))]
    p = plan(queue, [], {}, inventory(), NOW)
    assert placed(p) == ["restarting", "old"]
    assert p.wait_reasons == {}


def test_held_job_waits_with_its_reason_and_blocks_nobody() -> None:
    queue = [job("held", gpus=4, held_by="environment 'nlp' is building"), job("next", gpus=4)]
    p = plan(queue, [], {}, inventory(gpus=4), NOW)
    assert placed(p) == ["next"]
    assert p.wait_reasons == {"held": "environment 'nlp' is building"}
    assert p.blocked_by is None
