"""fair-share rule: catching up ("share"). A job larger than its tenant's whole guarantee, which the tenant is short
of, may preempt borrowed attempts of tenants whose share stays larger than its tenant's with it, once their victims
are gone."""

from __future__ import annotations

from dlcloud.scheduler.contract import Limits
from tests.unit.scheduler.fair_share.build import fair_share, ids
from tests.unit.scheduler.scenarios import job, nodes, running, victims

BIG = job("a0", "a", 4)


def six_of_b() -> list:
    return [running(f"b{i}", "b", (i,), minutes=10 + i) for i in range(6)]


def test_a_job_larger_than_what_its_tenant_lacks_is_catching_up_not_owed() -> None:
    fs = fair_share([BIG], [], {"a": Limits(guarantee_gpus=2)}, nodes(1, 8))
    s = fs.standing(BIG, fs.p.tenant("a"))
    assert s.catch_up and not s.owed
    # at its guarantee, the tenant is not short of it: no catching up
    fs = fair_share([BIG], [running("r", "a", (0, 1))], {"a": Limits(guarantee_gpus=2)}, nodes(1, 8))
    assert not fs.standing(BIG, fs.p.tenant("a")).catch_up


def test_it_takes_from_tenants_with_a_larger_share_only() -> None:
    held = [*six_of_b(), running("c0", "c", (6,))]
    fs = fair_share([BIG], held, {"a": Limits(guarantee_gpus=2)}, nodes(1, 8))
    a = fs.p.tenant("a")
    # b holds 6/8, more than a's 4/8 with the job; c's 1/8 is less
    assert ids(fs.share_victims(BIG, a)) == ["b0", "b1", "b2", "b3", "b4", "b5"]
    assert {c.reason for c in fs.share_victims(BIG, a)} == {"share"}


def test_the_tenants_it_takes_from_keep_a_larger_share_than_its_own() -> None:
    fs = fair_share([BIG], six_of_b(), {"a": Limits(guarantee_gpus=2)}, nodes(1, 8))
    cands = fs.share_victims(BIG, fs.p.tenant("a"))
    stay = fs.larger_shares_stay(BIG, fs.p.tenant("a"))
    assert stay(cands[:1])  # b keeps 5/8 > 4/8
    assert not stay(cands[:2])  # 4/8: not larger
    # in a whole pass: 2 free GPUs, 2 victims would make b as poor as a with the job: it preempts nothing
    fs.run()
    assert victims(fs.p.result) == []
    assert not fs.p.result.placements


def test_it_preempts_when_the_shares_allow() -> None:
    # b holds 9 of 12 GPUs, all borrowed; a (short of its guarantee of 2) needs 4, 3 are free: one victim leaves b
    # 8/12, more than a's 4/12
    held = [running(f"b{i}", "b", (i,), minutes=10 + i) for i in range(9)]
    fs = fair_share([BIG], held, {"a": Limits(guarantee_gpus=2)}, nodes(1, 12))
    fs.run()
    assert victims(fs.p.result) == ["b0"]  # the least work lost
    assert fs.p.result.preemptions[0].reason == "share"
    assert fs.p.result.wait_reasons["a0"] == (
        "preempting 1 job(s) of tenants with a larger share (its tenant is short of its guarantee)"
    )
