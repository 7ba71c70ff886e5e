"""ORM tables. Rows never leave the service layer: services return pydantic read models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from dlcloud.schemas.jobs import JobPlatformState
from dlcloud.schemas.studies import StudyPlatformState


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both SQLite (naive storage) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class PlatformStateJSON(TypeDecorator[BaseModel]):
    """A platform state model (``JobPlatformState``, ``StudyPlatformState``) stored as JSON, validated on load:
    the column reads back typed, in ORM rows and in Core rows alike."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[BaseModel]) -> None:
        super().__init__()
        self.model = model

    def process_bind_param(self, value: BaseModel | None, dialect: Any) -> dict[str, Any] | None:
        return None if value is None else value.model_dump(mode="json")

    def process_result_value(self, value: Any, dialect: Any) -> BaseModel | None:
        return None if value is None else self.model.model_validate(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime()}


# What the two versioned registries, models and datasets, have alike in their tables (each keeps its own tables;
# these mixins hold the columns written once, services/registry_access.py the rules over them). A registry's row
# classes name its kind (``kind = "model"``); its tables are ``{kind}s``, ``{kind}_versions``, ``{kind}_labels``
# and ``{kind}_shares``, and the entry's id is ``{kind}_id`` in the last three.


class _RegistryTable:
    """A registry's table, named after the registry's ``kind`` (its row class says it) and ``table_suffix``."""

    kind: ClassVar[str]  # "model", "dataset"
    table_suffix: ClassVar[str]  # the table's name after the kind: "s", "_versions", "_labels", "_shares"

    @declared_attr.directive
    def __tablename__(cls) -> str:
        return f"{cls.kind}{cls.table_suffix}"


class _RegistryItemColumns(_RegistryTable):
    """A name in a tenant. ``last_version`` is the highest number ever given, so a deleted version's number is
    never reused."""

    table_suffix = "s"

    @declared_attr.directive
    def __table_args__(cls) -> tuple[UniqueConstraint]:
        return (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    description: Mapped[str] = mapped_column(Text, default="")
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(32))  # user id
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class _RegistryVersionColumns(_RegistryTable):
    """An immutable numbered version of an item: its bytes' checksum and size, who made it and when. The entry's
    id is the registry's own column (``model_id``), declared by each version row."""

    table_suffix = "_versions"

    @declared_attr.directive
    def __table_args__(cls) -> tuple[UniqueConstraint]:
        return (UniqueConstraint(f"{cls.kind}_id", "version"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32), index=True)
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    description: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(32))  # user id
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class _RegistryEntryKey(_RegistryTable):
    """A row of one entry's (a label, a share): the entry's id, ``{kind}_id``, first in the primary key; the row
    goes with the entry."""

    @declared_attr
    def entry_id(cls) -> Mapped[str]:
        entries = ForeignKey(f"{cls.kind}s.id", ondelete="CASCADE")
        return mapped_column(f"{cls.kind}_id", entries, primary_key=True, sort_order=-2)


class _RegistryLabelColumns(_RegistryEntryKey):
    """A label points at exactly one version of its item (the primary key, item and label, makes that so)."""

    table_suffix = "_labels"

    @declared_attr
    def version_id(cls) -> Mapped[str]:
        versions = f"{cls.kind}_versions.id"
        return mapped_column(ForeignKey(versions, ondelete="CASCADE"), index=True, sort_order=-1)

    label: Mapped[str] = mapped_column(String(63), primary_key=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class _RegistryShareColumns(_RegistryEntryKey):
    """Read-only access to an item for another tenant."""

    table_suffix = "_shares"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True, index=True)
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class TenantRow(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    quota_gpus: Mapped[int | None] = mapped_column(Integer)
    quota_cpus: Mapped[float | None] = mapped_column(Float)
    quota_memory: Mapped[int | None] = mapped_column(BigInteger)
    quota_max_running_jobs: Mapped[int | None] = mapped_column(Integer)
    quota_max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    quota_storage: Mapped[int | None] = mapped_column(BigInteger)  # bytes of datasets, models and code
    # from which its jobs' sandbox uid is derived (settings.sandbox_uid_start + slot); assigned at creation,
    # one more than any slot ever given, so a deleted tenant's number (and files) never pass to another
    sandbox_slot: Mapped[int | None] = mapped_column(Integer, unique=True)
    # fair share (docs/scheduling.md): what the tenant is guaranteed (it may preempt borrowers to get it back),
    # how much more it may borrow from idle capacity (None: as much as is idle), its weight in dominant-resource
    # fairness, and the priorities its jobs may have
    guarantee_gpus: Mapped[int] = mapped_column(Integer, default=0)
    guarantee_cpus: Mapped[float] = mapped_column(Float, default=0.0)
    guarantee_memory: Mapped[int] = mapped_column(BigInteger, default=0)
    borrow_gpus: Mapped[int | None] = mapped_column(Integer)
    borrow_cpus: Mapped[float | None] = mapped_column(Float)
    borrow_memory: Mapped[int | None] = mapped_column(BigInteger)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    priority_min: Mapped[int] = mapped_column(Integer, default=-1000)
    priority_max: Mapped[int] = mapped_column(Integer, default=1000)
    # what its jobs may reach beyond their own network (docs/isolation.md#network): none | internet | allow, with
    # the allow-list; None: the platform's default
    egress: Mapped[str | None] = mapped_column(String(16))
    egress_allow: Mapped[list[str] | None] = mapped_column(JSON)
    # whether its jobs may make user namespaces of their own (docs/isolation.md#user-namespaces)
    user_namespaces: Mapped[bool] = mapped_column(Boolean, default=False)


class UserRow(Base):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    role: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AccessKeyRow(Base):
    __tablename__ = "access_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # the access key id itself
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    secret_encrypted: Mapped[bytes] = mapped_column(LargeBinary)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class NonceRow(Base):
    __tablename__ = "nonces"
    access_key: Mapped[str] = mapped_column(String(40), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(128), primary_key=True)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class CodeRow(Base):
    __tablename__ = "code_uploads"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # archive | wheel | sdist
    filename: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(Text)  # the object's key in the object store
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name"),
        # the queue in its order (fifo reads it so), and what changes while a job waits: a scheduling pass that reads
        # the whole queue reads this index alone (store/queue.py, CHANGING)
        Index(
            "ix_jobs_queue",
            "state",
            "priority",
            "created_at",
            "id",
            "not_before",
            "attained_gpu_seconds",
            "reclaiming",
        ),
        Index("ix_jobs_tenant_state", "tenant_id", "state"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    user_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the user's own (``JobDraft.stored``, services/job_drafts.py)
    # what the platform decided at submit, beside the spec, never in it (``JobPlatformState`` says why one
    # sub-document); fixed at submit
    platform_state: Mapped[JobPlatformState] = mapped_column(
        PlatformStateJSON(JobPlatformState), default=lambda: JobPlatformState()
    )
    command: Mapped[str] = mapped_column(Text)
    code_id: Mapped[str | None] = mapped_column(String(40))
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    cpus: Mapped[float] = mapped_column(Float, default=1.0)
    memory: Mapped[int] = mapped_column(BigInteger, default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    timeout_seconds: Mapped[float | None] = mapped_column(Float)
    max_restarts: Mapped[int] = mapped_column(Integer, default=0)
    backoff_seconds: Mapped[float] = mapped_column(Float, default=10.0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    environment: Mapped[str | None] = mapped_column(String(63))  # None: the server's own (``default``)
    environment_hash: Mapped[str | None] = mapped_column(String(64))  # its build; None for ``default``
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # a gang: [{"role", "count", "gpus", "cpus", "memory", "gpu_type"}] per replica process; None: one process
    replica_groups: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # scheduling (docs/scheduling.md): the priority class the priority came from, whether the job may be
    # preempted, its declared maximum run time of an attempt (backfill and estimates; the smaller of
    # ``max_run_time`` and ``timeout``), a preemption the scheduler asked for and not yet carried out (the
    # supervision stops the attempt like a cancel, then the job is queued again), the preemptions so far,
    # GPU-seconds of its ended attempts (why it waits and when it may start: ``WaitReasonRow``).
    # Fixed at submit, never written after (the scheduling pass reads them once per queued job, store/queue.py
    # ``FIXED_AT_SUBMIT``): tenant_id, gpus, cpus, memory, gpu_type, created_at, environment, environment_hash,
    # replica_groups, preemptible, max_run_time_seconds.
    priority_class: Mapped[str | None] = mapped_column(String(63))
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    max_run_time_seconds: Mapped[float | None] = mapped_column(Float)
    preempt_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    preempt_reason: Mapped[str | None] = mapped_column(Text)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    attained_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # the scheduler preempted attempts for it (fair-share): it is considered first until it starts, on what its
    # victims free
    reclaiming: Mapped[bool] = mapped_column(Boolean, default=False)
    # moved (a "defrag" preemption): the GPU indices its next attempt gets, held for it by the scheduler (no other
    # job gets them) from the preemption until it is placed again; while it stops, only until ``hold_until`` (a job
    # that takes longer to stop than the server's grace period does not keep GPUs idle for it)
    hold_gpus: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    hold_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # preempted for its tenant's turn (fair-share, "Guarantees when jobs are large" in docs/scheduling.md): the turn's
    # length, given to the attempt it is placed on (``AttemptRow.turn_until``); set only with ``reclaiming``
    turn_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # its tenant's storage quota (services/storage_quota.py): the bytes of its outputs saved in the object store
    # (while a new attempt's are copied, both), and the disk its checkpoints took on the executor when its latest
    # attempt ended; written by the supervision alone
    outputs_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    checkpoints_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class WaitReasonRow(Base):
    """Why queued jobs of one tenant wait and when they may start, as that tenant may read it (the scheduling pass's
    ``TenantView``): one row shared by all of them (``JobWaitRow``). The scheduling pass alone writes it and assigns
    its ids (store/waits.py)."""

    __tablename__ = "wait_reasons"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    reason: Mapped[str | None] = mapped_column(Text)
    estimated_start: Mapped[datetime | None] = mapped_column(UTCDateTime())


class JobWaitRow(Base):
    """The wait reason of a queued job the last scheduling pass looked at (none: it waits for nothing specific)."""

    __tablename__ = "job_waits"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    wait_id: Mapped[int] = mapped_column(ForeignKey("wait_reasons.id", ondelete="CASCADE"), index=True)


class AttemptRow(Base):
    __tablename__ = "job_attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "number"),
        Index("ix_attempts_tenant_time", "tenant_id", "started_at"),
        Index("ix_attempts_live", "finished_at"),
        # the attempts placed for a turn, for a pass's recent GPU-seconds (store/scheduling.py); few of them
        Index(
            "ix_attempts_turns",
            "turn_until",
            postgresql_where=text("turn_until IS NOT NULL"),
            sqlite_where=text("turn_until IS NOT NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # no foreign key: attempts outlive a deleted job, they are the usage record
    job_id: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(32))
    number: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[list[int]] = mapped_column(JSON)
    cpus: Mapped[float] = mapped_column(Float)
    memory: Mapped[int] = mapped_column(BigInteger)
    # the executor's opaque name of the attempt (Executor.handle); the column keeps its first name: rows
    # written before handles existed hold the local attempt directory, which the local executor still reads
    handle: Mapped[str] = mapped_column("attempt_dir", Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # the last change the attempt made to its job's checkpoint directory, as the executor saw it: preempting it
    # loses the work since (else since its start; control/supervision.py records it)
    checkpoint_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # placed for its tenant's turn: owed (not reclaimable) until then, and its tenant's usage counts it until then
    turn_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    exit_code: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str | None] = mapped_column(String(16))
    ports: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)  # from the managed range


class ReplicaRow(Base):
    """One replica (process) of one gang attempt: where it ran, what it held, how it ended."""

    __tablename__ = "job_replicas"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)  # no foreign key: usage record, like attempts
    tenant_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(32))
    index: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[list[int]] = mapped_column(JSON)
    cpus: Mapped[float] = mapped_column(Float)
    memory: Mapped[int] = mapped_column(BigInteger)
    ports: Mapped[list[int]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer)


class PortRow(Base):
    """A port of the managed range held by a live attempt (the primary key: no port is handed out twice)."""

    __tablename__ = "job_ports"
    port: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    allocated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobEventRow(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    time: Mapped[datetime] = mapped_column(UTCDateTime())
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)


class AuditRow(Base):
    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_tenant_time", "tenant_id", "time"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    tenant_id: Mapped[str | None] = mapped_column(String(32))
    tenant_name: Mapped[str | None] = mapped_column(String(63))
    user_name: Mapped[str | None] = mapped_column(String(63))
    access_key: Mapped[str | None] = mapped_column(String(40))
    action: Mapped[str] = mapped_column(String(64))
    resource: Mapped[str | None] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(16))
    status_code: Mapped[int] = mapped_column(Integer)
    error_code: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str] = mapped_column(String(64))
    client_address: Mapped[str | None] = mapped_column(String(255))


class ModelRow(_RegistryItemColumns, Base):
    """A registry model."""

    kind = "model"


class ModelVersionRow(_RegistryVersionColumns, Base):
    kind = "model"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    format: Mapped[str] = mapped_column(String(32))
    artifact_name: Mapped[str] = mapped_column(String(255))
    artifact_key: Mapped[str] = mapped_column(Text)  # the tree in the object store holding <artifact_name>
    signature: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_job_id: Mapped[str | None] = mapped_column(String(32))
    source_job_name: Mapped[str | None] = mapped_column(String(63))
    source_path: Mapped[str | None] = mapped_column(Text)


class ModelLabelRow(_RegistryLabelColumns, Base):
    kind = "model"


class ModelShareRow(_RegistryShareColumns, Base):
    kind = "model"


class ModelDeploymentRow(Base):
    """A deployment lease: the version counts as deployed while ``expires_at`` is in the future.

    A lease is named per holding tenant (two tenants' servers may pick the same name) and belongs to the user
    who created it: only that user renews or releases it. ``holder_id`` is empty for leases created before
    holders were recorded; the first renewal from the holding tenant adopts them.
    """

    __tablename__ = "model_deployments"
    __table_args__ = (
        UniqueConstraint("model_version_id", "tenant_id", "name", name="uq_model_deployments_version_tenant_name"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_version_id: Mapped[str] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(32))  # the tenant whose model server holds the lease
    holder_id: Mapped[str] = mapped_column(String(32))  # the user who holds it
    holder_key: Mapped[str] = mapped_column(String(64))  # the access key of its last heartbeat
    name: Mapped[str] = mapped_column(String(128))
    endpoint: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class EnvironmentRow(Base):
    """A user environment: a name in a tenant for a spec; its venv is the build of ``spec_hash``."""

    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the create request, as given
    spec_hash: Mapped[str] = mapped_column(String(64), index=True)
    created_by: Mapped[str] = mapped_column(String(32))  # user id
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class EnvironmentBuildRow(Base):
    """One materialised environment (a venv under ``<data_dir>/envs/<spec_hash>``), shared by every
    environment of any tenant with the same spec, and by the built-ins."""

    __tablename__ = "environment_builds"
    spec_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)  # BUILDING | READY | FAILED
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # what the builder needs (executors.environments.BuildSpec)
    error: Mapped[str | None] = mapped_column(Text)
    builds: Mapped[int] = mapped_column(Integer, default=0)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class LeadershipRow(Base):
    """The scheduler leader's fencing token: one row (id 1). Each new leader takes the next epoch, and every
    write of the control loop checks that the epoch is still its own (``control/leader.py``)."""

    __tablename__ = "leadership"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(255))  # <host>:<pid> of the leader
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime())


class DatasetRow(_RegistryItemColumns, Base):
    """A dataset of the sample library."""

    kind = "dataset"


class DatasetVersionRow(_RegistryVersionColumns, Base):
    """An immutable version: a tree in the object store (``storage_key``) with its manifest's checksum.

    Registered in place (``source_url`` set), its files stay in that bucket and the store holds only its
    manifest; it is ``pending`` until a worker has read every object for the manifest (``claimed_by`` /
    ``claimed_at``: the server process doing it and its last sign of life), then ``ready`` or ``failed``
    (``state_reason`` says why). ``services/dataset_sources.py`` owns that state machine."""

    kind = "dataset"
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    storage_key: Mapped[str] = mapped_column(Text)
    file_count: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready", index=True)
    state_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    source_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class DatasetLabelRow(_RegistryLabelColumns, Base):
    kind = "dataset"


class DatasetShareRow(_RegistryShareColumns, Base):
    kind = "dataset"


class UploadClaimRow(Base):
    """An upload a request is using right now (a register or a push): a second request for the same upload
    waits for none and is refused, so one upload never becomes two versions."""

    __tablename__ = "upload_claims"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobDatasetRow(Base):
    """A dataset version a job reads (resolved at submit): while the job has not ended the version cannot be
    deleted (the restriction on the foreign key makes that hold in the database too)."""

    __tablename__ = "job_datasets"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    version_id: Mapped[str] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="RESTRICT"), primary_key=True, index=True
    )


class JobMetricRow(Base):
    """One value of one metric at one step of one replica of one job attempt (docs/metrics.md).

    The primary key is the point's identity, so a retried push overwrites instead of adding; it starts with
    ``job_id``, which makes it the index of reads by job. Deleting the job deletes its metrics (the cascade).
    ``replica`` is '' for a job of one process. Metrics count against no quota.
    """

    __tablename__ = "job_metrics"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    replica: Mapped[str] = mapped_column(String(64), primary_key=True)
    metric: Mapped[str] = mapped_column(String(128), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    tenant_id: Mapped[str] = mapped_column(String(32))
    value: Mapped[float] = mapped_column(Float)
    time: Mapped[datetime] = mapped_column(UTCDateTime())


class StudyRow(Base):
    """A hyperparameter study (docs/tuning.md); its state changes only through ``services/study_states.py``.

    ``spec`` is the study file as submitted (the trial's ``secret_env`` values encrypted, as a job row keeps
    them); what the platform decided at submit is ``platform_state`` (``StudyPlatformState``; a row written
    before migration 0027 has an empty one and its decisions inside ``spec``). ``elapsed_seconds`` is the time it
    spent RUNNING before ``running_since`` (None while not RUNNING).
    """

    __tablename__ = "studies"
    __table_args__ = (UniqueConstraint("tenant_id", "name"), Index("ix_studies_state", "state"))
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    user_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    platform_state: Mapped[StudyPlatformState] = mapped_column(
        PlatformStateJSON(StudyPlatformState), default=lambda: StudyPlatformState()
    )
    algorithm: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    elapsed_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    running_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class StudyTrialRow(Base):
    """One trial of a study: written with its job in one transaction, so a trial is never lost nor run twice.

    ``number`` is the Optuna trial number; ``distributions`` and ``system_attrs`` are Optuna's (the JSON of
    each distribution; the sampler's and pruner's attributes), enough to rebuild the Optuna study from these
    rows after a restart. ``intermediate`` maps a step (as a string) to the objective's value there.
    ``job_id`` is None for a duplicate (no job) and after the trial's job was deleted.
    A trial of a pausing ASHA study runs as several jobs, one per rung it earns: ``segments`` lists them in order
    (``{"job_id", "job_name", "budget"}``; ``job_id``/``job_name`` are the last one's) and ``budget`` is the step
    the last one trains to (``DLCLOUD_STOP_AT_STEP``); other trials have no segments and no budget.
    """

    __tablename__ = "study_trials"
    __table_args__ = (UniqueConstraint("study_id", "number"), Index("ix_study_trials_job", "job_id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(32))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    distributions: Mapped[dict[str, Any]] = mapped_column(JSON)
    system_attrs: Mapped[dict[str, Any]] = mapped_column(JSON)
    intermediate: Mapped[dict[str, Any]] = mapped_column(JSON)
    value: Mapped[float | None] = mapped_column(Float)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    job_name: Mapped[str | None] = mapped_column(String(63))
    duplicate_of: Mapped[int | None] = mapped_column(Integer)
    segments: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    budget: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
