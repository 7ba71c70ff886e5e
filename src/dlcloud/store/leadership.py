"""The leadership row: the epoch (fencing token) of the scheduler leader.

One row, id 1, created by the first leader. Only ``control/leader.py`` calls these, inside its own
transactions.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlcloud.store.rows import LeadershipRow

ROW_ID = 1


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
