"""Invariants every policy keeps, over random small clusters, queues, running attempts and limits."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest

from dlcloud.scheduler.inventory import Inventory
from dlcloud.scheduler.planner import GroupDemand, Held, Limits, Plan, PlanConfig, Policy, QueuedJob, plan
from dlcloud.scheduler.policies.guarantees import owed_split
from dlcloud.scheduler.policies.state import Pass
from tests.unit.scheduler.scenarios import NOW, GiB, nodes


def scenario(rng: random.Random) -> tuple[list[QueuedJob], list[Held], dict[str, Limits], object]:
    per_node = rng.choice((2, 4, 8))
    count = rng.randint(1, 4)
    inv = nodes(count, per_node, cpus=rng.choice((16, 64)), memory=256 * GiB)
    tenants = ["a", "b", "c", "d"][: rng.randint(1, 4)]
    limits = {
        t: Limits(
            gpus=rng.choice((None, None, per_node * 2)),
            max_running_jobs=rng.choice((None, None, 3)),
            guarantee_gpus=rng.choice((0, per_node, per_node * 2)),
            borrow_gpus=rng.choice((None, None, 2)),
            weight=rng.choice((1.0, 2.0)),
        )
        for t in tenants
    }
    free = list(range(count * per_node))
    rng.shuffle(free)
    held = []
    for i in range(rng.randint(0, 2 * count)):
        if not free:
            break
        node = free[-1] // per_node
        mine = [g for g in free if g // per_node == node][: rng.randint(1, per_node)]
        for g in mine:
            free.remove(g)
        held.append(
            Held(
                rng.choice(tenants),
                tuple(sorted(mine)),
                1.0,
                GiB,
                job_id=f"h{i}",
                priority=rng.randint(-2, 2),
                started_at=NOW - timedelta(minutes=rng.randint(1, 90)),
                max_run_time_s=rng.choice((None, 7200.0)),
                preemptible=rng.random() < 0.8,
                attained_gpu_s=rng.choice((0.0, 5000.0, 50_000.0)),
                stopping=rng.random() < 0.15,
            )  # fmt: skip
        )
    queue = []
    for i in range(rng.randint(1, 12)):
        kw = dict(priority=rng.randint(-2, 3), submitted_at=NOW - timedelta(minutes=rng.randint(0, 600)),
                  max_run_time_s=rng.choice((None, 600.0, 3600.0)), preemptible=rng.random() < 0.8,
                  attained_gpu_s=rng.choice((0.0, 5000.0)))  # fmt: skip
        t = rng.choice(tenants)
        if rng.random() < 0.2:
            r, g = rng.randint(2, 3), rng.randint(1, per_node)
            queue.append(QueuedJob(f"j{i}", t, r * g, float(r), r * GiB, groups=(GroupDemand("w", r, g),), **kw))
        else:
            queue.append(QueuedJob(f"j{i}", t, rng.randint(0, per_node + 1), rng.choice((1.0, 4.0)), GiB, **kw))
    # turns (fair-share): each tenant's GPU-seconds over the last hour, and some attempts on their tenant's turn
    # (drawn apart, so that the scenarios above stay those of each seed)
    more = random.Random(rng.random())
    for t, lim in limits.items():
        of_guarantee = more.choice((None, 0.0, 0.5, 0.95, 1.5))  # the fraction of its guarantee over the hour
        recent = None if of_guarantee is None else of_guarantee * lim.guarantee_gpus * 3600.0
        limits[t] = replace(lim, recent_gpu_s=recent)
    held = [
        replace(h, turn_until=NOW + timedelta(minutes=more.choice((-5, 5)))) if more.random() < 0.15 else h
        for h in held
    ]
    return queue, held, limits, inv


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("seed", range(60))
def test_invariants(policy: Policy, seed: int) -> None:
    queue, held, limits, inv = scenario(random.Random(seed))
    p = plan(queue, held, limits, inv, NOW, PlanConfig(policy=policy))  # type: ignore[arg-type]
    by_id = {j.id: j for j in queue}
    per_node = len([g for g in inv.gpus if g.node == "n0"])  # type: ignore[attr-defined]
    # GPUs: free ones only, each once, each process on one node
    taken = [g for h in held for g in h.gpus]
    got = [g for _, gs in p.placements for g in gs]
    assert len(got) == len(set(got)) and not set(got) & set(taken)
    for jid, gs in p.placements:
        j = by_id[jid]
        sizes = [g.gpus for g in j.groups for _ in range(g.count)] if j.groups else [j.gpus]
        assert len(gs) == sum(sizes)
        at = 0
        for k in sizes:
            assert len({x // per_node for x in gs[at : at + k]}) <= 1
            at += k
    # hard caps hold for every tenant after the pass
    for t, lim in limits.items():
        mine = [by_id[jid] for jid, _ in p.placements if by_id[jid].tenant_id == t]
        running = [h for h in held if h.tenant_id == t]
        if lim.gpus is not None and mine:
            assert sum(len(h.gpus) for h in running) + sum(j.gpus for j in mine) <= lim.gpus
        if lim.max_running_jobs is not None and mine:
            assert len(running) + len(mine) <= lim.max_running_jobs
        if lim.borrow_gpus is not None and mine and policy == Policy.FAIR_SHARE:
            assert sum(len(h.gpus) for h in running) + sum(j.gpus for j in mine) <= lim.guarantee_gpus + lim.borrow_gpus
    # every job is placed or says why it waits (FIFO: those up to the one that blocks the line)
    placed_ids = {jid for jid, _ in p.placements}
    looked_at = [j.id for j in queue]
    if policy == Policy.FIFO and p.blocked_by is not None:
        looked_at = looked_at[: looked_at.index(p.blocked_by) + 1]
    assert placed_ids | set(p.wait_reasons) == set(looked_at) and not placed_ids & set(p.wait_reasons)
    # victims: preemptible, not stopping, each once, only by waiting jobs, never for fifo or priority-backfill
    held_by_id = {h.job_id: h for h in held}
    ids = [x.job_id for x in p.preemptions]
    assert len(ids) == len(set(ids))
    for x in p.preemptions:
        assert held_by_id[x.job_id].preemptible and not held_by_id[x.job_id].stopping
        assert x.by in p.wait_reasons and x.by not in placed_ids
    if policy in (Policy.FIFO, Policy.PRIORITY_BACKFILL):
        assert p.preemptions == [] and p.borrowing == set()
    # non-preemptible jobs never run borrowed
    assert all(by_id[jid].preemptible for jid in p.borrowing)
    assert p.borrowing <= placed_ids
    # turns: only of placed jobs, ending after now and at most half a window later; an attempt on its tenant's turn
    # is not another tenant's victim, and a turn takes nothing of its own tenant's
    assert set(p.turns) <= placed_ids
    window = PlanConfig().turn_window_s
    assert all(NOW < end <= NOW + timedelta(seconds=max(window / 2, 900.0)) for end in p.turns.values())
    for x in p.preemptions:
        victim, by = held_by_id[x.job_id], by_id[x.by]
        on_turn = victim.turn_until is not None and victim.turn_until > NOW
        assert not (on_turn and victim.tenant_id != by.tenant_id), (x, victim)
        if x.reason == "turn":
            assert victim.tenant_id != by.tenant_id and limits[by.tenant_id].recent_gpu_s is not None


def _with_holds(rng: random.Random, queue: list[QueuedJob], held: list[Held], inv: object) -> tuple[list, list]:
    """The scenario with moved jobs: stopping attempts with GPUs held for them (free ones, or one not in the
    inventory), queued jobs with held GPUs on one node, attempts preempted before."""
    gpus = inv.gpus  # type: ignore[attr-defined]
    busy = {g for h in held for g in h.gpus}
    free = [g.index for g in gpus if g.index not in busy]
    rng.shuffle(free)
    out_held = []
    for h in held:
        hold: tuple[int, ...] = ()
        if h.stopping and free and rng.random() < 0.6:
            k = min(len(h.gpus), len(free))
            hold = tuple(free[:k]) if rng.random() < 0.8 else (len(gpus) + 5,)
            free = free[k:]
        out_held.append(replace(h, hold=hold, preemptions=rng.choice((0, 0, 1))))
    node = {g.index: g.node for g in gpus}
    out_queue = []
    for j in queue:
        if not j.groups and j.gpus and free and rng.random() < 0.3:
            by_node: dict[str, list[int]] = {}
            for g in free:
                by_node.setdefault(node[g], []).append(g)
            fits = [gs for gs in by_node.values() if len(gs) >= j.gpus]
            if fits:
                pick = tuple(sorted(rng.choice(fits)[: j.gpus]))
                j = replace(j, hold=pick, reclaiming=True)
                free = [g for g in free if g not in pick]
        out_queue.append(j)
    return out_queue, out_held


@pytest.mark.parametrize("seed", range(300))
def test_held_gpus_go_to_their_moved_job_and_moves_go_to_free_gpus(seed: int) -> None:
    rng = random.Random(seed)
    queue, held, limits, inv = scenario(rng)
    queue, held = _with_holds(rng, queue, held, inv)
    p = plan(queue, held, limits, inv, NOW, PlanConfig(policy=Policy.FAIR_SHARE))
    busy = {g for h in held for g in h.gpus}
    placed = dict(p.placements)
    got = [g for gs in placed.values() for g in gs]
    assert len(got) == len(set(got)) and not set(got) & busy
    stopping_holds = {g for h in held if h.stopping for g in h.hold}
    assert not set(got) & stopping_holds  # nobody gets the GPUs of a moved job that is still stopping
    # a queued moved job resumes on its held GPUs unless something holds it back (then they are free for all):
    # checked where nothing can (no caps, no backoff, CPUs and memory for every job considered first)
    first = [q for q in queue if q.reclaiming or q.hold]
    cpus_free = inv.cpus - sum(h.cpus for h in held)  # type: ignore[attr-defined]
    memory_free = inv.memory - sum(h.memory for h in held)  # type: ignore[attr-defined]
    roomy = sum(q.cpus for q in first) <= cpus_free and sum(q.memory for q in first) <= memory_free
    for q in queue:
        lim = limits.get(q.tenant_id, Limits())
        uncapped = lim.gpus is None and lim.max_running_jobs is None and lim.borrow_gpus is None
        if q.hold and roomy and uncapped and q.not_before is None and q.held_by is None:
            assert placed.get(q.id) == q.hold
    held_by_id = {h.job_id: h for h in held}
    # a move goes to free GPUs, held from now on, or (chained) to GPUs of an attempt evicted in this pass
    evicted = {g for x in p.preemptions if x.reason != "defrag" for g in held_by_id[x.job_id].gpus}
    targets: list[int] = []
    for x in p.preemptions:
        if x.reason != "defrag":
            assert x.move_to == ()
            continue
        assert len(x.move_to) == len(held_by_id[x.job_id].gpus)
        assert not set(x.move_to) & (stopping_holds | set(got))
        assert not set(x.move_to) & busy - evicted
        targets += x.move_to
    assert len(targets) == len(set(targets))


def _turn_scenario(seed: int) -> tuple[list[QueuedJob], list[Held], dict[str, Limits], object]:
    """``scenario`` with small guarantees (jobs larger than them), demand waiting long enough, and every tenant's
    usage over the last hour known: where turns happen."""
    rng = random.Random(seed)
    queue, held, limits, inv = scenario(rng)
    per_node = len([g for g in inv.gpus if g.node == "n0"])  # type: ignore[attr-defined]
    limits = {
        t: replace(lim, gpus=None, max_running_jobs=None, borrow_gpus=None,
                   guarantee_gpus=rng.choice((1, max(1, per_node // 2))),
                   recent_gpu_s=rng.choice((0.0, 0.0, 1.0, 3.0, 6.0)) * per_node * 3600.0)
        for t, lim in limits.items()
    }  # fmt: skip
    queue = [replace(j, submitted_at=NOW - timedelta(minutes=rng.randint(20, 600))) for j in queue]
    # some were granted a turn by an earlier pass
    queue = [
        replace(j, reclaiming=True, turn_s=rng.choice((900.0, 1800.0))) if rng.random() < 0.15 else j for j in queue
    ]
    return queue, held, limits, inv


@pytest.mark.parametrize("seed", range(300))
def test_turns_keep_the_invariants(seed: int) -> None:
    queue, held, limits, inv = _turn_scenario(seed)
    p = plan(queue, held, limits, inv, NOW, PlanConfig(policy=Policy.FAIR_SHARE))  # type: ignore[arg-type]
    placed_ids = {jid for jid, _ in p.placements}
    taken = [g for h in held for g in h.gpus]
    got = [g for _, gs in p.placements for g in gs]
    assert len(got) == len(set(got)) and not set(got) & set(taken)
    by_id, held_by_id = {j.id: j for j in queue}, {h.job_id: h for h in held}
    # a turn starts only for a job granted one, on placement, as long as granted
    assert all(
        by_id[jid].turn_s is not None and end == NOW + timedelta(seconds=by_id[jid].turn_s)
        for jid, end in p.turns.items()
    )  # type: ignore[arg-type]
    assert set(p.turns) <= placed_ids
    window = PlanConfig().turn_window_s
    # a job granted a turn by an earlier pass waits for its victims; granted anew only when nothing is stopping (its
    # grant is void: what they freed went elsewhere)
    regranted = {jid for jid in p.turn_grants if by_id[jid].turn_s is not None}
    assert not regranted or not any(h.stopping for h in held)
    for x in p.preemptions:
        victim, by = held_by_id[x.job_id], by_id[x.by]
        assert not (victim.turn_until is not None and victim.turn_until > NOW and victim.tenant_id != by.tenant_id)
        if x.reason == "turn":
            assert victim.tenant_id != by.tenant_id and x.by in p.turn_grants
            mine = limits[by.tenant_id]
            waited = (NOW - by.submitted_at).total_seconds()  # type: ignore[operator]
            # due: its tenant below 90 % of its guarantee over what it waited (at most the window)
            assert mine.recent_gpu_s < 0.9 * mine.guarantee_gpus * min(window, waited)  # type: ignore[operator]
            assert 900.0 <= p.turn_grants[x.by] <= window / 2
    # a tenant a turn took attempts inside its guarantee from keeps 90 % of its guarantee over the window that ends
    # with the turn (what it held, as if evenly, and what it keeps for the turn's length, this pass's victims and its
    # stopping attempts gone)
    borrowed, _ = owed_split(Pass(held, limits, inv, NOW, PlanConfig(policy=Policy.FAIR_SHARE)))  # type: ignore[arg-type]
    gone: dict[str, int] = {}
    for h in held:
        if h.stopping or h.job_id in {x.job_id for x in p.preemptions}:
            gone[h.tenant_id] = gone.get(h.tenant_id, 0) + len(h.gpus)
    for x in p.preemptions:
        if x.reason != "turn" or id(held_by_id[x.job_id]) in borrowed:
            continue
        tid, length = held_by_id[x.job_id].tenant_id, p.turn_grants[x.by]
        lim = limits[tid]
        keeps = sum(len(h.gpus) for h in held if h.tenant_id == tid) - gone.get(tid, 0)
        ahead = lim.recent_gpu_s * (window - length) / window + keeps * length  # type: ignore[operator]
        assert ahead >= 0.9 * lim.guarantee_gpus * window - 1e-6, (tid, keeps, ahead)


def test_turn_scenarios_exercise_turns() -> None:
    """The scenarios above are not vacuous: some preempt for a turn, some place a job on one."""
    preempting = placing = 0
    for seed in range(300):
        queue, held, limits, inv = _turn_scenario(seed)
        p = plan(queue, held, limits, inv, NOW, PlanConfig(policy=Policy.FAIR_SHARE))  # type: ignore[arg-type]
        preempting += bool(p.turn_grants)
        placing += bool(p.turns)
    assert preempting >= 5 and placing >= 5, (preempting, placing)


def _contended_scenario(seed: int) -> tuple[list[QueuedJob], list[Held], dict[str, Limits], Inventory]:
    """Every GPU taken: owed small jobs of tenants inside their guarantees spread over the nodes, the rest borrowed
    (single-node jobs and some gangs), an idle tenant's owed job of a node's size waiting: where moves chain."""
    rng = random.Random(seed)
    per_node, count = rng.choice((4, 8)), rng.randint(2, 5)
    inv = nodes(count, per_node, cpus=256, memory=1024 * GiB)
    limits = {"a": Limits(guarantee_gpus=per_node), "b": Limits(guarantee_gpus=count), "c": Limits()}
    limits["d"] = Limits(guarantee_gpus=per_node // 2)
    held: list[Held] = []
    free = set(range(count * per_node))
    for n in range(count):  # an owed 1-GPU job of b on most nodes, sometimes moved before
        if rng.random() < 0.8:
            g = n * per_node + rng.randrange(per_node)
            free.discard(g)
            started = NOW - timedelta(minutes=rng.randint(1, 90))
            held.append(Held("b", (g,), 1.0, GiB, job_id=f"b{g}", started_at=started,
                             preemptions=rng.choice((0, 0, 0, 1))))  # fmt: skip
    if count >= 3 and rng.random() < 0.3:  # a borrowed gang of c over two nodes
        gpus = tuple(sorted([g for g in free if g // per_node == 1][:2] + [g for g in free if g // per_node == 2][:2]))
        free -= set(gpus)
        held.append(Held("c", gpus, 2.0, 2 * GiB, job_id="c-gang", started_at=NOW - timedelta(minutes=60)))
    for n in range(count):  # the rest: borrowed single-node jobs of c and d (d's partly owed), 1-3 GPUs
        left = sorted(g for g in free if g // per_node == n)
        while left:
            k = min(len(left), rng.randint(1, 3))
            gpus, left = tuple(left[:k]), left[k:]
            free -= set(gpus)
            t = rng.choice("cd")
            held.append(Held(t, gpus, 1.0, GiB, job_id=f"{t}{gpus[0]}",
                             started_at=NOW - timedelta(minutes=rng.randint(1, 120)),
                             max_run_time_s=rng.choice((None, None, 3600.0))))  # fmt: skip
    queue = [QueuedJob("a0", "a", per_node, 1.0, GiB, submitted_at=NOW - timedelta(minutes=30))]
    if rng.random() < 0.5:
        queue.append(QueuedJob("c-next", "c", 1, 1.0, GiB, submitted_at=NOW - timedelta(minutes=5)))
    return queue, held, limits, inv


@pytest.mark.parametrize("seed", range(200))
def test_chained_moves_keep_the_invariants(seed: int) -> None:
    queue, held, limits, inv = _contended_scenario(seed)
    p = plan(queue, held, limits, inv, NOW, PlanConfig(policy=Policy.FAIR_SHARE))
    _assert_chain_invariants(p, held, inv)


def _assert_chain_invariants(p: Plan, held: list[Held], inv: Inventory) -> int:
    """What every move keeps, chained or not; returns the number of chained moves."""
    node = {g.index: g.node for g in inv.gpus}
    by_id = {h.job_id: h for h in held}
    busy = {g for h in held for g in h.gpus}
    victims = {x.job_id: x for x in p.preemptions}
    assert len(victims) == len(p.preemptions)
    got = [g for _, gs in p.placements for g in gs]
    assert len(got) == len(set(got)) and not set(got) & busy
    evicted = {g: x.job_id for x in p.preemptions if x.reason != "defrag" for g in by_id[x.job_id].gpus}
    targets: list[int] = []
    chained = 0
    for x in p.preemptions:
        if x.reason != "defrag":
            continue
        h = by_id[x.job_id]
        assert len(x.move_to) == len(h.gpus) and len({node[g] for g in x.move_to}) == 1
        assert not set(x.move_to) & set(got)
        on = [evicted[g] for g in x.move_to if g in busy]
        assert all(g in evicted for g in x.move_to if g in busy)  # free GPUs or an evicted job's
        for v in on:  # chained: a job of another tenant than the preemptor's, on one node, not the moved job's node
            w = by_id[v]
            assert w.tenant_id != "a" and len({node[g] for g in w.gpus}) == 1
            assert node[w.gpus[0]] != node[h.gpus[0]]
        chained += bool(on)
        targets += x.move_to
    assert len(targets) == len(set(targets))
    assert "c-gang" not in victims or victims["c-gang"].reason != "defrag"
    return chained


def test_contended_scenarios_exercise_chains() -> None:
    # the test above can fail only where chains happen: most of its seeds must chain a move, and some must not
    chained = 0
    for seed in range(200):
        queue, held, limits, inv = _contended_scenario(seed)
        p = plan(queue, held, limits, inv, NOW, PlanConfig(policy=Policy.FAIR_SHARE))
        chained += _assert_chain_invariants(p, held, inv) > 0
    assert 40 <= chained < 200, chained
