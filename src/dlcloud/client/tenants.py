"""Tenants, users and access keys."""

from __future__ import annotations

import builtins
from typing import Any

from dlcloud.client.transport import API, Transport
from dlcloud.schemas.tenants import Tenant
from dlcloud.schemas.users import AccessKey, AccessKeyCreated, User


class TenantsAPI:
    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, quota: dict[str, Any] | None = None) -> Tenant:
        """Create a tenant (platform admin). ``quota`` keys: gpus, cpus, memory, max_running_jobs, max_queued_jobs."""
        return self._t.read(Tenant, "POST", f"{API}/tenants", json_body={"name": name, "quota": quota or {}})

    def list(self) -> builtins.list[Tenant]:
        """Every tenant (platform admin)."""
        return self._t.read_list(Tenant, f"{API}/tenants")

    def get(self, name: str) -> Tenant:
        """One tenant: its quota and terms."""
        return self._t.read(Tenant, "GET", f"{API}/tenants/{name}")

    def set_quota(self, name: str, quota: dict[str, Any]) -> Tenant:
        """Replace the tenant's quota (platform admin)."""
        return self._t.read(Tenant, "PATCH", f"{API}/tenants/{name}", json_body={"quota": quota})

    def update(
        self,
        name: str,
        *,
        quota: dict[str, Any] | None = None,
        scheduling: dict[str, Any] | None = None,
        network: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
    ) -> Tenant:
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
        return self._t.read(Tenant, "PATCH", f"{API}/tenants/{name}", json_body=body)


class UsersAPI:
    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, tenant: str | None = None, role: str = "member") -> User:
        """Create a user in ``tenant`` (default yours) with ``role`` (member or admin)."""
        body = {"name": name, "tenant": tenant, "role": role}
        return self._t.read(User, "POST", f"{API}/users", json_body=body)

    def list(self, tenant: str | None = None) -> builtins.list[User]:
        """The users of ``tenant`` (default yours)."""
        return self._t.read_list(User, f"{API}/users", params={"tenant": tenant})


class KeysAPI:
    def __init__(self, t: Transport):
        self._t = t

    def create(self, user: str | None = None, tenant: str | None = None) -> AccessKeyCreated:
        """A new key with its ``access_key`` and ``secret_key``; the secret is shown only this once."""
        return self._t.read(AccessKeyCreated, "POST", f"{API}/keys", json_body={"user": user, "tenant": tenant})

    def list(self, user: str | None = None, tenant: str | None = None) -> builtins.list[AccessKey]:
        """The keys of ``user`` (default yours), or of a tenant's users."""
        return self._t.read_list(AccessKey, f"{API}/keys", params={"user": user, "tenant": tenant})

    def disable(self, key: str) -> AccessKey:
        """Disable a key: requests signed with it are refused until it is enabled again."""
        return self._t.read(AccessKey, "POST", f"{API}/keys/{key}/disable")

    def enable(self, key: str) -> AccessKey:
        """Enable a disabled key."""
        return self._t.read(AccessKey, "POST", f"{API}/keys/{key}/enable")

    def delete(self, key: str) -> None:
        self._t.request("DELETE", f"{API}/keys/{key}")
