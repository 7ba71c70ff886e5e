"""fair-share: weighted DRF across tenants, guarantees and borrowing, reclaim and priority preemption, victim
choice, gangs, non-preemptible jobs, stopping attempts, fill, and the wait reasons."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from dlcloud.scheduler.planner import Limits, PlanConfig, Policy, plan
from tests.unit.scheduler.scenarios import NOW, GiB, gang, job, nodes, placed, running, victims

FS = PlanConfig(policy=Policy.FAIR_SHARE, aging_step=0)


def jobs(tenant: str, n: int, gpus: int = 1, **kw: object) -> list:
    return [job(f"{tenant}{i}", tenant, gpus, submitted_at=NOW - timedelta(seconds=100 - i), **kw) for i in range(n)]


# -- ordering and borrowing -----------------------------------------------------------------------------------------
def test_tenants_take_turns_by_dominant_share() -> None:
    p = plan(jobs("a", 6) + jobs("b", 6), [], {}, nodes(1, 4), NOW, FS)
    assert sorted(placed(p)) == ["a0", "a1", "b0", "b1"]


def test_weights_scale_the_share() -> None:
    limits = {"a": Limits(weight=2), "b": Limits(weight=1)}
    p = plan(jobs("a", 6) + jobs("b", 6), [], limits, nodes(1, 6), NOW, FS)
    assert sorted(placed(p)) == ["a0", "a1", "a2", "a3", "b0", "b1"]


def test_dominant_resource_is_what_counts() -> None:
    # "a" runs a CPU-heavy job (50% of CPUs, no GPUs): its dominant share is larger than b's 1 GPU of 4
    held = [running("cpu-hog", "a", (), cpus=16)]
    p = plan(jobs("a", 2) + jobs("b", 2), held, {}, nodes(1, 4, cpus=32), NOW, FS)
    assert placed(p)[:2] == ["b0", "b1"]


def test_idle_capacity_is_lent_and_marked_borrowed() -> None:
    limits = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=2)}
    p = plan(jobs("a", 4), [], limits, nodes(1, 4), NOW, FS)
    assert placed(p) == ["a0", "a1", "a2", "a3"]
    assert p.borrowing == {"a2", "a3"}


def test_borrowing_limit_caps_a_tenant_with_a_reason() -> None:
    limits = {"a": Limits(guarantee_gpus=2, borrow_gpus=1)}
    p = plan(jobs("a", 4), [], limits, nodes(1, 4), NOW, FS)
    assert placed(p) == ["a0", "a1", "a2"]
    assert p.wait_reasons["a3"] == "borrowing limit: needs 1 GPU(s), 3 in use of guarantee 2 + borrowing limit 1"
    assert p.blocked_by is None


def test_hard_quota_still_holds() -> None:
    limits = {"a": Limits(gpus=1, guarantee_gpus=4)}
    p = plan(jobs("a", 2), [], limits, nodes(1, 4), NOW, FS)
    assert placed(p) == ["a0"]
    assert p.wait_reasons["a1"].startswith("tenant quota: ")


# -- idle guaranteed GPUs lent only after lend_after_s --------------------------------------------------------------
def test_what_a_tenant_held_lately_stays_free_for_it_inside_its_guarantee() -> None:
    # a held 3 GPUs at once within the last lend_after_s, holds 1 now: 2 of its guarantee of 4 stay free for it; b
    # (no guarantee) borrows the rest and waits, told why
    limits = {"a": Limits(guarantee_gpus=4, recent_peak_gpus=3), "b": Limits(recent_peak_gpus=0)}
    held = [running("r0", "a", (0,))]
    p = plan(jobs("b", 8), held, limits, nodes(2, 4), NOW, FS)
    assert sorted(placed(p)) == ["b0", "b1", "b2", "b3", "b4"]
    assert p.borrowing == {"b0", "b1", "b2", "b3", "b4"}
    assert p.wait_reasons["b5"].startswith(
        "waiting for capacity: needs 1 GPU(s), 0 free; 2 idle GPU(s) kept for the return of tenants that used them "
        "within the last 10 min (inside their guarantees); "
    )
    # the kept GPUs are best fit on one node (the node a's attempt is on), the other node's stay whole for others
    assert {g for _, gs in p.placements for g in gs} == {4, 5, 6, 7, 3}
    # a's own jobs take them at once, in the same pass as b's
    p = plan(jobs("a", 2) + jobs("b", 8), held, limits, nodes(2, 4), NOW, FS)
    assert {"a0", "a1"} <= set(placed(p)) and len(placed(p)) == 7 and not p.preemptions


def test_only_the_guarantee_is_kept_and_none_without_lend_after() -> None:
    limits = {"a": Limits(guarantee_gpus=2, recent_peak_gpus=6)}  # held 6 lately, 4 of them borrowed
    p = plan(jobs("b", 8), [], limits, nodes(2, 4), NOW, FS)
    assert len(placed(p)) == 6
    for off in (replace(FS, lend_after_s=0), None):
        lim = limits if off is not None else {"a": Limits(guarantee_gpus=2)}  # no peak known: all lent
        p = plan(jobs("b", 8), [], lim, nodes(2, 4), NOW, off or FS)
        assert len(placed(p)) == 8


def test_an_owed_job_of_another_tenant_takes_kept_gpus_rather_than_reclaim_and_a_borrower_does_not() -> None:
    # the one idle GPU is kept for a: c's owed job (inside c's guarantee) takes it, nothing preempted; b's next job
    # (borrowing: b has no guarantee) waits
    limits = {"a": Limits(guarantee_gpus=1, recent_peak_gpus=1), "c": Limits(guarantee_gpus=1)}
    held = [running(f"b{i}", "b", (i,)) for i in range(3)]
    p = plan([job("c0", "c", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert placed(p) == ["c0"] and not p.preemptions
    p = plan([job("b3", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert placed(p) == [] and not p.preemptions
    assert "1 idle GPU(s) kept for the return of tenants" in p.wait_reasons["b3"]


def test_a_catching_up_job_takes_kept_gpus_rather_than_preempt() -> None:
    # c is short of its guarantee of 1 with a 2-GPU job (catching up): it takes the 2 GPUs kept for a, no preemption
    limits = {"a": Limits(guarantee_gpus=2, recent_peak_gpus=2), "c": Limits(guarantee_gpus=1)}
    held = [running(f"d{i}", "d", (i,)) for i in range(5)]
    p = plan([job("c0", "c", 2)], held, limits, nodes(2, 4), NOW, FS)
    assert placed(p) == ["c0"] and not p.preemptions


def test_a_reclaiming_job_placed_in_the_pass_is_not_counted_twice_against_what_its_tenant_keeps() -> None:
    # a (guaranteed 2, held 2 lately) gets its reclaiming job placed first: one more GPU stays kept, as for a plain job
    limits = {"a": Limits(guarantee_gpus=2, recent_peak_gpus=2)}
    for first in (job("a0", "a", 1, reclaiming=True), job("a0", "a", 1)):
        p = plan([first] + jobs("b", 4), [], limits, nodes(1, 4), NOW, FS)
        assert sorted(placed(p)) == ["a0", "b0", "b1"]


# -- reclaim -------------------------------------------------------------------------------------------------------
def full_of_a(*, minutes: tuple[float, ...] = (10, 20, 30, 40), **kw: object) -> list:
    """Tenant a runs one GPU job on each GPU of a 4-GPU node."""
    return [running(f"r{i}", "a", (i,), minutes=m, **kw) for i, m in enumerate(minutes)]


def test_owed_tenant_reclaims_borrowed_gpus_least_work_lost_first() -> None:
    limits = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=2)}
    # a's borrowed attempts are r2/r3 (owed: earliest started, r0 at 10 min ago... see _borrowed_attempts)
    held = full_of_a(minutes=(40, 30, 20, 10))  # r0 started first; r3 has lost the least work
    p = plan([job("b0", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p) == ["r3"]
    (pre,) = p.preemptions
    assert pre.by == "b0" and pre.reason == "reclaim"
    assert pre.message == "preempted by job b0 (reclaim): its tenant reclaims its guarantee"
    assert placed(p) == []  # it starts once the victim has stopped
    assert p.wait_reasons["b0"] == "preempting 1 job(s) to reclaim its guarantee"
    assert p.estimated_start["b0"] == NOW + timedelta(seconds=FS.preemption_grace_s)


def test_reclaim_takes_only_as_many_as_needed_and_never_owed_attempts() -> None:
    limits = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=2)}
    held = full_of_a(minutes=(40, 30, 20, 10))
    p = plan([job("b0", "b", 2)], held, limits, nodes(1, 4), NOW, FS)
    assert sorted(victims(p)) == ["r2", "r3"]
    # needing 3 would take owed attempts of a: not allowed, and 3 is beyond b's guarantee anyway
    limits3 = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=3)}
    p3 = plan([job("b0", "b", 3)], held, limits3, nodes(1, 4), NOW, FS)
    assert victims(p3) == []
    assert p3.wait_reasons["b0"].startswith("waiting for capacity: needs 3 GPU(s), 0 free")


def test_a_tenant_at_its_guarantee_does_not_reclaim() -> None:
    limits = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=1)}
    held = [running("b-own", "b", (0,)), *full_of_a()[1:]]
    p = plan([job("b0", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p) == []


def test_a_job_larger_than_a_guarantee_its_tenant_lacks_takes_only_from_larger_shares() -> None:
    # b is guaranteed 1 GPU and holds none; its job needs 2. a holds all 8 GPUs (2 owed, 6 borrowed): with the job
    # b's share would be 2/8, a's stays 6/8 without its victims, so b takes two of a's borrowed attempts
    limits = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=1)}
    held = [running(f"r{i}", "a", (i,), minutes=80 - i) for i in range(8)]  # r0, r1 started first: a's owed ones
    p = plan([job("b0", "b", 2)], held, limits, nodes(2, 4), NOW, FS)
    assert len(victims(p)) == 2 and not {"r0", "r1"} & set(victims(p))
    assert {x.reason for x in p.preemptions} == {"share"}
    assert p.wait_reasons["b0"] == (
        "preempting 2 job(s) of tenants with a larger share (its tenant is short of its guarantee)"
    )
    # 4 GPUs would leave a with 4 of 8, not more than b's 4: b waits (a is not made poorer than b)
    assert victims(plan([job("b0", "b", 4)], held, limits, nodes(2, 4), NOW, FS)) == []
    # a tenant without a guarantee filling a node keeps more than the catching-up tenant (the review's case: a
    # tenant guaranteed 1 GPU took 6 of 8 from one with none)
    c_fills = [running(f"c{i}", "c", (i,), minutes=30) for i in range(8)]
    assert victims(plan([job("a6", "a", 6)], c_fills, {"a": Limits(guarantee_gpus=1)}, nodes(2, 4), NOW, FS)) == []
    # two catching-up jobs in one pass each see what the other took
    two = plan(
        [job("a3", "a", 3), job("d3", "d", 3)],
        c_fills,
        {"a": Limits(guarantee_gpus=1), "d": Limits(guarantee_gpus=1)},
        nodes(2, 4),
        NOW,
        FS,
    )
    assert len(victims(two)) == 3  # after the first takes 3 (c keeps 5 > 3), the second would leave c 2 < 3
    # when the lenders' shares would not stay above b's (2 of 4 each), b waits
    even = [running("a0", "a", (0,)), running("a1", "a", (1,)), running("c0", "c", (2,)), running("c1", "c", (3,))]
    limits_c = {"a": Limits(guarantee_gpus=1), "b": Limits(guarantee_gpus=1)}
    assert victims(plan([job("b0", "b", 2, submitted_at=NOW)], even, limits_c, nodes(1, 4), NOW, FS)) == []


def test_a_job_straddling_its_guarantee_reclaims_and_counts_as_owed() -> None:
    # a is guaranteed 6 GPUs and holds 4; its next job needs 4 (8 > 6) but fits the guarantee alone: without the
    # straddling rule a tenant whose jobs are as large as what it lacks could never reclaim the rest
    limits = {"a": Limits(guarantee_gpus=6), "b": Limits(guarantee_gpus=1)}
    held = [running("a-old", "a", (0, 1, 2, 3), minutes=60), running("b-owed", "b", (8,), minutes=90)]
    held += [running(f"b{i}", "b", (i,), minutes=30 + i) for i in (4, 5, 6, 7)]  # borrowed: started after b-owed
    held += [running(f"b{i}", "b", (i,), minutes=30 + i) for i in (9, 10, 11)]
    p = plan([job("a1", "a", 4)], held, limits, nodes(3, 4), NOW, FS)
    assert placed(p) == []
    assert {x.reason for x in p.preemptions} == {"reclaim"}
    assert sorted(victims(p)) == ["b4", "b5", "b6", "b7"]  # node 2 holds b's owed job
    assert p.wait_reasons["a1"] == "preempting 4 job(s) to reclaim its guarantee"
    # a tenant at its guarantee does not straddle: it waits
    at = {**limits, "a": Limits(guarantee_gpus=4)}
    assert victims(plan([job("a1", "a", 4)], held, at, nodes(3, 4), NOW, FS)) == []
    # once running, the straddling attempt is owed: b (guaranteed 1, holding 1) cannot take it back
    done = [running("a-old", "a", (0, 1, 2, 3), minutes=60), running("a1", "a", (4, 5, 6, 7), minutes=1)]
    done += [running("b-owed", "b", (8,), minutes=90), *(running(f"b{i}", "b", (i,)) for i in (9, 10, 11))]
    big = {**limits, "b": Limits(guarantee_gpus=5)}
    p = plan([job("b2", "b", 4)], done, big, nodes(3, 4), NOW, replace(FS, defragment=False))
    assert victims(p) == []  # a1 straddles (owed), a-old is owed: nothing b may take


def test_a_straddling_attempt_is_taken_back_only_by_a_job_inside_its_guarantee_and_last() -> None:
    # a holds 4 owed + 4 straddling (guarantee 6); c is guaranteed 4 and idle; d borrows one GPU
    limits = {"a": Limits(guarantee_gpus=6), "c": Limits(guarantee_gpus=4), "e": Limits(guarantee_gpus=4)}
    held = [running("a-owed", "a", (0, 1, 2, 3), minutes=60), running("a-straddle", "a", (4, 5, 6, 7), minutes=30)]
    held += [running("d-borrowed", "d", (8,), minutes=5)]
    # c needs 1 GPU: the borrowed attempt goes first, the straddling one stays
    p = plan([job("c0", "c", 1)], held, limits, nodes(3, 4), NOW, replace(FS, defragment=False))
    assert placed(p) == ["c0"]  # three GPUs are free on node 2
    p = plan([job("c0", "c", 4)], held, limits, nodes(3, 4), NOW, replace(FS, defragment=False))
    assert victims(p) == ["d-borrowed"]
    # with node 2 full of owed work, c's 4-GPU job takes the straddling attempt back
    full = [*held[:2], running("e-owed", "e", (8, 9, 10, 11), minutes=5)]
    p = plan([job("c0", "c", 4)], full, limits, nodes(3, 4), NOW, FS)
    assert victims(p) == ["a-straddle"] and p.preemptions[0].reason == "reclaim"
    # a job that itself straddles (e: 3 + 4 > 4 guaranteed... here f, guaranteed 6, holding 4) does not
    limits_f = {**limits, "f": Limits(guarantee_gpus=6)}
    full_f = [*full[:2], running("f-owed", "f", (8, 9, 10, 11), minutes=5)]
    p = plan([job("f1", "f", 4)], full_f, limits_f, nodes(3, 4), NOW, FS)
    assert victims(p) == []


def test_a_job_larger_than_its_guarantee_does_not_straddle() -> None:
    limits = {"a": Limits(guarantee_gpus=3), "b": Limits(guarantee_gpus=1)}
    held = [running(f"b{i}", "b", (i,), minutes=30 + i) for i in range(4)]
    p = plan([job("a0", "a", 4, submitted_at=NOW)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p) == []
    assert p.borrowing == set()


def test_victims_lowest_priority_first_then_least_work_lost() -> None:
    limits = {"a": Limits(guarantee_gpus=1), "b": Limits(guarantee_gpus=2)}
    held = [
        running("owed", "a", (0,), priority=9, minutes=1),
        running("hi", "a", (1,), priority=5, minutes=1),
        running("lo-old", "a", (2,), priority=1, minutes=50),
        running("lo-new", "a", (3,), priority=1, minutes=5),
    ]
    p = plan([job("b0", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p) == ["lo-new"]
    p2 = plan([job("b0", "b", 2)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p2) == ["lo-new", "lo-old"]


def test_work_lost_counts_from_the_last_checkpoint_times_gpus() -> None:
    limits = {"a": Limits(guarantee_gpus=1), "b": Limits(guarantee_gpus=2)}
    checkpointed = NOW - timedelta(minutes=1)
    held = [
        running("owed", "a", (0,), priority=9),
        running("fresh-ckpt", "a", (1, 2), minutes=60, progress_at=checkpointed),  # 1 min × 2 GPUs lost
        running("no-ckpt", "a", (3,), minutes=5),  # 5 min × 1 GPU lost
    ]
    p = plan([job("b0", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p) == ["fresh-ckpt"]


def test_a_gang_is_preempted_whole_once() -> None:
    limits = {"a": Limits(guarantee_gpus=0), "b": Limits(guarantee_gpus=8)}
    # a's 2-replica gang holds GPUs 2-3 (node 0) and 6-7 (node 1); b needs 4 GPUs on one node
    held = [running("gang", "a", (2, 3, 6, 7), minutes=1), running("solo", "a", (0,), minutes=600)]
    p = plan([job("b0", "b", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert victims(p) == ["gang"]  # one preemption stops all its replicas (node 1 then fits b0)
    assert p.wait_reasons["b0"] == "preempting 1 job(s) to reclaim its guarantee"


def test_a_queued_gang_preempts_what_its_replicas_need() -> None:
    limits = {"a": Limits(guarantee_gpus=0), "b": Limits(guarantee_gpus=8)}
    held = [running(f"a{i}", "a", (i,), minutes=1 + i) for i in range(8)]
    p = plan([gang("g", "b", 2, 3)], held, limits, nodes(2, 4), NOW, FS)
    assert len(victims(p)) == 6
    got = set(victims(p))
    assert len(got & {"a0", "a1", "a2", "a3"}) == 3 and len(got & {"a4", "a5", "a6", "a7"}) == 3


def test_victims_are_chosen_on_one_node_for_a_single_process_job() -> None:
    limits = {"a": Limits(guarantee_gpus=0), "b": Limits(guarantee_gpus=8)}
    # node 0: four cheap 1-GPU jobs; node 1: two 2-GPU jobs that lost more work. 1 victim per node is not enough.
    held = [running(f"n0-{i}", "a", (i,), minutes=1) for i in range(4)]
    held += [running("n1-a", "a", (4, 5), minutes=30), running("n1-b", "a", (6, 7), minutes=30)]
    p = plan([job("b0", "b", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert sorted(victims(p)) == ["n0-0", "n0-1", "n0-2", "n0-3"]
    # globally cheapest victims spread over two nodes would not fit a 3-GPU process
    p3 = plan([job("b0", "b", 3)], held, limits, nodes(2, 4), NOW, FS)
    assert sorted(victims(p3)) == ["n0-0", "n0-1", "n0-2"]


# -- priority within a tenant ----------------------------------------------------------------------------------------
def test_higher_priority_preempts_lower_priority_of_its_own_tenant_only() -> None:
    held = [running("mine-low", "a", (0, 1), priority=0), running("theirs", "b", (2, 3), priority=-5)]
    p = plan([job("urgent", "a", 2, priority=10)], held, {}, nodes(1, 4), NOW, FS)
    assert victims(p) == ["mine-low"]
    assert p.preemptions[0].reason == "priority"
    assert p.wait_reasons["urgent"] == "preempting 1 job(s) of lower priority in its tenant"
    same = plan([job("same", "a", 2, priority=0)], held, {}, nodes(1, 4), NOW, FS)
    assert victims(same) == []


# -- non-preemptible jobs -----------------------------------------------------------------------------------------
def test_non_preemptible_job_only_inside_the_guarantee() -> None:
    limits = {"a": Limits(guarantee_gpus=2)}
    queue = [job("np0", "a", 1, preemptible=False), job("np1", "a", 1, preemptible=False)]
    queue += [job("np2", "a", 1, preemptible=False), job("p3", "a", 1)]
    p = plan(queue, [], limits, nodes(1, 4), NOW, FS)
    assert placed(p) == ["np0", "np1", "p3"]
    assert p.borrowing == {"p3"}
    assert p.wait_reasons["np2"] == (
        "non-preemptible: runs only inside tenant a's guarantee (2 of 2 guaranteed GPU(s) in use, needs 1)"
    )
    nothing = plan([job("np", "z", 1, preemptible=False)], [], {}, nodes(1, 4), NOW, FS)
    assert placed(nothing) == [] and "non-preemptible" in nothing.wait_reasons["np"]


def test_non_preemptible_attempts_are_never_victims() -> None:
    limits = {"a": Limits(guarantee_gpus=0), "b": Limits(guarantee_gpus=4)}
    held = [running(f"np{i}", "a", (i,), preemptible=False, priority=-9) for i in range(3)]
    held.append(running("ok", "a", (3,), priority=9, minutes=900))
    p = plan([job("b0", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p) == ["ok"]
    p2 = plan([job("b0", "b", 2)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(p2) == []
    hi = plan([job("hi", "a", 1, priority=99)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(hi) == ["ok"]


# -- attempts already stopping ----------------------------------------------------------------------------------------
def test_stopping_attempts_count_as_soon_free_and_are_not_preempted_again() -> None:
    limits = {"a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=2)}
    held = full_of_a(minutes=(40, 30, 20, 10))
    first = plan([job("b0", "b", 1)], held, limits, nodes(1, 4), NOW, FS)
    assert victims(first) == ["r3"]
    # next pass: r3 is stopping; b0 waits for it, nobody new is preempted
    held2 = [h if h.job_id != "r3" else running("r3", "a", (3,), minutes=10, stopping=True) for h in held]
    second = plan([job("b0", "b", 1)], held2, limits, nodes(1, 4), NOW, FS)
    assert victims(second) == []
    assert second.wait_reasons["b0"] == "waiting for 1 stopping job(s) to free their resources"
    assert second.estimated_start["b0"] == NOW + timedelta(seconds=FS.preemption_grace_s)
    # a second owed job does get a new victim, but never the stopping one
    third = plan([job("b0", "b", 1), job("b1", "b", 1)], held2, limits, nodes(1, 4), NOW, FS)
    assert victims(third) == ["r2"]


def test_a_stopping_attempt_is_never_a_victim() -> None:
    held = [running("going", "a", (0, 1, 2, 3), priority=-9, stopping=True)]
    p = plan([job("hi", "a", 4, priority=9)], held, {}, nodes(1, 4), NOW, FS)
    assert victims(p) == []
    assert p.estimated_start["hi"] == NOW + timedelta(seconds=FS.preemption_grace_s)  # it frees its GPUs then


# -- backfill and fill ------------------------------------------------------------------------------------------------
def test_preemptible_borrowed_fill_may_delay_the_reservation_but_owed_work_may_not() -> None:
    # b (no guarantee) heads the line with a 4-GPU job that does not fit; 2 GPUs free until +60 min
    limits = {"c": Limits(guarantee_gpus=1)}
    held = [running("long", "z", (2, 3), max_run_time_s=70 * 60)]
    queue = [job("big", "b", 4, submitted_at=NOW - timedelta(hours=1))]
    queue += [job("np", "c", 1, preemptible=False, submitted_at=NOW)]
    queue += [job("fill", "d", 1, submitted_at=NOW)]
    p = plan(queue, held, limits, nodes(1, 4), NOW, FS)
    assert p.blocked_by == "big"
    assert "np" in placed(p)  # inside c's guarantee: starts ahead of a borrowing reservation
    assert "fill" in placed(p) and "fill" in p.borrowing


def test_fill_that_started_ahead_is_preempted_by_the_head_job() -> None:
    # d's fill started after "big" was submitted, and d's share (3 of 4 GPUs) is larger than b's would be (2)
    held = [running("fill", "d", (0, 1, 2), minutes=1), running("other", "z", (3,), minutes=1)]
    queue = [job("big", "b", 2, submitted_at=NOW - timedelta(hours=1))]
    p = plan(queue, held, {}, nodes(1, 4), NOW, FS)
    assert victims(p) == ["fill"]
    assert p.preemptions[0].reason == "fill"
    # not when it started before the head job was submitted
    old = [running("fill", "d", (0, 1, 2), minutes=120), running("other", "z", (3,), minutes=1)]
    assert victims(plan(queue, old, {}, nodes(1, 4), NOW, FS)) == []


# -- wait reasons ---------------------------------------------------------------------------------------------------
def test_wait_reasons_name_the_share_and_the_tenants_ahead() -> None:
    held = [running("a-run", "a", (0, 1)), running("b-run", "b", (2,))]
    queue = [job("a-next", "a", 2), job("b-next", "b", 2), job("c-next", "c", 2)]
    p = plan(queue, held, {}, nodes(1, 4), NOW, FS)
    assert placed(p) == []
    assert p.wait_reasons["c-next"].startswith("waiting for capacity: needs 2 GPU(s), 1 free")
    assert p.wait_reasons["c-next"].endswith(
        "; fair share: tenant c uses 0% (dominant: GPUs), first in line among tenants with waiting jobs"
    )
    assert "behind job c-next" in p.wait_reasons["a-next"]
    assert p.wait_reasons["a-next"].endswith(
        "fair share: tenant a uses 50% (dominant: GPUs), behind tenant(s) c, b with a smaller share"
    )


def test_memory_dominant_share_is_named() -> None:
    held = [running("a-run", "a", (), memory=600 * GiB)]
    p = plan([job("a-next", "a", 1, memory=500 * GiB)], held, {}, nodes(1, 4, memory=1000 * GiB), NOW, FS)
    assert "tenant a uses 60% (dominant: memory)" in p.wait_reasons["a-next"]


def test_a_preempting_job_counts_toward_its_tenants_share_in_the_same_pass() -> None:
    # b reclaims 2 GPUs for b0; its share now counts b0, so c (share 0) comes before b's next job and takes the
    # reservation; without counting it, b1 would have been next in line
    limits = {"a": Limits(guarantee_gpus=0), "b": Limits(guarantee_gpus=2)}
    held = [running(f"r{i}", "a", (i,), minutes=100 + i) for i in range(4)]
    queue = [job("b0", "b", 2), job("b1", "b", 2), job("c0", "c", 2)]
    p = plan(queue, held, limits, nodes(1, 4), NOW, FS)
    assert {pre.by for pre in p.preemptions} == {"b0"}
    assert p.blocked_by == "c0"
    assert p.wait_reasons["b1"].startswith("waiting behind job c0")


def test_aging_orders_jobs_inside_a_tenant() -> None:
    aged = PlanConfig(policy=Policy.FAIR_SHARE, aging_interval_s=60, aging_step=1, aging_max=100)
    old = job("old", "a", 4, priority=0, submitted_at=NOW - timedelta(minutes=30))
    new = job("new", "a", 4, priority=10, submitted_at=NOW)
    assert placed(plan([new, old], [], {}, nodes(1, 4), NOW, aged)) == ["old"]
    assert placed(plan([new, old], [], {}, nodes(1, 4), NOW, FS)) == ["new"]


def test_victim_searches_per_pass_are_bounded() -> None:
    from dlcloud.scheduler.policies import MAX_SEARCHES

    # 64 borrowed 1-GPU attempts, 100 tenants each owed a GPU: only MAX_SEARCHES of them preempt in one pass,
    # the rest wait (the next passes go on)
    limits = {f"t{i:03d}": Limits(guarantee_gpus=1) for i in range(100)}
    held = [running(f"r{i}", "lender", (i,)) for i in range(64)]
    queue = [job(f"j{i:03d}", f"t{i:03d}", 1) for i in range(100)]
    p = plan(queue, held, limits, nodes(8, 8), NOW, FS)
    preemptors = {pre.by for pre in p.preemptions}
    assert len(preemptors) == len(p.preemptions) == MAX_SEARCHES
    assert placed(p) == [] and len(p.wait_reasons) == 100
    others = [why for jid, why in p.wait_reasons.items() if jid not in preemptors]
    assert all(why.startswith(("waiting for capacity", "waiting behind job")) for why in others)


def test_higher_priority_preempts_its_own_tenant_to_get_under_its_quota() -> None:
    limits = {"a": Limits(gpus=4)}
    held = [
        running("lo-a", "a", (0, 1), priority=0, minutes=30),
        running("lo-b", "a", (2,), priority=0, minutes=5),
        running("lo-c", "a", (3,), priority=1, minutes=1),
    ]
    p = plan([job("hi", "a", 2, priority=5)], held, limits, nodes(1, 8), NOW, FS)
    assert victims(p) == ["lo-a"]  # the lowest priority, and enough on its own
    assert p.preemptions[0].reason == "priority"
    assert p.wait_reasons["hi"] == "preempting 1 job(s) of lower priority in its tenant to make room in its quota"
    # next pass: lo-a is stopping; hi waits for it, nobody else is preempted
    held2 = [running("lo-a", "a", (0, 1), priority=0, stopping=True), held[1], held[2]]
    p2 = plan([job("hi", "a", 2, priority=5)], held2, limits, nodes(1, 8), NOW, FS)
    assert victims(p2) == []
    assert p2.wait_reasons["hi"] == "waiting for 1 stopping job(s) of its tenant to free its quota"
    # the same priority preempts nobody: it waits for its quota
    p3 = plan([job("same", "a", 2, priority=0)], held, limits, nodes(1, 8), NOW, FS)
    assert victims(p3) == [] and p3.wait_reasons["same"].startswith("tenant quota: ")


def test_after_a_reclaim_the_owed_job_goes_before_the_borrower_it_preempted() -> None:
    # the borrower's job (submitted first) was preempted for b's job and is queued again; both tenants now use
    # nothing, so their shares tie: the job inside its tenant's guarantee is placed, not the borrower again
    limits = {"a": Limits(guarantee_gpus=0, weight=1), "b": Limits(guarantee_gpus=2)}
    borrower = job("a-ddp", "a", 2, submitted_at=NOW - timedelta(hours=2))
    owner = job("b-own", "b", 2, submitted_at=NOW - timedelta(minutes=5))
    p = plan([borrower, owner], [], limits, nodes(1, 2), NOW, FS)
    assert placed(p) == ["b-own"]
    assert not victims(p)
    # the same with the borrower's tenant holding a guarantee elsewhere and the owner's queue ahead in the input
    limits = {"a": Limits(guarantee_gpus=1), "b": Limits(guarantee_gpus=2)}
    p = plan([owner, borrower], [], limits, nodes(1, 2), NOW, FS)
    assert placed(p) == ["b-own"]


def test_a_job_whose_preemptions_were_granted_gets_what_its_victims_freed() -> None:
    # b-big preempted borrowers in an earlier pass; they have stopped and its node is free. c1, owed as well and
    # first in the order (same share, earlier in the queue), would take a GPU of it and b-big would preempt again
    limits = {"b": Limits(guarantee_gpus=4), "c": Limits(guarantee_gpus=2)}
    c1 = job("c1", "c", 1, submitted_at=NOW - timedelta(hours=1))
    big = job("b-big", "b", 4, submitted_at=NOW - timedelta(minutes=5))
    without = plan([c1, big], [], limits, nodes(1, 4), NOW, FS)
    assert placed(without) == ["c1"]  # what happened, round after round, before the flag
    p = plan([c1, replace(big, reclaiming=True)], [], limits, nodes(1, 4), NOW, FS)
    assert placed(p) == ["b-big"]
    assert "c1" in p.wait_reasons


# -- least attained service inside a tenant (tenant_las_queues_gpu_s, on by default) ---------------------------------
BOUNDARY_GPU_S = PlanConfig.tenant_las_queues_gpu_s[0]  # the first boundary of the default (a tenant's las queue 1)


def test_a_tenants_fresh_job_goes_before_its_job_back_from_long_service() -> None:
    resumed = job("resumed", "a", 4, attained_gpu_s=2 * BOUNDARY_GPU_S, submitted_at=NOW - timedelta(hours=5))
    fresh = job("fresh", "a", 4, submitted_at=NOW - timedelta(minutes=1))
    assert placed(plan([resumed, fresh], [], {}, nodes(1, 4), NOW, FS)) == ["fresh"]
    by_submit = replace(FS, tenant_las_queues_gpu_s=())
    assert placed(plan([resumed, fresh], [], {}, nodes(1, 4), NOW, by_submit)) == ["resumed"]


def test_las_inside_a_tenant_never_beats_priority_but_aging_still_lifts() -> None:
    resumed = job("resumed", "a", 4, priority=5, attained_gpu_s=2 * BOUNDARY_GPU_S)
    fresh = job("fresh", "a", 4, priority=0)
    assert placed(plan([resumed, fresh], [], {}, nodes(1, 4), NOW, FS)) == ["resumed"]
    aged = replace(FS, aging_interval_s=60, aging_step=1)
    old_low = job("old-low", "a", 4, priority=0, submitted_at=NOW - timedelta(minutes=30))
    assert placed(plan([resumed, old_low], [], {}, nodes(1, 4), NOW, aged)) == ["old-low"]


def test_a_fresh_job_preempts_its_own_tenants_long_running_job_of_the_same_priority() -> None:
    held = [
        running("long", "a", (0, 1), attained_gpu_s=3 * BOUNDARY_GPU_S),
        running("short", "a", (2, 3), attained_gpu_s=0.5 * BOUNDARY_GPU_S),
    ]
    p = plan([job("new", "a", 2)], held, {}, nodes(1, 4), NOW, FS)
    assert victims(p) == ["long"] and p.preemptions[0].reason == "las"
    assert p.wait_reasons["new"] == "preempting 1 job(s) with more attained service (las)"
    # never a job in the same queue, never with las inside tenants turned off
    same_queue = [running("peer", "a", (0, 1, 2, 3), attained_gpu_s=0.5 * BOUNDARY_GPU_S)]
    assert victims(plan([job("new", "a", 2)], same_queue, {}, nodes(1, 4), NOW, FS)) == []
    assert (
        victims(plan([job("new", "a", 2)], held, {}, nodes(1, 4), NOW, replace(FS, tenant_las_queues_gpu_s=()))) == []
    )


def test_las_inside_a_tenant_never_preempts_another_tenant_or_a_higher_priority() -> None:
    held = [
        running("theirs", "b", (0, 1), attained_gpu_s=30 * BOUNDARY_GPU_S),
        running("mine-high", "a", (2, 3), priority=5, attained_gpu_s=30 * BOUNDARY_GPU_S),
    ]
    p = plan([job("new", "a", 2)], held, {}, nodes(1, 4), NOW, FS)
    assert victims(p) == []
    # a job back from preemption (more attained service) does not preempt a fresh one of its tenant
    fresh = [running("fresh", "a", (0, 1, 2, 3))]
    back = job("back", "a", 2, attained_gpu_s=2 * BOUNDARY_GPU_S)
    assert victims(plan([back], fresh, {}, nodes(1, 4), NOW, FS)) == []


# -- defragmentation ---------------------------------------------------------------------------------------------------
def test_scattered_free_gpus_are_gathered_for_a_gang_by_moving_small_jobs() -> None:
    # three nodes of 4, one GPU busy on each: 9 free, but a 2 x 4 gang needs two whole nodes
    held = [running("s0", "b", (0,), minutes=5), running("s1", "c", (4,), minutes=30), running("s2", "d", (8,))]
    p = plan([gang("g", "a", 2, 4)], held, {}, nodes(3, 4), NOW, FS)
    assert placed(p) == []
    assert sorted(victims(p)) == ["s0", "s2"]  # the least work lost; s1's node takes both back
    assert {x.reason for x in p.preemptions} == {"defrag"}
    assert p.wait_reasons["g"] == "preempting 2 job(s) to gather whole nodes (they resume at once on GPUs left free)"
    assert "resumes on GPUs held for it elsewhere" in p.preemptions[0].message
    # without defragmentation the gang waits (reserved) and nothing is stopped
    off = plan([gang("g", "a", 2, 4)], held, {}, nodes(3, 4), NOW, replace(FS, defragment=False))
    assert victims(off) == [] and off.blocked_by == "g"


def test_no_move_when_the_moved_jobs_would_not_fit_again() -> None:
    # a 2-GPU job fits only by moving a 3-GPU job, which then finds no node with 3 free GPUs
    held = [running("t0", "b", (0, 1, 2)), running("t1", "c", (4, 5, 6))]
    p = plan([job("two", "a", 2)], held, {}, nodes(2, 4), NOW, FS)
    assert victims(p) == [] and p.blocked_by == "two"


def test_non_preemptible_and_whole_node_attempts_are_never_moved() -> None:
    held = [
        running("np0", "b", (0,), preemptible=False),
        running("np1", "c", (4,), preemptible=False),
        running("whole", "d", (8, 9, 10, 11)),
    ]
    p = plan([gang("g", "a", 2, 4)], held, {}, nodes(3, 4), NOW, FS)
    assert victims(p) == [] and p.blocked_by == "g"


def _owed_small_jobs_on_every_node(b_preempted: int = 0) -> tuple[dict, list]:
    # node 0: b's owed 1-GPU job and c's three borrowed ones; node 1: b's other owed job, two of c's, GPU 7 free.
    # a (guaranteed 4, idle) needs a whole node; c's borrowed jobs alone free none
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=2)}
    held = [
        running("b-n0", "b", (0,), minutes=5, preemptions=b_preempted),
        running("b-n1", "b", (4,), minutes=50, preemptions=b_preempted),
    ]
    held += [running(f"c{i}", "c", (i,), minutes=20) for i in (1, 2, 3, 5, 6)]
    return limits, held


def test_an_owed_job_moves_another_tenants_owed_job_to_gpus_held_for_it() -> None:
    # a evicts c's borrowed jobs on node 0 and moves b's job there to the free GPU 7 of node 1 (the least work lost
    # of b's two): b keeps its guarantee, and GPU 7 is held for b-n0's next attempt. A GPU is free: no more of c's
    # jobs are evicted to make room for the moved one (a chain)
    limits, held = _owed_small_jobs_on_every_node()
    p = plan([job("a0", "a", 4), job("c9", "c", 1)], held, limits, nodes(2, 4), NOW, FS)
    assert sorted(victims(p)) == ["b-n0", "c1", "c2", "c3"]
    moved = {x.job_id: x for x in p.preemptions if x.reason == "defrag"}
    assert list(moved) == ["b-n0"] and moved["b-n0"].move_to == (7,)
    assert {x.reason for x in p.preemptions if x.job_id != "b-n0"} == {"reclaim"}
    assert p.wait_reasons["a0"] == "preempting 4 job(s) to reclaim its guarantee, moving 1 to gather whole nodes"
    assert placed(p) == []  # c9 does not get GPU 7, held for b-n0 from this pass on


def test_a_job_is_moved_for_another_tenants_guarantee_at_most_once() -> None:
    # b's jobs were preempted before: they are not moved for a again (a tenant submitting gangs cannot make b lose
    # work again and again), and without moving them nothing frees a node: a waits
    limits, held = _owed_small_jobs_on_every_node(b_preempted=1)
    p = plan([job("a0", "a", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert not {"b-n0", "b-n1"} & set(victims(p))
    assert not any(x.reason == "defrag" for x in p.preemptions)


def _owed_small_jobs_and_no_free_gpu(**c_kw: object) -> tuple[dict, list]:
    # as ``_owed_small_jobs_on_every_node``, but c's borrowed jobs take GPU 7 too: nothing is free anywhere
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=2)}
    held = [running("b-n0", "b", (0,), minutes=5), running("b-n1", "b", (4,), minutes=50)]
    held += [running(f"c{i}", "c", (i,), minutes=20, **c_kw) for i in (1, 2, 3, 5, 6, 7)]
    return limits, held


def test_an_owed_job_chains_a_move_onto_a_borrowed_job_it_evicts_on_another_node() -> None:
    # a's 4 GPUs of c's borrowed capacity are scattered over both nodes, each holding an owed job of b: a evicts c's
    # jobs on node 0, moves b-n0 onto GPU 5 of node 1 and evicts c5 there too; b keeps its guarantee
    limits, held = _owed_small_jobs_and_no_free_gpu()
    p = plan([job("a0", "a", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert {x.job_id: x.reason for x in p.preemptions} == {
        "c1": "reclaim", "c2": "reclaim", "c3": "reclaim", "b-n0": "defrag", "c5": "reclaim"}  # fmt: skip
    assert next(x.move_to for x in p.preemptions if x.job_id == "b-n0") == (5,)
    assert p.wait_reasons["a0"] == "preempting 5 job(s) to reclaim its guarantee, moving 1 to gather whole nodes"
    # b's jobs preempted before are not moved again: nothing is
    once = [replace(h, preemptions=1) if h.tenant_id == "b" else h for h in held]
    assert victims(plan([job("a0", "a", 4)], once, limits, nodes(2, 4), NOW, FS)) == []


def test_a_chain_evicts_the_fewest_gpus_on_one_node_and_never_a_gang() -> None:
    # 3 nodes of 4; b's owed jobs on every node, c's borrowed ones fill node 0. For one GPU for b-n0 the chain takes
    # e's 1-GPU job on node 2, not d's 3-GPU one on node 1 (which loses the least work); a gang of d over nodes 1 and
    # 2 is never chained (it would free GPUs on two nodes for one moved GPU): then a waits (review of the chain)
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=3)}
    held = [running("b-n0", "b", (0,), minutes=5), running("b-n1", "b", (4,), minutes=50)]
    held += [running("b-n2", "b", (8,), minutes=50)]
    held += [running(f"c{i}", "c", (i,), minutes=20) for i in (1, 2, 3)]
    small = [running("d3", "d", (5, 6, 7), minutes=2), running("e1", "e", (9,), minutes=30)]
    small += [running("f2", "f", (10, 11), minutes=30)]
    p = plan([job("a0", "a", 4)], held + small, limits, nodes(3, 4), NOW, FS)
    assert sorted(victims(p)) == ["b-n0", "c1", "c2", "c3", "e1"]
    assert next(x.move_to for x in p.preemptions if x.job_id == "b-n0") == (9,)
    gang = [running("d-gang", "d", (5, 6, 7, 9, 10, 11), minutes=60)]
    assert victims(plan([job("a0", "a", 4)], held + gang, limits, nodes(3, 4), NOW, FS)) == []


def test_no_chain_when_the_declared_ends_free_a_node_within_the_hour() -> None:
    # c's jobs and b-n0 declare they end within 40 minutes (node 0 whole then): a waits for that, losing no work
    limits, held = _owed_small_jobs_and_no_free_gpu(max_run_time_s=30 * 60)
    held = [replace(h, max_run_time_s=45 * 60) if h.job_id == "b-n0" else h for h in held]
    p = plan([job("a0", "a", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert victims(p) == []
    assert p.estimated_start["a0"] == NOW + timedelta(minutes=40)
    # b-n0 ends in 65 minutes, more than CHAIN_UNLESS_FREE_WITHIN_S (an hour): the chain
    held = [replace(h, max_run_time_s=70 * 60) if h.job_id == "b-n0" else h for h in held]
    assert "c5" in victims(plan([job("a0", "a", 4)], held, limits, nodes(2, 4), NOW, FS))


def test_no_chain_for_a_tenant_that_held_its_guarantee_over_the_turn_window() -> None:
    # a held 90 % of its 4 GPUs over the last hour (a job of its ended just now): it waits for a node to free
    # rather than make b and c lose work; short of it over the hour, it chains
    limits, held = _owed_small_jobs_and_no_free_gpu()
    served = {**limits, "a": replace(limits["a"], recent_gpu_s=0.9 * 4 * 3600)}
    assert victims(plan([job("a0", "a", 4)], held, served, nodes(2, 4), NOW, FS)) == []
    short = {**limits, "a": replace(limits["a"], recent_gpu_s=0.8 * 4 * 3600)}
    assert "c5" in victims(plan([job("a0", "a", 4)], held, short, nodes(2, 4), NOW, FS))


def test_a_job_moved_onto_a_stopping_victims_gpus_waits_for_them_until_its_hold_ends() -> None:
    # the pass after the chain: node 0 is free, c5 still stops on GPU 5, held for b-n0. b-n0 (submitted first, so
    # considered before a0) waits for it rather than start on node 0, which a0 gets
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=2)}
    held = [running("b-n1", "b", (4,), minutes=51), running("c5", "c", (5,), minutes=21, stopping=True)]
    held += [running(f"c{i}", "c", (i,), minutes=21) for i in (6, 7)]
    a0 = job("a0", "a", 4, reclaiming=True)
    until = NOW + timedelta(seconds=30)
    b0 = job("b-n0", "b", 1, submitted_at=NOW - timedelta(hours=1), reclaiming=True, hold=(5,), hold_until=until)
    p = plan([a0, b0], held, limits, nodes(2, 4), NOW, FS)
    assert dict(p.placements) == {"a0": (0, 1, 2, 3)}
    assert p.wait_reasons["b-n0"] == "moved: waiting for 1 GPU(s) held for it that a stopping job still holds"
    # its hold over (the victim takes longer than the server's grace period and the margin): decided as any job
    late = replace(b0, hold_until=NOW - timedelta(seconds=1))
    assert placed(plan([a0, late], held, limits, nodes(2, 4), NOW, FS)) == ["b-n0"]  # on node 0: a0 waits again
    # once c5 stopped, b-n0 resumes on GPU 5
    after = [h for h in held if h.job_id != "c5"]
    assert dict(plan([b0], after, limits, nodes(2, 4), NOW, FS).placements) == {"b-n0": (5,)}


def test_the_free_gpus_of_a_waiting_moved_jobs_hold_stay_held() -> None:
    # b-n0 (2 GPUs) was moved onto GPU 6 (free) and GPU 7 (c7's, still stopping): while it waits, GPU 6 stays held
    # for it (x does not get it); held back by its tenant's quota, it does not wait: both are free for all
    limits = {"b": Limits(guarantee_gpus=4)}
    held = [running("c7", "c", (7,), minutes=21, stopping=True)]
    held += [running(f"f{i}", "f", (i,), minutes=21) for i in (0, 1, 2, 3, 4, 5)]
    b0 = job("b-n0", "b", 2, submitted_at=NOW - timedelta(hours=1), reclaiming=True, hold=(6, 7),
             hold_until=NOW + timedelta(seconds=30))  # fmt: skip
    p = plan([b0, job("x", "x", 1)], held, limits, nodes(2, 4), NOW, FS)
    assert placed(p) == [] and p.wait_reasons["b-n0"].startswith("moved: waiting for 1 GPU(s)")
    capped = {"b": Limits(gpus=1, guarantee_gpus=4)}
    p = plan([b0, job("x", "x", 1)], held, capped, nodes(2, 4), NOW, FS)
    assert dict(p.placements) == {"x": (6,)} and not p.wait_reasons["b-n0"].startswith("moved")


def test_gpus_promised_to_a_waiting_moved_job_are_waited_for_by_nobody_else() -> None:
    # b-n0 waits for GPU 5 (c5 stopping, chained): e0 (owed, 1 GPU, nothing free) is not told it gets it once c5
    # has stopped, and no reservation counts it (review of the chain)
    limits = {"b": Limits(guarantee_gpus=2), "e": Limits(guarantee_gpus=2)}
    held = [running("c5", "c", (5,), minutes=21, stopping=True)]
    held += [running(f"f{i}", "f", (i,), minutes=21, preemptible=False) for i in (0, 1, 2, 3, 4, 6, 7)]
    b0 = job("b-n0", "b", 1, submitted_at=NOW - timedelta(hours=1), reclaiming=True, hold=(5,),
             hold_until=NOW + timedelta(seconds=30))  # fmt: skip
    p = plan([b0, job("e0", "e", 1)], held, limits, nodes(2, 4), NOW, FS)
    assert p.wait_reasons["b-n0"].startswith("moved: waiting")
    assert "stopping" not in p.wait_reasons["e0"] and "e0" not in p.estimated_start


def test_a_moved_job_resumes_on_its_held_gpus_whatever_the_reservation() -> None:
    # e's older job (reclaiming, no estimated start) holds the reservation; b's moved job, its GPU 7 held and free,
    # resumes on it anyway, and c's borrowing jobs do not get it
    limits = {"e": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=2), "n": Limits(guarantee_gpus=2)}
    held = [running("b-n1", "b", (4,), minutes=50)]
    held += [running(f"n{g}", "n", (g,), preemptible=False, minutes=30) for g in (0, 5, 6)]
    e4 = job("e4", "e", 4, submitted_at=NOW - timedelta(hours=5), reclaiming=True)
    moved = job("b-n0", "b", 1, submitted_at=NOW - timedelta(hours=1), reclaiming=True, hold=(7,))
    c = [job(f"c{i}", "c", 1) for i in range(4)]
    p = plan([e4, moved, *c], held, limits, nodes(2, 4), NOW, FS)
    assert dict(p.placements)["b-n0"] == (7,)
    assert all(7 not in gpus for jid, gpus in p.placements if jid != "b-n0")


def test_a_moved_job_takes_its_cpus_and_memory_with_it() -> None:
    # moving b-n0 (2 CPUs) frees its GPU for a's job, not its CPUs: a's job fits on the CPUs free and those of the
    # jobs it evicts, e's CPU-only job does not get the moved job's, and both resume at the next pass
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=2), "e": Limits(guarantee_gpus=1)}
    held = [running("b-n0", "b", (0,), cpus=2, minutes=5), running("b-n1", "b", (4,), minutes=50)]
    held += [running(f"c{i}", "c", (i,), minutes=20) for i in (1, 2, 3, 5, 6)]
    inv = nodes(2, 4, cpus=12)  # 4 CPUs free
    p = plan([job("a0", "a", 4, cpus=4), job("e-cpu", "e", 0, cpus=4)], held, limits, inv, NOW, FS)
    assert {x.job_id: x.move_to for x in p.preemptions if x.reason == "defrag"} == {"b-n0": (7,)}
    assert "e-cpu" not in placed(p)
    after = [h for h in held if h.job_id in ("b-n1", "c5", "c6")]
    queue = [job("a0", "a", 4, cpus=4, reclaiming=True), job("b-n0", "b", 1, cpus=2, reclaiming=True, hold=(7,))]
    assert dict(plan(queue, after, limits, inv, NOW, FS).placements) == {"a0": (0, 1, 2, 3), "b-n0": (7,)}


def test_a_job_catching_up_moves_an_owed_job_out_of_the_node_it_takes_from_a_richer_tenant() -> None:
    # s (guaranteed 1) wants 4 GPUs: more than its guarantee, so it catches up from tenants that stay richer. r
    # borrows GPUs 1-3 of node 0, where o's owed job sits on GPU 0; r's owed jobs fill nodes 1 and 2, q's node 3
    # but GPU 12. Evicting r's borrowed jobs frees 3 GPUs of node 0 only: o's job moves to GPU 12 (held for it)
    limits = {"s": Limits(guarantee_gpus=1), "r": Limits(guarantee_gpus=8), "o": Limits(guarantee_gpus=1),
              "q": Limits(guarantee_gpus=3)}  # fmt: skip
    held = [running("o0", "o", (0,), minutes=30)]
    held += [running(f"r-b{i}", "r", (i,), minutes=20) for i in (1, 2, 3)]
    held += [running("r-a", "r", (4, 5, 6, 7), minutes=90), running("r-b", "r", (8, 9, 10, 11), minutes=90)]
    held += [running(f"q{i}", "q", (i,), minutes=60) for i in (13, 14, 15)]
    p = plan([job("s0", "s", 4)], held, limits, nodes(4, 4), NOW, FS)
    assert {x.job_id: x.reason for x in p.preemptions} == {"r-b1": "share", "r-b2": "share", "r-b3": "share",
                                                          "o0": "defrag"}  # fmt: skip
    assert next(x.move_to for x in p.preemptions if x.job_id == "o0") == (12,)
    assert p.wait_reasons["s0"].startswith("preempting 4 job(s) of tenants with a larger share")
    # r would not stay richer than s with the job: nothing is taken, nothing moved
    poorer = [h for h in held if h.job_id != "r-b"]
    assert victims(plan([job("s0", "s", 4)], poorer, limits, nodes(4, 4), NOW, FS)) == []


def test_the_gpus_held_for_a_moved_job_are_its_own_until_it_is_placed() -> None:
    limits = {"a": Limits(guarantee_gpus=4), "b": Limits(guarantee_gpus=2)}
    busy = [running(f"c{i}", "c", (i,), minutes=20) for i in (5, 6)] + [running("b-n1", "b", (4,))]
    # while the moved job is stopping, nobody gets GPU 7; the gang waits for its victims
    stopping = [running("b-n0", "b", (0,), stopping=True, hold=(7,))]
    stopping += [running(f"c{i}", "c", (i,), stopping=True) for i in (1, 2, 3)]
    p = plan([job("a0", "a", 4, reclaiming=True), job("c9", "c", 1)], busy + stopping, limits, nodes(2, 4), NOW, FS)
    assert placed(p) == [] and victims(p) == []
    # once they have stopped: the moved job goes on GPU 7, the gang on node 0, c's job on nothing (it is full)
    queue = [
        job("c9", "c", 1, submitted_at=NOW - timedelta(hours=2)),
        job("b-n0", "b", 1, reclaiming=True, hold=(7,)),
        job("a0", "a", 4, reclaiming=True),
    ]
    p = plan(queue, busy, limits, nodes(2, 4), NOW, FS)
    assert dict(p.placements) == {"a0": (0, 1, 2, 3), "b-n0": (7,)}
    # a held GPU is preferred even where best fit would choose another one
    p = plan([job("m", "b", 1, hold=(7,)), job("x", "c", 1)], [running("y", "c", (0, 1, 2))], {}, nodes(2, 4), NOW, FS)
    assert dict(p.placements)["m"] == (7,)


def test_only_what_the_gang_could_preempt_anyway_is_moved() -> None:
    # b and c are inside their guarantees: their jobs are not moved for a's gang; a's own job and borrowed ones are
    held = [running("s0", "b", (0,)), running("s1", "c", (4,)), running("s2", "d", (8,))]
    limits = {"b": Limits(guarantee_gpus=1), "c": Limits(guarantee_gpus=1)}
    p = plan([gang("g", "a", 2, 4)], held, limits, nodes(3, 4), NOW, FS)
    assert victims(p) == [] and p.blocked_by == "g"
    mine = [running("s0", "a", (0,)), running("s1", "c", (4,)), running("s2", "d", (8,))]
    p = plan([gang("g", "a", 2, 4)], mine, limits, nodes(3, 4), NOW, FS)
    assert sorted(victims(p)) == ["s0", "s2"]
    higher = [running("s0", "a", (0,), priority=5), running("s1", "c", (4,)), running("s2", "d", (8,))]
    assert victims(plan([gang("g", "a", 2, 4)], higher, limits, nodes(3, 4), NOW, FS)) == []


# -- turns: a tenant whose jobs are larger than its guarantee, short of it over the last hour -----------------------
def _turn_case(b_recent: float = 0.0, a_recent: float = 4 * 3600.0, waited_min: float = 30) -> tuple:
    """One node of 4 GPUs: a (guaranteed 3) runs four 1-GPU jobs (3 owed, 1 borrowed); b (guaranteed 1) has held
    ``b_recent`` GPU-seconds over the last hour and waits with a 4-GPU job, which no share or reclaim rule can
    start: only a turn."""
    limits = {
        "a": Limits(guarantee_gpus=3, recent_gpu_s=a_recent),
        "b": Limits(guarantee_gpus=1, recent_gpu_s=b_recent),
    }
    held = [running(f"a{i}", "a", (i,), minutes=90 - i) for i in range(4)]
    b0 = job("b0", "b", 4, submitted_at=NOW - timedelta(minutes=waited_min))
    return [b0], held, limits


def test_a_tenant_short_of_its_guarantee_over_the_hour_takes_a_turn_from_one_above_it() -> None:
    queue, held, limits = _turn_case()
    assert (
        victims(plan(queue, held, {t: replace(x, recent_gpu_s=None) for t, x in limits.items()}, nodes(1, 4), NOW, FS))
        == []
    )
    p = plan(queue, held, limits, nodes(1, 4), NOW, FS)
    assert sorted(victims(p)) == ["a0", "a1", "a2", "a3"] and {x.reason for x in p.preemptions} == {"turn"}
    assert p.wait_reasons["b0"] == (
        "preempting 4 job(s) for its tenant's turn (short of its guarantee over the turn window)"
    )
    # the turn is as long as b needs to reach its guarantee over the hour (1 GPU x 3600 s on 4 GPUs: 900 s); it
    # starts when b0 is placed on what its victims free
    assert p.turn_grants == {"b0": 900.0} and p.turns == {}
    granted = replace(queue[0], reclaiming=True, turn_s=900.0)
    stopping = [replace(h, stopping=True) for h in held]
    # while they stop, it waits for them: no more victims (each pass would otherwise pick new ones)
    waiting = plan([granted], stopping, limits, nodes(1, 4), NOW, FS)
    assert (
        victims(waiting) == [] and waiting.wait_reasons["b0"] == "waiting for 4 stopping job(s) to free their resources"
    )
    placed_now = plan([granted], [], limits, nodes(1, 4), NOW + timedelta(minutes=1), FS)
    assert placed(placed_now) == ["b0"] and placed_now.turns == {"b0": NOW + timedelta(minutes=1, seconds=900)}
    # placed without a turn granted (on GPUs free anyway), it is borrowed like any job beyond a guarantee
    free = plan(queue, [], limits, nodes(1, 4), NOW, FS)
    assert placed(free) == ["b0"] and free.turns == {} and "b0" in free.borrowing


def test_a_granted_turn_whose_victims_are_gone_is_granted_anew() -> None:
    # b0 was granted a turn, but what its victims freed went elsewhere and nothing is stopping any more: the grant is
    # void, and b0 (still due) is granted a turn again instead of waiting for victims that will never stop
    queue, held, limits = _turn_case()
    stale = replace(queue[0], reclaiming=True, turn_s=900.0)
    p = plan([stale], held, limits, nodes(1, 4), NOW, FS)
    assert sorted(victims(p)) == ["a0", "a1", "a2", "a3"] and p.turn_grants == {"b0": 900.0}


def test_a_granted_job_that_cannot_wait_does_not_decide_for_one_not_granted() -> None:
    # node 0: a's four 1-GPU jobs (a can spare them); node 1: c's, one of them stopping (c cannot spare any). d0, a
    # gang that cannot start, holds the reservation. b0 was granted a turn and, with something stopping, looks only at
    # stopping attempts: too few, and it waits behind d0. b1, of the same shape but granted nothing, is not decided
    # by b0's wait (the pass's memo of decisions): it takes a turn of its own
    queue, held, limits = _turn_case()
    limits = limits | {"c": Limits(guarantee_gpus=4, recent_gpu_s=0.0), "d": Limits(guarantee_gpus=0)}
    held = held + [running("c0", "c", (4,), stopping=True)] + [running(f"c{i}", "c", (4 + i,)) for i in (1, 2, 3)]
    d0 = gang("d0", "d", 2, 4, reclaiming=True, submitted_at=NOW - timedelta(minutes=40))
    b0 = replace(queue[0], reclaiming=True, turn_s=900.0)
    b1 = replace(queue[0], id="b1", submitted_at=queue[0].submitted_at + timedelta(seconds=1))
    p = plan([d0, b0, b1], held, limits, nodes(2, 4), NOW, FS)
    assert p.wait_reasons["b0"].startswith("waiting behind job d0")
    assert sorted(victims(p)) == ["a0", "a1", "a2", "a3"] and p.turn_grants == {"b1": 900.0}


def test_no_turn_when_the_tenant_had_its_share_or_has_not_waited() -> None:
    # b held its guarantee over the 30 minutes its job waited: no turn; a little less (0.95 of it): a turn
    queue, held, limits = _turn_case(b_recent=1 * 1800)
    assert victims(plan(queue, held, limits, nodes(1, 4), NOW, FS)) == []
    queue, held, limits = _turn_case(b_recent=0.95 * 1 * 1800)
    assert victims(plan(queue, held, limits, nodes(1, 4), NOW, FS)) != []
    queue, held, limits = _turn_case(waited_min=10)  # demand shown for less than TURN_MIN_WAIT_S
    assert victims(plan(queue, held, limits, nodes(1, 4), NOW, FS)) == []
    # turns off (a window of 0)
    queue, held, limits = _turn_case()
    assert victims(plan(queue, held, limits, nodes(1, 4), NOW, replace(FS, turn_window_s=0))) == []


def test_a_turn_takes_only_what_its_victims_tenants_can_spare() -> None:
    # a held exactly its guarantee over the hour: losing 3 owed GPUs for the 900-s turn would take it below 90 %
    queue, held, limits = _turn_case(a_recent=3 * 3600.0)
    assert victims(plan(queue, held, limits, nodes(1, 4), NOW, FS)) == []
    # a tenant below its own guarantee over the hour is never a victim of a turn, whatever its borrowed attempts
    queue, held, limits = _turn_case(a_recent=2 * 3600.0)
    assert victims(plan(queue, held, limits, nodes(1, 4), NOW, FS)) == []


def _straddle_case(c_recent: float | None) -> tuple:
    """Three nodes of 8: c (guaranteed 12) runs an 8-GPU job on node 0 and waits with another (it straddles: c is
    short of 12, the job alone fits it); a's eight 1-GPU jobs on node 1 run inside a's guarantee of 8 (a also held
    node 2 until ten minutes ago: 14.5 GPU-hours over the hour), d's non-preemptible ones fill node 2. Nothing to
    reclaim."""
    limits = {
        "a": Limits(guarantee_gpus=8, recent_gpu_s=14.5 * 3600.0),
        "c": Limits(guarantee_gpus=12, recent_gpu_s=c_recent),
        "d": Limits(guarantee_gpus=8),
    }
    held = [running("c0", "c", tuple(range(8)), minutes=120)]
    held += [running(f"a{i}", "a", (8 + i,), minutes=90 - i) for i in range(8)]
    held += [running(f"d{i}", "d", (16 + i,), minutes=10, preemptible=False) for i in range(8)]
    c1 = job("c1", "c", 8, submitted_at=NOW - timedelta(minutes=90))
    return [c1], held, limits


def test_a_straddling_job_that_reclaims_nothing_takes_a_turn_once_its_tenant_held_under_90_percent() -> None:
    # c held 8 of 12 GPUs over the hour: a turn long enough to reach 12 over it (4 x 3600 / 8 = 1,800 s, half the
    # window), taken from a, which keeps 90 % of its guarantee over the window that ends with it
    p = plan(*_straddle_case(8 * 3600.0), nodes(3, 8), NOW, FS)
    assert sorted(victims(p)) == [f"a{i}" for i in range(8)] and p.turn_grants == {"c1": 1800.0}
    assert {x.reason for x in p.preemptions} == {"turn"}
    p = plan(*_straddle_case(0.89 * 12 * 3600), nodes(3, 8), NOW, FS)  # just below 90 %
    assert len(victims(p)) == 8 and p.turn_grants == {"c1": 900.0}  # what it lacks: 594 s, at least 900
    # 90 % of its guarantee over the hour: no turn (nor with no recent usage known), it waits for capacity
    for recent in (0.9 * 12 * 3600, None):
        p = plan(*_straddle_case(recent), nodes(3, 8), NOW, FS)
        assert victims(p) == [] and p.turn_grants == {} and p.wait_reasons["c1"].startswith("waiting for capacity")


def test_a_turn_is_owed_on_top_of_its_tenants_guarantee_so_its_victims_do_not_take_back_another_job() -> None:
    # c1 runs on its turn where a's jobs ran; a's jobs are back in the queue, inside a's guarantee (a holds 0 of 8).
    # c0 stays owed (c's 8 of 12, as before the turn): they wait for the turn's end, they do not reclaim c0 (which
    # would swap one of c's jobs for the other, with two jobs' work lost)
    queue, held, limits = _straddle_case(8 * 3600.0)
    c0 = held[0]
    on_turn = running("c1", "c", tuple(range(8, 16)), minutes=1, turn_until=NOW + timedelta(minutes=29))
    a_queue = [job(f"a{i}", "a", 1, submitted_at=NOW - timedelta(minutes=95 - i)) for i in range(8)]
    p = plan(a_queue, [c0, on_turn, *held[9:]], limits, nodes(3, 8), NOW, FS)
    assert victims(p) == [] and "run other tenants' turns" in p.wait_reasons["a0"]
    # c0 beyond c's guarantee besides the turn (a third job of c's, 16 of 12 without the turn) is borrowed: a
    # reclaims it
    c2 = running("c2", "c", tuple(range(16, 24)), minutes=5)
    p = plan(a_queue, [c0, on_turn, c2], limits, nodes(3, 8), NOW, FS)
    assert victims(p) == ["c2"] and {x.reason for x in p.preemptions} == {"reclaim"}


def test_a_turn_that_failed_for_a_smaller_job_is_still_looked_for_a_larger_one() -> None:
    # two nodes of 16: c (guaranteed 12) runs an 8-GPU job; a's 24 1-GPU jobs fill the rest, inside a's guarantee.
    # c's straddling 8-GPU job is due a turn of 1,800 s (at most half the window), which a cannot spare; its 16-GPU
    # job (catching up) one of 950 s, which a can: the first's failed search does not decide for the second (a
    # smaller job gets a longer turn, which is harder to spare)
    limits = {
        "a": Limits(guarantee_gpus=24, recent_gpu_s=96_500.0),
        "c": Limits(guarantee_gpus=12, recent_gpu_s=28_000.0),
    }
    held = [running("c0", "c", tuple(range(8)), minutes=120)]
    held += [running(f"a{i}", "a", (8 + i,), minutes=90 - i) for i in range(24)]
    c1 = job("c1", "c", 8, submitted_at=NOW - timedelta(minutes=90))
    c2 = job("c2", "c", 16, submitted_at=NOW - timedelta(minutes=80))
    p = plan([c1, c2], held, limits, nodes(2, 16), NOW, FS)
    assert p.turn_grants == {"c2": 950.0} and len(victims(p)) == 16


def test_turns_in_one_pass_take_together_only_what_a_tenant_can_spare() -> None:
    # a (guaranteed 8, held 9 GPUs on average over the hour) can spare up to 6 GPUs for 900 s; b, c and d each wait
    # with a 4-GPU job: one turn, not two
    limits = {"a": Limits(guarantee_gpus=8, recent_gpu_s=9 * 3600.0)}
    limits |= {t: Limits(guarantee_gpus=1, recent_gpu_s=0.0) for t in "bcd"}
    held = [running(f"a{i}", "a", (i,), minutes=90 - i) for i in range(8)]
    queue = [job(f"{t}0", t, 4, submitted_at=NOW - timedelta(minutes=30 + i)) for i, t in enumerate("bcd")]
    p = plan(queue, held, limits, nodes(2, 4), NOW, FS)
    assert len(victims(p)) == 4 and len(p.turn_grants) == 1
    # the next pass, with those 4 stopping, takes nothing more: a would keep too little over the hour
    rest = [replace(h, stopping=h.job_id in victims(p)) for h in held]
    again = plan([q for q in queue if q.id not in p.turn_grants], rest, limits, nodes(2, 4), NOW, FS)
    assert victims(again) == []


def test_a_turn_takes_first_from_the_tenant_that_held_most_of_its_guarantee_then_what_ran_longest() -> None:
    # two nodes of 4: a's four 1-GPU jobs on node 0, c's on node 1, all inside guarantees of 4, both able to spare
    # them for b's 900-s turn. a held 1.75 of its guarantee over the hour, c 1.25: a gives, though c's jobs have
    # attained more service (a higher las queue)
    limits = {
        "a": Limits(guarantee_gpus=4, recent_gpu_s=7 * 3600.0),
        "b": Limits(guarantee_gpus=1, recent_gpu_s=0.0),
        "c": Limits(guarantee_gpus=4, recent_gpu_s=5 * 3600.0),
    }
    a = [running(f"a{i}", "a", (i,), minutes=30) for i in range(4)]
    c = [running(f"c{i}", "c", (4 + i,), minutes=40, attained_gpu_s=50 * 3600.0) for i in range(4)]
    b0 = job("b0", "b", 4, submitted_at=NOW - timedelta(minutes=30))
    p = plan([b0], a + c, limits, nodes(2, 4), NOW, FS)
    assert sorted(victims(p)) == ["a0", "a1", "a2", "a3"] and p.turn_grants == {"b0": 900.0}
    # held alike (the same quarter of a guarantee): the attempts that have attained most go, though they lose more
    # work (40 minutes since their start, against 30)
    p = plan([b0], a + c, limits | {"c": replace(limits["c"], recent_gpu_s=7 * 3600.0)}, nodes(2, 4), NOW, FS)
    assert sorted(victims(p)) == ["c0", "c1", "c2", "c3"]


def test_no_turn_for_a_job_too_large_for_its_tenants_guarantee_over_the_window() -> None:
    # b is guaranteed 1 GPU: an 8-GPU job's shortest turn (900 s) would give it twice its guarantee over the hour
    limits = {"a": Limits(guarantee_gpus=7, recent_gpu_s=10 * 3600.0), "b": Limits(guarantee_gpus=1, recent_gpu_s=0.0)}
    held = [running(f"a{i}", "a", (i,), minutes=90 - i) for i in range(8)]
    b0 = job("b0", "b", 8, submitted_at=NOW - timedelta(minutes=30))
    assert victims(plan([b0], held, limits, nodes(1, 8), NOW, FS)) == []


def test_an_attempt_on_its_tenants_turn_is_never_moved_for_another_tenant() -> None:
    # three nodes of 2 GPUs: b0 runs on its turn on node 0, c's job (not preemptible) on node 2; a's gang of two
    # 2-GPU replicas, inside a's guarantee, would need b0 moved to GPU 5
    limits = {"a": Limits(guarantee_gpus=4, recent_gpu_s=0.0), "b": Limits(guarantee_gpus=1, recent_gpu_s=900.0)}
    on_turn = running("b0", "b", (0,), minutes=5, turn_until=NOW + timedelta(minutes=10))
    held = [on_turn, running("c0", "c", (4,), preemptible=False)]
    assert victims(plan([gang("g", "a", 2, 2)], held, limits, nodes(3, 2), NOW, FS)) == []
    ended = replace(on_turn, turn_until=NOW - timedelta(seconds=1))  # once the turn is over, it is moved
    assert victims(plan([gang("g", "a", 2, 2)], [ended, held[1]], limits, nodes(3, 2), NOW, FS)) == ["b0"]


def test_an_owed_job_behind_turns_is_told_when_the_turns_it_needs_have_ended() -> None:
    limits = {
        "a": Limits(guarantee_gpus=4, recent_gpu_s=0.0),
        "b": Limits(guarantee_gpus=1, recent_gpu_s=900.0),
        "c": Limits(guarantee_gpus=3),
    }
    soon, late = NOW + timedelta(minutes=5), NOW + timedelta(minutes=20)
    grace = timedelta(seconds=FS.preemption_grace_s)
    # two nodes of 4: b's turns on GPUs 0-1 (ends soon) and 4-7 (ends late); c's owed job on GPUs 2-3
    held = [
        running("b-soon", "b", (0, 1), turn_until=soon),
        running("b-late", "b", (4, 5, 6, 7), turn_until=late),
        running("c-own", "c", (2, 3)),
    ]
    # 2 GPUs: the first turn's end makes room
    p = plan([job("a2", "a", 2)], held, limits, nodes(2, 4), NOW, FS)
    assert victims(p) == [] and p.estimated_start["a2"] == soon + grace
    # 4 GPUs on one node: only the node of the later turn can hold it
    p = plan([job("a4", "a", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert p.estimated_start["a4"] == late + grace
    # a job behind it in the line gets no such estimate: the head job goes first
    p = plan([job("a4", "a", 4), job("a1", "a", 1, submitted_at=NOW)], held, limits, nodes(2, 4), NOW, FS)
    assert p.estimated_start["a4"] == late + grace and "a1" not in p.estimated_start
    assert "once the turns it needs have ended" not in p.wait_reasons["a1"]
    # no end of a turn makes room for 4 GPUs when the late turn's node also holds c's owed job
    held[1] = running("b-late", "b", (4, 5), turn_until=late)
    held.append(running("c-own2", "c", (6,)))
    p = plan([job("a4", "a", 4)], held, limits, nodes(2, 4), NOW, FS)
    assert "a4" not in p.estimated_start
    assert "other tenants' turns" in p.wait_reasons["a4"] and "once the turns" not in p.wait_reasons["a4"]


def test_an_attempt_on_its_tenants_turn_is_owed_until_the_turn_ends() -> None:
    limits = {"a": Limits(guarantee_gpus=3, recent_gpu_s=0.0), "b": Limits(guarantee_gpus=1, recent_gpu_s=900.0)}
    until = NOW + timedelta(minutes=5)
    on_turn = [running("b0", "b", (0, 1, 2, 3), minutes=10, turn_until=until)]
    a9 = job("a9", "a", 1)  # inside a's guarantee
    during = plan([a9], on_turn, limits, nodes(1, 4), NOW, FS)
    assert victims(during) == []
    # its wait says why and until when (no tenant named: TenantView shows another tenant's id as "another tenant")
    assert (
        "; 4 GPU(s) run other tenants' turns, the first ending 2024-01-01T12:05:00+00:00 (they may not be "
        "reclaimed before)" in during.wait_reasons["a9"]
    )
    # and, at the head of the line, when it may start: once the turn has ended and its victim has had its grace
    start = until + timedelta(seconds=FS.preemption_grace_s)
    assert during.estimated_start["a9"] == start
    assert (
        f"(they may not be reclaimed before): estimated start {start.isoformat(timespec='seconds')}, once the turns "
        "it needs have ended" in during.wait_reasons["a9"]
    )
    assert "no estimated start" not in during.wait_reasons["a9"]  # one estimate in the wait, not two
    # a declared end before the turn's is the estimate, and the only one said
    declared = [running("b0", "b", (0, 1, 2, 3), minutes=1, turn_until=until, max_run_time_s=120)]
    early = plan([a9], declared, limits, nodes(1, 4), NOW, FS)
    assert early.estimated_start["a9"] == NOW + timedelta(minutes=1)
    assert "estimated start 2024-01-01T12:01:00+00:00" in early.wait_reasons["a9"]
    assert "once the turns it needs have ended" not in early.wait_reasons["a9"]
    later = until + timedelta(seconds=1)  # the turn is over: b0 is borrowed beyond b's guarantee again
    p = plan([a9], on_turn, limits, nodes(1, 4), later, FS)
    assert victims(p) == ["b0"] and p.preemptions[0].reason == "reclaim"


# -- best fit gathers what runs inside guarantees --------------------------------------------------------------------
def pinned_scene() -> tuple[list, dict]:
    """Two nodes of 4 with one GPU free each: node 0 runs borrowed work (tenant y, no guarantee) on GPUs 0-2, node 1
    runs x's work inside its guarantee on GPUs 4-6; node 2 is empty."""
    held = [running("y0", "y", (0, 1, 2)), running("x0", "x", (4, 5, 6))]
    limits = {"x": Limits(guarantee_gpus=4), "a": Limits(guarantee_gpus=2), "c": Limits(guarantee_gpus=4)}
    return held, limits


def test_best_fit_breaks_ties_towards_the_node_that_runs_inside_guarantees() -> None:
    # both nodes fit the job equally (one free GPU each); the one whose GPUs no reclaim takes (x's, owed) gets it, so
    # node 0 stays reclaimable whole; the policies without guarantees keep the inventory order
    held, limits = pinned_scene()
    p = plan([job("a0", "a")], held, limits, nodes(3, 4), NOW, FS)
    assert p.placements == [("a0", (7,))]
    for policy in (Policy.FIFO, Policy.PRIORITY_BACKFILL, Policy.LAS):
        p = plan([job("a0", "a")], held, limits, nodes(3, 4), NOW, PlanConfig(policy=policy))
        assert p.placements == [("a0", (3,))], policy


def test_a_node_kept_free_of_guaranteed_work_is_taken_back_whole() -> None:
    # the pass after: c's 4-GPU job, inside its guarantee, finds no node free; node 0 holds only y's borrowed work
    # and is reclaimed whole. Had a0 gone to GPU 3 (inventory order), every node would hold owed work (node 2: x's
    # GPU 8) and the job would have to move a0 as well
    held, limits = pinned_scene()
    first = plan([job("a0", "a")], held, limits, nodes(3, 4), NOW, FS)
    after = [*held, running("a0", "a", first.placements[0][1], minutes=1)]
    after += [running("x1", "x", (8,)), running("y1", "y", (9, 10, 11))]
    p = plan([job("c0", "c", gpus=4)], after, limits, nodes(3, 4), NOW, FS)
    assert [(x.job_id, x.reason) for x in p.preemptions] == [("y0", "reclaim")]
    before = [*held, running("a0", "a", (3,), minutes=1), running("x1", "x", (8,)), running("y1", "y", (9, 10, 11))]
    p = plan([job("c0", "c", gpus=4)], before, limits, nodes(3, 4), NOW, FS)
    assert "defrag" in {x.reason for x in p.preemptions}


def test_stopping_and_borrowed_attempts_pin_nothing() -> None:
    # node 0 runs y's borrowed work; node 1 x's work inside its guarantee that is stopping, or x's work beyond its
    # guarantee (x1, started first, is inside it): neither pins node 1, and the tie goes to node 0 by inventory order
    y0 = running("y0", "y", (0, 1, 2))
    for guarantee, x in (
        (4, [running("x0", "x", (4, 5, 6), stopping=True)]),
        (2, [running("x1", "x", (8, 9), minutes=20), running("x2", "x", (4, 5, 6), minutes=5)]),
    ):
        limits = {"x": Limits(guarantee_gpus=guarantee), "a": Limits(guarantee_gpus=1)}
        p = plan([job("a0", "a")], [y0, *x], limits, nodes(3, 4), NOW, FS)
        assert p.placements == [("a0", (3,))], x


def test_straddling_and_non_preemptible_attempts_pin() -> None:
    # node 1 runs x1 (3 GPUs): straddling x's guarantee of 3 behind x0 (2 GPUs, started first, inside it), which only
    # a job strictly inside its guarantee reclaims, last; or non-preemptible beyond a guarantee of 2 (set lower after
    # it started), which no reclaim takes. Either pins node 1
    y0 = running("y0", "y", (0, 1, 2))
    for guarantee, x in (
        (3, [running("x0", "x", (8, 9), minutes=20), running("x1", "x", (4, 5, 6), minutes=5)]),
        (2, [running("x1", "x", (4, 5, 6), preemptible=False)]),
    ):
        limits = {"x": Limits(guarantee_gpus=guarantee), "a": Limits(guarantee_gpus=1)}
        p = plan([job("a0", "a")], [y0, *x], limits, nodes(3, 4), NOW, FS)
        assert p.placements == [("a0", (7,))], x


def one_free_each() -> list:
    """Nodes 0 and 1 with 3 and 2 GPUs free after x0 (owed) and y0; node 1 also runs y1; node 2 runs x1 (owed)."""
    return [running("x0", "x", (0,)), running("y0", "y", (1, 2)), running("y1", "y", (4,)), running("x1", "x", (8,))]


def test_a_job_placed_inside_its_guarantee_pins_its_node_for_the_rest_of_the_pass() -> None:
    # a0 (2 GPUs, owed) takes node 2's GPUs 9-10 (best fit among 3 free each); b0 (owed) then finds one free GPU on
    # node 0 and node 2 alike and goes where a0 made node 2 the most pinned
    limits = {"x": Limits(guarantee_gpus=4), "a": Limits(guarantee_gpus=2), "b": Limits(guarantee_gpus=1)}
    p = plan([job("a0", "a", gpus=2), job("b0", "b")], one_free_each(), limits, nodes(3, 4), NOW, FS)
    assert p.placements == [("a0", (9, 10)), ("b0", (11,))]


def test_a_job_placed_as_borrowed_pins_nothing() -> None:
    # the same with a and b guaranteed nothing: a0 borrows GPUs 9-10 and pins nothing; b0's tie goes to node 0
    limits = {"x": Limits(guarantee_gpus=4)}
    p = plan([job("a0", "a", gpus=2), job("b0", "b")], one_free_each(), limits, nodes(3, 4), NOW, FS)
    assert p.placements == [("a0", (9, 10)), ("b0", (3,))]


def test_the_other_policies_keep_the_inventory_order_within_a_pass() -> None:
    held = [running("y0", "y", (0, 1, 2)), running("y1", "y", (4,)), running("y2", "y", (8,))]
    for policy in (Policy.FIFO, Policy.PRIORITY_BACKFILL, Policy.LAS):
        p = plan([job("a0", "a", gpus=2), job("b0", "b")], held, {}, nodes(3, 4), NOW, PlanConfig(policy=policy))
        assert p.placements == [("a0", (5, 6)), ("b0", (3,))], policy
