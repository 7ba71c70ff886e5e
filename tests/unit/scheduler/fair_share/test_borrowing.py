"""fair-share rule: borrowing. Usage beyond a tenant's guarantee is borrowed (marked so in the plan), capped by its
borrowing limit per resource (``borrow_reason``); a non-preemptible job never borrows."""

from __future__ import annotations

from dlcloud.scheduler.contract import Limits, Usage
from dlcloud.scheduler.policies.terms import borrow_reason
from tests.unit.scheduler.fair_share.build import fair_share
from tests.unit.scheduler.scenarios import GiB, job, nodes, placed, running


def test_the_borrowing_limit_per_resource() -> None:
    lim = Limits(guarantee_gpus=2, borrow_gpus=1)
    assert borrow_reason(job("j", "a", 1), lim, Usage(gpus=2)) is None
    assert borrow_reason(job("j", "a", 2), lim, Usage(gpus=2)) == (
        "borrowing limit: needs 2 GPU(s), 2 in use of guarantee 2 + borrowing limit 1"
    )
    mem = Limits(guarantee_memory=4 * GiB, borrow_memory=0)
    assert borrow_reason(job("j", "a", 0, memory=GiB), mem, Usage(memory=4 * GiB)) is not None
    assert borrow_reason(job("j", "a", 64), Limits(guarantee_gpus=2), Usage(gpus=2)) is None  # no limit: all idle


def test_a_job_beyond_its_guarantee_starts_as_borrowed() -> None:
    fs = fair_share(
        [job("a0", "a"), job("a1", "a")], [running("r", "a", (0,))], {"a": Limits(guarantee_gpus=2)}, nodes(1, 4)
    )
    fs.run()
    assert placed(fs.p.result) == ["a0", "a1"]
    assert fs.p.result.borrowing == {"a1"}


def test_a_job_over_the_borrowing_limit_waits_and_says_so() -> None:
    limits = {"a": Limits(guarantee_gpus=1, borrow_gpus=1)}
    fs = fair_share([job("a0", "a", 2)], [running("r", "a", (0,))], limits, nodes(1, 4))
    assert fs.decide(job("a0", "a", 2), fs.p.tenant("a")) is False
    assert (
        fs.p.result.wait_reasons["a0"] == "borrowing limit: needs 2 GPU(s), 1 in use of guarantee 1 + borrowing limit 1"
    )
    assert not fs.p.result.placements


def test_a_non_preemptible_job_never_borrows() -> None:
    limits = {"a": Limits(guarantee_gpus=1)}
    rigid = job("a0", "a", 1, preemptible=False)
    fs = fair_share([rigid], [running("r", "a", (0,))], limits, nodes(1, 4))
    assert fs.decide(rigid, fs.p.tenant("a")) is False
    assert fs.p.result.wait_reasons["a0"] == (
        "non-preemptible: runs only inside tenant a's guarantee (1 of 1 guaranteed GPU(s) in use, needs 1)"
    )
