"""fair-share rule: priority preemption. A job may preempt its own tenant's attempts of a lower priority (their own,
not aged), never another tenant's; a job held back by its tenant's caps preempts them to get under the caps."""

from __future__ import annotations

from datetime import timedelta

from dlcloud.scheduler.contract import Limits, PlanConfig, Policy
from dlcloud.scheduler.policies.tenant_las import OwnAttempts
from tests.unit.scheduler.fair_share.build import fair_share, ids
from tests.unit.scheduler.scenarios import NOW, job, nodes, running, victims

URGENT = job("a-urgent", "a", 1, priority=5)


def test_own_lower_priority_attempts_are_victims_borrowed_first() -> None:
    live = [
        running("a-low-owed", "a", (0,), priority=1),
        running("a-low-borrowed", "a", (1,), priority=1),
        running("a-high", "a", (2,), priority=5),
        running("b-low", "b", (3,), priority=0),
    ]
    own = OwnAttempts(live, {id(live[1])}, (), NOW)
    assert own.outranks(URGENT, "a")
    assert ids(own.victims(URGENT, "a")) == ["a-low-borrowed", "a-low-owed"]
    assert {c.reason for c in own.victims(URGENT, "a")} == {"priority"}
    assert not own.outranks(job("a-same", "a", 1, priority=1), "a")
    assert ids(own.victims(job("b-urgent", "b", 1, priority=5), "b")) == ["b-low"]  # a tenant's own attempts only


def test_aging_does_not_preempt() -> None:
    cfg = PlanConfig(policy=Policy.FAIR_SHARE, aging_step=1, aging_interval_s=60)
    old = job("a-old", "a", 1, submitted_at=NOW - timedelta(hours=5))  # aged far above 1, its own priority is 0
    fs = fair_share([old], [running("a-low", "a", (0,), priority=0)], {}, nodes(1, 1), cfg)
    fs.run()
    assert victims(fs.p.result) == []


def test_a_higher_priority_job_preempts_its_tenants_lower_one_when_nothing_is_free() -> None:
    held = [running("a-low", "a", (0,), priority=0), running("b-low", "b", (1,), priority=0, minutes=1)]
    fs = fair_share([URGENT], held, {}, nodes(1, 2))
    fs.run()
    assert victims(fs.p.result) == ["a-low"]
    assert fs.p.result.wait_reasons["a-urgent"] == "preempting 1 job(s) of lower priority in its tenant"


def test_held_back_by_its_quota_it_preempts_to_get_under_it() -> None:
    held = [running("a-low0", "a", (0,), minutes=20), running("a-low1", "a", (1,), minutes=10)]
    fs = fair_share([URGENT], held, {"a": Limits(gpus=2)}, nodes(1, 4))
    a = fs.p.tenant("a")
    assert fs.over_quota_by_priority(URGENT, a)
    assert victims(fs.p.result) == ["a-low1"]
    assert fs.p.result.wait_reasons["a-urgent"] == (
        "preempting 1 job(s) of lower priority in its tenant to make room in its quota"
    )


def test_held_back_by_its_quota_it_waits_for_its_tenants_stopping_attempts() -> None:
    held = [running("a-low0", "a", (0,)), running("a-stopping", "a", (1,), stopping=True)]
    fs = fair_share([URGENT], held, {"a": Limits(gpus=2)}, nodes(1, 4))
    assert fs.over_quota_by_priority(URGENT, fs.p.tenant("a"))
    assert victims(fs.p.result) == []
    assert fs.p.result.wait_reasons["a-urgent"] == "waiting for 1 stopping job(s) of its tenant to free its quota"
