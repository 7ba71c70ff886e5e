"""Tenants, quotas and usage on the wire."""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

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


EgressMode = Literal["none", "internet", "allow"]
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def egress_target(value: str) -> str:
    """An allow-list entry: an IP address, a CIDR or a host name (resolved when a job starts)."""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        pass
    if _HOST_NAME.match(value):
        return value.lower()
    raise ValueError(f"{value!r} is neither an IP address, a CIDR (10.1.0.0/16) nor a host name")


EgressTarget = Annotated[str, Field(min_length=1, max_length=253), AfterValidator(egress_target)]


class NetworkSpec(Request):
    """What a tenant's jobs may reach beyond their own network (docs/isolation.md#network): ``egress`` none
    (nothing), internet (anything but the host's own addresses), allow (only ``allow``: addresses, CIDRs, host
    names); ``None``: the platform's default (``job_egress``)."""

    egress: EgressMode | None = None
    allow: list[EgressTarget] = Field(default_factory=list, max_length=256)


class SandboxSpec(Request):
    """What a tenant's jobs may do inside their sandbox beyond the default (docs/isolation.md#user-namespaces):
    ``user_namespaces`` true lets them make user namespaces of their own (rootless containers, nested sandboxes;
    more of the kernel in reach), which they otherwise cannot."""

    user_namespaces: bool = False


class TenantCreate(Request):
    name: Name
    quota: QuotaSpec = QuotaSpec()
    scheduling: SchedulingSpec = SchedulingSpec()
    network: NetworkSpec = NetworkSpec()
    sandbox: SandboxSpec = SandboxSpec()


class TenantUpdate(Request):
    """What is given is replaced whole (a quota, the scheduling terms, the network policy, the sandbox terms);
    what is left out stays."""

    quota: QuotaSpec | None = None
    scheduling: SchedulingSpec | None = None
    network: NetworkSpec | None = None
    sandbox: SandboxSpec | None = None


class Tenant(Response):
    id: str
    name: str
    created_at: datetime
    quota: QuotaSpec
    scheduling: SchedulingSpec = SchedulingSpec()
    network: NetworkSpec = NetworkSpec()
    sandbox: SandboxSpec = SandboxSpec()


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
    # what bounds each job and the tenant's processes (docs/isolation.md#processes-and-disk; None: no bound)
    processes_per_job: int | None = None  # per replica (pids cgroup, else RLIMIT_NPROC in its sandbox)
    processes_per_tenant: int | None = None  # its uid's, as root without a pids cgroup (derived from its quota)
    disk_per_job: int | None = None  # bytes its writable directories may take


class SchedulingTerms(Response):
    """A tenant's fair-share terms as its members see them (``dlcloud quota``; docs/scheduling.md): what it is
    guaranteed (it may preempt other tenants' borrowers to get it back), how far it may borrow beyond that (its
    jobs running there may be preempted), its weight, and the priorities and priority classes its jobs may use."""

    policy: str  # the platform's scheduling policy: guarantees, borrowing and weights decide under fair-share
    guarantee: GuaranteeSpec
    borrow_limit: BorrowLimitSpec
    weight: float
    priority_min: int
    priority_max: int
    priority_classes: dict[str, int]  # the platform's classes whose priority is inside the tenant's range
    default_priority_class: str  # what a job that gives neither a class nor a priority gets


class QuotaReport(Response):
    tenant: str
    limits: QuotaSpec  # the tenant's own quota, as set
    usage: QuotaUsage
    admission: AdmissionLimits
    scheduling: SchedulingTerms


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
