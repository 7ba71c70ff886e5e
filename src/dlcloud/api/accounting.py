"""Quota, usage and audit reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Depends, Query

from dlcloud.api.deps import caller, get_platform
from dlcloud.errors import InvalidArgument
from dlcloud.schemas.audit import AuditEvent
from dlcloud.schemas.common import IsoTime, Name, Text
from dlcloud.schemas.tenants import QuotaReport, UsageReport
from dlcloud.services import accounting as svc
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform

router = APIRouter()


@router.get("/quota", response_model=QuotaReport, name="quota.get")
def get_quota(
    tenant: Name | None = Query(None), c: Caller = Depends(caller), p: Platform = Depends(get_platform)
) -> QuotaReport:
    return svc.quota_report(p, c, tenant)


@router.get("/usage", response_model=UsageReport, name="usage.get")
def get_usage(
    since: IsoTime | None = Query(None, description="start of the window (default: 24 hours ago)"),
    until: IsoTime | None = Query(None, description="end of the window (default: now); after since"),
    tenant: Name | None = Query(None),
    all: bool = Query(False, description="every tenant (platform admin)"),
    c: Caller = Depends(caller),
    p: Platform = Depends(get_platform),
) -> UsageReport:
    start = since or datetime.now(UTC) - timedelta(days=1)
    end = until
    if end is not None and end <= start:
        raise InvalidArgument("'until' must be after 'since'")
    return svc.usage_report(p, c, start, end, tenant, all)


@router.get("/audit", response_model=list[AuditEvent], name="audit.list")
def list_audit(
    since: IsoTime | None = Query(None, description="only events at or after this time"),
    action: Text | None = Query(None, max_length=64),
    user: Name | None = Query(None),
    all: bool = Query(False, description="every tenant (platform admin)"),
    limit: int = Query(100, ge=1, le=10_000),
    c: Caller = Depends(caller),
    p: Platform = Depends(get_platform),
) -> list[AuditEvent]:
    return svc.list_audit(p, c, since=since, action=action, user=user, all_tenants=all, limit=limit)
