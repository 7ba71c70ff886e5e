"""fair-share rule: las inside tenants. A tenant's jobs of one priority go least attained service first, and a job
may preempt its own tenant's attempts of the same priority in a higher las queue; never across tenants."""

from __future__ import annotations

from datetime import timedelta

from dlcloud.scheduler.contract import PlanConfig, Policy
from dlcloud.scheduler.policies.tenant_las import OwnAttempts, tenant_las_queue, tenant_order
from tests.unit.scheduler.fair_share.build import FS, fair_share, ids
from tests.unit.scheduler.scenarios import NOW, job, nodes, running, victims

OFF = PlanConfig(policy=Policy.FAIR_SHARE, aging_step=0, tenant_las_queues_gpu_s=())


def test_tenant_las_queue() -> None:
    assert [tenant_las_queue((7200.0, 72000.0), x) for x in (0, 7199, 7200, 80000)] == [0, 0, 1, 2]
    assert tenant_las_queue((), 1e9) == 0


def test_a_job_back_after_long_service_waits_behind_its_tenants_fresh_ones() -> None:
    long = job("long", "a", 1, submitted_at=NOW - timedelta(hours=3), attained_gpu_s=10_000)
    fresh = job("fresh", "a", 1, submitted_at=NOW - timedelta(minutes=1))
    assert [j.id for j in tenant_order([long, fresh], NOW, FS)] == ["fresh", "long"]
    assert [j.id for j in tenant_order([long, fresh], NOW, OFF)] == ["long", "fresh"]  # off: submit order
    # a higher priority still goes first, whatever its attained service
    urgent = job("urgent", "a", 1, priority=3, attained_gpu_s=100_000)
    assert [j.id for j in tenant_order([long, fresh, urgent], NOW, FS)] == ["urgent", "fresh", "long"]


def test_same_priority_attempts_in_a_higher_queue_are_victims() -> None:
    live = [running("a-long", "a", (0,), attained_gpu_s=10_000), running("a-short", "a", (1,), attained_gpu_s=10)]
    own = OwnAttempts(live, set(), FS.tenant_las_queues_gpu_s, NOW)
    fresh = job("fresh", "a", 1)
    assert own.outranks(fresh, "a")
    assert ids(own.victims(fresh, "a")) == ["a-long"]
    assert own.victims(fresh, "a")[0].reason == "las"
    off = OwnAttempts(live, set(), (), NOW)
    assert not off.outranks(fresh, "a") and off.victims(fresh, "a") == []


def test_never_across_tenants() -> None:
    held = [running("b-long", "b", (0,), attained_gpu_s=100_000)]
    fs = fair_share([job("fresh", "a", 1)], held, {}, nodes(1, 1))
    fs.run()
    assert victims(fs.p.result) == []


def test_a_pass_time_shares_inside_the_tenant() -> None:
    held = [running("a-long", "a", (0,), attained_gpu_s=10_000)]
    fs = fair_share([job("fresh", "a", 1)], held, {}, nodes(1, 1))
    fs.run()
    assert victims(fs.p.result) == ["a-long"]
    assert fs.p.result.wait_reasons["fresh"] == "preempting 1 job(s) with more attained service (las)"
