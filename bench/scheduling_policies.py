"""Scheduling policies on the 14-day Philly window: every policy replayed through the real planner, one table.

Replays ``philly_jobs_2017-10-02_to_2017-10-16.csv`` (24,137 jobs; the trace's README cites its source, CC BY 4.0:
Jeon et al., ATC'19; Qiao et al., OSDI'21) with ``dlcloud.scheduler.simulator`` on 256 GPUs as 32 nodes x 8,
where demand (about 514 GPUs busy on average) exceeds capacity. Each trace virtual cluster is a tenant
guaranteed GPUs in proportion to its GPU-time. Prints, per policy, avg / p50 / p99 JCT, makespan, GPU
allocation, preemptions, planner time per pass, and the ratio of its avg JCT to FIFO's, then the targets:

- the default policy (fair-share): avg JCT <= 0.4 x FIFO's;
- GPU allocation >= 90 % whenever queued demand exceeds free capacity (share of that time it held);
- no tenant with demand below 90 % of min(its demand, its entitlement) over any one-hour window.

Policies run one after the other in this process (``--jobs N`` runs N at a time in worker processes).
Nothing is written into the repository; ``--json FILE`` saves every report.

    python bench/scheduling_policies.py
    python bench/scheduling_policies.py --policies fifo,las --limit-jobs 5000
    python bench/scheduling_policies.py --policies fifo,fair-share --tenant-las-queues none --no-defragment
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _common import load_average, machine  # bench/ is on sys.path when run as a script

from dlcloud.errors import DlcloudError
from dlcloud.scheduler.planner import PlanConfig, Policy
from dlcloud.scheduler.simulator import SimConfig, parse_boundaries, simulate
from dlcloud.scheduler.trace import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
DEFAULT_TRACE = DEFAULT_TRACE / "philly_jobs_2017-10-02_to_2017-10-16.csv"
TARGET_JCT_RATIO = 0.4
TARGET_BUSY = 0.9


def _run(args: tuple[Path, dict[str, Any], float | None, int | None]) -> dict[str, Any]:
    trace, config, end_s, limit = args
    jobs = load_trace(trace, end_s=end_s, limit_jobs=limit)
    t0, step = time.perf_counter(), max(len(jobs) // 20, 1)
    mark = [step]

    def progress(done: int, total: int) -> None:  # a line per 5 % of jobs finished: long replays show life
        if done >= mark[0]:
            mark[0] += step
            print(
                f"  {config['policy']}: {done:,} of {total:,} jobs finished, {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return simulate(jobs, SimConfig(**config), progress)


def _h(seconds: float) -> str:
    return f"{seconds / 3600:,.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE.resolve(), help="default: %(default)s")
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--policies", default=",".join(p.value for p in Policy), help="comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tick", type=float, default=60.0)
    ap.add_argument("--end-s", type=float, help="replay only jobs submitted before this trace time")
    ap.add_argument("--limit-jobs", type=int, help="replay only the first N jobs")
    ap.add_argument(
        "--tenant-las-queues",
        default=",".join(f"{x:g}" for x in PlanConfig.tenant_las_queues_gpu_s),
        help="fair-share: las boundaries (GPU-s) inside tenants, comma-separated; none: off (default: %(default)s)",
    )
    ap.add_argument("--no-defragment", action="store_true", help="fair-share: do not move jobs to gather whole nodes")
    ap.add_argument(
        "--turn-window", type=float, default=3600.0, help="fair-share: turns' window in seconds (0: no turns)"
    )
    ap.add_argument(
        "--lend-after",
        type=float,
        default=600.0,
        help="fair-share: seconds idle guaranteed GPUs stay free for their tenant before they are lent (0: at once)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="policies replayed at once, in worker processes")
    ap.add_argument("--json", type=Path, help="write every policy's full report here (outside the repository)")
    args = ap.parse_args()
    try:
        policies = [Policy(p.strip()) for p in args.policies.split(",") if p.strip()]
    except ValueError:
        ap.error(f"--policies: each must be one of {', '.join(p.value for p in Policy)}")
    try:
        boundaries = parse_boundaries(args.tenant_las_queues)
    except DlcloudError as exc:
        ap.error(str(exc))
    if Policy.FIFO not in policies:
        policies.insert(0, Policy.FIFO)  # the baseline of every ratio
    work = [
        (
            args.trace,
            {
                "gpus": args.gpus,
                "gpus_per_node": args.gpus_per_node,
                "policy": p,
                "seed": args.seed,
                "tick_s": args.tick,
                "tenant_las_queues_gpu_s": boundaries,
                "defragment": not args.no_defragment,
                "turn_window_s": args.turn_window,
                "lend_after_s": args.lend_after,
            },
            args.end_s,
            args.limit_jobs,
        )
        for p in policies
    ]
    try:
        jobs = load_trace(args.trace, end_s=args.end_s, limit_jobs=args.limit_jobs)
        SimConfig(gpus=args.gpus, gpus_per_node=args.gpus_per_node).validate()
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                reports = list(pool.map(_run, work))
        else:
            reports = []
            for w in work:
                reports.append(_run(w))
                r = reports[-1]
                print(f"  {r['policy']}: replayed in {r['timing']['wall_s']:.0f} s", file=sys.stderr, flush=True)
    except DlcloudError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2))
    fifo = next(r for r in reports if r["policy"] == Policy.FIFO.value)
    print(f"machine:  {machine()}, load average {load_average()}")
    print(
        f"trace:    {args.trace.name}, {len(jobs):,} jobs, {args.gpus} GPUs as {args.gpus // args.gpus_per_node} x "
        f"{args.gpus_per_node}, tick {args.tick:g} s, seed {args.seed}"
    )
    print()
    head = (
        "policy",
        "avg JCT h",
        "/ FIFO",
        "p50 JCT h",
        "p99 JCT h",
        "makespan h",
        "alloc",
        ">=90% contended",
        "tenant-h <90%",
        "preempt",
        "pass ms mean/max",
        "wall s",
    )
    rows = []
    for r in reports:
        a, t = r["gpu_allocation"], r["timing"]
        rows.append(
            (
                r["policy"],
                _h(r["avg_jct_s"]),
                f"{r['avg_jct_s'] / fifo['avg_jct_s']:.2f}" if fifo["avg_jct_s"] else "-",
                _h(r["p50_jct_s"]),
                _h(r["p99_jct_s"]),
                _h(r["makespan_s"]),
                f"{a['mean']:.1%}",
                f"{a['busy_when_contended']:.1%}",
                str(r["fairness"]["windows_below_90pct"]),
                f"{r['preemptions']:,}",
                f"{t['planner_ms_mean']:.1f}/{t['planner_ms_max']:.0f}",
                f"{t['wall_s']:.0f}",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print()
    default = next((r for r in reports if r["policy"] == Policy.FAIR_SHARE.value), None)
    if default is not None:
        ratio = default["avg_jct_s"] / fifo["avg_jct_s"] if fifo["avg_jct_s"] else float("nan")
        busy = default["gpu_allocation"]["busy_when_contended"]
        below = default["fairness"]["windows_below_90pct"]
        print("targets (default policy fair-share):")
        print(
            f"  avg JCT / FIFO            {ratio:.2f}  (<= {TARGET_JCT_RATIO}) "
            f"{'met' if ratio <= TARGET_JCT_RATIO else 'NOT met'}"
        )
        print(
            f"  allocation when contended {busy:.1%} of the time >= 90 %  (always) "
            f"{'met' if busy >= 1.0 else 'NOT met'}"
        )
        print(f"  tenant-hours below 90 %   {below}  (0) {'met' if below == 0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
