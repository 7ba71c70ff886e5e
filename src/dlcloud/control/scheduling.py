"""The scheduling pass: places queued jobs and records their new attempts, in one write transaction.

The pass reads the queue (``queue_cache.QueueCache``: in QUEUE_ORDER, whole or lazily for fifo, each row's QueuedJob
kept from pass to pass while the row stays the same), what the planner weighs besides (``planner_inputs``: the live
attempts, the tenants' quotas and fair-share terms, recent usage), decides with ``scheduler.pass_core`` (the pure core
the trace simulator drives too: the planner under the server's ``PlanConfig``), writes the wait reasons and estimated
starts (store/waits.py: one row per tenant and text, shared by the jobs that wait for it; only what changed is
written), asks for the preemptions the plan chose (``job_states.request_preemption``: the supervision stops those
attempts), and for each placement records the attempt (STARTING) with its ports and replicas and builds its Workload
(``workloads.build``); a placement beyond its tenant's guarantee gets a "borrowing" event. Its SQL is store/queue.py's
and store/scheduling.py's.

Isolation (docs/isolation.md): everything written into a job's row or events goes through ``TenantView`` first
(``tenant_view.py``): a tenant may learn that it waits behind or was preempted by other tenants' work, and why;
never whose.

It starts nothing: the control loop starts the workloads after the transaction commits, so a crash in between
leaves attempts that never launched, which supervision starts (``supervision.py``); nothing is lost and nothing
runs twice.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from dlcloud.control import workloads
from dlcloud.control.planner_inputs import plan_config, read_held, read_limits
from dlcloud.control.ports import PortAllocator
from dlcloud.control.queue_cache import EnvironmentHolds, QueueCache, Queued
from dlcloud.control.tenant_view import OTHER_JOB, TenantView
from dlcloud.executors.base import Executor, Workload
from dlcloud.scheduler import pass_core
from dlcloud.scheduler.planner import PREEMPTION_WHY, Limits, Plan, Policy
from dlcloud.schemas.jobs import JobState
from dlcloud.services import job_states, recipes, replica_states
from dlcloud.services.jobs import QUEUE_STATES
from dlcloud.services.platform import Platform
from dlcloud.store import queue, waits
from dlcloud.store import scheduling as store
from dlcloud.store.rows import JobRow, utcnow

# a fenced write transaction of the control loop (ControlLoop._write)
WriteTransaction = Callable[[], contextlib.AbstractContextManager[Session]]

# what placing a job may change in its row, written for every placed job whether it changed or not: the flush at
# commit sends the UPDATEs of one column set as one executemany (one round trip on PostgreSQL), and jobs whose
# changes differ (a wait reason to clear or not, ...) would split it into one per run of alike jobs
_PLACED_COLUMNS = (
    "state",
    "reason",
    "attempt",
    "reclaiming",
    "preempt_reason",
    "hold_gpus",
    "hold_until",
    "turn_seconds",
)


@dataclass
class _Placed:
    """The rows a pass's placements add, for one bulk insert each at its end."""

    attempts: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the length of a pass. A pass allocates ~10 objects per queued job
    (its row as read, the planner's per-job state) that reference counting frees as the pass ends; the collections
    their allocation set off promoted them, alive, to the oldest generation, whose full collections then walked them
    and every cached QueuedJob: a quarter of an idle pass's time and most of its p99 (bench/scheduler.py). Cycles made
    meanwhile are collected by the first collection after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SchedulingPass:
    """One scheduling pass at a time (``run``), writing through the loop's fenced transactions."""

    def __init__(self, platform: Platform, executor: Executor, write: WriteTransaction) -> None:
        self.p = platform
        self.executor = executor
        self.write = write
        self.queue = QueueCache()

    def run(self) -> list[tuple[str, Workload]]:
        """One pass; returns the (handle, workload) of the attempts it recorded, for the caller to start."""
        with _collector_paused():
            return self._run()

    def _run(self) -> list[tuple[str, Workload]]:
        now = utcnow()
        workloads: list[tuple[str, Workload]] = []
        config = plan_config(self.p.settings)
        with self.write() as s:
            if not self.p.db.is_sqlite:
                store.lock_pass(s)  # passes must not interleave (two would place the same job)
            conn = s.connection()
            seen: list[Queued] = []  # queue rows the planner looked at, in order
            holds = EnvironmentHolds(conn)
            # fifo stops at the first job that does not fit: it reads the queue lazily; the others read it whole
            queue = self.queue.read(conn, seen, holds, whole=config.policy != Policy.FIFO)
            first = next(queue, None)
            if first is None:
                if self.queue.keep(seen):  # the last jobs left: no job waits
                    waits.set_waits(conn, waits.read_waits(conn), {})
                return []
            held = read_held(conn, now)
            limits = read_limits(conn, now, config)
            result = pass_core.decide(itertools.chain((first,), queue), held, limits, self.p.inventory, now, config)
            placed = {job_id for job_id, _ in result.placements}
            gone = self.queue.keep(seen, leaving=placed | holds.failed.keys())
            shared = waits.read_waits(conn)
            if result.preemptions:
                self._preempt(s, result, now)
            rows = _Placed()
            no_ports = self._place_all(s, result, limits, now, rows, workloads)
            self._write_waits(conn, seen, result, shared, gone, placed, holds.failed, no_ports)
            events = rows.events
            if holds.failed:  # their environment failed to build: they can never start
                for job in store.lock_jobs(s, list(holds.failed)).values():
                    if job.state in QUEUE_STATES:
                        job_states.transition(s, job, JobState.FAILED, holds.failed[job.id], at=now, events=events)
            store.insert_attempts(s, rows.attempts, rows.replicas)
            job_states.add_events(s, events)
        return workloads

    def _place_all(
        self,
        s: Session,
        result: Plan,
        limits: dict[str, Limits],
        now: datetime,
        rows: _Placed,
        workloads: list[tuple[str, Workload]],
    ) -> dict[str, str]:
        """Record an attempt of each job the plan placed (``_place``) that is still queued and gets its ports;
        their workloads go to ``workloads``. Returns the jobs placed by the plan but left waiting, with why."""
        # ``pinned`` keeps the tenant and code rows the workloads read in the identity map until the end
        jobs, pinned = self._load_for_placement(s, [job_id for job_id, _ in result.placements])
        settings = self.p.settings
        low, high = settings.job_port_range_start, settings.job_port_range_end
        ports = PortAllocator(s, low, high, is_free=self.executor.port_is_free)
        no_ports: dict[str, str] = {}  # placed by the plan, left waiting: why
        for job_id, gpus in result.placements:
            job = jobs.get(job_id)
            if job is None or job.state not in QUEUE_STATES:
                continue  # cancelled since the queue was read (PostgreSQL); its resources stay free
            needed = recipes.ports_needed(job.spec, job.replica_groups)
            got = ports.allocate(job.id, job.attempt + 1, needed, now)
            if got is None:
                no_ports[job_id] = (
                    f"waiting for {needed} free port(s) in {settings.job_port_range_start}-"
                    f"{settings.job_port_range_end}"
                )
                continue
            # a tenant without a guarantee borrows all it uses: no event says so for every job
            lim = limits.get(job.tenant_id)
            borrowing = job_id in result.borrowing and lim is not None and lim.guaranteed
            workloads.append(self._place(s, job, gpus, now, rows, got, borrowing, result.turns.get(job_id)))
        del pinned  # held until every workload above was built
        return no_ports

    def _write_waits(
        self,
        conn: Connection,
        seen: list[Queued],
        result: Plan,
        shared: dict[int, waits.Wait],
        gone: list[str],
        placed: Container[str],
        failed: Container[str],
        no_ports: dict[str, str],
    ) -> None:
        """Record why each job the planner looked at waits, as its tenant may read it (``TenantView``), and when it
        may start; a job no longer held back by something specific has none, nor has a job that leaves the queue
        (``gone``) or that the planner did not look at."""
        reasons, starts = result.wait_reasons, result.estimated_start
        # the planner's texts, each with the jobs that wait for it (most of a tenant's jobs share a few texts) ...
        planned: dict[waits.Wait, list[tuple[str, int | None]]] = {}
        clear = [job_id for job_id in gone if job_id not in no_ports]
        reason: str | None
        for queued in seen:
            job_id = queued.job.id
            if job_id in placed:
                if job_id not in no_ports:
                    continue
                reason, start = no_ports[job_id], None
            elif job_id in failed:
                continue
            else:
                reason, start = reasons.get(job_id), starts.get(job_id)
            if reason is None and start is None:
                if queued.wait_id is not None:
                    clear.append(job_id)
                continue
            planned.setdefault((queued.job.tenant_id, reason, start), []).append((job_id, queued.wait_id))
        # ... as their tenant may read it: texts that read alike are one
        view = TenantView(conn)
        shown: dict[waits.Wait, list[tuple[str, int | None]]] = {}
        for (tenant_id, reason, start), members in planned.items():
            shown.setdefault((tenant_id, view.text(reason, tenant_id), start), []).extend(members)
        waits.set_waits(conn, shared, shown, clear)
        if not self.queue.complete:
            # the jobs behind the last one the planner looked at (it stopped reading the queue there) wait behind it,
            # for no reason of their own
            last = seen[-1].job
            queue.clear_waits_behind(conn, last.priority, last.submitted_at, last.id)

    def _preempt(self, s: Session, result: Plan, now: datetime) -> None:
        """Ask for the plan's preemptions: each victim's row gets ``preempt_requested`` and an event naming the
        job it makes room for; the preemptor an event too (once: a victim already being stopped is skipped).
        Each names the other job only when both are of the same tenant (``TenantView``)."""
        ids = sorted({p.job_id for p in result.preemptions} | {p.by for p in result.preemptions})
        rows = store.lock_jobs(s, ids)
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
            marks = pass_core.moved(p, now, self.p.settings.stop_grace_seconds)
            if marks is not None:  # moved, not evicted: considered first once queued again, on the GPUs held for it
                victim.reclaiming = marks.reclaiming
                victim.hold_gpus = list(marks.hold) or None
                victim.hold_until = marks.hold_until
            if by is not None:
                by.reclaiming = True  # what its victims free is its own: the planner considers it first
                if by.id in result.turn_grants:  # the turn starts when it is placed on what they free
                    by.turn_seconds = result.turn_grants[by.id]
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
        if not job_ids:
            return {}, []
        jobs = store.lock_jobs(s, job_ids)
        return jobs, store.load_tenants_and_code(s, jobs.values())  # the tenants' sandbox slots, the code

    def _place(
        self,
        s: Session,
        job: JobRow,
        gpus: tuple[int, ...],
        now: datetime,
        rows: _Placed,
        ports: list[int],
        borrowing: bool = False,
        turn_until: datetime | None = None,
    ) -> tuple[str, Workload]:
        """Record attempt ``job.attempt + 1``: the attempt, replica and event rows go to ``rows`` for one bulk
        insert each."""
        job.attempt += 1
        handle = self.executor.handle(job.tenant_id, job.id, job.attempt)
        workload = workloads.build(self.p, self.executor, s, job, gpus, handle, ports)
        host = self.p.inventory.host
        rows.replicas.extend(
            replica_states.placed(
                job,
                host,
                r.name,
                r.role,
                r.index,
                gpus=list(r.gpus),
                cpus=r.cpus,
                memory=r.memory_bytes,
                ports=list(r.ports),
            )
            for r in workload.replicas
        )
        rows.attempts.append(
            {
                "job_id": job.id,
                "tenant_id": job.tenant_id,
                "user_id": job.user_id,
                "number": job.attempt,
                "host": host,
                "gpus": list(gpus),
                "cpus": job.cpus,
                "memory": job.memory,
                "handle": handle,
                "started_at": now,
                "ports": list(ports) or None,
                "turn_until": turn_until,
            }
        )
        where = f" on GPU(s) {','.join(map(str, gpus))}" if gpus else ""
        if workload.replicas:
            where = f" as a gang of {len(workload.replicas)} replica(s){where}"
        job.reclaiming = False
        job.hold_gpus = job.hold_until = None
        job.turn_seconds = None
        resumed = ""
        if job.preempt_reason is not None:  # the first attempt after a preemption
            resumed = f"resumed after preemption {job.preemptions}: "
            job.preempt_reason = None
        why = f"{resumed}attempt {job.attempt} placed on {host}{where}"
        job_states.transition(s, job, JobState.STARTING, why, at=now, events=rows.events)
        store.write_columns(job, _PLACED_COLUMNS)
        terms = _placement_terms(borrowing, turn_until)
        if terms is not None:
            rows.events.append(
                {
                    "job_id": job.id,
                    "tenant_id": job.tenant_id,
                    "time": now,
                    "from_state": JobState.STARTING.value,
                    "to_state": JobState.STARTING.value,
                    "reason": terms,
                    "attempt": job.attempt,
                }
            )
        return handle, workload


def _placement_terms(borrowing: bool, turn_until: datetime | None) -> str | None:
    """The event that says on what terms a job was placed: on its tenant's turn, or borrowing; None for neither."""
    if turn_until is not None:
        return (
            f"its tenant's turn until {turn_until.isoformat(timespec='seconds')}: larger than what its tenant's "
            "guarantee leaves, which the tenant was short of over the turn window; others may not take these "
            "GPUs back before then"
        )
    if borrowing:
        return (
            "borrowing idle capacity beyond its tenant's guarantee: it may be preempted when the lenders need it back"
        )
    return None
