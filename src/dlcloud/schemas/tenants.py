"""Tenants, quotas and usage on the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, model_validator

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


Priority = Annotated[int, Field(ge=-1000, le=1000), JSON_NUMBER]
Weight = Annotated[float, Field(gt=0, le=1000), JSON_NUMBER]


class GuaranteeSpec(Request):
    """What a tenant is guaranteed: it may preempt borrowers of other tenants to get it back (fair-share)."""

    gpus: GpuCount = 0
    cpus: CpuCount = 0.0
    memory: MemoryBytes = 0


class BorrowLimitSpec(Request):
    """How much a tenant may use beyond its guarantee when capacity is idle; ``None`` means unlimited."""

    gpus: GpuCount | None = None
    cpus: CpuCount | None = None
    memory: MemoryBytes | None = None


class SchedulingSpec(Request):
    """A tenant's fair-share terms (docs/scheduling.md): guarantee, borrowing limit, weight in dominant-resource
    fairness, and the priorities its jobs may have (``priority_min`` .. ``priority_max``)."""

    guarantee: GuaranteeSpec = GuaranteeSpec()
    borrow_limit: BorrowLimitSpec = BorrowLimitSpec()
    weight: Weight = 1.0
    priority_min: Priority = -1000
    priority_max: Priority = 1000

    @model_validator(mode="after")
    def _range_in_order(self) -> SchedulingSpec:
        if self.priority_min > self.priority_max:
            raise ValueError(f"priority_min ({self.priority_min}) must not be above priority_max ({self.priority_max})")
        return self


class TenantCreate(Request):
    name: Name
    quota: QuotaSpec = QuotaSpec()
    scheduling: SchedulingSpec = SchedulingSpec()


class TenantUpdate(Request):
    """What is given is replaced whole (a quota, the scheduling terms); what is left out stays."""

    quota: QuotaSpec | None = None
    scheduling: SchedulingSpec | None = None


class Tenant(Response):
    id: str
    name: str
    created_at: datetime
    quota: QuotaSpec
    scheduling: SchedulingSpec = SchedulingSpec()


class QuotaUsage(Response):
    gpus: int
    cpus: float
    memory: int
    running_jobs: int
    queued_jobs: int
    storage: int  # bytes stored: datasets, model versions, code uploads


class RateLimit(Response):
    """A token bucket: refilled at ``requests_per_second``, holding up to ``burst`` requests."""

    requests_per_second: float
    burst: int


class AdmissionLimits(Response):
    """What the platform admits from the caller (docs/quotas-and-usage.md#request-rate-limits): the queued-jobs
    cap in force (the tenant's own, else the platform's default; ``None``: none) and the request rate limits of
    this API process (``None``: off)."""

    max_queued_jobs: int | None
    max_queued_jobs_source: Literal["tenant quota", "platform default", "none"]
    rate_limit_per_key: RateLimit | None
    rate_limit_per_tenant: RateLimit | None


class QuotaReport(Response):
    tenant: str
    limits: QuotaSpec  # the tenant's own quota, as set
    usage: QuotaUsage
    admission: AdmissionLimits


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
