"""fair-share rule: straddling. The attempt (or job) that takes its tenant from short of its guarantee to beyond it,
and alone fits the guarantee, counts as owed: a straddling job reclaims borrowed attempts, and a straddling attempt is
taken back only by a job strictly inside its guarantee, after every borrowed one."""

from __future__ import annotations

from dlcloud.scheduler.contract import Limits, Usage
from dlcloud.scheduler.policies.guarantees import owed_split
from dlcloud.scheduler.policies.terms import straddles
from tests.unit.scheduler.fair_share.build import fair_share, ids
from tests.unit.scheduler.scenarios import job, nodes, running


def test_straddles_needs_the_tenant_short_and_the_job_alone_inside() -> None:
    lim = Limits(guarantee_gpus=6)
    assert straddles(lim, Usage(gpus=4), 4, 0, 0)
    assert not straddles(lim, Usage(gpus=2), 4, 0, 0)  # 6: inside, not beyond
    assert not straddles(lim, Usage(gpus=6), 1, 0, 0)  # not short of it
    assert not straddles(lim, Usage(gpus=4), 7, 0, 0)  # larger than the whole guarantee
    assert not straddles(Limits(), Usage(), 1, 0, 0)  # no guarantee


def test_the_attempt_across_the_guarantee_straddles_and_one_larger_than_it_is_borrowed() -> None:
    held = [
        running("small", "a", (0, 1, 2, 3), minutes=30),
        running("across", "a", (4, 5, 6, 7), minutes=20),
        running("huge", "b", tuple(range(8, 16)), minutes=10),
    ]
    fs = fair_share([], held, {"a": Limits(guarantee_gpus=6), "b": Limits(guarantee_gpus=6)}, nodes(2, 8))
    borrowed, straddling = owed_split(fs.p)
    assert {h.job_id for h in held if id(h) in straddling} == {"across"}
    assert {h.job_id for h in held if id(h) in borrowed} == {"huge"}


def test_a_straddling_attempt_is_taken_back_only_from_strictly_inside_and_after_borrowed_ones() -> None:
    held = [
        running("b-owed", "b", (0, 1, 2, 3), minutes=30),
        running("b-across", "b", (4, 5, 6, 7), minutes=20),
        running("c-borrowed", "c", (8,), minutes=5),
    ]
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=6)}
    fs = fair_share([job("a0", "a")], held, limits, nodes(2, 8))
    a = fs.p.tenant("a")
    assert ids(fs.reclaim_victims(a, inside=False)) == ["c-borrowed"]  # a straddling job reclaims borrowed only
    assert ids(fs.reclaim_victims(a, inside=True)) == ["c-borrowed", "b-across"]
    # the tenant's own straddling attempt is never its own reclaim victim
    assert ids(fs.reclaim_victims(fs.p.tenant("b"), inside=True)) == ["c-borrowed"]
