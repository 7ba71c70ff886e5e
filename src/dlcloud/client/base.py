"""The SDK's entry point: ``Client`` holds one signed ``Transport`` (``transport.py``) and a sub-API per resource."""

from __future__ import annotations

from typing import Any

import httpx

from dlcloud.client.accounting import AccountingAPI
from dlcloud.client.config import Credentials, load_credentials
from dlcloud.client.datasets import DatasetsAPI
from dlcloud.client.environments import EnvironmentsAPI
from dlcloud.client.jobs import CodeAPI, JobsAPI
from dlcloud.client.models import ModelsAPI
from dlcloud.client.studies import StudiesAPI
from dlcloud.client.tenants import KeysAPI, TenantsAPI, UsersAPI
from dlcloud.client.transport import API, Transport
from dlcloud.schemas.users import Whoami


class Client:
    """Entry point of the SDK.

    Sub-APIs: ``jobs``, ``environments``, ``models``, ``datasets``, ``tenants``, ``users``, ``keys``, ``code``,
    ``accounting``, ``studies``.
    """

    def __init__(self, creds: Credentials, *, timeout: float = 60.0, http_client: httpx.Client | None = None):
        self.transport = Transport(creds, timeout=timeout, client=http_client)
        self.jobs = JobsAPI(self.transport)
        self.code = CodeAPI(self.transport)
        self.environments = EnvironmentsAPI(self.transport)
        self.models = ModelsAPI(self.transport)
        self.datasets = DatasetsAPI(self.transport)
        self.tenants = TenantsAPI(self.transport)
        self.users = UsersAPI(self.transport)
        self.keys = KeysAPI(self.transport)
        self.accounting = AccountingAPI(self.transport)
        self.studies = StudiesAPI(self.transport)

    @classmethod
    def from_env(cls, profile: str | None = None, **kwargs: Any) -> Client:
        """Credentials from DLCLOUD_* variables, else the config file's (current) profile."""
        return cls(load_credentials(profile), **kwargs)

    def whoami(self) -> Whoami:
        """Who the credentials are: user, tenant, role."""
        return self.transport.read(Whoami, "GET", f"{API}/whoami")

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["API", "Client", "Transport"]
