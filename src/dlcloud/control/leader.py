"""Leader election for the control loop, fenced: one scheduler per database, and a deposed one writes nothing.

The lock: PostgreSQL, a session-level advisory lock held on a dedicated connection; SQLite, an exclusive
``flock`` on ``<data-dir>/scheduler.lock`` (SQLite databases are local files).

The fence: after taking the lock, a leader takes the next *epoch* of the one-row ``leadership`` table in its
own transaction and remembers it. Every write transaction of the control loop and of the environment
builder starts with ``fence``, which reads the epoch (PostgreSQL: ``FOR SHARE``) and raises
``LeadershipLost`` unless it is still ours, so the transaction writes nothing.

Invariants:
- A takeover's epoch update waits for the fenced transactions in flight (PostgreSQL: the share lock;
  SQLite: ``BEGIN IMMEDIATE`` admits one writer), so every write of a former leader is ordered before the
  new epoch, and none after it. Losing the lock session cannot let two leaders' writes interleave, even if
  the former leader has not noticed yet. On PostgreSQL a takeover waits ``TAKEOVER_WAIT_MS`` for them, then
  terminates their sessions (a frozen former leader must not hold the new one back; they roll back).
- ``verify`` runs at the start of every pass: the lock session must still hold the advisory lock (one
  query on it), or the locked file must still be the one at ``scheduler.lock``. Once lost (there, or by a
  refused ``fence``), a ``Leadership`` stays lost until ``release``; the loop then stops leading, releases,
  and competes for the lock again like any follower.
- What runs outside the database (detached job processes) is not stopped by losing leadership; the next
  leader re-adopts it from the executor's records.

Vocabulary: *epoch*, the fencing token, grows by one with every leader; *holder*, ``<host>:<pid>``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from dlcloud.store import leadership as store
from dlcloud.store.db import Database
from dlcloud.store.rows import utcnow

log = logging.getLogger(__name__)
ADVISORY_LOCK_ID = 0x646C636C6F7564  # "dlcloud"
TAKEOVER_WAIT_MS = 2000  # how long a new leader lets the deposed one's fenced transactions finish


class LeadershipLost(Exception):
    """This process no longer leads the scheduler: its lock is gone or a newer leader took the epoch."""


class Leadership:
    def __init__(self, db: Database, data_dir: Path, holder: str | None = None):
        self.db = db
        self.data_dir = data_dir
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.epoch: int | None = None  # set while this process leads
        self._lost: str | None = None  # why this leadership ended, until released
        self._conn: Any = None
        self._fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "scheduler.lock"

    @property
    def leading(self) -> bool:
        return self.epoch is not None and self._lost is None

    def try_acquire(self) -> bool:
        """Take the lock and the next epoch; False when another process holds the lock."""
        if self.epoch is not None:
            return self._lost is None
        if not self._lock():
            return False
        try:
            epoch = self._take_epoch()
        except BaseException:
            self._unlock()
            raise
        self.epoch, self._lost = epoch, None
        log.info("this process leads the scheduler (epoch %d, %s)", epoch, self.holder)
        return True

    def verify(self) -> None:
        """Raise ``LeadershipLost`` unless this process still holds the lock (cheap: one query or two stats)."""
        if self._lost is not None:
            raise LeadershipLost(self._lost)
        if self.epoch is None:
            raise LeadershipLost("this process does not lead the scheduler")
        if self.db.is_sqlite:
            assert self._fd is not None
            try:
                on_disk = os.stat(self.lock_path)
            except FileNotFoundError:
                self._lose(f"the lock file {self.lock_path} was removed")
            held = os.fstat(self._fd)
            if (on_disk.st_dev, on_disk.st_ino) != (held.st_dev, held.st_ino):
                self._lose(f"the lock file {self.lock_path} was replaced")
            return
        try:
            holds = store.holds_advisory_lock(self._conn, ADVISORY_LOCK_ID)
            self._conn.commit()
        except SQLAlchemyError as exc:
            self._lose(f"the session holding the scheduler lock failed: {exc.__class__.__name__}: {exc}")
        if not holds:
            self._lose("the session holding the scheduler lock no longer holds it")

    def fence(self, s: Session) -> None:
        """First statement of a leader's write transaction: raise ``LeadershipLost`` (the transaction then
        rolls back) unless our epoch is still the current one."""
        epoch = self.epoch
        if epoch is None or self._lost is not None:
            raise LeadershipLost(self._lost or "this process does not lead the scheduler")
        current = store.current_epoch(s)
        if current != epoch:
            self._lose(f"a newer leader took epoch {current} (ours was {epoch})")

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """``db.write()``, fenced."""
        with self.db.write() as s:
            self.fence(s)
            yield s

    def release(self) -> None:
        """Stop leading and let the lock go (safe to call again, and after the lock session died)."""
        if self.epoch is not None:
            log.info("this process no longer leads the scheduler (epoch %d)", self.epoch)
        self.epoch, self._lost = None, None
        self._unlock()

    # -- the lock ----------------------------------------------------------------------------------
    def _take_epoch(self) -> int:
        if self.db.is_sqlite:
            with self.db.write() as s:
                return store.take_next_epoch(s, self.holder, utcnow())
        for _ in range(3):
            try:
                with self.db.write() as s:
                    store.set_lock_timeout(s, TAKEOVER_WAIT_MS)
                    return store.take_next_epoch(s, self.holder, utcnow())
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                    raise
            # fenced transactions of the deposed leader are still open (a frozen process): end them. They
            # roll back, as if it had crashed; it is no longer the leader, so nothing may commit from it.
            with self.db.engine.connect() as conn:
                for pid in store.fenced_sessions(conn):
                    log.warning("ending session %d: a fenced transaction of a deposed leader holds the epoch", pid)
                    store.terminate_session(conn, pid)
                conn.commit()
        raise LeadershipLost("could not take the next epoch: the deposed leader's transactions did not end")

    def _lose(self, why: str) -> NoReturn:
        self._lost = why
        raise LeadershipLost(why)

    def _lock(self) -> bool:
        if self.db.is_sqlite:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._fd = fd
            return True
        conn = self.db.engine.connect()
        try:
            got = store.try_advisory_lock(conn, ADVISORY_LOCK_ID)
            conn.commit()
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        if got:
            self._conn = conn
            return True
        conn.close()
        return False

    def _unlock(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                store.advisory_unlock(conn, ADVISORY_LOCK_ID)
                conn.commit()
            except SQLAlchemyError:  # the session is gone, and its lock with it
                conn.invalidate()
            conn.close()
