"""Tenants, quotas and usage on the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from dlcloud.schemas.common import JSON_NUMBER, MemoryBytes, Name, Request, Response

# quotas are numbers: ``{"gpus": true}`` is refused, not read as 1
GpuCount = Annotated[int, Field(ge=0, le=100_000), JSON_NUMBER]
CpuCount = Annotated[float, Field(ge=0, le=1_000_000), JSON_NUMBER]
JobCount = Annotated[int, Field(ge=0, le=10_000_000), JSON_NUMBER]


class QuotaSpec(Request):
    """Limits of a tenant; ``None`` means unlimited."""

    gpus: GpuCount | None = None
    cpus: CpuCount | None = None
    memory: MemoryBytes | None = None
    max_running_jobs: JobCount | None = None
    max_queued_jobs: JobCount | None = None
    storage: MemoryBytes | None = None  # bytes of the tenant's datasets, model versions and code uploads


class TenantCreate(Request):
    name: Name
    quota: QuotaSpec = QuotaSpec()


class TenantUpdate(Request):
    quota: QuotaSpec


class Tenant(Response):
    id: str
    name: str
    created_at: datetime
    quota: QuotaSpec


class QuotaUsage(Response):
    gpus: int
    cpus: float
    memory: int
    running_jobs: int
    queued_jobs: int
    storage: int  # bytes stored: datasets, model versions, code uploads


class QuotaReport(Response):
    tenant: str
    limits: QuotaSpec
    usage: QuotaUsage


class UsageRow(Response):
    tenant: str
    user: str
    jobs: int
    attempts: int
    gpu_seconds: float
    cpu_seconds: float


class UsageReport(Response):
    since: datetime
    until: datetime
    rows: list[UsageRow]
