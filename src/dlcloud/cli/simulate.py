"""dlcloud simulate: replay a job trace through the real planner on this machine (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from dlcloud.cli.output import Output, OutputOption, console, err_console, print_json, render
from dlcloud.scheduler.planner import PlanConfig, Policy
from dlcloud.scheduler.simulator import SimConfig, Simulator, parse_boundaries
from dlcloud.scheduler.trace import load_trace

DEFAULT_TENANT_LAS_QUEUES = ",".join(f"{b:g}" for b in PlanConfig.tenant_las_queues_gpu_s)


def simulate(
    trace: Path = typer.Option(..., "--trace", help="CSV with job_id, submit_time_s, num_gpus, duration_s, user."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the simulated cluster."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per node; must divide --gpus."),
    policy: Policy = typer.Option(Policy.FAIR_SHARE, "--policy", help="Scheduling policy of the planner."),
    start_s: float | None = typer.Option(None, "--start-s", help="Replay jobs submitted at or after this trace time."),
    end_s: float | None = typer.Option(None, "--end-s", help="Replay jobs submitted before this trace time."),
    limit_jobs: int | None = typer.Option(None, "--limit-jobs", min=1, help="Replay only the first N jobs."),
    seed: int = typer.Option(0, "--seed", help="Orders equal-time events; same seed, same result."),
    tick: float = typer.Option(
        60.0,
        "--tick",
        help="Simulated seconds between the passes of the timed looks, at least (a las queue crossed, a turn's end, "
        "idle GPUs kept for a tenant lent, aging); a submit, an attempt's end and the end of a preemption's grace "
        "period pass at once, as the control loop does.",
    ),
    grace: float = typer.Option(30.0, "--grace", help="Simulated seconds a preempted attempt runs on."),
    checkpoint_every: float = typer.Option(
        900.0, "--checkpoint-every", help="Jobs checkpoint every this many simulated seconds (0: never)."
    ),
    estimates: bool | None = typer.Option(
        None,
        "--estimates/--no-estimates",
        help="Jobs declare max_run_time = their duration (backfill) [default: on, except for las].",
    ),
    tenant_las_queues: str = typer.Option(
        DEFAULT_TENANT_LAS_QUEUES,
        "--tenant-las-queues",
        help="fair-share: attained-service boundaries (GPU-seconds) inside each tenant, comma-separated; none: off.",
    ),
    defragment: bool = typer.Option(
        True, "--defragment/--no-defragment", help="fair-share: move small jobs to gather whole nodes for gangs."
    ),
    turn_window: float = typer.Option(
        3600.0,
        "--turn-window",
        help="fair-share: seconds over which a tenant whose jobs exceed its guarantee gets it in turns; 0: none.",
    ),
    lend_after: float = typer.Option(
        600.0,
        "--lend-after",
        help="fair-share: seconds guaranteed GPUs a tenant stopped using stay free for it before they are lent; 0: "
        "lent at once.",
    ),
    output: Output = OutputOption,
) -> None:
    """Replay a job trace through the production planner with a simulated clock; report JCT, GPU allocation,
    fairness per tenant and preemptions. Runs locally: no server needed.

    Each trace user (a Philly virtual cluster) is a tenant guaranteed GPUs in proportion to its share of the
    trace's GPU-time, borrowing unlimited; jobs larger than a node are gangs of node-sized replicas. See
    docs/scheduling.md ("Simulator").

    Examples:

      dlcloud simulate --trace philly_jobs_2017-10-02_to_2017-10-16.csv --gpus 256 --gpus-per-node 8 --policy las
      dlcloud simulate --trace jobs.csv --gpus 64 --policy fifo --limit-jobs 2000 --seed 1 -o json
      dlcloud simulate --trace jobs.csv --gpus 64 --tenant-las-queues none --no-defragment --turn-window 0
      dlcloud simulate --trace jobs.csv --gpus 64 --lend-after 0
    """
    config = SimConfig(
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        policy=policy,
        seed=seed,
        tick_s=tick,
        grace_s=grace,
        checkpoint_every_s=checkpoint_every,
        estimates=estimates,
        tenant_las_queues_gpu_s=parse_boundaries(tenant_las_queues),
        defragment=defragment,
        turn_window_s=turn_window,
        lend_after_s=lend_after,
    )
    config.validate()
    report = _run(load_trace(trace, start_s=start_s, end_s=end_s, limit_jobs=limit_jobs), config)
    if output == Output.json:
        print_json(report)
        return
    render_report(report)


def _run(jobs: list[Any], config: SimConfig) -> dict[str, Any]:
    """The simulator's report, with a progress bar on a terminal for a long trace."""
    if not (err_console.is_terminal and len(jobs) >= 5_000):
        return Simulator(jobs, config).run()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task(f"{config.policy.value}: jobs finished", total=len(jobs))
        return Simulator(jobs, config, lambda done, total: bar.update(task, completed=done)).run()


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def render_report(r: dict[str, Any]) -> None:
    jobs, alloc, timing = r["jobs"], r["gpu_allocation"], r["timing"]
    lend = f"after {r['lend_after_s'] / 60:g} min" if r["lend_after_s"] else "at once"
    rows = [
        ("policy", f"{r['policy']} on {r['gpus']} GPUs ({r['gpus'] // r['gpus_per_node']} x {r['gpus_per_node']})"),
        (
            "jobs",
            f"{jobs['finished']} finished of {jobs['total']} ({jobs['skipped_too_large']} larger than the cluster)",
        ),
        ("avg JCT", _hours(r["avg_jct_s"])),
        ("p50 JCT", _hours(r["p50_jct_s"])),
        ("p99 JCT", _hours(r["p99_jct_s"])),
        ("makespan", _hours(r["makespan_s"])),
        ("GPU allocation (mean)", f"{alloc['mean']:.1%}"),
        (
            "allocation >= 90% when contended",
            f"{alloc['busy_when_contended']:.1%} of {_hours(alloc['contended_time_s'])}",
        ),
        ("preemptions", f"{r['preemptions']} ({r['work_lost_gpu_s'] / 3600:.1f} GPU-hours of work lost)"),
        ("tenant-hours below 90% of entitlement", str(r["fairness"]["windows_below_90pct"])),
        (
            "fair-share inside tenants",
            f"las boundaries {', '.join(f'{x:g}' for x in r['tenant_las_queues_gpu_s']) or 'none'} GPU-s; "
            f"defragment {'on' if r['defragment'] else 'off'}; "
            f"turns {'over ' + _hours(r['turn_window_s']) if r['turn_window_s'] else 'off'}; "
            f"idle guaranteed GPUs lent {lend}",
        ),
        ("planner pass (mean / max)", f"{timing['planner_ms_mean']:.2f} / {timing['planner_ms_max']:.2f} ms"),
        ("passes / wall time", f"{r['passes']} / {timing['wall_s']:.1f} s"),
    ]
    if r["node_violations"]:
        rows.append(("placements across nodes (planner)", str(r["node_violations"])))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        console.print(f"{key + ':':<{width + 1}}  {value}")
    tenants = [{"name": name, **t} for name, t in r["tenants"].items()]
    console.print()
    render(
        tenants,
        Output.table,
        [
            ("TENANT", "name"),
            ("JOBS", "jobs"),
            ("GUARANTEE", "guarantee_gpus"),
            ("TRACE SHARE", lambda t: f"{t['trace_gpu_time_share']:.1%}"),
            ("SHARE", lambda t: f"{t['share']:.1%}"),
            ("HOURS <90%", lambda t: f"{t['windows_below_90pct']} of {t['windows_with_demand']}"),
            ("AVG JCT", lambda t: _hours(t["avg_jct_s"])),
        ],
    )
