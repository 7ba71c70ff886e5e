"""The leadership row: the epoch (fencing token) of the scheduler leader.

One row, id 1, created by the first leader. Only ``control/leader.py`` calls these, inside its own
transactions; and, on PostgreSQL, the advisory lock it is elected by and the sessions it ends at a takeover.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from dlcloud.store.rows import LeadershipRow

ROW_ID = 1
# sessions in a fenced transaction: FOR SHARE on the leadership row holds ROW SHARE on its table
_FENCED_SESSIONS = text(
    "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'relation' AND relation = 'leadership'::regclass"
    " AND mode = 'RowShareLock' AND granted AND pid <> pg_backend_pid()"
)
# pg_locks shows a bigint advisory key as classid (high 32 bits), objid (low 32 bits), objsubid 1
_HOLDS_LOCK = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
    " AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1)"
)


def take_next_epoch(s: Session, holder: str, now: datetime) -> int:
    """Make ``holder`` the leader of the next epoch; returns that epoch. The row lock makes a concurrent
    fenced transaction of the former leader finish first (PostgreSQL; SQLite serialises writers anyway)."""
    row = s.get(LeadershipRow, ROW_ID, with_for_update=True)
    if row is None:
        row = LeadershipRow(id=ROW_ID, epoch=1, holder=holder, acquired_at=now)
        s.add(row)
    else:
        row.epoch += 1
        row.holder, row.acquired_at = holder, now
    s.flush()
    return row.epoch


def current_epoch(s: Session) -> int | None:
    """The epoch, share-locked until the transaction ends (PostgreSQL), so no new leader can take the next
    one while a write checked against it is still open; None before the first leader."""
    q = select(LeadershipRow.epoch).where(LeadershipRow.id == ROW_ID).with_for_update(read=True)
    return s.scalar(q)


def get_leadership(s: Session) -> LeadershipRow | None:
    return s.get(LeadershipRow, ROW_ID)


# -- PostgreSQL: the lock and the sessions of a deposed leader ----------------------------------------------


def try_advisory_lock(conn: Connection, key: int) -> bool:
    """Take the session-level advisory lock ``key`` on ``conn`` unless another session holds it."""
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())


def holds_advisory_lock(conn: Connection, key: int) -> bool:
    """Whether the session of ``conn`` still holds the advisory lock ``key``."""
    return bool(conn.execute(_HOLDS_LOCK, {"hi": key >> 32, "lo": key & 0xFFFFFFFF}).scalar())


def advisory_unlock(conn: Connection, key: int) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})


def set_lock_timeout(s: Session, milliseconds: int) -> None:
    """How long a lock of this transaction may be waited for before it fails (``lock_not_available``)."""
    s.execute(text(f"SET LOCAL lock_timeout = {int(milliseconds)}"))


def fenced_sessions(conn: Connection) -> list[int]:
    """The other sessions in a fenced transaction (the backend pids that share-lock the leadership row)."""
    return [int(pid) for pid in conn.execute(_FENCED_SESSIONS).scalars()]


def terminate_session(conn: Connection, pid: int) -> None:
    """End the backend ``pid``: its transaction rolls back."""
    conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
