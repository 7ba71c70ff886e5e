"""Wait reasons: why each queued job waits and when it may start, as the last scheduling pass found it.

Two tables, written by the scheduling pass alone, one pass at a time (its lock), which also assigns their ids:

- ``wait_reasons``: one text and estimated start as one tenant may read them (the pass's ``TenantView``), shared by
  every queued job of that tenant that waits for exactly that;
- ``job_waits``: which of them a queued job waits for. None: it waits for nothing specific, or the last pass did
  not look at it (fifo stops at the first job that must wait).

Why shared: most of a pass's texts change together (free GPUs, each tenant's share and place in line, the
reservation's estimated start), for thousands of jobs, while the jobs that share a text stay together. The jobs
keep their row and only the shared text is rewritten (``set_waits``): a pass writes about one row per distinct text,
not one per queued job; an unchanged queue, none.

Invariants: a ``wait_reasons`` row is of one tenant and only that tenant's jobs point to it; reads join it on the
job's tenant too (``WAIT_REASON``, ``ESTIMATED_START`` over ``with_waits``), so a job shows no text written for
another tenant whatever the rows say. A row of a job that left the queue is harmless (reads show waits of queued
jobs only) and goes when the pass sees the job leave, or with its shared row; deleting either row's job or tenant
deletes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import and_, bindparam, delete, insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import FromClause

from dlcloud.store.rows import JobRow, JobWaitRow, WaitReasonRow

Wait = tuple[str, str | None, datetime | None]  # (tenant id, reason, estimated start)

_jobs, _reasons, _job_waits = JobRow.__table__, WaitReasonRow.__table__, JobWaitRow.__table__
WAIT_REASON = _reasons.c.reason.label("wait_reason")
ESTIMATED_START = _reasons.c.estimated_start.label("estimated_start")


def with_waits(joined: FromClause) -> Any:
    """``joined`` (the jobs table, or a join that starts with it) joined with each job's wait: select
    ``WAIT_REASON`` and ``ESTIMATED_START`` (None where it has none)."""
    return joined.outerjoin(_job_waits, _job_waits.c.job_id == _jobs.c.id).outerjoin(
        _reasons, and_(_reasons.c.id == _job_waits.c.wait_id, _reasons.c.tenant_id == _jobs.c.tenant_id)
    )


def read_waits(conn: Connection) -> dict[int, Wait]:
    """Every shared wait by id."""
    q = select(_reasons.c.id, _reasons.c.tenant_id, _reasons.c.reason, _reasons.c.estimated_start)
    return {i: (t, r, st) for i, t, r, st in conn.execute(q)}


_MOVE = update(JobWaitRow).where(JobWaitRow.job_id == bindparam("j")).values(wait_id=bindparam("w"))
# PostgreSQL: the moves as one statement over two arrays instead of an executemany (one UPDATE a job, each executed
# apart by the server): a placing pass of bench/scheduler.py moves ~550 jobs' waits, 21-24 -> 15-17 ms
_MOVE_ALL = text(
    f"UPDATE {JobWaitRow.__tablename__} AS w SET wait_id = m.wait_id "
    "FROM unnest(CAST(:jobs AS VARCHAR[]), CAST(:waits AS INTEGER[])) AS m(job_id, wait_id) "
    "WHERE w.job_id = m.job_id"
)
MOVE_ALL_MIN = 16
_REWRITE = (
    update(WaitReasonRow)
    .where(WaitReasonRow.id == bindparam("i"))
    .values(tenant_id=bindparam("t"), reason=bindparam("r"), estimated_start=bindparam("s"))
)


def set_waits(
    conn: Connection,
    shared: dict[int, Wait],
    waiting: Mapping[Wait, Sequence[tuple[str, int | None]]],
    gone: Collection[str] = (),
) -> None:
    """Record the waits of a pass.

    Args:
        shared: ``read_waits`` as read in this transaction.
        waiting: each (tenant id, reason, estimated start) that queued jobs of that tenant wait for, with those jobs:
            (job id, its wait id as read in this transaction); every queued job the pass looked at that waits for
            something specific, each once.
        gone: jobs that no longer wait (placed, failed, left the queue, no longer held back): their wait is deleted.

    Each (tenant, reason, start) takes the shared row most of its jobs already point to (one with that text already
    counts one more), else one of its tenant's that no job takes any more, rewritten if its text differs, else a new
    one; the jobs pointing elsewhere move to it, and the shared rows no job takes are deleted, with the waits of the
    jobs the pass did not look at that still point to them."""
    having = {wait: i for i, wait in shared.items()}
    taken: set[int] = set()
    next_id = max(shared, default=0) + 1
    new: list[dict[str, Any]] = []
    rewrite: list[dict[str, Any]] = []
    moves: list[dict[str, Any]] = []
    joins: list[dict[str, Any]] = []
    homeless: list[tuple[Wait, Sequence[tuple[str, int | None]]]] = []

    def point(wait_id: int, members: Sequence[tuple[str, int | None]]) -> None:
        for job_id, current in members:
            if current is None:
                joins.append({"job_id": job_id, "wait_id": wait_id})
            elif current != wait_id:
                moves.append({"j": job_id, "w": wait_id})

    for wait, members in sorted(waiting.items(), key=lambda g: -len(g[1])):  # the largest choose first
        pointing = Counter(map(itemgetter(1), members))  # most often one id: the jobs stay together
        votes = Counter({c: n for c, n in pointing.items() if c is not None and c in shared and c not in taken})
        same = having.get(wait)
        if same is not None and same not in taken:
            votes[same] += 1  # its text is right already: one row less to write
        if not votes:
            homeless.append((wait, members))
            continue
        wait_id = max(votes, key=lambda i: (votes[i], -i))
        if shared[wait_id] != wait:
            rewrite.append({"i": wait_id, "t": wait[0], "r": wait[1], "s": wait[2]})
        taken.add(wait_id)
        if len(pointing) > 1 or wait_id not in pointing:  # else they all point to it already
            point(wait_id, members)
    # the others take a row of their tenant that no job takes any more, rewritten, else a new one
    spare: dict[str, list[int]] = {}
    for i in sorted(shared.keys() - taken, reverse=True):
        spare.setdefault(shared[i][0], []).append(i)
    for wait, members in homeless:
        if spare.get(wait[0]):
            wait_id = spare[wait[0]].pop()
            rewrite.append({"i": wait_id, "t": wait[0], "r": wait[1], "s": wait[2]})
        else:
            wait_id, next_id = next_id, next_id + 1
            new.append({"id": wait_id, "tenant_id": wait[0], "reason": wait[1], "estimated_start": wait[2]})
        taken.add(wait_id)
        point(wait_id, members)
    if new:
        conn.execute(insert(WaitReasonRow), new)
    if rewrite:
        conn.execute(_REWRITE, rewrite)
    if len(moves) >= MOVE_ALL_MIN and conn.dialect.name == "postgresql":
        conn.execute(_MOVE_ALL, {"jobs": [m["j"] for m in moves], "waits": [m["w"] for m in moves]})
    elif moves:
        conn.execute(_MOVE, moves)
    if joins:
        conn.execute(insert(JobWaitRow), joins)
    clear = list(gone)
    for lo in range(0, len(clear), 5000):
        conn.execute(delete(JobWaitRow).where(JobWaitRow.job_id.in_(clear[lo : lo + 5000])))
    unused = sorted(shared.keys() - taken)
    if unused:  # with the waits (ON DELETE CASCADE) of jobs that left the queue or that the pass did not look at
        conn.execute(delete(WaitReasonRow).where(WaitReasonRow.id.in_(unused)))


def clear_waits(conn: Connection, job_ids: Any) -> None:
    """Delete the waits of the jobs ``job_ids`` (a subquery of job ids) selects."""
    conn.execute(delete(JobWaitRow).where(JobWaitRow.job_id.in_(job_ids)))
