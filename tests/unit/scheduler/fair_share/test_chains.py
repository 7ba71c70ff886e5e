"""fair-share rule: defragmentation and chains. A job that needs a whole node while free GPUs are scattered moves
small preemptible attempts onto GPUs that stay free (``defragment``); where none stay free, a moved job goes onto GPUs
of borrowed attempts evicted with it on another node (``chain``), unless the job had better wait
(``chain_needless``)."""

from __future__ import annotations

from dataclasses import replace

from dlcloud.scheduler.contract import Limits
from dlcloud.scheduler.policies.defrag import chain, chain_needless, defragment, movable
from dlcloud.scheduler.preemption import Candidate
from tests.unit.scheduler.fair_share.build import FS, fair_share, ids
from tests.unit.scheduler.scenarios import job, nodes, running

WHOLE = job("a0", "a", 4)  # a whole node of 4


def scattered() -> list:
    # node 0: b-old0, b-old1 (long-running), node 1: b-new0, b-new1 (just started): two free GPUs on each node
    return [
        running("b-old0", "b", (0,), minutes=60),
        running("b-old1", "b", (1,), minutes=60),
        running("b-new0", "b", (4,), minutes=1),
        running("b-new1", "b", (5,), minutes=1),
    ]


def test_it_moves_the_attempts_that_lose_least_onto_gpus_left_free() -> None:
    fs = fair_share([WHOLE], scattered(), {}, nodes(2, 4))
    assert defragment(fs.p, WHOLE, fs.p.tenant("a"), fs.borrowed)
    r = fs.p.result
    assert sorted(x.job_id for x in r.preemptions) == ["b-new0", "b-new1"]
    assert {x.reason for x in r.preemptions} == {"defrag"}
    assert sorted(x.move_to for x in r.preemptions) == [(2,), (3,)]  # node 0's free GPUs, held for them
    assert r.wait_reasons["a0"] == "preempting 2 job(s) to gather whole nodes (they resume at once on GPUs left free)"


def test_nothing_moves_with_defragment_off_or_where_a_moved_job_would_not_fit_again() -> None:
    fs = fair_share([WHOLE], scattered(), {}, nodes(2, 4), replace(FS, defragment=False))
    assert not defragment(fs.p, WHOLE, fs.p.tenant("a"), fs.borrowed)
    # node 0: b's 2-GPU attempt and 2 free; node 1: 3 GPUs of a non-preemptible job and 1 free. Moving b's
    # attempt would make room for a 3-GPU job on node 0, but leave it 2 GPUs on no node: nothing moves
    held = [running("b0", "b", (0, 1)), running("c", "c", (4, 5, 6), preemptible=False)]
    three = job("a0", "a", 3)
    fs = fair_share([three], held, {}, nodes(2, 4))
    assert not defragment(fs.p, three, fs.p.tenant("a"), fs.borrowed)
    assert fs.p.result.preemptions == []


def test_only_attempts_it_could_preempt_anyway_are_movable() -> None:
    held = [
        *scattered(),
        running("a-high", "a", (2,), priority=9),
        running("c-owed", "c", (6,)),
    ]
    fs = fair_share([WHOLE], held, {"c": Limits(guarantee_gpus=1)}, nodes(2, 4))
    moves = movable(fs.p, WHOLE, fs.borrowed, set(), owed=False)
    # b's borrowed attempts, least work lost first; not a's own of a higher priority, not c's inside its guarantee
    assert ids(moves) == ["b-new0", "b-new1", "b-old0", "b-old1"]
    # an owed job may move c's attempt too, once (never preempted before)
    assert "c-owed" in ids(movable(fs.p, WHOLE, fs.borrowed, set(), owed=True))


def test_chain_evicts_on_the_node_needing_the_fewest_gpus() -> None:
    held = [running("y1", "b", (4,)), running("y3", "b", (6,)), running("y2", "b", (10,))]
    fs = fair_share([], held, {}, nodes(3, 4))
    spare = [Candidate(h, (0, i), "reclaim") for i, h in enumerate(held)]
    free = [[], [5], [8, 9]]  # what the moves so far left free, by node
    assert ids(chain(fs.p, 3, "", free, spare, ()) or []) == ["y2"]  # node 2: 2 free + 1 evicted
    assert ids(chain(fs.p, 3, "", free, spare, (10,)) or []) == ["y1", "y3"]  # not on the GPUs the job takes
    assert chain(fs.p, 4, "", free, spare, ()) is None


def test_a_chain_is_needless_when_the_tenant_held_its_guarantee_or_a_node_frees_soon() -> None:
    held = [running("b0", "b", (0, 1, 2, 3)), running("b1", "b", (4, 5, 6, 7))]
    short = Limits(guarantee_gpus=4, recent_gpu_s=0)
    fs = fair_share([WHOLE], held, {"a": short}, nodes(2, 4))
    assert not chain_needless(fs.p, WHOLE, fs.p.tenant("a"))  # no declared end: chaining is worth it
    fs = fair_share([WHOLE], held, {"a": Limits(guarantee_gpus=4, recent_gpu_s=0.95 * 4 * 3600)}, nodes(2, 4))
    assert chain_needless(fs.p, WHOLE, fs.p.tenant("a"))
    ending = [running("b0", "b", (0, 1, 2, 3), max_run_time_s=660), held[1]]  # ends in 1 minute
    fs = fair_share([WHOLE], ending, {"a": short}, nodes(2, 4))
    assert chain_needless(fs.p, WHOLE, fs.p.tenant("a"))


def test_an_owed_job_chains_a_moved_job_onto_a_borrowed_attempt_evicted_elsewhere() -> None:
    # node 0: c's owed c0, c1 and b's borrowed b2, b3; node 1: c's owed c4 and b's borrowed b5-b7; nothing free. a's
    # job of a whole node is inside a's guarantee: it evicts b5-b7, moves c4 out of its way, and, with no GPU free
    # for c4, evicts b2 on node 0 for it (chained)
    held = [
        running("c0", "c", (0,), minutes=30),
        running("c1", "c", (1,), minutes=30),
        running("b2", "b", (2,), minutes=5),
        running("b3", "b", (3,), minutes=50),
        running("c4", "c", (4,), minutes=10),
        *(running(f"b{g}", "b", (g,), minutes=20) for g in (5, 6, 7)),
    ]
    limits = {"a": Limits(guarantee_gpus=4), "c": Limits(guarantee_gpus=3)}
    fs = fair_share([WHOLE], held, limits, nodes(2, 4))
    fs.run()
    r = fs.p.result
    assert sorted((x.job_id, x.reason, x.move_to) for x in r.preemptions) == [
        ("b2", "reclaim", ()),
        ("b5", "reclaim", ()),
        ("b6", "reclaim", ()),
        ("b7", "reclaim", ()),
        ("c4", "defrag", (2,)),
    ]
    assert r.wait_reasons["a0"] == "preempting 5 job(s) to reclaim its guarantee, moving 1 to gather whole nodes"
    # its tenant held 90 % of its guarantee over the last hour: it waits rather than chain
    limits["a"] = Limits(guarantee_gpus=4, recent_gpu_s=4 * 3600)
    fs = fair_share([WHOLE], held, limits, nodes(2, 4))
    fs.run()
    assert fs.p.result.preemptions == []
