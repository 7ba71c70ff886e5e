"""The queries behind usage and the audit log (``services/accounting.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from dlcloud.store.rows import AttemptRow, AuditRow, TenantRow, UserRow


def usage_attempts(
    s: Session, since: datetime, until: datetime, tenant_id: str | None, user_id: str | None
) -> Iterable[Any]:
    """The attempts that ran between ``since`` and ``until`` (of one tenant, of one user of it, or all): tenant
    name, user name (None where the user is gone), job id, GPUs, CPUs, start, end (None: still running), user id."""
    q = (
        select(
            TenantRow.name,
            UserRow.name,
            AttemptRow.job_id,
            AttemptRow.gpus,
            AttemptRow.cpus,
            AttemptRow.started_at,
            AttemptRow.finished_at,
            AttemptRow.user_id,
        )
        .join(TenantRow, TenantRow.id == AttemptRow.tenant_id)
        .outerjoin(UserRow, UserRow.id == AttemptRow.user_id)
        .where(AttemptRow.started_at < until, or_(AttemptRow.finished_at.is_(None), AttemptRow.finished_at > since))
    )
    if tenant_id is not None:
        q = q.where(AttemptRow.tenant_id == tenant_id)
    if user_id is not None:
        q = q.where(AttemptRow.user_id == user_id)
    return s.execute(q)


def audit_events(
    s: Session, tenant_id: str | None, since: datetime | None, action: str | None, user: str | None, limit: int
) -> Iterable[AuditRow]:
    """The newest ``limit`` audit records (of one tenant, or all), filtered by time, action and user name."""
    q = select(AuditRow)
    if tenant_id is not None:
        q = q.where(AuditRow.tenant_id == tenant_id)
    if since is not None:
        q = q.where(AuditRow.time >= since)
    if action:
        q = q.where(AuditRow.action == action)
    if user:
        q = q.where(AuditRow.user_name == user)
    return s.scalars(q.order_by(AuditRow.id.desc()).limit(limit))
