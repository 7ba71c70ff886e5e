"""The queue as the scheduling pass reads it: each queued job's QueuedJob, kept from pass to pass (``QueueCache``),
and the jobs held back by their environment's build (``EnvironmentHolds``). The SQL is store/queue.py's.

The pass reads the queue in QUEUE_ORDER: whole (every policy but fifo: one query, sorted here), or lazily for fifo,
which stops at the first job that does not fit. A row's QueuedJob is reused while the row's values are the same, so
an idle pass over a long queue builds none and converts no datetime.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from sqlalchemy.engine import Connection

from dlcloud.scheduler.planner import GroupDemand, QueuedJob
from dlcloud.schemas.environments import EnvironmentState
from dlcloud.store import queue as store


class EnvironmentHolds:
    """Queued jobs whose environment is not READY: held while it builds, failed when its build failed.
    The builds are read once per pass, and only when a job in the queue runs in a built environment."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.failed: dict[str, str] = {}  # job id -> the reason it fails
        self._builds: dict[str, tuple[str, str | None]] | None = None

    def reason(self, job_id: str, environment: str | None, environment_hash: str) -> str | None:
        if self._builds is None:
            self._builds = store.builds_not_ready(self.conn)
        state, error = self._builds.get(environment_hash, (EnvironmentState.READY.value, None))
        if state == EnvironmentState.FAILED.value:
            self.failed[job_id] = f"environment {environment!r} failed to build: {error}"
            return f"environment {environment!r} failed to build"
        return None if state == EnvironmentState.READY.value else f"environment {environment!r} is building"


@dataclass(slots=True)
class Queued:
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
        self._rows: dict[str, Queued] = {}
        self._convert: dict[str, Callable[[Any], Any]] | None = None  # column -> the dialect's result conversion
        self.complete = False  # the last read reached the end of the queue

    def __len__(self) -> int:
        return len(self._rows)

    def read(
        self, conn: Connection, seen: list[Queued], holds: EnvironmentHolds, *, whole: bool
    ) -> Iterator[QueuedJob]:
        """The queue in QUEUE_ORDER. ``whole`` (a policy that reads it all): in one query, unordered, sorted here (the
        database's sort of the whole queue cost more than the rest of its read); else lazily, in growing chunks of at
        most ``store.MAX_CHUNK`` rows: a pass that stops at the first job that must wait reads one small chunk, not
        the whole queue. Rows handed out are appended to ``seen``."""
        if self._convert is None:
            self._convert = store.result_converters(conn)
        self.complete = False
        rows = self._whole(conn) if whole else self._lazily(conn, seen)
        for queued in rows:
            if whole:
                seen.append(queued)
            environment_hash, environment = queued.fixed[0], queued.fixed[1]
            held_by = None if environment_hash is None else holds.reason(queued.job.id, environment, environment_hash)
            yield queued.job if held_by is None else replace(queued.job, held_by=held_by)
        self.complete = True

    def _whole(self, conn: Connection) -> list[Queued]:
        before = self._rows
        rows = store.read_changing(conn)
        holds = store.read_holds(conn) if any(row[-1] for row in rows) else {}
        missing = [row[0] for row in rows if row[0] not in before]
        # most of the queue (the first pass): one scan, no list of ids
        fixed = store.read_fixed(conn, None if len(missing) > len(rows) // 2 else missing)
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

    def _lazily(self, conn: Connection, seen: list[Queued]) -> Iterator[Queued]:
        before = self._rows
        size = 512
        after: QueuedJob | None = None
        while True:
            rows = store.read_chunk(
                conn, None if after is None else (after.priority, after.submitted_at, after.id), size
            )
            for row in rows:
                job_id, fixed, changing = row[0], row[store.FIXED], row[store.CHANGED]
                queued = before.get(job_id)
                if queued is None or queued.changing != changing or queued.fixed != fixed:
                    queued = self._build(job_id, fixed, changing)
                queued.wait_id = row[1]
                seen.append(queued)
                yield queued
            if len(rows) < size:
                return
            after = seen[-1].job
            size = min(size * 4, store.MAX_CHUNK)

    def keep(self, seen: list[Queued], leaving: Container[str] = ()) -> list[str]:
        """Keep the rows of ``seen`` (the last pass's) but those of the jobs in ``leaving`` (it places or fails
        them), drop every other. Returns the jobs dropped that had a wait as last read: they no longer wait."""
        before = self._rows
        self._rows = {queued.job.id: queued for queued in seen if queued.job.id not in leaving}
        gone = {q.job.id for q in before.values() if q.wait_id is not None and q.job.id not in self._rows}
        gone.update(q.job.id for q in seen if q.wait_id is not None and q.job.id in leaving)
        return sorted(gone)

    def _build(self, job_id: str, fixed: tuple[Any, ...], changing: tuple[Any, ...]) -> Queued:
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
        return Queued(tuple(fixed), tuple(changing), job, (-priority, created_at, job_id))
