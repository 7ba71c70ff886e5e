"""Quota reports, usage accounting and the audit log.

Usage is computed from job attempts: an attempt holds its GPUs and CPUs from placement until it
finishes, so GPU-seconds = GPUs x held seconds, clipped to the asked window. Running attempts count
up to now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import anyio
from sqlalchemy.orm import Session

from dlcloud.schemas.audit import AuditEvent
from dlcloud.schemas.jobs import JobState
from dlcloud.schemas.tenants import QuotaReport, QuotaUsage, SchedulingTerms, UsageReport, UsageRow
from dlcloud.services.admission import admission_limits
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.services.tenants import quota_model, resolve_tenant, scheduling_model
from dlcloud.store import accounting as accounting_store
from dlcloud.store import jobs as job_store
from dlcloud.store.db import Database
from dlcloud.store.rows import AccessKeyRow, AuditRow, TenantRow, utcnow
from dlcloud.store.tenants import storage_used

QUEUE_STATES = (JobState.QUEUED.value, JobState.RESTARTING.value)


def quota_report(platform: Platform, caller: Caller, tenant: str | None) -> QuotaReport:
    with platform.db.read() as s:
        t = resolve_tenant(s, caller, tenant)
        live = job_store.live_attempts(s, t.id)
        queued = job_store.count_queued(s, t.id)
        return QuotaReport(
            tenant=t.name,
            limits=quota_model(t),
            usage=QuotaUsage(
                gpus=sum(len(g) for g, _, _ in live),
                cpus=sum(c for _, c, _ in live),
                memory=sum(m for _, _, m in live),
                running_jobs=len(live),
                queued_jobs=int(queued or 0),
                storage=storage_used(s, t.id),
            ),
            admission=admission_limits(platform.settings, t.quota_max_queued_jobs, t.quota_max_running_jobs),
            scheduling=_scheduling_terms(platform, t),
        )


def _scheduling_terms(platform: Platform, t: TenantRow) -> SchedulingTerms:
    settings = platform.settings
    terms = scheduling_model(t)
    allowed = {k: v for k, v in settings.priority_classes.items() if terms.priority_min <= v <= terms.priority_max}
    return SchedulingTerms(
        policy=settings.scheduling_policy,
        guarantee=terms.guarantee,
        borrow_limit=terms.borrow_limit,
        weight=terms.weight,
        priority_min=terms.priority_min,
        priority_max=terms.priority_max,
        priority_classes=dict(sorted(allowed.items(), key=lambda kv: kv[1])),
        default_priority_class=settings.default_priority_class,
    )


def usage_report(
    platform: Platform, caller: Caller, since: datetime, until: datetime | None, tenant: str | None, all_tenants: bool
) -> UsageReport:
    until = until or utcnow()
    with platform.db.read() as s:
        tenant_id = only_user = None
        if all_tenants:
            caller.require_platform_admin("usage of all tenants")
        else:
            tenant_id = resolve_tenant(s, caller, tenant).id
            if not caller.is_tenant_admin:
                only_user = caller.user_id
        now = utcnow()
        acc: dict[tuple[str, str], dict] = {}
        attempts = accounting_store.usage_attempts(s, since, until, tenant_id, only_user)
        for tname, uname, job_id, gpus, cpus, start, end, user_id in attempts:
            lo = max(start, since)
            hi = min(end or now, until)
            secs = max((hi - lo).total_seconds(), 0.0)
            row = acc.setdefault((tname, uname or user_id), {"jobs": set(), "attempts": 0, "gpu": 0.0, "cpu": 0.0})
            row["jobs"].add(job_id)
            row["attempts"] += 1
            row["gpu"] += len(gpus) * secs
            row["cpu"] += cpus * secs
        rows = [
            UsageRow(
                tenant=t,
                user=u,
                jobs=len(v["jobs"]),
                attempts=v["attempts"],
                gpu_seconds=round(v["gpu"], 3),
                cpu_seconds=round(v["cpu"], 3),
            )
            for (t, u), v in sorted(acc.items())
        ]
        return UsageReport(since=since, until=until, rows=rows)


@dataclass(frozen=True)
class AuditRecord:
    tenant_id: str | None
    tenant: str | None
    user: str | None
    access_key: str | None
    action: str
    resource: str | None
    status_code: int
    error_code: str | None
    request_id: str
    client_address: str | None


def _audit_row(s: Session, rec: AuditRecord) -> AuditRow:
    tenant_id, tenant = rec.tenant_id, rec.tenant
    if tenant_id is None and rec.access_key:
        # an authentication failure with a known key belongs to that key's tenant's log
        key = s.get(AccessKeyRow, rec.access_key[:40])
        owner = s.get(TenantRow, key.tenant_id) if key else None
        if owner is not None:
            tenant_id, tenant = owner.id, owner.name
    return AuditRow(
        time=utcnow(),
        tenant_id=tenant_id,
        tenant_name=tenant,
        user_name=rec.user,
        access_key=rec.access_key,
        action=rec.action,
        resource=rec.resource,
        outcome="success" if rec.status_code < 400 else "failure",
        status_code=rec.status_code,
        error_code=rec.error_code,
        request_id=rec.request_id,
        client_address=rec.client_address,
    )


def record_audit(db: Database, rec: AuditRecord) -> None:
    with db.write() as s:
        s.add(_audit_row(s, rec))


def repeats_resource(repeats: int, window_seconds: float) -> str:
    """The ``resource`` of the event that counts the repeats of an authentication failure."""
    return f"repeated {repeats} more time{'s' if repeats != 1 else ''} within {window_seconds:g} s"


def record_auth_repeats(
    db: Database, last: AuditRecord, repeats: int, window_seconds: float, row_id: int | None
) -> int:
    """Write (``row_id`` None) or rewrite the event counting ``repeats``; returns its id. It carries the time,
    request id and client address of the latest repeat ``last``."""
    with db.write() as s:
        row = s.get(AuditRow, row_id) if row_id is not None else None
        if row is None:
            row = _audit_row(s, last)
            s.add(row)
        row.time = utcnow()
        row.resource = repeats_resource(repeats, window_seconds)
        row.request_id = last.request_id
        row.client_address = last.client_address
        s.flush()
        return row.id


@dataclass
class _FailureWindow:
    start: float  # time.monotonic()
    first: AuditRecord
    first_written: bool = False
    repeats: int = 0
    last: AuditRecord | None = None
    written: int = 0  # repeats in the counting event so far
    row_id: int | None = None  # the counting event
    busy: bool = False  # a write of this window is under way


class AuthFailureAudit:
    """Authentication failures in the audit log, at most two events per source, error code and window.

    A source is the access key the request named when that key exists, else the client address (so neither
    a flood with one tenant's key id nor one with made-up key ids grows a log by a row per request). The
    first failure of a window is written at once, as any event; the later ones of the same window are
    counted in one more event, written at the second failure and rewritten as the count grows
    (``resource``: "repeated N more times within 60 s"). One write per window is under way at a time;
    the failures that arrive meanwhile are folded into the next. Counts are per API process.
    """

    MAX_WINDOWS = 4096  # past this, windows that ended are forgotten, then the oldest

    def __init__(self, db: Database, window_seconds: float):
        self._db = db
        self.window_seconds = window_seconds
        self._windows: dict[tuple[str, str], _FailureWindow] = {}

    def _source(self, rec: AuditRecord) -> tuple[str, str]:
        if rec.access_key and rec.error_code != "unknown_access_key":
            return (f"key:{rec.access_key}", rec.action)
        return (f"address:{rec.client_address}", rec.action)

    async def record(self, rec: AuditRecord) -> None:
        now = time.monotonic()
        source = self._source(rec)
        window = self._windows.get(source)
        if window is None or now - window.start >= self.window_seconds:
            if len(self._windows) >= self.MAX_WINDOWS:
                self._forget_ended(now)
            window = self._windows[source] = _FailureWindow(now, rec)
        else:
            window.repeats += 1
            window.last = rec
        if window.busy:
            return  # the write under way picks this one up
        window.busy = True
        try:
            while True:
                if not window.first_written:
                    await anyio.to_thread.run_sync(record_audit, self._db, window.first)
                    window.first_written = True
                elif window.repeats > window.written and window.last is not None:
                    repeats, last = window.repeats, window.last
                    window.row_id = await anyio.to_thread.run_sync(
                        record_auth_repeats, self._db, last, repeats, self.window_seconds, window.row_id
                    )
                    window.written = repeats
                else:
                    return
        finally:
            window.busy = False

    def _forget_ended(self, now: float) -> None:
        """Forget the windows that ended; if too many are still open (a flood from many addresses), the
        oldest: a source forgotten early starts a new window, one more event, never an unbounded dict."""
        for source, window in list(self._windows.items()):
            if now - window.start >= self.window_seconds and not window.busy:
                del self._windows[source]
        idle = [source for source, window in self._windows.items() if not window.busy]  # oldest first
        for source in idle[: max(0, len(self._windows) - self.MAX_WINDOWS // 2)]:
            del self._windows[source]


def list_audit(
    platform: Platform,
    caller: Caller,
    *,
    since: datetime | None,
    action: str | None,
    user: str | None,
    all_tenants: bool,
    limit: int,
) -> list[AuditEvent]:
    caller.require_tenant_admin("reading the audit log")
    with platform.db.read() as s:
        if all_tenants:
            caller.require_platform_admin("the audit log of all tenants")
        rows = accounting_store.audit_events(s, None if all_tenants else caller.tenant_id, since, action, user, limit)
        return [
            AuditEvent(
                id=r.id,
                time=r.time,
                tenant=r.tenant_name,
                user=r.user_name,
                access_key=r.access_key,
                action=r.action,
                resource=r.resource,
                outcome=r.outcome,
                status_code=r.status_code,
                error_code=r.error_code,
                request_id=r.request_id,
                client_address=r.client_address,
            )
            for r in rows
        ]
