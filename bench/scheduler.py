"""Scheduler benchmark: 10,000 queued jobs from 50 tenants on a simulated 1,000-GPU host.

Uses the real store and ``ControlLoop.schedule()`` with the SimulatedExecutor. Measures:

- placements/s of passes that place jobs: the queue is ordered, jobs ask for 1-8 GPUs, so one pass fills
  the ~1,000 GPUs (then a job that does not fit blocks the line); between rounds every running attempt is
  finished and supervised (not timed), and the next pass fills the host again. The first pass after a start
  reads and converts every queued job once (the control loop keeps them from pass to pass) and writes the wait
  of nearly every job: it is printed apart, and the rate is that of the later passes (also printed with it);
- ms per idle pass: every GPU is taken, the queue is still ~full, nothing can start.

A placing pass ends by starting its workloads, which for every job creates its checkpoint and output
directories under the data directory; that share is printed apart because it is filesystem time (a
busy disk can dominate it), not scheduling.

A fifth of the tenants have a GPU quota and a running-jobs limit, so passes also skip quota-blocked jobs
and record their wait reasons.

    python bench/scheduler.py                                   # SQLite in a temporary directory
    python bench/scheduler.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
      (a scratch database is created on that server and dropped afterwards)
    python bench/scheduler.py --policy fair-share          # or fifo, priority-backfill, las, all

--policy times ``planner.plan()`` itself with that policy (the control loop's pass has no policy setting yet): the
same 10,000 jobs from 50 tenants (guarantees of 16 GPUs each, a fifth with hard caps, half declaring a maximum run
time) on 1,000 GPUs as 125 nodes of 8, in three passes: placing (empty cluster), idle (full, the rest queued) and
contended (ten tenants hold every GPU as borrowed capacity: the others reclaim).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from _common import load_average, machine, percentile  # bench/ is on sys.path when run as a script
from sqlalchemy import create_engine, insert, text
from sqlalchemy.pool import NullPool

from dlcloud.control.loop import ControlLoop
from dlcloud.executors.base import Workload
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.planner import Held, Limits, PlanConfig, Policy, QueuedJob, plan
from dlcloud.schemas.jobs import JobSpec, JobState
from dlcloud.services.platform import Platform
from dlcloud.services.recipes import shell_command
from dlcloud.services.secrets import SecretBox
from dlcloud.settings import Settings
from dlcloud.store.db import Database, migrate
from dlcloud.store.ids import new_id
from dlcloud.store.rows import JobEventRow, JobRow, TenantRow, UserRow, utcnow

GiB = 1024**3
TARGET_PLACEMENTS_PER_S = 2_000
TARGET_IDLE_MS = 100


class TimedControlLoop(ControlLoop):
    """The real control loop, timing the start of workloads (directory creation + executor start)."""

    start_seconds = 0.0

    def _start(self, handle: str, w: Workload) -> None:
        t0 = time.perf_counter()
        super()._start(handle, w)
        self.start_seconds += time.perf_counter() - t0


def _sa_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@contextmanager
def scratch_database(url: str | None, tmp: Path) -> Iterator[str]:
    """A fresh, migrated database: SQLite in ``tmp``, or a new database on the given PostgreSQL server."""
    if url is None or url.startswith("sqlite"):
        db_url = url or f"sqlite:///{tmp / 'bench.db'}"
        migrate(db_url)
        yield db_url
        return
    admin_url = _sa_url(url)
    admin = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    name = f"dlcloud_bench_{os.getpid()}_{secrets.token_hex(3)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        migrate(db_url)
        yield db_url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def populate(db: Database, n_jobs: int, n_tenants: int, rng: random.Random) -> None:
    """Tenants, one user each, and ``n_jobs`` queued jobs: the rows ``submit_job`` writes, bulk-inserted."""
    now = utcnow()
    tenants, users = [], []
    for t in range(n_tenants):
        capped = t % 5 == 4  # every fifth tenant has limits
        tenants.append(
            {
                "id": new_id("t-"),
                "name": f"tenant-{t:02d}",
                "created_at": now,
                "quota_gpus": 24 if capped else None,
                "quota_cpus": None,
                "quota_memory": None,
                "quota_max_running_jobs": 6 if capped else None,
                "quota_max_queued_jobs": None,
            }
        )
        users.append(
            {"id": new_id("u-"), "tenant_id": tenants[-1]["id"], "name": "user", "role": "member", "created_at": now}
        )
    jobs, events = [], []
    for i in range(n_jobs):
        t = rng.randrange(n_tenants)
        spec = JobSpec.model_validate(
            {
                "name": f"job-{i:05d}",
                "command": "python train.py --epochs 3",
                "resources": {"gpus": rng.randint(1, 8), "cpu": 4, "memory": "16Gi"},
                "priority": rng.choice((0, 0, 0, 0, 1, 5)),
                "env": {"SEED": str(i)},
            }
        )
        created = now + timedelta(microseconds=i)  # distinct submit times: a stable FIFO order
        row = {
            "id": new_id("j-"),
            "tenant_id": tenants[t]["id"],
            "user_id": users[t]["id"],
            "name": spec.name,
            "spec": spec.model_dump(mode="json"),
            "command": shell_command(spec),
            "code_id": None,
            "state": JobState.QUEUED.value,
            "reason": "submitted",
            "wait_reason": None,
            "priority": spec.priority,
            "gpus": spec.resources.gpus,
            "cpus": spec.resources.cpu,
            "memory": spec.resources.memory,
            "gpu_type": None,
            "timeout_seconds": spec.timeout,
            "max_restarts": spec.restart.max_restarts,
            "backoff_seconds": spec.restart.backoff_seconds,
            "attempt": 0,
            "restarts": 0,
            "exit_code": None,
            "cancel_requested": False,
            "not_before": None,
            "created_at": created,
            "started_at": None,
            "finished_at": None,
        }
        jobs.append(row)
        events.append(
            {
                "job_id": row["id"],
                "tenant_id": row["tenant_id"],
                "time": created,
                "from_state": None,
                "to_state": JobState.QUEUED.value,
                "reason": "submitted by user",
                "attempt": 0,
            }
        )
    with db.write() as s:
        s.execute(insert(TenantRow), tenants)
        s.execute(insert(UserRow), users)
        for lo in range(0, n_jobs, 2000):
            s.execute(insert(JobRow), jobs[lo : lo + 2000])
            s.execute(insert(JobEventRow), events[lo : lo + 2000])


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="dlcloud-bench-", dir=args.data_dir) as tmp_name:
        tmp = Path(tmp_name)
        with scratch_database(args.database_url, tmp) as url:
            settings = Settings(data_dir=tmp / "data", database_url=url, host_name="bench")
            db = Database(settings.resolved_database_url)
            inventory = Inventory(
                host="bench",
                gpus=tuple(Gpu(i, "NVIDIA H100 80GB HBM3", 81_559) for i in range(args.gpus)),
                cpus=100_000.0,
                memory=1_000_000 * GiB,
            )
            box = SecretBox.from_file(settings.resolved_server_key_file)
            executor = SimulatedExecutor()
            control = TimedControlLoop(Platform(settings, db, box, inventory, executor=executor), executor)

            t0 = time.perf_counter()
            populate(db, args.jobs, args.tenants, rng)
            setup_s = time.perf_counter() - t0

            place_times: list[float] = []
            start_times: list[float] = []
            placed_counts: list[int] = []
            finish_times: list[float] = []
            for r in range(args.rounds):
                if r:
                    t0 = time.perf_counter()
                    for handle in executor.running():
                        executor.finish(handle, 0)
                    control.supervise()
                    finish_times.append(time.perf_counter() - t0)
                control.start_seconds = 0.0
                t0 = time.perf_counter()
                n = control.schedule()
                place_times.append(time.perf_counter() - t0)
                start_times.append(control.start_seconds)
                placed_counts.append(n)
                if n == 0:
                    print("a placing pass placed nothing; check the setup", file=sys.stderr)
                    return 1

            gpus_busy = sum(len(w.gpus) for w in executor.running().values())
            idle: list[float] = []
            for _ in range(args.idle_passes):
                t0 = time.perf_counter()
                n = control.schedule()
                idle.append((time.perf_counter() - t0) * 1000)
                if n:
                    print(f"an idle pass placed {n} job(s); check the setup", file=sys.stderr)
                    return 1
            with db.read() as s:
                queued = s.scalar(text("SELECT count(*) FROM jobs WHERE state IN ('QUEUED', 'RESTARTING')"))
            db.dispose()

    # the first pass after a start reads every queued job's fixed columns and builds its QueuedJob (``QueueCache``),
    # and writes a wait for nearly every job: it is timed apart; the rate is that of the passes of a running server
    placements = sum(placed_counts[1:])
    rate = placements / sum(place_times[1:])
    rate_sched = placements / (sum(place_times[1:]) - sum(start_times[1:]))
    rate_all = sum(placed_counts) / sum(place_times)
    start_share = sum(start_times[1:]) / sum(place_times[1:])
    median, p99 = statistics.median(idle), percentile(idle, 99)
    backend = "PostgreSQL" if args.database_url and not args.database_url.startswith("sqlite") else "SQLite"
    print(f"machine:   {machine()}, load average {load_average()}")
    print(
        f"setup:     {args.jobs} jobs / {args.tenants} tenants / {args.gpus} GPUs on {backend}, "
        f"inserted in {setup_s:.2f} s"
    )
    print(
        f"placing:   {args.rounds} passes placed {sum(placed_counts)} jobs ({', '.join(map(str, placed_counts))}); "
        f"finish+supervise between rounds {statistics.mean(finish_times) * 1000 if finish_times else 0:.0f} ms"
    )
    print(f"idle:      {args.idle_passes} passes with {gpus_busy} of {args.gpus} GPUs busy and {queued} jobs queued")
    print()
    rows = [
        (
            "placements/s (placing passes)",
            f"{rate:,.0f}",
            f">= {TARGET_PLACEMENTS_PER_S:,}",
            rate >= TARGET_PLACEMENTS_PER_S,
        ),
        ("  without starting workloads", f"{rate_sched:,.0f}", "", None),
        ("  with the first pass after a start", f"{rate_all:,.0f}", "", None),
        ("ms per placing pass (mean)", f"{statistics.mean(place_times[1:]) * 1000:.1f}", "", None),
        ("ms of the first pass after a start", f"{place_times[0] * 1000:.1f}", "", None),
        ("  share starting workloads (mkdir)", f"{start_share:.0%}", "", None),
        ("ms per idle pass, median", f"{median:.1f}", f"<= {TARGET_IDLE_MS}", median <= TARGET_IDLE_MS),
        ("ms per idle pass, p99", f"{p99:.1f}", f"<= {TARGET_IDLE_MS}", p99 <= TARGET_IDLE_MS),
    ]
    w0 = max(len(r[0]) for r in rows)
    print(f"{'metric':<{w0}}  {'value':>10}  {'target':>8}  ok")
    for name, value, target, ok in rows:
        mark = "" if ok is None else ("yes" if ok else "NO")
        print(f"{name:<{w0}}  {value:>10}  {target:>8}  {mark}")
    return 0


def planner_only(args: argparse.Namespace) -> int:
    """Time ``plan()`` per policy on a multi-node cluster, without the database."""
    rng = random.Random(args.seed)
    now = utcnow()
    per_node = 8
    inventory = Inventory(
        host="bench",
        gpus=tuple(Gpu(i, "NVIDIA H100 80GB HBM3", 81_559, f"node-{i // per_node:03d}") for i in range(args.gpus)),
        cpus=100_000.0,
        memory=1_000_000 * GiB,
    )
    tenants = [f"tenant-{t:02d}" for t in range(args.tenants)]
    limits = {
        t: Limits(gpus=24, max_running_jobs=6, guarantee_gpus=16) if i % 5 == 4 else Limits(guarantee_gpus=16)
        for i, t in enumerate(tenants)
    }
    queue = [
        QueuedJob(
            f"j-{i:05d}",
            rng.choice(tenants),
            rng.randint(1, 8),
            4.0,
            16 * GiB,
            priority=rng.choice((0, 0, 0, 0, 1, 5)),
            submitted_at=now - timedelta(seconds=args.jobs - i),
            max_run_time_s=rng.choice((None, 1800.0, 3600.0, 4 * 3600.0)),
            attained_gpu_s=rng.choice((0.0, 0.0, 5000.0, 50_000.0)),
        )
        for i in range(args.jobs)
    ]
    by_id = {j.id: j for j in queue}

    def held_for(placements: list[tuple[str, tuple[int, ...]]], tenant_of: dict[str, str] | None = None) -> list[Held]:
        out = []
        for jid, gpus in placements:
            j = by_id[jid]
            t = tenant_of[jid] if tenant_of else j.tenant_id
            started = now - timedelta(seconds=rng.randint(60, 7200))
            out.append(
                Held(t, gpus, j.cpus, j.memory, job_id=jid, priority=j.priority, started_at=started,
                     max_run_time_s=j.max_run_time_s, attained_gpu_s=rng.choice((100.0, 9000.0, 90_000.0)))
            )  # fmt: skip
        return out

    def timed(config: PlanConfig, q: list[QueuedJob], held: list[Held]) -> tuple[float, object]:
        best, result = float("inf"), None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = plan(q, held, limits, inventory, now, config)
            best = min(best, time.perf_counter() - t0)
        return best * 1000, result

    policies = list(Policy) if args.policy == "all" else [Policy(args.policy)]
    print(f"machine:   {machine()}, load average {load_average()}")
    print(
        f"setup:     plan() alone, {args.jobs} jobs / {args.tenants} tenants / {args.gpus} GPUs as "
        f"{args.gpus // per_node} nodes of {per_node}; best of {args.repeat} runs per pass"
    )
    print()
    print(f"{'policy':<18} {'placing ms':>10} {'placed':>7} {'placements/s':>13} {'idle ms':>8} {'contended ms':>13} "
          f"{'preempted':>9}  ok")  # fmt: skip
    ok_all = True
    for policy in policies:
        config = PlanConfig(policy=policy)
        placing_ms, first = timed(config, queue, [])
        placed = first.placements  # type: ignore[attr-defined]
        placed_ids = {jid for jid, _ in placed}
        rest = [j for j in queue if j.id not in placed_ids]
        idle_ms, _ = timed(config, rest, held_for(placed))
        # contended: ten tenants hold every GPU the placing pass filled, as borrowed capacity
        lenders = {jid: tenants[k % 10] for k, (jid, _) in enumerate(placed)}
        contended_ms, third = timed(config, rest, held_for(placed, lenders))
        preempted = len(third.preemptions)  # type: ignore[attr-defined]
        rate = len(placed) / (placing_ms / 1000) if placing_ms else float("inf")
        ok = max(placing_ms, idle_ms, contended_ms) <= TARGET_IDLE_MS and rate >= TARGET_PLACEMENTS_PER_S
        ok_all &= ok
        print(f"{policy.value:<18} {placing_ms:>10.1f} {len(placed):>7} {rate:>13,.0f} {idle_ms:>8.1f} "
              f"{contended_ms:>13.1f} {preempted:>9}  {'yes' if ok else 'NO'}")  # fmt: skip
    print(f"\ntargets: every pass <= {TARGET_IDLE_MS} ms, >= {TARGET_PLACEMENTS_PER_S:,} placements/s")
    return 0 if ok_all else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", help="default: SQLite in a temporary directory")
    ap.add_argument("--data-dir", help="where the temporary data directory goes (default: the system's temp dir)")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=6, help="placing passes (the host is emptied between them)")
    ap.add_argument("--idle-passes", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--policy", choices=[*(p.value for p in Policy), "all"], help="time plan() alone with it")
    ap.add_argument("--repeat", type=int, default=5, help="with --policy: runs per pass (the best is reported)")
    args = ap.parse_args()
    if args.policy:
        return planner_only(args)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: the first pass after a start is timed apart")
    if args.idle_passes < 20:
        ap.error("--idle-passes must be at least 20 for a meaningful p99")
    logging.basicConfig(level=logging.WARNING)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
