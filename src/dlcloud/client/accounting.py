"""Quota, usage and audit."""

from __future__ import annotations

from typing import Any

from dlcloud.client.transport import API, Transport


class AccountingAPI:
    def __init__(self, t: Transport):
        self._t = t

    def quota(self, tenant: str | None = None) -> dict[str, Any]:
        return self._t.request("GET", f"{API}/quota", params={"tenant": tenant})

    def usage(
        self, since: str | None = None, until: str | None = None, tenant: str | None = None, all_tenants: bool = False
    ) -> dict[str, Any]:
        params = {"since": since, "until": until, "tenant": tenant, "all": all_tenants or None}
        return self._t.request("GET", f"{API}/usage", params=params)

    def audit(
        self,
        since: str | None = None,
        action: str | None = None,
        user: str | None = None,
        all_tenants: bool = False,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        params = {"since": since, "action": action, "user": user, "all": all_tenants or None, "limit": limit}
        return self._t.request("GET", f"{API}/audit", params=params)
