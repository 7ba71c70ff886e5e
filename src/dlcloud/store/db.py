"""Engine, sessions and transactions for SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


class Database:
    """One engine plus read/write session helpers.

    ``write()`` yields a session inside a transaction that commits on success and rolls back on any
    exception, so a failed request leaves the database as it was. On SQLite the transaction begins
    with ``BEGIN IMMEDIATE`` (one writer at a time, no lock upgrades mid-transaction).

    ``read_connection()`` / ``write_connection()`` are the same transactions on a Core connection, for
    hot paths that need no ORM (request authentication, describe). On SQLite the write transactions of
    this process queue on an in-process lock before ``BEGIN IMMEDIATE``: SQLite admits one writer
    anyway, and its busy handler polls with sleeps of up to 100 ms, which under concurrent requests
    turned a sub-millisecond wait into a tail of seconds. Other processes still wait in the busy handler.
    """

    def __init__(self, url: str, *, pool_size: int = 20, max_overflow: int | None = None):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            if ":memory:" in url:
                raise ValueError("in-memory SQLite is not supported: the scheduler and API share the database")
            kwargs["pool_size"] = pool_size
            kwargs["max_overflow"] = 40 if max_overflow is None else max_overflow
        else:
            kwargs["pool_size"] = pool_size
            kwargs["max_overflow"] = 20 if max_overflow is None else max_overflow
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False, autoflush=True)
        # re-entrant: a nested write on SQLite fails with "database is locked" as before, never hangs
        self._write_lock: contextlib.AbstractContextManager[object] = (
            threading.RLock() if self.is_sqlite else contextlib.nullcontext()
        )

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            try:
                yield session
            finally:
                session.rollback()

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        with self._write_lock, self._sessions() as session:
            if self.is_sqlite:
                session.connection(execution_options={"sqlite_immediate": True})
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    @contextlib.contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """A Core connection in a read transaction (one snapshot on SQLite), always rolled back."""
        with self.engine.connect() as conn:
            conn.begin()
            try:
                yield conn
            finally:
                conn.rollback()

    @contextlib.contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """A Core connection in a write transaction: commits on success, rolls back on any exception."""
        with self._write_lock, self.engine.connect() as conn:
            if self.is_sqlite:
                conn.execution_options(sqlite_immediate=True)
            with conn.begin():
                yield conn

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get("sqlite_immediate"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


def migrate(url: str) -> None:
    """Bring the schema to the newest Alembic revision."""
    from alembic import command  # alembic is heavy (~1 s): loaded only to migrate
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, "head")
