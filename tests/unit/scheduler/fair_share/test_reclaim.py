"""fair-share rule: reclaim. A job inside (or straddling) its tenant's guarantee preempts other tenants' borrowed
attempts, least work lost first; it waits for attempts already stopping rather than pick new victims."""

from __future__ import annotations

from dlcloud.scheduler.contract import Limits
from tests.unit.scheduler.fair_share.build import fair_share, ids
from tests.unit.scheduler.scenarios import job, nodes, running, victims

LIMITS = {"a": Limits(guarantee_gpus=4), "b": Limits()}


def borrowers() -> list:
    return [running(f"b{i}", "b", (i,), minutes=40 - 10 * i) for i in range(4)]


def test_reclaim_victims_are_other_tenants_borrowed_attempts_least_work_lost_first() -> None:
    held = [*borrowers(), running("a-own", "a", (4,))]
    fs = fair_share([job("a0", "a")], held, {"a": Limits(guarantee_gpus=1), "b": Limits()}, nodes(1, 5))
    # a's own attempt is inside its guarantee of 1; b's are borrowed, b3 started last
    assert ids(fs.reclaim_victims(fs.p.tenant("a"), inside=True)) == ["b3", "b2", "b1", "b0"]


def test_a_job_inside_its_guarantee_reclaims() -> None:
    fs = fair_share([job("a0", "a", 2)], borrowers(), LIMITS, nodes(1, 4))
    a = fs.p.tenant("a")
    job_ = a.jobs[0]
    assert fs.standing(job_, a).inside
    assert fs.preempt_for(job_, a, fs.standing(job_, a))
    assert victims(fs.p.result) == ["b3", "b2"]
    assert {x.reason for x in fs.p.result.preemptions} == {"reclaim"}
    assert fs.p.result.wait_reasons["a0"] == "preempting 2 job(s) to reclaim its guarantee"
    assert fs.p.tenant("a").use.gpus == 2  # claimed: its share counts the GPUs coming to it


def test_a_job_beyond_its_guarantee_does_not_reclaim() -> None:
    limits = {"a": Limits(guarantee_gpus=1), "b": Limits()}
    held = [*borrowers()[:3], running("a-own", "a", (3,))]
    fs = fair_share([job("a0", "a")], held, limits, nodes(1, 4))
    fs.run()
    assert victims(fs.p.result) == []


def test_attempts_already_stopping_are_waited_for_not_added_to() -> None:
    held = [*borrowers()[:2], running("b-stopping", "b", (2, 3), stopping=True)]
    fs = fair_share([job("a0", "a", 2)], held, LIMITS, nodes(1, 4))
    fs.run()
    assert victims(fs.p.result) == []
    assert fs.p.result.wait_reasons["a0"] == "waiting for 1 stopping job(s) to free their resources"
