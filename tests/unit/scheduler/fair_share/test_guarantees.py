"""fair-share rule: the guarantees, i.e. which running attempts are owed and which are borrowed (``owed_split``),
which tenant goes first (``FairShare.rank``: owed work first) and where a queued job stands (``standing``)."""

from __future__ import annotations

from datetime import timedelta

from dlcloud.scheduler.contract import Limits
from dlcloud.scheduler.policies.fair_share import FairShare
from dlcloud.scheduler.policies.guarantees import owed_split, standing
from tests.unit.scheduler.fair_share.build import fair_share
from tests.unit.scheduler.scenarios import NOW, job, nodes, running


def borrowed_ids(fs: FairShare) -> set[str]:
    borrowed, _ = owed_split(fs.p)
    return {h.job_id for h in fs.p.held if id(h) in borrowed}


def test_the_latest_started_attempts_beyond_the_guarantee_are_borrowed() -> None:
    held = [running("old", "a", (0,), minutes=30), running("mid", "a", (1,), minutes=20), running("new", "a", (2,))]
    fs = fair_share([], held, {"a": Limits(guarantee_gpus=2)}, nodes(1, 4))
    assert borrowed_ids(fs) == {"new"}


def test_non_preemptible_then_higher_priority_attempts_are_owed_first() -> None:
    held = [
        running("early", "a", (0,), minutes=30),
        running("pinned", "a", (1,), minutes=1, preemptible=False),
        running("urgent", "a", (2,), minutes=2, priority=5),
    ]
    fs = fair_share([], held, {"a": Limits(guarantee_gpus=2)}, nodes(1, 4))
    assert borrowed_ids(fs) == {"early"}


def test_a_tenant_without_a_guarantee_borrows_all_it_runs() -> None:
    held = [running("x", "b", (0,)), running("y", "b", (1,))]
    fs = fair_share([], held, {}, nodes(1, 4))
    assert borrowed_ids(fs) == {"x", "y"}


def test_an_attempt_on_its_turn_is_owed_on_top_of_the_guarantee() -> None:
    held = [
        running("r0", "a", (0,), minutes=30),
        running("r1", "a", (1,), minutes=20),
        running("turn", "a", (2,), minutes=1, turn_until=NOW + timedelta(minutes=10)),
    ]
    fs = fair_share([], held, {"a": Limits(guarantee_gpus=2)}, nodes(1, 4))
    assert borrowed_ids(fs) == set()
    # once the turn has ended it is split as any other attempt: the latest started, borrowed
    held[2] = running("turn", "a", (2,), minutes=1, turn_until=NOW - timedelta(seconds=1))
    assert borrowed_ids(fair_share([], held, {"a": Limits(guarantee_gpus=2)}, nodes(1, 4))) == {"turn"}


def test_standing_inside_straddling_or_neither() -> None:
    limits = {"a": Limits(guarantee_gpus=4)}
    fs = fair_share([], [running("r", "a", (0, 1))], limits, nodes(1, 8))
    t = fs.p.tenant("a")
    assert standing(job("two", "a", 2), t) == (True, False)
    assert standing(job("three", "a", 3), t) == (False, True)  # 2 + 3 > 4, but 3 alone fits the guarantee
    assert standing(job("five", "a", 5), t) == (False, False)  # larger than the whole guarantee
    assert standing(job("rigid", "a", 3, preemptible=False), t) == (False, False)  # only preemptible jobs straddle


def test_a_tenant_with_owed_work_goes_before_a_smaller_share_that_would_borrow() -> None:
    # a holds more (3 of 8) than b (1 of 8), but its next job runs inside its guarantee: it goes first
    held = [running("a0", "a", (0, 1, 2)), running("b0", "b", (3,))]
    limits = {"a": Limits(guarantee_gpus=6), "b": Limits()}
    fs = fair_share([job("a1", "a"), job("b1", "b")], held, limits, nodes(1, 8))
    ta, tb = fs.p.tenant("a"), fs.p.tenant("b")
    assert fs.rank(ta) == (0, 3 / 8)
    assert fs.rank(tb) == (1, 1 / 8)
    assert fs.rank(ta) < fs.rank(tb)
