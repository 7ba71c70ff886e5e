"""fair-share's defragmentation and chains: moving small jobs so that a job that needs whole nodes fits.

Enough GPUs are free for a job but not on the nodes it needs (a gang wants whole nodes; free GPUs are scattered
where small jobs ended): ``defragment`` stops single-node preemptible attempts so that it fits, only where every one
of them fits again on the GPUs that stay free: they are moved ("defrag"), not evicted, and the GPUs each resumes on
are held for it from this pass until it is placed (``Preemption.move_to``, then ``Held.hold`` / ``QueuedJob.hold``:
no other job gets them). An owed or catching-up job whose victims are not where it needs them evicts them and moves
other tenants' small jobs out of the way too, even those inside their guarantees, but only jobs never preempted
before (a job is moved for another tenant at most once). Where no GPUs stay free for a moved job, it goes onto GPUs
of other tenants' borrowed single-node attempts on another node, evicted with it ("chained", ``chain``): what the
job may take back is scattered over nodes that each hold some owed job. Not when the job had better wait
(``chain_needless``): its tenant held 90 % of its guarantee over the turn window, or the declared ends free what it
needs within ``CHAIN_UNLESS_FREE_WITHIN_S``; a moved job waits for its chained victim while it stops
(``QueuedJob.hold_until``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from datetime import timedelta

from dlcloud.scheduler.backfill import reserve
from dlcloud.scheduler.contract import Held, QueuedJob
from dlcloud.scheduler.placement import choose
from dlcloud.scheduler.policies.state import PREEMPTING, Pass, Tenant, main_reason, preemption
from dlcloud.scheduler.policies.terms import on_turn
from dlcloud.scheduler.policies.turns import held_over_window
from dlcloud.scheduler.preemption import Candidate, find_victims, lost_gpu_s, victims_cost

# an owed job that finds no node to take whole moves small jobs onto GPUs of borrowed attempts evicted elsewhere
# ("chained") only when the declared ends free what it needs no sooner than this (and its tenant is short over the
# turn window): a chain costs the moved jobs' and the extra victims' work and delays them (on the Philly window an
# hour gave fewer tenant-hours below than 15 minutes at the same JCT: docs/scheduling.md)
CHAIN_UNLESS_FREE_WITHIN_S = 3600.0


def defragment(
    p: Pass,
    job: QueuedJob,
    tenant: Tenant | None,
    borrowed: set[int],
    reclaim: Callable[[], list[Candidate]] | None = None,
    also: Callable[[Sequence[Candidate]], bool] | None = None,
    memo: tuple = (),
) -> bool:
    """Move attempts so that ``job`` fits (see the module docstring); True when it preempted for it. Least work
    lost first; at most ``job``'s GPUs are moved. Only attempts ``job`` could preempt anyway may be moved: its own
    tenant's of at most its priority, and other tenants' borrowed ones (``borrowed``: their ``id()``).

    ``reclaim``: ``job`` is owed (inside or straddling its tenant's guarantee) and these are the victims it may
    evict, but they and the free GPUs are not on the nodes it needs: every node also holds small jobs of other
    tenants running inside their guarantees. Then the victims are evicted (they need not fit again) and those small
    jobs may be moved too, when they were never preempted: a job is moved for another tenant's guarantee at most
    once, so submitting gangs cannot make a tenant lose work again and again, and a moved job keeps its guarantee
    (it resumes at once, on GPUs held for it). Under contention no GPUs stay free for a moved job: it then goes onto
    GPUs of more of those victims on another node (``chain``), evicted with it; not when ``job`` had better wait
    (``chain_needless``). ``also``: a further check of the chosen victims (a catching-up job's shares)."""
    c = p.cluster
    if not p.cfg.defragment or not c.fits_totals(job) or c.single_node:
        return False
    if reclaim is None and c.nfree < job.gpus:
        return False
    memo = ("defrag", reclaim is not None, *memo, job.gpu_type, bool(job.groups))
    if not p.may_search(memo, job):
        return False
    evict = [x for x in reclaim() if id(x.held) not in p.victims] if reclaim is not None else []
    if reclaim is not None and c.nfree + sum(len(x.held.gpus) for x in evict) < job.gpus:
        p.failed[memo].append((job.gpus, job.cpus, job.memory))
        return False
    moves = movable(p, job, borrowed, {id(x.held) for x in evict}, reclaim is not None)

    def at_most_its_gpus(chosen: Sequence[Candidate]) -> bool:
        moved = sum(len(x.held.gpus) for x in chosen if x.reason == "defrag")
        return moved <= job.gpus and (also is None or also(chosen))

    found = find_victims(job, c, evict + moves, at_most_its_gpus)
    if found is None or not found[0]:
        p.failed[memo].append((job.gpus, job.cpus, job.memory))
        return False
    chosen, gpus = found
    free = [list(fl) for fl in c.free]
    for g in gpus:
        fl = free[c.node_of[g]]
        i = bisect.bisect_left(fl, g)
        if i < len(fl) and fl[i] == g:
            del fl[i]
    free_now = {g for fl in free for g in fl}
    moved = _move_targets(p, job, tenant, chosen, gpus, free, _spare(p, job, chosen, evict, borrowed), also)
    if moved is None:
        return False
    move_to, chained = moved
    chosen += chained
    p.claim(job, chosen, gpus, tenant)
    for pick in move_to.values():  # held for the moved jobs from now on (a chained victim's: once it stopped)
        p.cluster.take([g for g in pick if g in free_now], 0, 0)
    p.result.preemptions.extend(preemption(x, job.id, move_to.get(id(x.held), ())) for x in chosen)
    main = main_reason(chosen)
    moving = f", moving {len(move_to)} to gather whole nodes" if main != "defrag" and move_to else ""
    p.result.wait_reasons[job.id] = f"preempting {len(chosen)} job(s) {PREEMPTING[main]}{moving}"
    p.result.estimated_start[job.id] = p.now + p.grace
    return True


def _one_node(p: Pass, h: Held) -> bool:
    node_of = p.cluster.node_of
    return all(node_of.get(g) == node_of.get(h.gpus[0]) for g in h.gpus)


def movable(p: Pass, job: QueuedJob, borrowed: set[int], evicting: set[int], owed: bool) -> list[Candidate]:
    """The attempts ``defragment`` may move for ``job`` (least work lost first): preemptible, running, single-node,
    smaller than a node, not chosen already (``evicting``: what an ``owed`` job evicts anyway); its own tenant's of at
    most its priority, other tenants' borrowed ones, or (``owed``) any never preempted before; never another
    tenant's attempt on its turn (it is owed until the turn ends)."""
    c = p.cluster

    def may_move(h: Held) -> bool:
        if h.tenant_id == job.tenant_id:
            may = h.priority <= job.priority
        else:
            may = (id(h) in borrowed or (owed and h.preemptions == 0)) and not on_turn(h, p.now)
        return (
            may
            and id(h) not in evicting
            and h.preemptible
            and not h.stopping
            and 0 < len(h.gpus) < c.max_size
            and id(h) not in p.victims
            and _one_node(p, h)
        )

    now = p.now
    return sorted(
        (Candidate(h, (2, lost_gpu_s(h, now), len(h.gpus)), "defrag") for h in p.held if may_move(h)),
        key=lambda x: x.key,
    )


def _spare(
    p: Pass, job: QueuedJob, chosen: list[Candidate], evict: list[Candidate], borrowed: set[int]
) -> list[Candidate]:
    """What a chain may evict: other tenants' borrowed attempts on one node (not gangs, not straddling attempts, not
    the job's own tenant's), among those the job may evict anyway and did not choose."""
    taken = {id(y.held) for y in chosen}
    return [
        x
        for x in evict
        if id(x.held) not in taken
        and id(x.held) in borrowed
        and x.held.tenant_id != job.tenant_id
        and x.held.gpus
        and _one_node(p, x.held)
    ]


def _move_targets(
    p: Pass,
    job: QueuedJob,
    tenant: Tenant | None,
    chosen: list[Candidate],
    gpus: tuple[int, ...],
    free: list[list[int]],
    spare: list[Candidate],
    also: Callable[[Sequence[Candidate]], bool] | None,
) -> tuple[dict[int, tuple[int, ...]], list[Candidate]] | None:
    """Where each moved attempt of ``chosen`` resumes (by ``id()`` of its ``Held``), and the chained victims; None
    when one fits nowhere. Every moved attempt must fit again on GPUs free now that ``job`` does not take (``free``,
    updated), or (an owed or catching-up job, chained) on one node with GPUs of borrowed attempts ``job`` may evict
    anyway (``spare``), evicted with it: such a victim may stop after the moved job, which then waits for it
    (``resume``, until ``QueuedJob.hold_until``) instead of starting anywhere, the node ``job`` needs included; its
    CPUs and memory go with it (``moves_away``)."""
    node_of, names = p.cluster.node_of, p.cluster.names
    move_to: dict[int, tuple[int, ...]] = {}
    chained: list[Candidate] = []
    wait: bool | None = None  # whether ``job`` had better wait than chain (asked once, if needed)
    for x in sorted((x for x in chosen if x.reason == "defrag"), key=lambda x: -len(x.held.gpus)):
        want = names.get(x.held.gpus[0], "").lower()
        k = len(x.held.gpus)
        pick = choose(free, names, [(k, want)])
        if pick is None and spare:
            if wait is None:
                wait = chain_needless(p, job, tenant)
            more = None if wait else chain(p, k, want, free, spare, gpus)
            if more is not None and (also is None or also([*chosen, *chained, *more])):
                chained += more
                spare = [y for y in spare if all(y is not z for z in more)]
                for y in more:
                    for g in y.held.gpus:
                        if g in node_of and g not in gpus:
                            bisect.insort(free[node_of[g]], g)
                pick = choose(free, names, [(k, want)])
        if pick is None:  # not remembered in ``failed``: a larger job may leave room elsewhere
            return None
        move_to[id(x.held)] = pick
        for g in pick:
            fl = free[node_of[g]]
            del fl[bisect.bisect_left(fl, g)]
    return move_to, chained


def chain_needless(p: Pass, job: QueuedJob, tenant: Tenant | None) -> bool:
    """Whether ``job`` waits rather than chain moves: its tenant held 90 % of its guarantee over the last turn
    window (``held_over_window``: a short gap, the hours count, and a chain costs other jobs' work and completion
    times), or the declared ends free what it needs within ``CHAIN_UNLESS_FREE_WITHIN_S``."""
    if held_over_window(tenant, p.cfg.turn_window_s):
        return True
    r = reserve(p.cluster, job, list(p.releases.values()))
    return r.at is not None and r.at <= p.now + timedelta(seconds=CHAIN_UNLESS_FREE_WITHIN_S)


def chain(
    p: Pass, k: int, want: str, free: list[list[int]], spare: list[Candidate], taken: tuple[int, ...]
) -> list[Candidate] | None:
    """Victims among ``spare`` (other tenants' borrowed single-node attempts the job may evict, waste order) on one
    node whose GPUs, with those free there (``free``, what the moves so far left), make room for a moved job of
    ``k`` GPUs (of type ``want``), not on the GPUs ``taken`` by the job: the node where they are fewest GPUs, then
    cost least (``find_victims``' rule)."""
    c = p.cluster
    on_node: dict[int, list[tuple[Candidate, int]]] = {}  # each node's victims with their matching GPUs there
    for y in spare:
        if set(y.held.gpus).isdisjoint(taken):
            for n, here in c.held_by_node(y.held, want):  # one node: ``spare`` holds single-node attempts
                on_node.setdefault(n, []).append((y, here))
    best: list[Candidate] | None = None
    best_cost: tuple = ()
    for n, ys in on_node.items():
        fl = free[n]
        have = len(fl) if not want else sum(1 for g in fl if want in c.names[g])
        picked: list[Candidate] = []
        for y, here in ys:
            if have >= k:
                break
            picked.append(y)
            have += here
        if have >= k:
            cost = (sum(len(y.held.gpus) for y in picked), victims_cost(picked))
            if best is None or cost < best_cost:
                best, best_cost = picked, cost
    return best
