"""Quota, usage and audit reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Query

from dlcloud.api.deps import CallerDep, PlatformDep
from dlcloud.errors import InvalidArgument
from dlcloud.schemas.audit import AuditEvent
from dlcloud.schemas.common import IsoTime, Name, Text
from dlcloud.schemas.tenants import QuotaReport, UsageReport
from dlcloud.services import accounting as svc

router = APIRouter()


@router.get("/quota", response_model=QuotaReport, name="quota.get")
def get_quota(c: CallerDep, p: PlatformDep, tenant: Name | None = Query(None)) -> QuotaReport:
    return svc.quota_report(p, c, tenant)


@router.get("/usage", response_model=UsageReport, name="usage.get")
def get_usage(
    c: CallerDep,
    p: PlatformDep,
    since: IsoTime | None = Query(None, description="start of the window (default: 24 hours ago)"),
    until: IsoTime | None = Query(None, description="end of the window (default: now); after since"),
    tenant: Name | None = Query(None),
    all: bool = Query(False, description="every tenant (platform admin)"),
) -> UsageReport:
    start = since or datetime.now(UTC) - timedelta(days=1)
    end = until
    if end is not None and end <= start:
        raise InvalidArgument("'until' must be after 'since'")
    return svc.usage_report(p, c, start, end, tenant, all)


@router.get("/audit", response_model=list[AuditEvent], name="audit.list")
def list_audit(
    c: CallerDep,
    p: PlatformDep,
    since: IsoTime | None = Query(None, description="only events at or after this time"),
    action: Text | None = Query(None, max_length=64),
    user: Name | None = Query(None),
    all: bool = Query(False, description="every tenant (platform admin)"),
    limit: int = Query(100, ge=1, le=10_000),
) -> list[AuditEvent]:
    return svc.list_audit(p, c, since=since, action=action, user=user, all_tenants=all, limit=limit)
