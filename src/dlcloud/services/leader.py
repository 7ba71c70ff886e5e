"""Leader election for the control loop: one scheduler per database.

PostgreSQL: a session-level advisory lock held on a dedicated connection for the process lifetime.
SQLite: an exclusive ``flock`` on ``<data-dir>/scheduler.lock`` (SQLite databases are local files).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from sqlalchemy import text

from dlcloud.store.db import Database

ADVISORY_LOCK_ID = 0x646C636C6F7564  # "dlcloud"


class Leadership:
    def __init__(self, db: Database, data_dir: Path):
        self.db = db
        self.data_dir = data_dir
        self._conn: Any = None
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self.db.is_sqlite:
            if self._fd is not None:
                return True
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.data_dir / "scheduler.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._fd = fd
            return True
        if self._conn is not None:
            return True
        conn = self.db.engine.connect()
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_LOCK_ID}).scalar()
        conn.commit()
        if got:
            self._conn = conn
            return True
        conn.close()
        return False

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_ID})
            self._conn.commit()
            self._conn.close()
            self._conn = None
