"""The scheduling pass: places queued jobs and records their new attempts, in one write transaction.

The pass reads the queue (in QUEUE_ORDER: whole, or lazily for fifo; ``QueueCache`` keeps each row's QueuedJob
from pass to pass while the row stays the same), the live attempts (``Held``, with what the policies weigh:
priority, submit and start times, preemptibility, declared run time, attained GPU-seconds, whether it is already
being stopped) and the tenants' quotas and fair-share terms (``Limits``), plans with ``scheduler.planner`` under
the server's ``PlanConfig`` (``plan_config``), writes the wait reasons and estimated starts (store/waits.py: one row per
tenant and text, shared by the jobs that wait for it; only what changed is written), asks
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
import gc
import itertools
import re
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, and_, func, insert, or_, select, text, type_coerce
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified
from sqlalchemy.types import NULLTYPE

from dlcloud.executors.base import Executor, Workload
from dlcloud.scheduler.attempts import gpu_seconds_in_window, peak_gpus
from dlcloud.scheduler.contract import HOLD_MARGIN_S
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
from dlcloud.store import waits
from dlcloud.store.rows import (
    AttemptRow,
    CodeRow,
    EnvironmentBuildRow,
    JobRow,
    JobWaitRow,
    ReplicaRow,
    TenantRow,
    utcnow,
)

SCHEDULE_LOCK_ID = 0x646C636C6F7565  # PostgreSQL advisory lock: one scheduling pass at a time
# a fenced write transaction of the control loop (ControlLoop._write)
WriteTransaction = Callable[[], contextlib.AbstractContextManager[Session]]


QUEUE_ORDER = (JobRow.priority.desc(), JobRow.created_at, JobRow.id)
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
        turn_window_s=settings.scheduling_turn_window_seconds,
        lend_after_s=settings.scheduling_lend_after_seconds,
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
        JobRow.preemptions,
        JobRow.hold_gpus,
        JobRow.hold_until,
        AttemptRow.turn_until,
    ).outerjoin(JobRow, JobRow.id == AttemptRow.job_id)
    held = []
    for r in conn.execute(q.where(AttemptRow.finished_at.is_(None))):
        gpus = tuple(r.gpus)
        running_s = max(0.0, (now - r.started_at).total_seconds()) if r.started_at is not None else 0.0
        stopping = bool(r.cancel_requested or r.preempt_requested)
        # a moved job's next GPUs are held while it stops (a cancelled one's are not: it does not come back), for
        # at most the server's grace period and a tick (``_preempt``): a job that sets a longer grace period and
        # takes it keeps no GPUs idle
        moving = r.preempt_requested and not r.cancel_requested and r.hold_until is not None and r.hold_until > now
        hold = tuple(r.hold_gpus or ()) if moving else ()
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
                stopping=stopping,
                hold=hold,
                preemptions=r.preemptions or 0,
                turn_until=r.turn_until,
            )
        )
    return held


def _recent_attempts(since: datetime) -> Select[str, int, datetime, datetime | None, datetime | None]:
    """The attempts that count towards usage since ``since``: live, ended since, or placed for a turn that ends
    since. Each term has its index (ix_attempts_live, ix_attempts_turns), so the read does not grow with the
    attempts history; the database counts the GPUs (not Python, from each row's JSON list)."""
    a = AttemptRow
    return select(a.tenant_id, func.json_array_length(a.gpus), a.started_at, a.finished_at, a.turn_until).where(
        or_(a.finished_at.is_(None), a.finished_at > since, a.turn_until > since)
    )


@dataclass
class RecentUsage:
    """What each tenant's attempts held lately (``recent_usage``): None where the pass does not need it."""

    gpu_s: dict[str, float] | None = None  # GPU-seconds over the turn window (``Limits.recent_gpu_s``)
    peak_gpus: dict[str, int] | None = None  # the most GPUs at once over ``lend_after_s`` (``Limits.recent_peak_gpus``)


def recent_usage(conn: Connection, now: datetime, turn_window_s: float, lend_after_s: float) -> RecentUsage:
    """From the live attempts and those that ended within the longer window (0: not needed): each tenant's
    GPU-seconds over the last ``turn_window_s``, each attempt counted from its start or the window's, and the most
    GPUs its attempts held at once over the last ``lend_after_s``."""
    if turn_window_s <= 0 and lend_after_s <= 0:
        return RecentUsage()
    t1 = now.timestamp()
    t0, p0 = t1 - turn_window_s, t1 - lend_after_s
    used: dict[str, float] = {}
    spans: dict[str, list[tuple[int, float, float | None]]] = {}
    for tenant_id, gpus, started_at, finished_at, turn_until in conn.execute(
        _recent_attempts(now - timedelta(seconds=max(turn_window_s, lend_after_s)))
    ):
        if gpus and started_at is not None:
            ended = None if finished_at is None else finished_at.timestamp()
            if turn_window_s > 0:
                turn = None if turn_until is None else turn_until.timestamp()
                seconds = gpu_seconds_in_window(gpus, started_at.timestamp(), ended, turn, t0, t1)
                used[tenant_id] = used.get(tenant_id, 0.0) + seconds
            if lend_after_s > 0:
                spans.setdefault(tenant_id, []).append((gpus, started_at.timestamp(), ended))
    return RecentUsage(
        used if turn_window_s > 0 else None,
        {tid: peak_gpus(xs, p0, t1) for tid, xs in spans.items()} if lend_after_s > 0 else None,
    )


def read_limits(conn: Connection, recent: RecentUsage | None = None) -> dict[str, Limits]:
    """Every tenant's quota (hard caps) and fair-share terms with ``recent_usage`` (None: none, no turns)."""
    gpu_s, peaks = (recent.gpu_s, recent.peak_gpus) if recent is not None else (None, None)
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
            recent_gpu_s=None if gpu_s is None else gpu_s.get(r.id, 0.0),
            recent_peak_gpus=None if peaks is None else peaks.get(r.id, 0),
        )
        for r in conn.execute(q)
    }


def _behind(priority: int, created_at: datetime | None, job_id: str) -> ColumnElement[bool]:
    """Jobs after the job of ``priority``, ``created_at`` and ``job_id`` in QUEUE_ORDER."""
    return or_(
        JobRow.priority < priority,
        and_(
            JobRow.priority == priority,
            or_(JobRow.created_at > created_at, and_(JobRow.created_at == created_at, JobRow.id > job_id)),
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

    def reason(self, job_id: str, environment: str | None, environment_hash: str) -> str | None:
        if self._builds is None:
            q = select(EnvironmentBuildRow.spec_hash, EnvironmentBuildRow.state, EnvironmentBuildRow.error)
            self._builds = {h: (st, e) for h, st, e in self.conn.execute(q.where(EnvironmentBuildRow.state != "READY"))}
        state, error = self._builds.get(environment_hash, ("READY", None))
        if state == "FAILED":
            self.failed[job_id] = f"environment {environment!r} failed to build: {error}"
            return f"environment {environment!r} failed to build"
        return None if state == "READY" else f"environment {environment!r} is building"


# The queue's columns as the pass reads them, by position (a Row's attributes cost a lookup each): those fixed at
# submit (nothing writes them after, store/rows.py JobRow) and those that change while a job waits. A whole read (every
# policy but fifo) reads the changing ones and the job's wait of every queued job, every pass, and the fixed ones only
# of the jobs ``QueueCache`` does not hold yet; fifo's lazy read reads them all at once.
FIXED_AT_SUBMIT = (
    JobRow.environment_hash,  # first: whether the job may be held (the hold is decided per pass)
    JobRow.environment,
    JobRow.tenant_id,
    JobRow.gpus,
    JobRow.cpus,
    JobRow.memory,
    JobRow.gpu_type,
    JobRow.created_at,
    JobRow.replica_groups,
    JobRow.preemptible,
    JobRow.max_run_time_seconds,
)
# The changing ones are the last columns of the queue's index (``ix_jobs_queue``, store/rows.py): a whole read reads
# the index alone, not the ~1 KB rows. ``hold_gpus`` is not in it (a JSON column has no B-tree order on PostgreSQL): it
# is set only with ``reclaiming`` (a moved job, as it leaves the queue) and both are cleared as the job is placed, so a
# whole read reads it of the reclaiming jobs alone, in a second query (``_QUEUE_HOLDS``).
_CHANGING = (JobRow.priority, JobRow.not_before, JobRow.attained_gpu_seconds, JobRow.reclaiming)
_MAX_CHUNK = 16_384  # queue rows read by one query (fifo)
_MAX_IDS = 2_000  # ids in one query's IN list
# read as the driver returns them and converted only for a row that changed (``QueueCache``): converting datetimes of
# each of 10,000 rows, every pass, was most of reading the queue
_UNCONVERTED = ("not_before", "created_at", "replica_groups", "hold_gpus")


def _as_read_column(c: Any) -> Any:
    return type_coerce(c, NULLTYPE).label(c.key) if c.key in _UNCONVERTED else c


_QUEUED = JobRow.state.in_(QUEUE_STATES)
_WITH_WAIT = JobRow.__table__.outerjoin(JobWaitRow, JobWaitRow.job_id == JobRow.id)
# whole: (id, wait id, *changing), (id, hold, turn, hold until) of the reclaiming jobs, then (id, *fixed) of the jobs
# not held; fifo: (id, wait id, *fixed, *changing, hold, turn, hold until)
_QUEUE_CHANGING = select(JobRow.id, JobWaitRow.wait_id, *map(_as_read_column, _CHANGING)).select_from(_WITH_WAIT)
_QUEUE_CHANGING = _QUEUE_CHANGING.where(_QUEUED)
_QUEUE_HOLDS = select(JobRow.id, _as_read_column(JobRow.hold_gpus), JobRow.turn_seconds, JobRow.hold_until)
_QUEUE_HOLDS = _QUEUE_HOLDS.where(_QUEUED, JobRow.reclaiming)
_QUEUE_FIXED = select(JobRow.id, *map(_as_read_column, FIXED_AT_SUBMIT))
_QUEUE = select(
    JobRow.id,
    JobWaitRow.wait_id,
    *map(_as_read_column, (*FIXED_AT_SUBMIT, *_CHANGING, JobRow.hold_gpus)),
    JobRow.turn_seconds,
    JobRow.hold_until,
)
_QUEUE = _QUEUE.select_from(_WITH_WAIT).where(_QUEUED)
_FIXED = slice(2, 2 + len(FIXED_AT_SUBMIT))
_CHANGED = slice(2 + len(FIXED_AT_SUBMIT), None)


@dataclass(slots=True)
class _Queued:
    """A queue row as the pass uses it: its QueuedJob (never held: a hold is decided per pass), the row values it was
    built from, its place in QUEUE_ORDER, and the id of its wait (store/waits.py) as last read."""

    fixed: tuple[Any, ...]
    changing: tuple[Any, ...]
    job: QueuedJob
    order: tuple[int, Any, str]  # (-priority, created_at as read, id)
    wait_id: int | None = None


_ORDER = attrgetter("order")


class QueueCache:
    """The queue as QueuedJobs, read by the scheduling passes of one control loop, one pass at a time (the write
    transaction's lock serialises them). Each row's QueuedJob is kept from pass to pass by job id with the row values
    it was built from, and reused while they are the same: an idle pass over a long queue builds none, and converts
    no datetime. It is a memo of the row's values, and the values that may change are read every pass (those fixed
    at submit only once: nothing writes them after), so it stays right whatever changed a row and whoever led in
    between; it keeps the rows the last pass read and no others (``keep``)."""

    def __init__(self) -> None:
        self._rows: dict[str, _Queued] = {}
        self._convert: dict[str, Callable[[Any], Any]] | None = None  # column -> the dialect's result conversion
        self.complete = False  # the last read reached the end of the queue

    def __len__(self) -> int:
        return len(self._rows)

    def read(
        self, conn: Connection, seen: list[_Queued], holds: _EnvironmentHolds, *, whole: bool
    ) -> Iterator[QueuedJob]:
        """The queue in QUEUE_ORDER. ``whole`` (a policy that reads it all): in one query, unordered, sorted here (the
        database's sort of the whole queue cost more than the rest of its read); else lazily, in growing chunks of
        at most ``_MAX_CHUNK`` rows: a pass that stops at the first job that must wait reads one small chunk, not the
        whole queue. Rows handed out are appended to ``seen``."""
        if self._convert is None:  # what SQLAlchemy would do to these values (a UTCDateTime's, JSON's conversion)
            d = conn.dialect
            self._convert = {
                c.key: c.type.dialect_impl(d).result_processor(d, None) or _as_read
                for c in (*FIXED_AT_SUBMIT, *_CHANGING, JobRow.hold_gpus)
                if c.key in _UNCONVERTED
            }
        self.complete = False
        rows = self._whole(conn) if whole else self._lazily(conn, seen)
        for queued in rows:
            if whole:
                seen.append(queued)
            environment_hash, environment = queued.fixed[0], queued.fixed[1]
            held_by = None if environment_hash is None else holds.reason(queued.job.id, environment, environment_hash)
            yield queued.job if held_by is None else replace(queued.job, held_by=held_by)
        self.complete = True

    def _whole(self, conn: Connection) -> list[_Queued]:
        before = self._rows
        rows = conn.execute(_QUEUE_CHANGING).all()
        holds = {r[0]: tuple(r[1:]) for r in conn.execute(_QUEUE_HOLDS)} if any(row[-1] for row in rows) else {}
        missing = [row[0] for row in rows if row[0] not in before]
        fixed: dict[str, tuple[Any, ...]] = {}
        if len(missing) > len(rows) // 2:  # most of the queue (the first pass): one scan, no list of ids
            fixed = {r[0]: r[1:] for r in conn.execute(_QUEUE_FIXED.where(_QUEUED))}
        else:
            for lo in range(0, len(missing), _MAX_IDS):
                q = _QUEUE_FIXED.where(JobRow.id.in_(missing[lo : lo + _MAX_IDS]))
                fixed.update((r[0], r[1:]) for r in conn.execute(q))
        queue = []
        for row in rows:
            job_id = row[0]
            # (priority, not_before, attained, reclaiming[, hold, turn, hold until]): as ``_lazily`` reads it when
            # reclaiming
            changing = (*row[2:], *holds.get(job_id, (None, None, None))) if row[-1] else row[2:]
            queued = before.get(job_id)
            if queued is None:
                values = fixed.get(job_id)
                if values is None:
                    continue  # left the queue between the two reads (PostgreSQL: each reads what is committed)
                queued = self._build(job_id, values, changing)
            elif queued.changing != changing:
                queued = self._build(job_id, queued.fixed, changing)
            queued.wait_id = row[1]
            queue.append(queued)
        queue.sort(key=_ORDER)
        return queue

    def _lazily(self, conn: Connection, seen: list[_Queued]) -> Iterator[_Queued]:
        before = self._rows
        size = 512
        after: QueuedJob | None = None
        while True:
            q = _QUEUE if after is None else _QUEUE.where(_behind(after.priority, after.submitted_at, after.id))
            rows = conn.execute(q.order_by(*QUEUE_ORDER).limit(size)).all()
            for row in rows:
                job_id, fixed, changing = row[0], row[_FIXED], row[_CHANGED]
                queued = before.get(job_id)
                if queued is None or queued.changing != changing or queued.fixed != fixed:
                    queued = self._build(job_id, fixed, changing)
                queued.wait_id = row[1]
                seen.append(queued)
                yield queued
            if len(rows) < size:
                return
            after = seen[-1].job
            size = min(size * 4, _MAX_CHUNK)

    def keep(self, seen: list[_Queued], leaving: Container[str] = ()) -> list[str]:
        """Keep the rows of ``seen`` (the last pass's) but those of the jobs in ``leaving`` (it places or fails
        them), drop every other. Returns the jobs dropped that had a wait as last read: they no longer wait."""
        before = self._rows
        self._rows = {queued.job.id: queued for queued in seen if queued.job.id not in leaving}
        gone = {q.job.id for q in before.values() if q.wait_id is not None and q.job.id not in self._rows}
        gone.update(q.job.id for q in seen if q.wait_id is not None and q.job.id in leaving)
        return sorted(gone)

    def _build(self, job_id: str, fixed: tuple[Any, ...], changing: tuple[Any, ...]) -> _Queued:
        assert self._convert is not None
        convert = self._convert
        _, _, tenant_id, gpus, cpus, memory, gpu_type, created_at, replica_groups, preemptible, max_run_time = fixed
        priority, not_before, attained_gpu_s, reclaiming = changing[:4]
        hold_gpus, turn_s, hold_until = changing[4:7] if len(changing) > 4 and reclaiming else (None, None, None)
        groups = tuple(
            GroupDemand(g["role"], int(g["count"]), int(g["gpus"]), g.get("gpu_type"))
            for g in convert["replica_groups"](replica_groups) or ()
        )
        job = QueuedJob(
            job_id,
            tenant_id,
            gpus,
            cpus,
            memory,
            gpu_type,
            convert["not_before"](not_before),
            None,
            groups,
            priority=priority,
            # kept across preemptions: a preempted job keeps its place
            submitted_at=convert["created_at"](created_at),
            max_run_time_s=max_run_time,
            preemptible=preemptible,
            attained_gpu_s=attained_gpu_s or 0.0,
            reclaiming=bool(reclaiming),
            hold=tuple(convert["hold_gpus"](hold_gpus) or ()),
            hold_until=hold_until,
            turn_s=turn_s,
        )
        return _Queued(tuple(fixed), tuple(changing), job, (-priority, created_at, job_id))


def _as_read(value: Any) -> Any:
    return value


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
                # passes must not interleave (two would place the same job); SQLite's BEGIN IMMEDIATE
                # already serialises them, PostgreSQL needs this transaction-scoped lock
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEDULE_LOCK_ID})
            conn = s.connection()
            seen: list[_Queued] = []  # queue rows the planner looked at, in order
            holds = _EnvironmentHolds(conn)
            # fifo stops at the first job that does not fit: it reads the queue lazily; the others read it whole
            queue = self.queue.read(conn, seen, holds, whole=config.policy != Policy.FIFO)
            first = next(queue, None)
            if first is None:
                if self.queue.keep(seen):  # the last jobs left: no job waits
                    waits.set_waits(conn, waits.read_waits(conn), {})
                return []
            held = read_held(conn, now)
            fair = config.policy == Policy.FAIR_SHARE
            limits = read_limits(
                conn, recent_usage(conn, now, config.turn_window_s, config.lend_after_s) if fair else None
            )
            result = plan(itertools.chain((first,), queue), held, limits, self.p.inventory, now, config)
            placed = {job_id for job_id, _ in result.placements}
            gone = self.queue.keep(seen, leaving=placed | holds.failed.keys())
            shared = waits.read_waits(conn)
            if result.preemptions:
                self._preempt(s, result, now)
            # ``pinned`` keeps the tenant and code rows the workloads read in the identity map until the end
            jobs, pinned = self._load_for_placement(s, [job_id for job_id, _ in result.placements])
            attempts: list[dict] = []
            events: list[dict] = []
            replicas: list[dict] = []
            settings = self.p.settings
            ports = PortAllocator(s, settings.job_port_range_start, settings.job_port_range_end)
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
                turn = result.turns.get(job_id)
                workloads.append(self._place(s, job, gpus, now, attempts, events, replicas, got, borrowing, turn))
            self._write_waits(conn, seen, result, shared, gone, placed, holds.failed, no_ports)
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

    def _write_waits(
        self,
        conn: Connection,
        seen: list[_Queued],
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
            behind = select(JobRow.id).where(_QUEUED, _behind(last.priority, last.submitted_at, last.id))
            waits.clear_waits(conn, behind)

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
                # moved, not evicted: considered first once it is queued again, on the GPUs held for it
                victim.reclaiming = True
                victim.hold_gpus = list(p.move_to) or None
                victim.hold_until = now + timedelta(seconds=self.p.settings.stop_grace_seconds + HOLD_MARGIN_S)
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
        jobs: dict[str, JobRow] = {}
        if not job_ids:
            return jobs, []
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
        turn_until: datetime | None = None,
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
        why = None
        if turn_until is not None:
            why = (
                f"its tenant's turn until {turn_until.isoformat(timespec='seconds')}: larger than what its tenant's "
                "guarantee leaves, which the tenant was short of over the turn window; others may not take these "
                "GPUs back before then"
            )
        elif borrowing:
            why = (
                "borrowing idle capacity beyond its tenant's guarantee: it may be preempted when the lenders need it "
                "back"
            )
        if why is not None:
            events.append(
                {
                    "job_id": job.id,
                    "tenant_id": job.tenant_id,
                    "time": now,
                    "from_state": JobState.STARTING.value,
                    "to_state": JobState.STARTING.value,
                    "reason": why,
                    "attempt": job.attempt,
                }
            )
        return handle, workload
