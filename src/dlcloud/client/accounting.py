"""Quota, usage and audit."""

from __future__ import annotations

from dlcloud.client.transport import API, Transport
from dlcloud.schemas.audit import AuditEvent
from dlcloud.schemas.tenants import QuotaReport, UsageReport


class AccountingAPI:
    def __init__(self, t: Transport):
        self._t = t

    def quota(self, tenant: str | None = None) -> QuotaReport:
        """The tenant's quota, usage, admission limits and scheduling terms (yours by default)."""
        return self._t.read(QuotaReport, "GET", f"{API}/quota", params={"tenant": tenant})

    def usage(
        self, since: str | None = None, until: str | None = None, tenant: str | None = None, all_tenants: bool = False
    ) -> UsageReport:
        """Resource usage between ``since`` and ``until`` (ISO 8601 times), yours or every tenant's."""
        params = {"since": since, "until": until, "tenant": tenant, "all": all_tenants or None}
        return self._t.read(UsageReport, "GET", f"{API}/usage", params=params)

    def audit(
        self,
        since: str | None = None,
        action: str | None = None,
        user: str | None = None,
        all_tenants: bool = False,
        limit: int = 100,
    ) -> list[AuditEvent]:
        """The audit log, newest first."""
        params = {"since": since, "action": action, "user": user, "all": all_tenants or None, "limit": limit}
        return self._t.read_list(AuditEvent, f"{API}/audit", params=params)
