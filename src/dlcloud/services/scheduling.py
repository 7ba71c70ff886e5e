"""The scheduling pass: places queued jobs and records their new attempts, in one write transaction.

The pass reads the queue (in QUEUE_ORDER, lazily), the live attempts (``Held``, with what the policies weigh:
priority, submit and start times, preemptibility, declared run time, attained GPU-seconds, whether it is already
being stopped) and the tenants' quotas and fair-share terms (``Limits``), plans with ``scheduler.planner`` under
the server's ``PlanConfig`` (``plan_config``), writes the wait reasons and estimated starts that changed, asks
for the preemptions the plan chose (``job_states.request_preemption``: the supervision stops those attempts), and
for each placement records the attempt (STARTING) with its ports and replicas and builds its Workload
(``workloads.build``); a placement beyond its tenant's guarantee gets a "borrowing" event.

Isolation (docs/isolation.md): the planner's texts name jobs and tenants by id ("waiting behind job j-...",
"behind tenant(s) t-..., t-...", "preempted by job j-..."); everything written into a job's row or events goes
through ``TenantView`` first, which keeps the job's own tenant's jobs (by name) and its own tenant (by name) and
turns every other tenant's job into "a job of another tenant" and other tenants into "another tenant" / "N other
tenants". A tenant may learn that it waits behind or was preempted by other tenants' work, and why; never whose.

It starts nothing: the control loop starts the workloads after the transaction commits, so a crash in between
leaves attempts that never launched, which supervision starts (``supervision.py``); nothing is lost and nothing
runs twice.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Iterator
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, Row, and_, insert, or_, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from dlcloud.executors.base import Executor, Workload
from dlcloud.scheduler.planner import (
    PREEMPTION_WHY,
    GroupDemand,
    Held,
    Limits,
    Plan,
    PlanConfig,
    Policy,
    QueuedJob,
    plan,
)
from dlcloud.schemas.jobs import JobState
from dlcloud.services import job_states, recipes, workloads
from dlcloud.services.jobs import QUEUE_STATES
from dlcloud.services.platform import Platform
from dlcloud.services.ports import PortAllocator
from dlcloud.settings import Settings
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import AttemptRow, CodeRow, EnvironmentBuildRow, JobRow, ReplicaRow, TenantRow, utcnow

SCHEDULE_LOCK_ID = 0x646C636C6F7565  # PostgreSQL advisory lock: one scheduling pass at a time
# a fenced write transaction of the control loop (ControlLoop._write)
WriteTransaction = Callable[[], contextlib.AbstractContextManager[Session]]


QUEUE_ORDER = (JobRow.priority.desc(), JobRow.created_at, JobRow.id)
# what placing a job may change in its row, written for every placed job whether it changed or not: the flush at
# commit sends the UPDATEs of one column set as one executemany (one round trip on PostgreSQL), and jobs whose
# changes differ (a wait reason to clear or not, ...) would split it into one per run of alike jobs
_PLACED_COLUMNS = ("state", "reason", "attempt", "wait_reason", "estimated_start", "reclaiming", "preempt_reason")


def plan_config(settings: Settings) -> PlanConfig:
    """The planner's configuration from the server's settings (docs/scheduling.md)."""
    return PlanConfig(
        policy=Policy(settings.scheduling_policy),
        aging_interval_s=settings.scheduling_aging_interval_seconds,
        aging_step=settings.scheduling_aging_step,
        aging_max=settings.scheduling_aging_max,
        las_queues_gpu_s=tuple(settings.scheduling_las_queues_gpu_seconds),
        tenant_las_queues_gpu_s=tuple(settings.scheduling_tenant_las_queues_gpu_seconds),
        defragment=settings.scheduling_defragment,
        preemption_grace_s=settings.stop_grace_seconds,
    )


def read_held(conn: Connection, now: datetime) -> list[Held]:
    """What every live attempt holds, with what the policies weigh (a gang is one ``Held``: preempted whole).
    ``progress_at`` is the attempt's start: the platform does not see a job's checkpoints."""
    q = select(
        AttemptRow.tenant_id,
        AttemptRow.gpus,
        AttemptRow.cpus,
        AttemptRow.memory,
        AttemptRow.job_id,
        AttemptRow.started_at,
        JobRow.priority,
        JobRow.created_at,
        JobRow.preemptible,
        JobRow.max_run_time_seconds,
        JobRow.attained_gpu_seconds,
        JobRow.cancel_requested,
        JobRow.preempt_requested,
    ).outerjoin(JobRow, JobRow.id == AttemptRow.job_id)
    held = []
    for r in conn.execute(q.where(AttemptRow.finished_at.is_(None))):
        gpus = tuple(r.gpus)
        running_s = max(0.0, (now - r.started_at).total_seconds()) if r.started_at is not None else 0.0
        held.append(
            Held(
                r.tenant_id,
                gpus,
                r.cpus,
                r.memory,
                job_id=r.job_id,
                priority=r.priority or 0,
                submitted_at=r.created_at,
                started_at=r.started_at,
                progress_at=r.started_at,
                max_run_time_s=r.max_run_time_seconds,
                # a job deleted under a live attempt (no row) cannot be a victim
                preemptible=bool(r.preemptible) if r.preemptible is not None else False,
                attained_gpu_s=(r.attained_gpu_seconds or 0.0) + len(gpus) * running_s,
                stopping=bool(r.cancel_requested or r.preempt_requested),
            )
        )
    return held


def read_limits(conn: Connection) -> dict[str, Limits]:
    """Every tenant's quota (hard caps) and fair-share terms."""
    q = select(
        TenantRow.id,
        TenantRow.quota_gpus,
        TenantRow.quota_cpus,
        TenantRow.quota_memory,
        TenantRow.quota_max_running_jobs,
        TenantRow.guarantee_gpus,
        TenantRow.guarantee_cpus,
        TenantRow.guarantee_memory,
        TenantRow.borrow_gpus,
        TenantRow.borrow_cpus,
        TenantRow.borrow_memory,
        TenantRow.weight,
    )
    return {
        r.id: Limits(
            r.quota_gpus,
            r.quota_cpus,
            r.quota_memory,
            r.quota_max_running_jobs,
            guarantee_gpus=r.guarantee_gpus or 0,
            guarantee_cpus=r.guarantee_cpus or 0.0,
            guarantee_memory=r.guarantee_memory or 0,
            borrow_gpus=r.borrow_gpus,
            borrow_cpus=r.borrow_cpus,
            borrow_memory=r.borrow_memory,
            weight=r.weight or 1.0,
        )
        for r in conn.execute(q)
    }


def _behind(row: Row) -> ColumnElement[bool]:
    """Jobs after ``row`` in QUEUE_ORDER."""
    return or_(
        JobRow.priority < row.priority,
        and_(
            JobRow.priority == row.priority,
            or_(JobRow.created_at > row.created_at, and_(JobRow.created_at == row.created_at, JobRow.id > row.id)),
        ),
    )


_ID = r"[a-z]{1,2}-[a-z0-9]{16}"  # store/ids.py
_JOB_REF = re.compile(r"\bjob (j-[a-z0-9]{16})\b")
_TENANTS_AHEAD = re.compile(rf"\btenant\(s\) ((?:{_ID})(?:, {_ID})*)(?: and (\d+) more)?")
_TENANT_REF = re.compile(r"\btenant (t-[a-z0-9]{16})\b")
_ANY_ID = re.compile(rf"\b{_ID}\b")
OTHER_JOB = "a job of another tenant"


class TenantView:
    """Texts of the planner as a job's tenant may read them: its own tenant's jobs and the tenant itself by
    name, other tenants' jobs as "a job of another tenant", other tenants as "another tenant" / "N other
    tenants", and any other id left in the text (a planner message this class does not know yet) as
    "another tenant's object". Names are read once per pass, and only for the ids the texts mention."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._jobs: dict[str, tuple[str, str]] = {}  # job id -> (tenant id, name)
        self._tenants: dict[str, str] | None = None  # tenant id -> name
        self._memo: dict[tuple[str, str], str] = {}

    def job_name(self, job_id: str, tenant_id: str) -> str:
        """``job NAME`` for a job of ``tenant_id``, else ``a job of another tenant``."""
        if job_id not in self._jobs:
            q = select(JobRow.tenant_id, JobRow.name).where(JobRow.id == job_id)
            row = self.conn.execute(q).first()
            self._jobs[job_id] = (row.tenant_id, row.name) if row is not None else ("", "")
        owner, name = self._jobs[job_id]
        return f"job {name}" if owner == tenant_id and name else OTHER_JOB

    def tenant_name(self, tenant_id: str) -> str:
        if self._tenants is None:
            self._tenants = dict(self.conn.execute(select(TenantRow.id, TenantRow.name)).all())
        return self._tenants.get(tenant_id, "")

    def text(self, text: str | None, tenant_id: str) -> str | None:
        """``text`` as a job of ``tenant_id`` may show it (None stays None)."""
        if not text or "-" not in text:
            return text
        key = (text, tenant_id)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = self._translate(text, tenant_id)
        return out

    def _translate(self, text: str, tenant_id: str) -> str:
        text = _JOB_REF.sub(lambda m: self.job_name(m.group(1), tenant_id), text)

        def ahead(m: re.Match[str]) -> str:
            ids = m.group(1).split(", ")
            n = len([i for i in ids if i != tenant_id]) + int(m.group(2) or 0)
            return "1 other tenant" if n == 1 else f"{n} other tenants"

        text = _TENANTS_AHEAD.sub(ahead, text)
        own = self.tenant_name(tenant_id) or "its tenant"
        text = _TENANT_REF.sub(lambda m: f"tenant {own}" if m.group(1) == tenant_id else "another tenant", text)
        return _ANY_ID.sub(lambda m: own if m.group(0) == tenant_id else "another tenant's object", text)


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
            JobRow.estimated_start,
            JobRow.priority,
            JobRow.created_at,
            JobRow.environment,
            JobRow.environment_hash,
            JobRow.replica_groups,
            JobRow.preemptible,
            JobRow.max_run_time_seconds,
            JobRow.attained_gpu_seconds,
            JobRow.reclaiming,
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
                r.id,
                r.tenant_id,
                r.gpus,
                r.cpus,
                r.memory,
                r.gpu_type,
                r.not_before,
                holds.reason(r),
                groups,
                priority=r.priority,
                submitted_at=r.created_at,  # kept across preemptions: a preempted job keeps its place
                max_run_time_s=r.max_run_time_seconds,
                preemptible=r.preemptible,
                attained_gpu_s=r.attained_gpu_seconds or 0.0,
                reclaiming=bool(r.reclaiming),
            )
        if len(rows) < size:
            return
        after = rows[-1]
        size = min(size * 4, 16_384)


def _reasons_with_tenants(result: Plan, seen: list[Row]) -> Iterator[tuple[str, str, str]]:
    """(job id, the planner's wait reason, the job's tenant id) of every job the plan gave a reason."""
    tenants = {r.id: r.tenant_id for r in seen}
    for job_id, reason in result.wait_reasons.items():
        tenant = tenants.get(job_id)
        if tenant is not None:
            yield job_id, reason, tenant


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
            held = read_held(conn, now)
            limits = read_limits(conn)
            config = plan_config(self.p.settings)
            result = plan(itertools.chain((first,), queue), held, limits, self.p.inventory, now, config)
            placed = {job_id for job_id, _ in result.placements}
            view = TenantView(conn)
            reasons = {jid: view.text(r, t) for jid, r, t in _reasons_with_tenants(result, seen)}
            starts = result.estimated_start
            # write the wait reasons and estimated starts that changed; a job no longer held back by something
            # specific gets its reason cleared (a placed job's is cleared by its transition)
            job_store.set_wait_reasons(
                conn,
                [
                    (r.id, reasons.get(r.id), starts.get(r.id))
                    for r in seen
                    if (r.wait_reason != reasons.get(r.id) or r.estimated_start != starts.get(r.id))
                    and r.id not in placed
                    and r.id not in holds.failed
                ],
            )
            if result.blocked_by is not None:
                # the jobs behind the blocked one were not looked at: they wait behind it, for no reason of
                # their own
                s.execute(
                    update(JobRow)
                    .where(
                        JobRow.state.in_(QUEUE_STATES),
                        or_(JobRow.wait_reason.is_not(None), JobRow.estimated_start.is_not(None)),
                        _behind(seen[-1]),
                    )
                    .values(wait_reason=None, estimated_start=None)
                    .execution_options(synchronize_session=False)
                )
            if result.preemptions:
                self._preempt(s, result, now)
            # ``pinned`` keeps the tenant and code rows the workloads read in the identity map until the end
            jobs, pinned = self._load_for_placement(s, [job_id for job_id, _ in result.placements])
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
                # a tenant without a guarantee borrows all it uses: no event says so for every job
                lim = limits.get(job.tenant_id)
                borrowing = job_id in result.borrowing and lim is not None and lim.guaranteed
                workloads.append(self._place(s, job, gpus, now, attempts, events, replicas, got, borrowing))
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

    def _preempt(self, s: Session, result: Plan, now: datetime) -> None:
        """Ask for the plan's preemptions: each victim's row gets ``preempt_requested`` and an event naming the
        job it makes room for; the preemptor an event too (once: a victim already being stopped is skipped).
        Each names the other job only when both are of the same tenant (``TenantView``)."""
        ids = sorted({p.job_id for p in result.preemptions} | {p.by for p in result.preemptions})
        rows = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(ids)).with_for_update())}
        asked = False
        for p in result.preemptions:
            victim, by = rows.get(p.job_id), rows.get(p.by)
            if victim is None:
                continue
            by_name = by.name if by is not None and by.tenant_id == victim.tenant_id else OTHER_JOB
            detail = PREEMPTION_WHY.get(p.reason)  # the planner's message names the preemptor by id: not shown
            why = f"preempted by {by_name} ({p.reason})" + (f": {detail}" if detail else "")
            if not job_states.request_preemption(s, victim, why, at=now):
                continue
            asked = True
            if p.reason == "defrag":
                victim.reclaiming = True  # moved, not evicted: considered first once it is queued again
            if by is not None:
                by.reclaiming = True  # what its victims free is its own: the planner considers it first
                what = "reclaiming its tenant's guarantee" if p.reason == "reclaim" else f"preemption ({p.reason})"
                whom = f"job {victim.name}" if victim.tenant_id == by.tenant_id else OTHER_JOB
                job_states.note(s, by, f"{what}: stopping {whom} to make room", at=now)
        if asked:
            self.p.wake()  # the supervision stops them at its next pass

    def _load_for_placement(self, s: Session, job_ids: list[str]) -> tuple[dict[str, JobRow], list[object]]:
        """The jobs to place, locked, in a few queries, and their tenant and code rows, for ``workloads.build``
        to find in the identity map (``s.get``) with no query. A query there would autoflush: each placed job's
        UPDATE would go alone, one round trip per job, instead of all of them in one flush at commit.

        The caller holds the second list for as long as it builds workloads: the identity map references rows
        weakly, and a row nothing else references is dropped from it at once."""
        jobs: dict[str, JobRow] = {}
        for lo in range(0, len(job_ids), 500):
            q = select(JobRow).where(JobRow.id.in_(job_ids[lo : lo + 500])).with_for_update()
            jobs.update((j.id, j) for j in s.scalars(q))
        tenant_ids = sorted({j.tenant_id for j in jobs.values()})
        pinned: list[object] = []
        pinned.extend(s.scalars(select(TenantRow).where(TenantRow.id.in_(tenant_ids))))  # their sandbox slots
        code_ids = sorted({j.code_id for j in jobs.values() if j.code_id})
        for lo in range(0, len(code_ids), 500):
            pinned.extend(s.scalars(select(CodeRow).where(CodeRow.id.in_(code_ids[lo : lo + 500]))))
        return jobs, pinned

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
        borrowing: bool = False,
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
        job.reclaiming = False
        resumed = ""
        if job.preempt_reason is not None:  # the first attempt after a preemption
            resumed = f"resumed after preemption {job.preemptions}: "
            job.preempt_reason = None
        job_states.transition(
            s,
            job,
            JobState.STARTING,
            f"{resumed}attempt {job.attempt} placed on {self.p.inventory.host}{where}",
            at=now,
            events=events,
        )
        for column in _PLACED_COLUMNS:
            flag_modified(job, column)
        if borrowing:
            events.append(
                {
                    "job_id": job.id,
                    "tenant_id": job.tenant_id,
                    "time": now,
                    "from_state": JobState.STARTING.value,
                    "to_state": JobState.STARTING.value,
                    "reason": "borrowing idle capacity beyond its tenant's guarantee: it may be preempted when the "
                    "lenders need it back",
                    "attempt": job.attempt,
                }
            )
        return handle, workload
