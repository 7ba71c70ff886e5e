"""The nonces of signed requests (``services/auth.py``): each is accepted once within the clock-skew window."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select
from sqlalchemy.orm import Session

from dlcloud.store.rows import NonceRow

# built once (a constant statement is compiled once): the nonces of a batch already stored, and the insert
_nonces = NonceRow.__table__
_USED_NONCES = select(_nonces.c.access_key, _nonces.c.nonce).where(
    _nonces.c.access_key.in_(bindparam("keys", expanding=True)),
    _nonces.c.nonce.in_(bindparam("nonces", expanding=True)),
)
_INSERT_NONCE = insert(NonceRow)


def used(conn: Connection, keys: list[str], nonces: list[str]) -> set[tuple[str, str]]:
    """The (access key, nonce) pairs among ``keys`` × ``nonces`` already stored."""
    return {(k, n) for k, n in conn.execute(_USED_NONCES, {"keys": keys, "nonces": nonces})}


def add(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    """Store nonces (``access_key``, ``nonce``, ``seen_at``); one executemany."""
    conn.execute(_INSERT_NONCE, list(rows))  # a multi-row VALUES statement would be compiled every time


def purge(s: Session, before: datetime) -> int:
    """Forget the nonces seen before ``before``; how many."""
    result = s.execute(delete(NonceRow).where(NonceRow.seen_at < before))
    return int(getattr(result, "rowcount", 0) or 0)
