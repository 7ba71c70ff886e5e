"""The queue snapshot: what the scheduling pass reads of the queued jobs (control/queue_cache.py keeps it).

The queue's columns are read by position (a Row's attributes cost a lookup each), in two groups: those fixed at
submit (nothing writes them after, store/rows.py JobRow) and those that change while a job waits. A whole read
(every policy but fifo) reads the changing ones and the job's wait of every queued job in one query
(``read_changing``), and the fixed ones only of the jobs the cache does not hold yet (``read_fixed``); fifo's lazy
read reads them all at once, a chunk at a time in QUEUE_ORDER (``read_chunk``).

The changing ones are the last columns of the queue's index (``ix_jobs_queue``, store/rows.py): a whole read reads
the index alone, not the ~1 KB rows. ``hold_gpus`` is not in it (a JSON column has no B-tree order on PostgreSQL):
it is set only with ``reclaiming`` (a moved job, as it leaves the queue) and both are cleared as the job is placed,
so a whole read reads it of the reclaiming jobs alone, in a second query (``read_holds``).

Values in ``UNCONVERTED`` are returned as the driver gives them; the caller converts them only for a row that
changed (``result_converters``): converting datetimes of each of 10,000 rows, every pass, was most of reading the
queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, select, type_coerce
from sqlalchemy.engine import Connection
from sqlalchemy.types import NULLTYPE

from dlcloud.schemas.environments import EnvironmentState
from dlcloud.store import waits
from dlcloud.store.jobs import QUEUE_STATES
from dlcloud.store.rows import EnvironmentBuildRow, JobRow, JobWaitRow

QUEUE_ORDER = (JobRow.priority.desc(), JobRow.created_at, JobRow.id)
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
CHANGING = (JobRow.priority, JobRow.not_before, JobRow.attained_gpu_seconds, JobRow.reclaiming)
MAX_CHUNK = 16_384  # queue rows read by one query (fifo)
_MAX_IDS = 2_000  # ids in one query's IN list
UNCONVERTED = ("not_before", "created_at", "replica_groups", "hold_gpus")


def _as_read_column(c: Any) -> Any:
    return type_coerce(c, NULLTYPE).label(c.key) if c.key in UNCONVERTED else c


QUEUED = JobRow.state.in_(QUEUE_STATES)
_WITH_WAIT = JobRow.__table__.outerjoin(JobWaitRow, JobWaitRow.job_id == JobRow.id)
# whole: (id, wait id, *changing), (id, hold, turn, hold until) of the reclaiming jobs, then (id, *fixed) of the jobs
# not held; fifo: (id, wait id, *fixed, *changing, hold, turn, hold until)
QUEUE_CHANGING = select(JobRow.id, JobWaitRow.wait_id, *map(_as_read_column, CHANGING)).select_from(_WITH_WAIT)
QUEUE_CHANGING = QUEUE_CHANGING.where(QUEUED)
_QUEUE_HOLDS = select(JobRow.id, _as_read_column(JobRow.hold_gpus), JobRow.turn_seconds, JobRow.hold_until)
_QUEUE_HOLDS = _QUEUE_HOLDS.where(QUEUED, JobRow.reclaiming)
_QUEUE_FIXED = select(JobRow.id, *map(_as_read_column, FIXED_AT_SUBMIT))
_QUEUE = select(
    JobRow.id,
    JobWaitRow.wait_id,
    *map(_as_read_column, (*FIXED_AT_SUBMIT, *CHANGING, JobRow.hold_gpus)),
    JobRow.turn_seconds,
    JobRow.hold_until,
)
_QUEUE = _QUEUE.select_from(_WITH_WAIT).where(QUEUED)
# the parts of a ``read_chunk`` row: (id, wait id, *FIXED, *CHANGED)
FIXED = slice(2, 2 + len(FIXED_AT_SUBMIT))
CHANGED = slice(2 + len(FIXED_AT_SUBMIT), None)


def _as_read(value: Any) -> Any:
    return value


def result_converters(conn: Connection) -> dict[str, Callable[[Any], Any]]:
    """What SQLAlchemy would do to each ``UNCONVERTED`` value (a UTCDateTime's, JSON's conversion) on ``conn``."""
    d = conn.dialect
    return {
        c.key: c.type.dialect_impl(d).result_processor(d, None) or _as_read
        for c in (*FIXED_AT_SUBMIT, *CHANGING, JobRow.hold_gpus)
        if c.key in UNCONVERTED
    }


def behind(priority: int, created_at: datetime | None, job_id: str) -> ColumnElement[bool]:
    """Jobs after the job of ``priority``, ``created_at`` and ``job_id`` in QUEUE_ORDER."""
    return or_(
        JobRow.priority < priority,
        and_(
            JobRow.priority == priority,
            or_(JobRow.created_at > created_at, and_(JobRow.created_at == created_at, JobRow.id > job_id)),
        ),
    )


def read_changing(conn: Connection) -> Sequence[Any]:
    """(id, wait id, *CHANGING) of every queued job, unordered: one query, the queue's index alone."""
    return conn.execute(QUEUE_CHANGING).all()


def read_holds(conn: Connection) -> dict[str, tuple[Any, ...]]:
    """job id -> (hold GPUs as read, turn seconds, hold until) of the queued jobs that are reclaiming."""
    return {r[0]: tuple(r[1:]) for r in conn.execute(_QUEUE_HOLDS)}


def read_fixed(conn: Connection, job_ids: list[str] | None) -> dict[str, tuple[Any, ...]]:
    """job id -> FIXED_AT_SUBMIT of the queued jobs ``job_ids`` (None: of every queued job, in one scan)."""
    if job_ids is None:
        return {r[0]: r[1:] for r in conn.execute(_QUEUE_FIXED.where(QUEUED))}
    fixed: dict[str, tuple[Any, ...]] = {}
    for lo in range(0, len(job_ids), _MAX_IDS):
        q = _QUEUE_FIXED.where(JobRow.id.in_(job_ids[lo : lo + _MAX_IDS]))
        fixed.update((r[0], r[1:]) for r in conn.execute(q))
    return fixed


def read_chunk(conn: Connection, after: tuple[int, datetime | None, str] | None, size: int) -> Sequence[Any]:
    """At most ``size`` queued jobs in QUEUE_ORDER, after the job (priority, created_at, id) ``after`` (None: from
    the first): (id, wait id, *FIXED_AT_SUBMIT, *CHANGING, hold GPUs, turn seconds, hold until) each."""
    q = _QUEUE if after is None else _QUEUE.where(behind(*after))
    return conn.execute(q.order_by(*QUEUE_ORDER).limit(size)).all()


def clear_waits_behind(conn: Connection, priority: int, created_at: datetime | None, job_id: str) -> None:
    """Delete the waits of the queued jobs after the job (priority, created_at, id) in QUEUE_ORDER."""
    waits.clear_waits(conn, select(JobRow.id).where(QUEUED, behind(priority, created_at, job_id)))


def builds_not_ready(conn: Connection) -> dict[str, tuple[str, str | None]]:
    """environment spec hash -> (state, error) of every environment build that is not READY."""
    q = select(EnvironmentBuildRow.spec_hash, EnvironmentBuildRow.state, EnvironmentBuildRow.error)
    return {h: (st, e) for h, st, e in conn.execute(q.where(EnvironmentBuildRow.state != EnvironmentState.READY.value))}
