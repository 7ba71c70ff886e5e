"""Tenants, users and access keys."""

from __future__ import annotations

from typing import Any

from dlcloud.client.transport import API, Transport


class TenantsAPI:
    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, quota: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create a tenant (platform admin). ``quota`` keys: gpus, cpus, memory, max_running_jobs, max_queued_jobs."""
        return self._t.request("POST", f"{API}/tenants", json_body={"name": name, "quota": quota or {}})

    def list(self) -> list[dict[str, Any]]:
        return self._t.request("GET", f"{API}/tenants")

    def get(self, name: str) -> dict[str, Any]:
        return self._t.request("GET", f"{API}/tenants/{name}")

    def set_quota(self, name: str, quota: dict[str, Any]) -> dict[str, Any]:
        return self._t.request("PATCH", f"{API}/tenants/{name}", json_body={"quota": quota})

    def update(
        self,
        name: str,
        *,
        quota: dict[str, Any] | None = None,
        scheduling: dict[str, Any] | None = None,
        network: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Replace a tenant's quota, its scheduling terms, its network policy and/or its sandbox terms (platform
        admin):
        ``scheduling`` keys are guarantee {gpus, cpus, memory}, borrow_limit {gpus, cpus, memory} (None:
        unlimited), weight, priority_min, priority_max (docs/scheduling.md); ``network`` keys are egress (none,
        internet, allow; None: the platform's default) and allow (addresses, CIDRs, host names;
        docs/isolation.md#network); ``sandbox`` keys are user_namespaces (bool;
        docs/isolation.md#user-namespaces)."""
        body: dict[str, Any] = {}
        if quota is not None:
            body["quota"] = quota
        if scheduling is not None:
            body["scheduling"] = scheduling
        if network is not None:
            body["network"] = network
        if sandbox is not None:
            body["sandbox"] = sandbox
        return self._t.request("PATCH", f"{API}/tenants/{name}", json_body=body)


class UsersAPI:
    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, tenant: str | None = None, role: str = "member") -> dict[str, Any]:
        body = {"name": name, "tenant": tenant, "role": role}
        return self._t.request("POST", f"{API}/users", json_body=body)

    def list(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return self._t.request("GET", f"{API}/users", params={"tenant": tenant})


class KeysAPI:
    def __init__(self, t: Transport):
        self._t = t

    def create(self, user: str | None = None, tenant: str | None = None) -> dict[str, Any]:
        """Returns ``access_key`` and ``secret_key``; the secret is shown only this once."""
        return self._t.request("POST", f"{API}/keys", json_body={"user": user, "tenant": tenant})

    def list(self, user: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        return self._t.request("GET", f"{API}/keys", params={"user": user, "tenant": tenant})

    def disable(self, key: str) -> dict[str, Any]:
        return self._t.request("POST", f"{API}/keys/{key}/disable")

    def enable(self, key: str) -> dict[str, Any]:
        return self._t.request("POST", f"{API}/keys/{key}/enable")

    def delete(self, key: str) -> None:
        self._t.request("DELETE", f"{API}/keys/{key}")
