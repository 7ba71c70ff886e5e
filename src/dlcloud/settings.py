"""Settings: one pydantic-settings tree, built at the entry point and passed down.

Environment variables use the prefix ``DLCLOUD_`` (``DLCLOUD_DATA_DIR``, ``DLCLOUD_DATABASE_URL``, ...).
Nothing here imports other dlcloud modules.
"""

from __future__ import annotations

import os
from ipaddress import IPv4Address
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, IPvAnyAddress, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The planner's bounds and defaults live here, at the bottom, so that settings imports nothing of dlcloud;
# scheduler/contract.py's PlanConfig takes its defaults from these names.
TURN_MIN_S = 900.0  # no fair-share turn shorter than this (a job's work up to a first checkpoint) ...
MIN_TURN_WINDOW_S = 2 * TURN_MIN_S  # ... nor longer than half the window: the shortest window that has turns
MAX_LEND_AFTER_S = 86_400.0  # ``PlanConfig.lend_after_s``: at most a day (the attempts read for it grow with it)
LAS_QUEUES_GPU_S: tuple[float, ...] = (3600.0, 36_000.0)  # ``PlanConfig.las_queues_gpu_s``
TENANT_LAS_QUEUES_GPU_S: tuple[float, ...] = (7_200.0, 72_000.0)  # ``PlanConfig.tenant_las_queues_gpu_s``
LEND_AFTER_S = 600.0  # ``PlanConfig.lend_after_s``


class GpuSpec(BaseModel):
    """One GPU of a declared inventory (used where detection is not wanted)."""

    index: Annotated[int, Field(ge=0, le=1023)]
    name: Annotated[str, Field(min_length=1, max_length=128)] = "GPU"
    memory_mb: Annotated[int, Field(ge=0)] = 0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DLCLOUD_", extra="ignore")

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8420
    data_dir: Path = Path("~/.dlcloud").expanduser()
    # the API's address as jobs reach it (DLCLOUD_METRICS_URL, docs/metrics.md); None: http://<host>:<port>,
    # with a wildcard host (0.0.0.0, ::) read as 127.0.0.1: jobs share the host's network namespace
    job_api_url: str | None = None

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    database_url: str | None = None  # default: SQLite in the data dir

    # Auth
    clock_skew_seconds: Annotated[int, Field(ge=1, le=3600)] = 300
    server_key_file: Path | None = None  # default: <data_dir>/server.key
    bootstrap_admin_name: str = "admin"
    bootstrap_tenant_name: str = "default"
    # repeated authentication failures of one access key (of one client address without a known key) and one
    # error code: the first is audited at once, the rest of this window as one event with a count
    auth_failure_audit_window_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # GET /metrics: with a token, it takes only ``Authorization: Bearer <token>`` and its scheduling series have a
    # ``tenant`` label; without one, it is open and those series are platform totals (no tenant's name, queue or
    # GPUs shown to anyone who can reach the API, jobs included: docs/isolation.md)
    metrics_scrape_token: SecretStr | None = None

    # Admission (docs/quotas-and-usage.md#request-rate-limits): token buckets of this API process, refilled at
    # the rate (requests per second) up to the burst; a request over one is 429 rate_limited with Retry-After.
    # Signed requests count after authentication, in their access key's bucket and their tenant's (all its keys
    # together); a job's metrics pushes count only in the bucket of their job attempt. A rate of 0 turns that
    # limit off. /healthz, /readyz and /metrics are never limited.
    api_rate_limit_per_key: Annotated[float, Field(ge=0, le=1_000_000)] = 50.0
    api_rate_limit_per_key_burst: Annotated[int, Field(ge=1, le=10_000_000)] = 200
    api_rate_limit_per_tenant: Annotated[float, Field(ge=0, le=1_000_000)] = 200.0
    api_rate_limit_per_tenant_burst: Annotated[int, Field(ge=1, le=10_000_000)] = 1000
    api_rate_limit_per_job: Annotated[float, Field(ge=0, le=1_000_000)] = 20.0
    api_rate_limit_per_job_burst: Annotated[int, Field(ge=1, le=10_000_000)] = 100
    # the queued-jobs cap (QUEUED or RESTARTING) of a tenant whose quota leaves max_queued_jobs unset; 0: none
    default_max_queued_jobs: Annotated[int, Field(ge=0, le=10_000_000)] = 1000

    # Request bodies: uploads (code, model artifacts) up to max_upload_bytes, every other request up to
    # max_request_bytes; both checked before authentication (api/guard.py)
    max_request_bytes: Annotated[int, Field(ge=1024)] = 1024 * 1024
    # Uploads
    max_upload_bytes: Annotated[int, Field(ge=1024)] = 512 * 1024 * 1024
    max_unpacked_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024 * 1024
    max_archive_members: Annotated[int, Field(ge=1)] = 100_000

    # Storage (docs/storage.md): where code uploads, model artifacts and datasets are kept. file:///PATH or
    # s3://BUCKET/PREFIX; None: file://<data_dir> (the layout of earlier versions, which keeps working).
    storage_url: str | None = None
    # S3-compatible storage; what is left unset comes from boto3's standard sources (AWS_ENDPOINT_URL,
    # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, ~/.aws). Never passed to any job or build.
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
    s3_multipart_threshold_bytes: Annotated[int, Field(ge=5 * 1024 * 1024)] = 64 * 1024 * 1024
    s3_multipart_chunk_bytes: Annotated[int, Field(ge=5 * 1024 * 1024)] = 16 * 1024 * 1024

    # datasets registered in place (`datasets create NAME --from s3://BUCKET/PREFIX`, docs/datasets.md): the
    # s3:// locations (each with everything below it) tenants may register objects from, read with the S3
    # settings above and never written; empty: registering in place is off. Never the store's own prefix.
    dataset_source_urls: list[str] = []

    # this host's cache of dataset versions read by jobs (a remote store's; a local store's are used in place):
    # least recently used versions are evicted beyond this size, never one a job reads
    dataset_cache_max_bytes: Annotated[int, Field(ge=1024 * 1024)] = 50 * 1024**3

    # Model registry
    model_inspect_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 120.0  # signature inference
    model_upload_ttl_seconds: Annotated[float, Field(gt=0)] = 24 * 3600.0  # an unused artifact upload is dropped

    # Scheduler and executor: "local" runs jobs on this host; "simulated" runs nothing (attempts are records,
    # for demonstrations and the scheduling simulator)
    executor: Literal["local", "simulated"] = "local"
    scheduler_interval_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    supervisor_interval_seconds: Annotated[float, Field(gt=0, le=60)] = 0.2
    # how often the TensorBoard event files of a running attempt are read into its metrics (docs/metrics.md)
    tensorboard_interval_seconds: Annotated[float, Field(gt=0, le=3600)] = 5.0
    stop_grace_seconds: Annotated[float, Field(ge=0, le=3600)] = 10.0
    gpu_inventory: list[GpuSpec] | None = None  # declared inventory; None = detect
    cpu_capacity: Annotated[float, Field(gt=0)] | None = None  # None = os.cpu_count()
    memory_capacity_bytes: Annotated[int, Field(gt=0)] | None = None  # None = physical memory
    host_name: str | None = None  # recorded on attempts; None = socket.gethostname()
    # ports handed to distributed jobs (MASTER_PORT, TF_CONFIG, JAX coordinator), one set per attempt
    job_port_range_start: Annotated[int, Field(ge=1024, le=65535)] = 29500
    job_port_range_end: Annotated[int, Field(ge=1024, le=65535)] = 30499
    # a job log (each replica's) keeps at most this many bytes on disk, its end: older lines are dropped
    job_log_max_bytes: Annotated[int, Field(ge=16 * 1024)] = 256 * 1024 * 1024
    # a log read without --follow returns at most this many bytes, the end of the log (--follow streams it all)
    job_log_response_max_bytes: Annotated[int, Field(ge=4 * 1024)] = 4 * 1024 * 1024
    # the most disk a job's checkpoint_from copy may take (the source's allocated blocks, each hard-linked file
    # once), else its launch fails; the copy also leaves 5 % of the disk free, at least 1 GiB (docs/jobs.md)
    checkpoint_copy_max_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024**3
    # jobs' checkpoints saved into the object store too (docs/jobs.md#checkpoints), so that an attempt on another
    # host, or after this host's copy is lost, resumes from the last one saved: "on", "off", or "auto" (on where
    # the store is not this host's disk, i.e. S3: a second copy on the same disk would be lost with the first).
    # A running job's are saved when it changed them and then left them alone a few seconds, at most once every
    # ``checkpoint_save_interval_seconds``; an attempt's, when it ends (preempted or not). Bounded like a copy.
    checkpoint_store: Literal["auto", "on", "off"] = "auto"
    checkpoint_save_interval_seconds: Annotated[float, Field(ge=0, le=86_400)] = 60.0

    # Scheduling (docs/scheduling.md): how each pass orders and places jobs (fifo | priority-backfill | fair-share
    # | las); aging raises a waiting job's priority by ``scheduling_aging_step`` every
    # ``scheduling_aging_interval_seconds`` waited, up to ``scheduling_aging_max`` (0: no aging); las: the
    # attained-service boundaries (GPU-seconds) of its queues, lowest first; fair-share: the same inside each
    # tenant (``scheduling_tenant_las_queues_gpu_seconds``, [] = off), and small jobs moved to gather whole nodes
    # for a waiting gang (``scheduling_defragment``), and turns of a tenant below its guarantee over the last
    # ``scheduling_turn_window_seconds`` whose jobs are larger than what it lacks of it (0: no turns); guaranteed GPUs a
    # tenant stopped using are lent to others only after ``scheduling_lend_after_seconds`` (0: at once)
    scheduling_policy: Literal["fifo", "priority-backfill", "fair-share", "las"] = "fair-share"
    scheduling_aging_interval_seconds: Annotated[float, Field(gt=0)] = 3600.0
    scheduling_aging_step: Annotated[int, Field(ge=0, le=1000)] = 1
    scheduling_aging_max: Annotated[int, Field(ge=0, le=2000)] = 100
    scheduling_las_queues_gpu_seconds: list[Annotated[float, Field(gt=0)]] = list(LAS_QUEUES_GPU_S)
    scheduling_tenant_las_queues_gpu_seconds: list[Annotated[float, Field(gt=0)]] = list(TENANT_LAS_QUEUES_GPU_S)
    scheduling_defragment: bool = True
    scheduling_turn_window_seconds: Annotated[float, Field(ge=0, le=7 * 86_400)] = 3600.0
    scheduling_lend_after_seconds: Annotated[float, Field(ge=0, le=MAX_LEND_AFTER_S)] = LEND_AFTER_S
    # named priorities a job spec may give as ``priority_class`` (each inside -1000..1000); a job that gives
    # neither a class nor a ``priority`` gets ``default_priority_class``'s
    priority_classes: dict[str, Annotated[int, Field(ge=-1000, le=1000)]] = {"low": -100, "normal": 0, "high": 100}
    default_priority_class: str = "normal"

    @model_validator(mode="after")
    def _default_class_exists(self) -> Settings:
        if self.default_priority_class not in self.priority_classes:
            raise ValueError(
                f"default_priority_class {self.default_priority_class!r} is not one of priority_classes "
                f"({', '.join(sorted(self.priority_classes)) or 'none'})"
            )
        for name in ("scheduling_las_queues_gpu_seconds", "scheduling_tenant_las_queues_gpu_seconds"):
            if sorted(getattr(self, name)) != getattr(self, name):
                raise ValueError(f"{name} must be in increasing order")
        if 0 < self.scheduling_turn_window_seconds < MIN_TURN_WINDOW_S:
            raise ValueError(
                f"scheduling_turn_window_seconds must be 0 (no turns) or at least {MIN_TURN_WINDOW_S:g}: a turn lasts "
                f"{TURN_MIN_S:g} s to half the window, got {self.scheduling_turn_window_seconds:g}"
            )
        return self

    # Runtime environments (venvs built by the control plane)
    env_build_workers: Annotated[int, Field(ge=1, le=16)] = 2  # builds running at once
    env_build_timeout_seconds: Annotated[float, Field(gt=0, le=24 * 3600)] = 3600.0  # one build, pip included
    # the package index of builds (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL in pip's environment), the only pip
    # settings builds get from the server: its own PIP_* variables are not passed on (docs/environments.md)
    env_build_index_url: str | None = None
    env_build_extra_index_urls: list[str] = []

    # Sandboxing of user code (docs/isolation.md): "auto" uses bubblewrap where it works; "off" never does.
    # Without a working sandbox only the bootstrap tenant's jobs run, unless allow_unsandboxed_tenants.
    sandbox: Literal["auto", "off"] = "auto"
    allow_unsandboxed_tenants: bool = False
    # as root, a tenant's jobs run as uid sandbox_uid_start + its slot (slot 0: environment builds)
    sandbox_uid_start: Annotated[int, Field(ge=1000, le=2**31 - 2**20)] = 200_000
    sandbox_uid_count: Annotated[int, Field(ge=2, le=2**20)] = 100_000
    # Bounds of every sandboxed job (docs/isolation.md). job_network "private": each attempt (a gang together) its
    # own network namespace, reaching only the API; "host": the host's network (the old behaviour; unsafe when
    # tenants share the host). Processes: pids.max of each replica (a pids cgroup), and as root where there is
    # none, RLIMIT_NPROC of the tenant's uid. Disk: what a job's writable directories (work, /tmp, checkpoints,
    # outputs, TensorBoard) may take; past it the job is stopped with that reason, and no single file may
    # grow past it (RLIMIT_FSIZE). 0: no limit.
    job_network: Literal["private", "host"] = "private"
    # what a job may reach beyond its own network, where its tenant sets nothing (docs/isolation.md#network):
    # none | internet (anything but this host's own addresses) | allow (only job_egress_allow: addresses, CIDRs,
    # host names)
    job_egress: Literal["none", "internet", "allow"] = "none"
    job_egress_allow: list[str] = []
    # where the ports jobs publish (``publish`` in a job's spec) listen on this host: each on a free port of this
    # address, forwarded into the job's own network (docs/jobs.md#publishing-ports)
    job_publish_address: IPvAnyAddress = IPv4Address("127.0.0.1")
    job_pids_max: Annotated[int, Field(ge=0)] = 4096
    tenant_processes_max: Annotated[int, Field(ge=0)] = 16384
    job_disk_max_bytes: Annotated[int, Field(ge=0)] = 50 * 1024**3

    log_level: str = "info"
    # API processes of ``dlcloud up`` behind its port (docs/configuration.md#api-workers): 1 serves the API and
    # runs the control plane in one process; more, a control process keeps that many API processes; None: one per
    # core of this machine
    api_workers: Annotated[int, Field(ge=1, le=256)] | None = None

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            url = self.database_url
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url[len("postgresql://") :]
            elif url.startswith("postgres://"):
                url = "postgresql+psycopg://" + url[len("postgres://") :]
            return url
        return f"sqlite:///{self.data_dir / 'dlcloud.db'}"

    @property
    def resolved_job_api_url(self) -> str:
        """The base URL (no trailing '/') jobs send their metrics to."""
        if self.job_api_url:
            return self.job_api_url.rstrip("/")
        return self.local_url()

    def local_url(self, port: int | None = None) -> str:
        """``http://host:port`` where a process on this host reaches the server: a wildcard ``host`` as
        127.0.0.1, an IPv6 address in brackets; ``port`` in place of the configured one when given."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{port if port is not None else self.port}"

    @property
    def resolved_server_key_file(self) -> Path:
        return self.server_key_file or self.data_dir / "server.key"

    @property
    def resolved_api_workers(self) -> int:
        return self.api_workers if self.api_workers is not None else min(256, max(1, len(os.sched_getaffinity(0))))

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def scratch_dir(self) -> Path:
        """Where requests keep files while they run (uploads before their check, an artifact fetched to be
        inspected): this host's own, and what a crash leaves there is swept (``sweep_upload_scratch``)."""
        return self.data_dir / "tmp" / "uploads"

    @property
    def code_dir(self) -> Path:
        return self.data_dir / "code"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def envs_dir(self) -> Path:
        return self.data_dir / "envs"
