"""The scheduling pass: places queued jobs and records their new attempts, in one write transaction.

The pass reads the queue (in QUEUE_ORDER, lazily), plans placements with ``scheduler.planner``, writes the wait
reasons that changed, and for each placement records the attempt (STARTING) with its ports and replicas and
builds its Workload (``workloads.build``). It starts nothing: the control loop starts the workloads after the
transaction commits, so a crash in between leaves attempts that never launched, which supervision starts
(``supervision.py``); nothing is lost and nothing runs twice.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, Row, and_, insert, or_, select, text, update
from sqlalchemy.orm import Session

from dlcloud.executors.base import Executor, Workload
from dlcloud.scheduler.planner import GroupDemand, Held, Limits, QueuedJob, plan
from dlcloud.schemas.jobs import JobState
from dlcloud.services import job_states, recipes, workloads
from dlcloud.services.jobs import QUEUE_STATES
from dlcloud.services.platform import Platform
from dlcloud.services.ports import PortAllocator
from dlcloud.store.rows import AttemptRow, CodeRow, EnvironmentBuildRow, JobRow, ReplicaRow, TenantRow, utcnow

SCHEDULE_LOCK_ID = 0x646C636C6F7565  # PostgreSQL advisory lock: one scheduling pass at a time
# a fenced write transaction of the control loop (ControlLoop._write)
WriteTransaction = Callable[[], contextlib.AbstractContextManager[Session]]


QUEUE_ORDER = (JobRow.priority.desc(), JobRow.created_at, JobRow.id)


def _behind(row: Row) -> ColumnElement[bool]:
    """Jobs after ``row`` in QUEUE_ORDER."""
    return or_(
        JobRow.priority < row.priority,
        and_(
            JobRow.priority == row.priority,
            or_(JobRow.created_at > row.created_at, and_(JobRow.created_at == row.created_at, JobRow.id > row.id)),
        ),
    )


class _EnvironmentHolds:
    """Queued jobs whose environment is not READY: held while it builds, failed when its build failed.
    The builds are read once per pass, and only when a job in the queue runs in a built environment."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.failed: dict[str, str] = {}  # job id -> the reason it fails
        self._builds: dict[str, tuple[str, str | None]] | None = None

    def reason(self, r: Row) -> str | None:
        if r.environment_hash is None:
            return None
        if self._builds is None:
            q = select(EnvironmentBuildRow.spec_hash, EnvironmentBuildRow.state, EnvironmentBuildRow.error)
            self._builds = {h: (st, e) for h, st, e in self.conn.execute(q.where(EnvironmentBuildRow.state != "READY"))}
        state, error = self._builds.get(r.environment_hash, ("READY", None))
        if state == "FAILED":
            self.failed[r.id] = f"environment {r.environment!r} failed to build: {error}"
            return f"environment {r.environment!r} failed to build"
        return None if state == "READY" else f"environment {r.environment!r} is building"


def _read_queue(conn: Connection, seen: list[Row], holds: _EnvironmentHolds) -> Iterator[QueuedJob]:
    """The queue in QUEUE_ORDER, read lazily in growing chunks: a pass that stops at the first job that
    must wait reads one small chunk, not the whole queue. Rows handed out are appended to ``seen``."""
    size = 512
    after: Row | None = None
    while True:
        q = select(
            JobRow.id,
            JobRow.tenant_id,
            JobRow.gpus,
            JobRow.cpus,
            JobRow.memory,
            JobRow.gpu_type,
            JobRow.not_before,
            JobRow.wait_reason,
            JobRow.priority,
            JobRow.created_at,
            JobRow.environment,
            JobRow.environment_hash,
            JobRow.replica_groups,
        ).where(JobRow.state.in_(QUEUE_STATES))
        if after is not None:
            q = q.where(_behind(after))
        rows = conn.execute(q.order_by(*QUEUE_ORDER).limit(size)).all()
        for r in rows:
            seen.append(r)
            groups = tuple(
                GroupDemand(g["role"], int(g["count"]), int(g["gpus"]), g.get("gpu_type"))
                for g in r.replica_groups or ()
            )
            yield QueuedJob(
                r.id, r.tenant_id, r.gpus, r.cpus, r.memory, r.gpu_type, r.not_before, holds.reason(r), groups
            )
        if len(rows) < size:
            return
        after = rows[-1]
        size = min(size * 4, 16_384)


class SchedulingPass:
    """One scheduling pass at a time (``run``), writing through the loop's fenced transactions."""

    def __init__(self, platform: Platform, executor: Executor, write: WriteTransaction) -> None:
        self.p = platform
        self.executor = executor
        self.write = write

    def run(self) -> list[tuple[str, Workload]]:
        """One pass; returns the (handle, workload) of the attempts it recorded, for the caller to start."""
        now = utcnow()
        workloads: list[tuple[str, Workload]] = []
        with self.write() as s:
            if not self.p.db.is_sqlite:
                # passes must not interleave (two would place the same job); SQLite's BEGIN IMMEDIATE
                # already serialises them, PostgreSQL needs this transaction-scoped lock
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEDULE_LOCK_ID})
            conn = s.connection()
            seen: list[Row] = []  # queue rows the planner looked at, in order
            holds = _EnvironmentHolds(conn)
            queue = _read_queue(conn, seen, holds)
            first = next(queue, None)
            if first is None:
                return []
            held = [
                Held(t, tuple(g), c, m)
                for t, g, c, m in conn.execute(
                    select(AttemptRow.tenant_id, AttemptRow.gpus, AttemptRow.cpus, AttemptRow.memory).where(
                        AttemptRow.finished_at.is_(None)
                    )
                )
            ]
            limits = {
                t: Limits(g, c, m, r)
                for t, g, c, m, r in conn.execute(
                    select(
                        TenantRow.id,
                        TenantRow.quota_gpus,
                        TenantRow.quota_cpus,
                        TenantRow.quota_memory,
                        TenantRow.quota_max_running_jobs,
                    )
                )
            }
            result = plan(itertools.chain((first,), queue), held, limits, self.p.inventory, now)
            placed = {job_id for job_id, _ in result.placements}
            reasons = result.wait_reasons
            # write the wait reasons that changed; a job no longer held back by something specific gets its
            # reason cleared (a placed job's is cleared by its transition)
            changed = [
                {"id": r.id, "wait_reason": reasons.get(r.id)}
                for r in seen
                if r.wait_reason != reasons.get(r.id) and r.id not in placed and r.id not in holds.failed
            ]
            if changed:
                s.execute(update(JobRow), changed)
            if result.blocked_by is not None:
                # the jobs behind the blocked one were not looked at: they wait behind it, for no reason of
                # their own
                s.execute(
                    update(JobRow)
                    .where(JobRow.state.in_(QUEUE_STATES), JobRow.wait_reason.is_not(None), _behind(seen[-1]))
                    .values(wait_reason=None)
                    .execution_options(synchronize_session=False)
                )
            jobs = self._load_for_placement(s, [job_id for job_id, _ in result.placements])
            attempts: list[dict] = []
            events: list[dict] = []
            replicas: list[dict] = []
            settings = self.p.settings
            ports = PortAllocator(s, settings.job_port_range_start, settings.job_port_range_end)
            for job_id, gpus in result.placements:
                job = jobs.get(job_id)
                if job is None or job.state not in QUEUE_STATES:
                    continue  # cancelled since the queue was read (PostgreSQL); its resources stay free
                needed = recipes.ports_needed(job.spec, job.replica_groups)
                got = ports.allocate(job.id, job.attempt + 1, needed, now)
                if got is None:
                    job.wait_reason = (
                        f"waiting for {needed} free port(s) in {settings.job_port_range_start}-"
                        f"{settings.job_port_range_end}"
                    )
                    continue
                workloads.append(self._place(s, job, gpus, now, attempts, events, replicas, got))
            if holds.failed:  # their environment failed to build: they can never start
                for job in s.scalars(select(JobRow).where(JobRow.id.in_(list(holds.failed))).with_for_update()):
                    if job.state in QUEUE_STATES:
                        job_states.transition(s, job, JobState.FAILED, holds.failed[job.id], at=now, events=events)
            if attempts:
                s.execute(insert(AttemptRow), attempts)
            if replicas:
                s.execute(insert(ReplicaRow), replicas)
            job_states.add_events(s, events)
        return workloads

    def _load_for_placement(self, s: Session, job_ids: list[str]) -> dict[str, JobRow]:
        """The jobs to place, locked, in a few queries; their code rows go into the identity map so that
        ``_workload`` needs no query (a query would autoflush, turning batched inserts into one per row)."""
        jobs: dict[str, JobRow] = {}
        for lo in range(0, len(job_ids), 500):
            q = select(JobRow).where(JobRow.id.in_(job_ids[lo : lo + 500])).with_for_update()
            jobs.update((j.id, j) for j in s.scalars(q))
        tenant_ids = sorted({j.tenant_id for j in jobs.values()})
        s.scalars(select(TenantRow).where(TenantRow.id.in_(tenant_ids))).all()  # their sandbox slots
        code_ids = sorted({j.code_id for j in jobs.values() if j.code_id})
        for lo in range(0, len(code_ids), 500):
            s.scalars(select(CodeRow).where(CodeRow.id.in_(code_ids[lo : lo + 500]))).all()
        return jobs

    def _place(
        self,
        s: Session,
        job: JobRow,
        gpus: tuple[int, ...],
        now: datetime,
        attempts: list[dict],
        events: list[dict],
        replicas: list[dict],
        ports: list[int],
    ) -> tuple[str, Workload]:
        """Record attempt ``job.attempt + 1``: the attempt, replica and event rows go to ``attempts`` /
        ``replicas`` / ``events`` for one bulk insert each."""
        job.attempt += 1
        handle = self.executor.handle(job.tenant_id, job.id, job.attempt)
        workload = workloads.build(self.p, self.executor, s, job, gpus, handle, ports)
        for r in workload.replicas:
            replicas.append(
                {
                    "job_id": job.id,
                    "tenant_id": job.tenant_id,
                    "attempt": job.attempt,
                    "name": r.name,
                    "role": r.role,
                    "index": r.index,
                    "host": self.p.inventory.host,
                    "gpus": list(r.gpus),
                    "cpus": r.cpus,
                    "memory": r.memory_bytes,
                    "ports": list(r.ports),
                    "state": "running",
                    "exit_code": None,
                }
            )
        attempts.append(
            {
                "job_id": job.id,
                "tenant_id": job.tenant_id,
                "user_id": job.user_id,
                "number": job.attempt,
                "host": self.p.inventory.host,
                "gpus": list(gpus),
                "cpus": job.cpus,
                "memory": job.memory,
                "handle": handle,
                "started_at": now,
                "ports": list(ports) or None,
            }
        )
        where = f" on GPU(s) {','.join(map(str, gpus))}" if gpus else ""
        if workload.replicas:
            where = f" as a gang of {len(workload.replicas)} replica(s){where}"
        job_states.transition(
            s,
            job,
            JobState.STARTING,
            f"attempt {job.attempt} placed on {self.p.inventory.host}{where}",
            at=now,
            events=events,
        )
        return handle, workload
