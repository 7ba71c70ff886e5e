"""Why tenants fall below their entitlement in a trace replay: a diagnostic for the fairness target of
bench/scheduling_policies.py (docs/scheduling.md, "Results").

Replays the trace with the fair-share policy (the same simulator and planner as ``dlcloud simulate``) and, for
every moment a tenant holds less than 90 % of min(its demand, its guarantee), adds the time to a row of: the
tenant, the wait reason the last pass gave its oldest queued job (numbers replaced by N), that job's GPUs, and
how many whole nodes were then free or held only by other tenants' borrowed attempts (what a reclaim could
gather without moving anything). Prints the rows with the most hours first.

Before it, per tenant, the windows the report counts as below: what was owed in them, the share held, the
GPU-hours short. After it, those windows' shortfall (GPU-hours short of min(demand, guarantee)) by the same rows,
plus one row per tenant for the time since the last pass where it was not below then (the simulator passes at once
after a submit and an attempt's end; only its timed looks wait for the tick), which the first table does not see.
Then the hours such a tenant's oldest job waited behind another job's reservation, by whose reservation it was.

    python bench/fairness_probe.py                                 # the 14-day Philly window, ~5 min
    python bench/fairness_probe.py --limit-jobs 3000 --top 20
    python bench/fairness_probe.py --tenant vc_ee9e8c
    python bench/fairness_probe.py --whole-nodes                   # and what keeps whole nodes from large jobs
    python bench/fairness_probe.py --tick 45                       # the simulator's tick (default 60 s)

``--whole-nodes`` also looks at every pass after which a tenant below its entitlement has a queued job of a node
or more (its oldest) and no node is reclaimable whole: how many GPUs the job could not take on the least held
node, and, where it waits for capacity, whether the chain (``defrag.chain_needless``) held it back and what held
the three least held nodes (docs/scheduling.md, "Best fit gathers what runs inside guarantees").
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

from dlcloud.errors import DlcloudError
from dlcloud.scheduler.contract import QueuedJob
from dlcloud.scheduler.planner import Plan
from dlcloud.scheduler.policies.defrag import chain_needless
from dlcloud.scheduler.policies.guarantees import owed_split
from dlcloud.scheduler.policies.state import Pass
from dlcloud.scheduler.policies.terms import on_turn
from dlcloud.scheduler.policies.turns import held_over_window
from dlcloud.scheduler.simulator import EPOCH, FAIR_FRACTION, SimConfig, Simulator
from dlcloud.scheduler.trace import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
DEFAULT_TRACE = DEFAULT_TRACE / "philly_jobs_2017-10-02_to_2017-10-16.csv"
_NUMBERS = re.compile(r"\d[\d,.:T+-]*")

Row = tuple[str, str, int, int]  # (tenant, reason, the oldest queued job's GPUs, reclaimable whole nodes)
SINCE_PASS = "since the last pass (not below then; a timed change, such as kept GPUs lent, waits for the tick)"


class Probe(Simulator):
    """The simulator, recording after each pass why each tenant below its entitlement waits (``rows``: hours)."""

    def __init__(self, *args: object, only: str | None = None, whole_nodes: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.only = only
        self.whole_nodes = whole_nodes
        self.least_held: Counter[int] = Counter()  # passes by the GPUs the job cannot take on the least held node
        self.chain: Counter[str] = Counter()  # passes waiting for capacity, by what the chain rule said
        self.kinds: Counter[str] = Counter()  # the GPUs it cannot take on the three least held nodes, by kind
        self.rows: Counter[Row] = Counter()
        self._waiting: dict[str, Row] = {}
        # hours a tenant below its entitlement waited behind another job's reservation, by (tenant, its job's GPUs,
        # the reserving job's tenant: "own" or its name, the reserving job's GPUs, whether that tenant then held less
        # than its guarantee)
        self.behind: Counter[tuple[str, int, str, int, str]] = Counter()
        self._behind: dict[str, tuple[str, int, str, int, str]] = {}
        # (tenant, window) -> row -> GPU-seconds short of min(demand, guarantee)
        self.short: dict[tuple[str, int], Counter[Row]] = {}

    def _below(self, name: str) -> bool:
        t = self.tenants[name]
        return bool(t.demand) and t.alloc < FAIR_FRACTION * min(t.demand, t.guarantee)

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for name, row in self._waiting.items():
                if self._below(name):
                    self.rows[row] += dt / 3600
            for name, key in self._behind.items():
                if self._below(name):
                    self.behind[key] += dt / 3600
            self._shortfall(t)
        super()._advance(t)

    def _shortfall(self, t: float) -> None:
        """Each tenant's GPU-seconds short of min(demand, guarantee) from now to ``t``, per window, by the row its
        oldest queued job had at the last pass, or ``SINCE_PASS`` where it was not below then."""
        for w, d in self.window_spans(t):
            for name, x in self.tenants.items():
                short = min(x.demand, x.guarantee) - x.alloc
                if short > 0 and (self.only is None or name == self.only):
                    row = self._waiting.get(name) or (name, SINCE_PASS, 0, -1)
                    self.short.setdefault((name, w), Counter())[row] += short * d

    def _apply(self, result: Plan) -> None:
        super()._apply(result)
        below = [n for n in self.tenants if (self.only is None or n == self.only) and self._below(n)]
        self._waiting = {}
        self._behind = {}
        if not below:
            return
        held = [self._held(j) for j in self.running.values()]
        p = Pass(held, self.limits, self.inventory, EPOCH + timedelta(seconds=self.now), self.pcfg)
        borrowed, _ = owed_split(p)
        node_of = {g.index: g.node for g in self.inventory.gpus}
        kept: dict[str, set[str]] = {}  # per tenant: nodes with a GPU a reclaim by it could not take
        for h in held:
            for g in h.gpus:
                for name in below:
                    if not (id(h) in borrowed and not h.stopping and h.tenant_id != name):
                        kept.setdefault(name, set()).add(node_of[g])
        nodes = {g.node for g in self.inventory.gpus}
        oldest = {}
        for q in self.queued:
            if q.tenant_id in below and q.tenant_id not in oldest:
                oldest[q.tenant_id] = q
        for name in below:
            q = oldest.get(name)
            raw = result.wait_reasons.get(q.id, "placed") if q is not None else "nothing queued"
            reason = _NUMBERS.sub("N", raw)
            # waiting behind the pass's reservation: the plan names its job (``Plan.blocked_by``)
            blocker = result.blocked_by if q is not None and raw.startswith("waiting behind job") else None
            holder = self.jobs.get(blocker) if blocker is not None else None
            if holder is not None and q is not None:
                theirs = self.tenants[holder.trace.tenant]
                owed = "short of its guarantee" if theirs.alloc < theirs.guarantee else "at or beyond its guarantee"
                who = "own" if holder.trace.tenant == name else holder.trace.tenant
                self._behind[name] = (name, q.gpus, who, holder.trace.gpus, owed)
            whole = len(nodes - kept.get(name, set()))
            self._waiting[name] = (name, reason[:90], q.gpus if q is not None else 0, whole)
            if self.whole_nodes and q is not None and whole == 0 and q.gpus >= self.cfg.gpus_per_node:
                self._whole_nodes(p, borrowed, q, reason)

    def _whole_nodes(self, p: Pass, borrowed: set[int], q: QueuedJob, reason: str) -> None:
        """Why tenant ``q.tenant_id``'s job of a node or more finds none to take (``--whole-nodes``)."""
        _, straddling = owed_split(p)
        node_of = {g.index: g.node for g in self.inventory.gpus}
        held: dict[str, Counter[str]] = {n: Counter() for n in sorted({g.node for g in self.inventory.gpus})}
        for h in p.held:
            if id(h) in borrowed and not h.stopping and h.tenant_id != q.tenant_id:
                continue  # a reclaim takes it
            nodes = {node_of[g] for g in h.gpus}
            kind = (
                "the tenant's own" if h.tenant_id == q.tenant_id
                else "stopping" if h.stopping
                else "non-preemptible" if not h.preemptible
                else "on a turn" if on_turn(h, p.now)
                else "on several nodes" if len(nodes) > 1
                else "a node or more" if len(h.gpus) >= self.cfg.gpus_per_node
                else "straddling" if id(h) in straddling
                else "owed, moved before" if h.preemptions
                else "owed, never moved"
            )  # fmt: skip
            for g in h.gpus:
                held[node_of[g]][kind] += 1
        least = sorted(held.values(), key=lambda c: sum(c.values()))
        self.least_held[sum(least[0].values())] += 1
        if not reason.startswith("waiting for capacity"):
            return
        t = p.tenant(q.tenant_id)
        self.chain[
            "its tenant held 90 % of its guarantee over the window" if held_over_window(t, p.cfg.turn_window_s)
            else "a node frees within the hour" if chain_needless(p, q, t)
            else "allowed (none found)"
        ] += 1  # fmt: skip
        for c in least[:3]:
            self.kinds.update(c)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE.resolve(), help="default: %(default)s")
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tick", type=float, default=60.0, help="the simulator's tick in seconds (default: %(default)s)")
    ap.add_argument("--limit-jobs", type=int, help="replay only the first N jobs")
    ap.add_argument("--tenant", help="only this tenant")
    ap.add_argument("--top", type=int, default=30, help="rows printed (default: %(default)s)")
    ap.add_argument("--whole-nodes", action="store_true", help="also: what keeps whole nodes from large jobs")
    args = ap.parse_args()
    try:
        jobs = load_trace(args.trace, limit_jobs=args.limit_jobs)
        cfg = SimConfig(gpus=args.gpus, gpus_per_node=args.gpus_per_node, seed=args.seed, tick_s=args.tick)
        cfg.validate()
        sim = Probe(jobs, cfg, only=args.tenant, whole_nodes=args.whole_nodes)
        report = sim.run()
    except DlcloudError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    per_tenant = {n: t["windows_below_90pct"] for n, t in report["tenants"].items() if t["windows_below_90pct"]}
    print(f"tenant-hours below 90 %: {report['fairness']['windows_below_90pct']} {per_tenant}")
    _print_windows(sim)
    print()
    print("| hours | tenant | oldest queued job's GPUs | reclaimable whole nodes | its wait reason |")
    print("|---|---|---|---|---|")
    for (name, reason, gpus, whole), hours in sorted(sim.rows.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {hours:.1f} | {name} | {gpus} | {whole} | {reason} |")
    below: Counter[Row] = Counter()
    for name, x in sim.tenants.items():
        for w, (got, owed) in x.windows.items():
            if owed > 0 and got < FAIR_FRACTION * owed - 1e-6:
                below.update(sim.short.get((name, w), Counter()))
    print()
    print("In the windows below: GPU-hours short of min(demand, guarantee), by the reason at the last pass")
    print()
    print("| GPU-hours short | tenant | oldest queued job's GPUs | reclaimable whole nodes | its wait reason |")
    print("|---|---|---|---|---|")
    for (name, reason, gpus, whole), gpu_s in sorted(below.items(), key=lambda kv: -kv[1])[: args.top]:
        shape = f"{gpus} | {whole}" if whole >= 0 else " | "  # SINCE_PASS: no job, no nodes looked at
        print(f"| {gpu_s / 3600:.1f} | {name} | {shape} | {reason} |")
    if sim.behind:
        print()
        print("Hours a tenant below its entitlement waited behind another job's reservation, by the reserving job")
        print()
        print("| hours | tenant | its job's GPUs | reserving job's tenant | its GPUs | that tenant then |")
        print("|---|---|---|---|---|---|")
        for (name, gpus, who, theirs, owed), hours in sorted(sim.behind.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| {hours:.1f} | {name} | {gpus} | {who} | {theirs} | {owed} |")
    if args.whole_nodes:
        _print_whole_nodes(sim)
    return 0


def _print_windows(sim: Probe) -> None:
    """Per tenant, the one-hour windows the report counts as below: how much was owed in them (GPU-hours of
    min(demand, guarantee)), the share of it held, and the GPU-hours short of 90 % of it in all: an hour of a
    tenant of one-minute jobs counts as much as an hour of a tenant of whole nodes."""
    print()
    print(
        "| tenant | guarantee (GPUs) | windows below | owed per window, median (GPU-h) | held / owed, median "
        "| short of 90 % in all (GPU-h) |"
    )
    print("|---|---|---|---|---|---|")
    for name in sorted(sim.tenants):
        x = sim.tenants[name]
        below = [(got, owed) for got, owed in x.windows.values() if owed > 0 and got < FAIR_FRACTION * owed - 1e-6]
        if not below:
            continue
        owed = sorted(o / 3600 for _, o in below)
        held = sorted(g / o for g, o in below)
        short = sum(FAIR_FRACTION * o - g for g, o in below) / 3600
        print(
            f"| {name} | {x.guarantee} | {len(below)} | {owed[len(owed) // 2]:.2f} | {held[len(held) // 2]:.1%} "
            f"| {short:.1f} |"
        )


def _print_whole_nodes(sim: Probe) -> None:
    passes = sum(sim.least_held.values())
    print()
    print(f"Passes with a job of a node or more and no node reclaimable whole: {passes}")
    print()
    print("| GPUs it cannot take on the least held node | passes | share |")
    print("|---|---|---|")
    for gpus, n in sorted(sim.least_held.items()):
        print(f"| {gpus} | {n} | {n / passes:.1%} |")
    waiting = sum(sim.chain.values())
    print()
    print(f"Of those, waiting for capacity: {waiting}; the chain rule said")
    print()
    print("| chain | passes | share |")
    print("|---|---|---|")
    for said, n in sim.chain.most_common():
        print(f"| {said} | {n} | {n / waiting:.1%} |")
    total = sum(sim.kinds.values())
    print()
    print("| what held the three least held nodes | GPU-passes | share |")
    print("|---|---|---|")
    for kind, n in sim.kinds.most_common():
        print(f"| {kind} | {n} | {n / total:.1%} |")


if __name__ == "__main__":
    sys.exit(main())
