"""fair-share rule: fill. The job at the head of the line (no reservation yet), not owed, may preempt borrowed
attempts of tenants with a larger share that started after it was submitted: what filled in ahead of it."""

from __future__ import annotations

from datetime import timedelta

from dlcloud.scheduler.backfill import Reservation
from dlcloud.scheduler.contract import Limits
from tests.unit.scheduler.fair_share.build import fair_share, ids
from tests.unit.scheduler.scenarios import NOW, job, nodes, running, victims

HEAD = job("a0", "a", 2, submitted_at=NOW - timedelta(minutes=5))


def held() -> list:
    return [
        running("before", "b", (0,), minutes=10),  # started before a0 was submitted
        running("after1", "b", (1,), minutes=3),
        running("after2", "b", (2,), minutes=2),
        running("c-after", "c", (3,), minutes=1),
    ]


def test_fill_victims_started_after_it_in_tenants_with_a_larger_share() -> None:
    fs = fair_share([HEAD], held(), {}, nodes(1, 4))
    # b holds 3/4, more than a's 2/4 with the job; c's 1/4 is not
    assert ids(fs.fill_victims(HEAD, fs.p.tenant("a"))) == ["after2", "after1"]  # least work lost first
    assert {c.reason for c in fs.fill_victims(HEAD, fs.p.tenant("a"))} == {"fill"}


def test_only_the_head_of_the_line_fills() -> None:
    fs = fair_share([HEAD], held(), {}, nodes(1, 4))
    a = fs.p.tenant("a")
    assert ids(fs.candidates(HEAD, a, False, False, False)) == ["after2", "after1"]
    fs.p.reservation = Reservation("x", None)
    assert fs.candidates(HEAD, a, False, False, False) == []


def test_a_pass_preempts_what_filled_in_ahead_of_it() -> None:
    fs = fair_share([HEAD], held(), {}, nodes(1, 4))
    fs.run()
    assert sorted(victims(fs.p.result)) == ["after1", "after2"]
    assert fs.p.result.wait_reasons["a0"].startswith("preempting 2 job(s) that started ahead of it as borrowed fill")


def test_an_owed_job_reclaims_rather_than_fills() -> None:
    fs = fair_share([HEAD], held(), {"a": Limits(guarantee_gpus=2)}, nodes(1, 4))
    fs.run()
    assert {x.reason for x in fs.p.result.preemptions} == {"reclaim"}
