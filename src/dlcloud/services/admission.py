"""Admission: request rate limits (token buckets) and the queued-jobs cap in force.

Purpose: one access key, one tenant or one job cannot take the API from the others, and no tenant fills the
queue without bound, even one whose quota leaves ``max_queued_jobs`` unset (docs/quotas-and-usage.md).

Invariants:
- A signed request is counted after it authenticated (``api/deps.py``): a flood of unsigned or badly signed
  requests spends no one's budget. It counts in its access key's bucket and in its tenant's; it is admitted
  only when both hold a whole token, and then takes one from each: a refused request takes nothing.
- A job's metrics push counts only in the bucket of its job attempt, after its token's MAC checked: a user's
  flood cannot starve their jobs' pushes, nor a job's its user.
- ``/healthz``, ``/readyz`` and ``/metrics`` never pass through here.
- The API processes of one ``dlcloud up --api-workers N`` share their buckets (``rate_table.py``, a table mapped
  into each): a key's requests count against one limit whichever process answers. Behind N replicas on
  several hosts (the cluster deployment), each replica's are its own: a key may send up to N times the rate.
- At most ``MAX_BUCKETS`` buckets per limit are kept in one process: past that, the full ones are forgotten
  first (a full bucket and a new one are the same), then the oldest.

Vocabulary: *rate*: tokens added per second; *burst*: a bucket's size, the requests admitted at once after a
quiet spell; a rate of 0 turns that limit off. *Queued*: a job ``QUEUED`` or ``RESTARTING``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Literal

from dlcloud.errors import QuotaExceeded, RateLimited
from dlcloud.schemas.tenants import AdmissionLimits, RateLimit
from dlcloud.services.auth import Caller
from dlcloud.services.rate_table import SharedBuckets
from dlcloud.settings import Settings
from dlcloud.store.rows import TenantRow

MAX_BUCKETS = 100_000
QueueCapSource = Literal["tenant quota", "platform default", "none"]


class TokenBuckets:
    """The buckets of one limit, keyed by access key id, tenant id or job attempt: this process's, or those of
    the shared table ``shared`` (under the name ``limit``). Not thread-safe: the caller holds a lock (and the
    shared table's)."""

    def __init__(self, rate: float, burst: int, shared: SharedBuckets | None = None, limit: str = "") -> None:
        self.rate = rate
        self.burst = burst
        self.shared, self.limit = shared, limit
        self._buckets: dict[object, list[float]] = {}  # key -> [tokens, at (monotonic seconds)]

    @property
    def on(self) -> bool:
        return self.rate > 0

    def wait(self, key: object, now: float) -> float:
        """Seconds until ``key`` holds a whole token (0: it holds one now)."""
        tokens = self._refilled(key, now)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def take(self, key: object, now: float) -> None:
        tokens = self._refilled(key, now) - 1
        if self.shared is not None:
            self.shared.write(self.shared.find(self.limit, key, self.burst, self.rate, now), tokens, now)
        else:
            self._buckets[key] = [tokens, now]

    def _refilled(self, key: object, now: float) -> float:
        if self.shared is not None:
            tokens, at = self.shared.read(self.shared.find(self.limit, key, self.burst, self.rate, now))
        else:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_BUCKETS:
                    self._forget(now)
                bucket = self._buckets[key] = [float(self.burst), now]
            tokens, at = bucket
        return min(float(self.burst), tokens + max(0.0, now - at) * self.rate)

    def _forget(self, now: float) -> None:
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate >= self.burst:
                del self._buckets[key]
        for key in list(self._buckets)[: max(0, len(self._buckets) - MAX_BUCKETS // 2)]:
            del self._buckets[key]


@dataclass(frozen=True)
class _Check:
    buckets: TokenBuckets
    key: object
    limit: str  # details["limit"]: access_key | tenant | job
    who: str  # for the message: "access key AK..." / "tenant 'vision' (all its access keys together)"
    per: str  # "per access key" / "per tenant" / "per job attempt"


class RateLimits:
    """The request rate limits of one API process (``create_app`` builds it from the settings), in buckets of
    its own or in the table the API processes of this host share (``shared``)."""

    def __init__(self, settings: Settings, shared: SharedBuckets | None = None) -> None:
        s = settings
        self.per_key = TokenBuckets(s.api_rate_limit_per_key, s.api_rate_limit_per_key_burst, shared, "key")
        self.per_tenant = TokenBuckets(s.api_rate_limit_per_tenant, s.api_rate_limit_per_tenant_burst, shared, "tenant")
        self.per_job = TokenBuckets(s.api_rate_limit_per_job, s.api_rate_limit_per_job_burst, shared, "job")
        self.shared = shared
        self._lock = threading.Lock()

    def admit(self, caller: Caller) -> None:
        """Count an authenticated request of ``caller``; RateLimited when its key or its tenant is over its rate."""
        self._admit(
            _Check(self.per_key, caller.access_key, "access_key", f"access key {caller.access_key}", "per access key"),
            _Check(
                self.per_tenant,
                caller.tenant_id,
                "tenant",
                f"tenant {caller.tenant!r} (all its access keys together)",
                "per tenant",
            ),
        )

    def admit_job(self, job_id: str, attempt: int) -> None:
        """Count a metrics push of a job attempt (its token checked); RateLimited when it is over its rate."""
        self._admit(
            _Check(self.per_job, (job_id, attempt), "job", f"job {job_id} (attempt {attempt})", "per job attempt")
        )

    def _admit(self, *checks: _Check) -> None:
        checks = tuple(c for c in checks if c.buckets.on)
        if not checks:
            return
        with self._lock, self.shared.locked() if self.shared is not None else contextlib.nullcontext():
            now = time.monotonic()
            waits = [(c.buckets.wait(c.key, now), c) for c in checks]
            longest, check = max(waits, key=lambda w: w[0])
            if longest > 0:
                raise _refusal(check, longest)
            for c in checks:
                c.buckets.take(c.key, now)


def _refusal(check: _Check, wait: float) -> RateLimited:
    seconds = max(1, math.ceil(wait))
    rate, burst = check.buckets.rate, check.buckets.burst
    return RateLimited(
        f"too many requests from {check.who}: at most {rate:g} request(s) per second are allowed {check.per}, "
        f"in bursts of up to {burst}; retry in {seconds} s (the Retry-After header)",
        details={"limit": check.limit, "requests_per_second": rate, "burst": burst, "retry_after_seconds": seconds},
    )


def queued_jobs_cap(settings: Settings, tenant_limit: int | None) -> tuple[int | None, QueueCapSource]:
    """The queued-jobs cap in force for a tenant whose quota says ``tenant_limit``, and where it comes from."""
    if tenant_limit is not None:
        return tenant_limit, "tenant quota"
    if settings.default_max_queued_jobs > 0:
        return settings.default_max_queued_jobs, "platform default"
    return None, "none"


def check_queue_room(settings: Settings, tenant: TenantRow, queued: int) -> None:
    """QuotaExceeded when ``tenant`` (locked by the caller's transaction), with ``queued`` jobs waiting in the
    queue, cannot queue one more job."""
    limit, source = queued_jobs_cap(settings, tenant.quota_max_queued_jobs)
    if limit is None or queued < limit:
        return
    whose = (
        f"the limit is {limit}"
        if source == "tenant quota"
        else f"the platform's default limit for a tenant without its own max_queued_jobs is {limit} "
        "(a platform admin can set the tenant's)"
    )
    raise QuotaExceeded(
        f"tenant {tenant.name!r} already has {queued} queued job(s), {whose}; wait for some to start or cancel some",
        details={"resource": "max_queued_jobs", "limit": limit, "queued": queued, "source": source},
    )


def tenant_processes(settings: Settings, max_running_jobs: int | None, replicas: int = 1) -> int:
    """How many processes a tenant's uid may run at once where only a per-uid limit counts them (as root without
    a pids cgroup): what its quota lets it run, ``job_pids_max`` for each replica of each of its
    ``max_running_jobs`` (as many replicas each as the job at hand has), within the platform's
    ``tenant_processes_max`` (0: none); without that quota, the platform's."""
    if max_running_jobs is None or settings.job_pids_max <= 0:
        return settings.tenant_processes_max
    derived = settings.job_pids_max * max_running_jobs * max(1, replicas)
    cap = settings.tenant_processes_max
    return max(1, min(cap, derived) if cap > 0 else derived)


def admission_limits(
    settings: Settings, tenant_limit: int | None, max_running_jobs: int | None = None
) -> AdmissionLimits:
    """What the platform admits from a caller of a tenant whose quota says ``tenant_limit`` queued jobs and
    ``max_running_jobs`` running ones, and what bounds each of its jobs (``dlcloud quota``)."""
    limit, source = queued_jobs_cap(settings, tenant_limit)

    def rate(value: float, burst: int) -> RateLimit | None:
        return RateLimit(requests_per_second=value, burst=burst) if value > 0 else None

    return AdmissionLimits(
        max_queued_jobs=limit,
        max_queued_jobs_source=source,
        rate_limit_per_key=rate(settings.api_rate_limit_per_key, settings.api_rate_limit_per_key_burst),
        rate_limit_per_tenant=rate(settings.api_rate_limit_per_tenant, settings.api_rate_limit_per_tenant_burst),
        processes_per_job=settings.job_pids_max or None,
        processes_per_tenant=tenant_processes(settings, max_running_jobs) or None,
        disk_per_job=settings.job_disk_max_bytes or None,
    )
