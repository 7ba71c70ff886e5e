"""Ports held by live attempts (``job_ports``): read, taken in the scheduling transaction, given back when the
attempt ends (control/ports.py hands them out)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from dlcloud.store.rows import PortRow


def held_ports(s: Session) -> set[int]:
    """Every port some attempt holds."""
    return set(s.scalars(select(PortRow.port)))


def hold_ports(s: Session, job_id: str, attempt: int, ports: Sequence[int], now: datetime) -> None:
    s.execute(insert(PortRow), [{"port": p, "job_id": job_id, "attempt": attempt, "allocated_at": now} for p in ports])


def release_ports(s: Session, job_id: str, attempt: int) -> None:
    """Give back the ports of an attempt that ended."""
    s.execute(delete(PortRow).where(PortRow.job_id == job_id, PortRow.attempt == attempt))


def attempt_ports(s: Session, job_id: str, attempt: int) -> list[int]:
    return sorted(s.scalars(select(PortRow.port).where(PortRow.job_id == job_id, PortRow.attempt == attempt)))
