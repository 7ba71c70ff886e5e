"""Jobs on the wire: the job spec (ARCHITECTURE.md "Job spec") and the read models."""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from dlcloud.schemas.common import JSON_NUMBER, DurationSeconds, MemoryBytes, Name, Request, Response, exactly_one_of
from dlcloud.schemas.datasets import DatasetRef, JobDataset
from dlcloud.schemas.models import ModelFormat

MAX_COMMAND = 16_384
EnvKey = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, Field(max_length=32_768)]
RESERVED_ENV_PREFIXES = ("DLCLOUD_",)
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES"}
SECRET_MASK = "***"  # what reads show for each value of a job's secret_env
DEFAULT_POST_TIMEOUT_SECONDS = 300.0
MAX_POST_TIMEOUT_SECONDS = 3600.0

MAX_PUBLISHED_PORTS = 8  # ports one job may publish


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"
    PREEMPTED = "PREEMPTED"  # transient: its attempt was stopped for another job; queued again at once


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING})


class Framework(StrEnum):
    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"
    MPI = "mpi"
    JAX = "jax"
    NONE = "none"


class Resources(Request):
    cpu: Annotated[float, Field(gt=0, le=1024)] = 1.0
    memory: MemoryBytes = 2 * 1024**3
    gpus: Annotated[int, Field(ge=0, le=64)] = 0
    gpu_type: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @field_validator("memory")
    @classmethod
    def _memory_positive(cls, v: int) -> int:
        if v < 16 * 1024**2:
            raise ValueError(f"memory must be at least 16Mi, got {v} bytes")
        return v

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> Resources:
        if self.gpu_type and not self.gpus:
            raise ValueError(f"gpu_type {self.gpu_type!r} needs gpus of at least 1")
        return self


ExitCode = Annotated[int, Field(ge=-64, le=255)]


class RestartPolicy(Request):
    """``max_restarts`` new attempts of the whole gang after a failure, ``backoff_seconds`` apart.

    ``restart_on_exit_codes``: only these exit codes of the failing replica restart (empty: any).
    ``never_restart_on_exit_codes``: these exit codes never restart (checked first)."""

    max_restarts: Annotated[int, Field(ge=0, le=100)] = 0
    backoff_seconds: Annotated[float, Field(ge=0, le=3600)] = 10.0
    restart_on_exit_codes: Annotated[list[ExitCode], Field(max_length=64)] = []
    never_restart_on_exit_codes: Annotated[list[ExitCode], Field(max_length=64)] = []

    def restarts_on(self, code: int | None) -> bool:
        """Whether a failure with exit ``code`` may restart (the restart budget aside)."""
        if code is not None and code in self.never_restart_on_exit_codes:
            return False
        return not self.restart_on_exit_codes or code in self.restart_on_exit_codes


class TfConfigStyle(StrEnum):
    ENV = "env"  # TF_CONFIG (TF2 strategies)
    FLAGS = "flags"  # --ps_hosts --worker_hosts --job_name --task_index appended to the command (TF1)


class MpiLaunch(StrEnum):
    MPIRUN = "mpirun"  # the launcher replica runs mpirun ... <command>
    MANUAL = "manual"  # the launcher replica runs <command>; it calls mpirun with $DLCLOUD_MPI_HOSTFILE itself


# Replica groups each framework knows, the first being the one a job without ``replicas`` gets.
FRAMEWORK_GROUPS: dict[str, tuple[str, ...]] = {
    "none": ("worker",),
    "pytorch": ("worker",),
    "jax": ("worker",),
    "tensorflow": ("worker", "chief", "ps", "evaluator"),
    "mpi": ("launcher", "worker"),
}


HParamName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]
HParamValue = bool | int | float | Annotated[str, Field(max_length=1024)]


class TemplateSpec(Request):
    """A no-code template job (docs/templates.md): the platform's trainer on a dataset version. The template's
    name and its hyperparameters (the spec's ``hparams``) are checked at submit against
    ``dlcloud.templates.catalog`` (400 naming what is allowed)."""

    name: Annotated[str, Field(min_length=1, max_length=32)]
    data: DatasetRef  # added to the job's datasets; the trainer reads it at $DLCLOUD_DATASET_<NAME>
    path: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^/]")] | None = None  # file in it
    label: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # CSV label column (default: last)
    data_format: Literal["csv", "libsvm"] | None = None  # default: libsvm for .libsvm/.svm, else csv
    num_features: Annotated[int, Field(ge=1, le=10_000_000)] | None = None  # LibSVM width (default: max index)
    validation_split: Annotated[float, Field(ge=0, le=0.9)] = 0.2
    task: Literal["classification", "regression"] = "classification"
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0

    @field_validator("path")
    @classmethod
    def _path_inside(cls, v: str | None) -> str | None:
        if v is not None and ".." in v.split("/"):
            raise ValueError(f"template.path {v!r} must stay inside the dataset; '..' is not allowed")
        return v


class RegisterModelSpec(Request):
    """Register a model version from the job's outputs when the job succeeds (docs/jobs.md#registering-a-model)."""

    name: Name
    # in DLCLOUD_OUTPUT_DIR; a template job's default is its export directory, ``model``
    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    format: ModelFormat | None = None  # default: torchscript for a template, else from the path's suffix
    signature: dict[str, Any] | None = None  # default: the one inferred (a template's signature.json)
    description: Annotated[str, Field(max_length=4096)] = ""


class JobSpec(Request):
    """What a user submits. ``code`` is an uploaded code id (the CLI uploads directories first). A ``template``
    job gives neither ``command`` nor ``module``: its command is the platform's trainer."""

    # checked by _command_or_module
    model_config = exactly_one_of(command="string", module="string", template="object")

    name: Name
    code: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)] | None = None
    module: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")] | None = None
    args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=1024)] = []
    framework: Framework = Framework.NONE
    environment: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    resources: Resources = Resources()
    replicas: Annotated[
        dict[Annotated[str, Field(max_length=32)], Annotated[int, Field(ge=1, le=1024)]], Field(max_length=8)
    ] = {}
    # per replica group, replacing ``resources`` for that group's replicas
    replica_resources: Annotated[dict[Annotated[str, Field(max_length=32)], Resources], Field(max_length=8)] = {}
    procs_per_worker: Annotated[int, Field(ge=1, le=64)] = 1  # pytorch: processes per worker (nproc_per_node)
    slots_per_worker: Annotated[int, Field(ge=1, le=1024)] = 1  # mpi: ranks per worker
    tf_config_style: TfConfigStyle = TfConfigStyle.ENV
    mpi_launch: MpiLaunch = MpiLaunch.MPIRUN
    grace_period: DurationSeconds | None = None  # SIGTERM -> SIGKILL on cancel and stop; None: the server's default
    env: Annotated[dict[EnvKey, EnvValue], Field(max_length=256)] = {}
    # data the job reads: NAME, NAME@VERSION, NAME@LABEL, OWNER/NAME@... or {name: NAME, version: VERSION}
    # (docs/datasets.md), each resolved to one version at submit and mounted read-only at $DLCLOUD_DATASET_<NAME>
    datasets: Annotated[list[JobDataset], Field(max_length=32)] = []
    # more env whose values are secrets: stored encrypted, never shown again (reads show SECRET_MASK)
    secret_env: Annotated[dict[EnvKey, EnvValue], Field(max_length=256, repr=False)] = {}
    restart: RestartPolicy = RestartPolicy()
    timeout: DurationSeconds | None = None
    # scheduling (docs/scheduling.md): a priority class of the server's ``priority_classes`` or a priority of
    # its own (None of both: the default class); either must be inside the tenant's allowed range
    priority: Annotated[int, Field(ge=-1000, le=1000), JSON_NUMBER] | None = None
    priority_class: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    # False: never preempted, and so only started inside the tenant's guarantee (fair-share)
    preemptible: bool = True
    # the longest an attempt is expected to run: a declaration for backfill and start estimates, not enforced
    # (``timeout`` is the enforced limit, and the estimate when this is not given)
    max_run_time: DurationSeconds | None = None
    pre_command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)] | None = None
    post_command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)] | None = None
    post_timeout: DurationSeconds | None = None  # None: DEFAULT_POST_TIMEOUT_SECONDS
    # hyperparameters: $DLCLOUD_HPARAMS (JSON) in the job; also --name=value arguments with hparams_as_args;
    # a template's are checked against its table
    hparams: Annotated[dict[HParamName, HParamValue], Field(max_length=256)] = {}
    hparams_as_args: bool = False
    template: TemplateSpec | None = None
    register_model: RegisterModelSpec | None = None
    # a job of the caller's tenant that has ended (name or id): this job's DLCLOUD_CHECKPOINT_DIR starts as a
    # copy of that job's, taken when its first attempt is prepared (docs/jobs.md#starting-from-another-jobs-checkpoints)
    checkpoint_from: Name | None = None
    # ports the job serves on inside its own network, published on the host while it runs (the job's
    # ``endpoints``; docs/jobs.md#publishing-ports)
    publish: Annotated[list[Annotated[int, Field(ge=1, le=65535)]], Field(max_length=MAX_PUBLISHED_PORTS)] = []

    @field_validator("publish")
    @classmethod
    def _distinct_ports(cls, v: list[int]) -> list[int]:
        twice = sorted({p for p in v if v.count(p) > 1})
        if twice:
            raise ValueError(f"publish names port(s) {', '.join(map(str, twice))} more than once")
        return v

    @field_validator("hparams")
    @classmethod
    def _finite_hparams(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"hparam {key} must be a finite number, got {value}")
        return v

    @field_validator("post_timeout")
    @classmethod
    def _post_timeout_bounded(cls, v: float | None) -> float | None:
        if v is not None and v > MAX_POST_TIMEOUT_SECONDS:
            raise ValueError(f"post_timeout must be at most 1h, got {v:g} s")
        return v

    @field_validator("env", "secret_env")
    @classmethod
    def _env_not_reserved(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key in env:
            if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(
                    f"{info.field_name} {key} is set by dlcloud and cannot be overridden "
                    "(reserved: CUDA_VISIBLE_DEVICES and names starting with DLCLOUD_)"
                )
        return env

    @model_validator(mode="after")
    def _command_or_module(self) -> JobSpec:
        if self.template is not None:
            if self.command or self.module:
                raise ValueError("a 'template' job runs the platform's trainer; leave 'command' and 'module' out")
            if self.hparams_as_args:
                raise ValueError("'hparams_as_args' goes with 'command' or 'module'; a template reads its hparams")
            if self.code is not None:
                raise ValueError("a 'template' job takes no 'code'; its data comes from 'template.data'")
        elif bool(self.command) == bool(self.module):
            raise ValueError(
                "give exactly one of 'command' (a shell command), 'module' (a Python module to run) or 'template' "
                "(a no-code template)"
            )
        if self.register_model is not None and self.register_model.path is None and self.template is None:
            raise ValueError("register_model.path is required: the file or directory in DLCLOUD_OUTPUT_DIR to register")
        if self.args and not self.module:
            raise ValueError("'args' goes with 'module'; put arguments into 'command' instead")
        if self.priority is not None and self.priority_class is not None:
            raise ValueError("give 'priority' or 'priority_class', not both")
        if self.max_run_time is not None and self.max_run_time <= 0:
            raise ValueError(f"max_run_time must be positive, got {self.max_run_time:g} s")
        if self.post_timeout is not None and not self.post_command:
            raise ValueError("'post_timeout' goes with 'post_command'; add a post_command or leave post_timeout out")
        self._check_replica_groups()
        return self

    def _check_replica_groups(self) -> None:
        fw = self.framework.value
        allowed = FRAMEWORK_GROUPS[fw]
        unknown = sorted(set(self.replicas) - set(allowed))
        if unknown:
            raise ValueError(
                f"framework {fw} has no replica group {', '.join(unknown)}; its groups are: {', '.join(allowed)}"
            )
        unknown = sorted(set(self.replica_resources) - set(self.groups()))
        if unknown:
            raise ValueError(f"replica_resources names group(s) {', '.join(unknown)} that replicas does not ask for")
        groups = self.groups()
        if fw == "tensorflow":
            for one in ("chief", "evaluator"):
                if groups.get(one, 0) > 1:
                    raise ValueError(f"tensorflow runs at most 1 {one}, got {groups[one]}")
            if not groups.get("chief") and not groups.get("worker"):
                raise ValueError("tensorflow needs a chief or a worker")
        if fw == "mpi" and (groups.get("launcher") != 1 or not groups.get("worker")):
            raise ValueError("mpi needs replicas {launcher: 1, worker: N}")
        if self.procs_per_worker > 1 and fw != "pytorch":
            raise ValueError("procs_per_worker goes with framework pytorch")
        if self.slots_per_worker > 1 and fw != "mpi":
            raise ValueError("slots_per_worker goes with framework mpi")

    def groups(self) -> dict[str, int]:
        """The replica groups, in the framework's order (a job without ``replicas``: one replica)."""
        allowed = FRAMEWORK_GROUPS[self.framework.value]
        if not self.replicas:
            return {"launcher": 1, "worker": 1} if self.framework == Framework.MPI else {allowed[0]: 1}
        return {g: self.replicas[g] for g in allowed if g in self.replicas}

    def group_resources(self, group: str) -> Resources:
        return self.replica_resources.get(group, self.resources)

    def process_count(self) -> int:
        """How many processes an attempt runs (each worker runs ``procs_per_worker``)."""
        return sum(n * (self.procs_per_worker if g == "worker" else 1) for g, n in self.groups().items())

    def total_resources(self) -> tuple[int, float, int]:
        """(GPUs, CPUs, memory) of the whole gang: what quotas and the scheduler count."""
        gpus, cpus, memory = 0, 0.0, 0
        for g, n in self.groups().items():
            r = self.group_resources(g)
            gpus += r.gpus * n
            cpus += r.cpu * n
            memory += r.memory * n
        return gpus, cpus, memory

    def hparam_args(self) -> list[str]:
        """``--name=value`` for each hyperparameter when ``hparams_as_args`` (booleans as true/false)."""
        if not self.hparams_as_args:
            return []
        shown = {True: "true", False: "false"}
        return [f"--{k}={shown[v] if isinstance(v, bool) else v}" for k, v in self.hparams.items()]


class LogSection(StrEnum):
    """Which phases' lines a log read returns: each output.log line belongs to one phase's section."""

    ALL = "all"
    PRE = "pre"
    MAIN = "main"
    POST = "post"


class JobEvent(Response):
    time: datetime
    from_state: JobState | None
    to_state: JobState
    reason: str
    attempt: int


class ReplicaState(StrEnum):
    """A replica's state on its record (``job_replicas``): running from its placement, then how it ended.
    ``services/replica_states.py`` is the one writer."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped by the platform: cancelled, preempted, timed out, or its gang ended
    LOST = "lost"  # the executor lost track of it


class JobReplica(Response):
    """One replica of one attempt."""

    name: str  # <role>-<index>, e.g. worker-1
    role: str
    index: int
    host: str
    gpus: list[int]
    cpus: float
    memory: int
    ports: list[int]
    state: ReplicaState
    exit_code: int | None


class JobAttempt(Response):
    number: int
    host: str
    gpus: list[int]
    cpus: float
    memory: int
    started_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    outcome: str | None
    ports: list[int] = []
    replicas: list[JobReplica] = []
    # the last change it made to the job's checkpoint directory, as the platform saw it (a preemption loses the
    # work since; docs/scheduling.md#preemption-step-by-step); None: none seen
    checkpoint_at: datetime | None = None


class Job(Response):
    id: str
    name: str
    tenant: str
    user: str
    state: JobState
    reason: str
    priority: int
    gpus: int
    cpus: float
    memory: int
    attempt: int
    restarts: int
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    code: str | None
    command: str
    environment: str  # "default": the server's own Python environment
    priority_class: str | None = None
    preemptible: bool = True
    preemptions: int = 0  # times its attempt was stopped for another job (restarts do not count them)


class JobDatasetVersion(Response):
    """A dataset version a job reads: one of its references (``datasets``, a template's ``data``) as resolved
    at submit."""

    ref: str  # as the job gave it
    name: str  # the dataset's name (the job's DLCLOUD_DATASET_<NAME> is derived from it)
    owner: str  # the tenant that owns the dataset
    version: int
    sha256: str
    size_bytes: int


class ResolvedDataset(JobDatasetVersion):
    """A job's dataset version as the platform keeps it: also the version's id and where its files are stored,
    which reads never show."""

    model_config = ConfigDict(frozen=True)

    version_id: str
    storage_key: str


class ModelTarget(BaseModel):
    """``register_model`` as the platform completed it at submit: the path in the outputs (a template's export
    directory by default), the format (a template's, else told from the path's suffix), the signature
    validated and normalised (None: inferred when the model is registered)."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    format: str
    signature: dict[str, Any] | None = None
    description: str = ""


class JobPlatformState(BaseModel):
    """What the platform decided for a job at submit, kept beside the user's spec (``jobs.platform_state``),
    never inside it: the spec a job row keeps is the user's own, and no reader looks the platform's state up by
    a string key in it.

    - ``datasets``: each dataset reference resolved to one version (a label moved afterwards does not change
      what the job reads); the executor mounts them by storage key.
    - ``checkpoint_from_id``: the id of the job ``spec.checkpoint_from`` names (None: the spec names none, or
      that job never ran an attempt and so has no checkpoints).
    - ``env``: the DLCLOUD_* variables the study driver gives a trial's job (DLCLOUD_HPARAMS, DLCLOUD_STUDY,
      DLCLOUD_TRIAL, DLCLOUD_STOP_AT_STEP), which a user's spec may not set; empty for other jobs.
    - ``register_model``: the spec's ``register_model`` completed (``ModelTarget``); None when it has none.

    One typed sub-document in one JSON column rather than a column each: they are decided together at
    submit and never written after, no query filters or joins on them (the jobs reading a dataset version are
    the ``job_datasets`` rows), two of them are a list and a mapping (JSON either way), and what the platform
    decides next at submit becomes a field here, not another migration. The store validates it on every load
    (``store/rows.py``), so readers get attributes, never a dict.
    """

    model_config = ConfigDict(frozen=True)

    datasets: tuple[ResolvedDataset, ...] = ()
    checkpoint_from_id: str | None = None
    env: dict[str, str] = {}
    register_model: ModelTarget | None = None


class JobResolved(Response):
    """``JobPlatformState`` as reads show it: what the platform decided for the job at submit, beside the spec
    the user gave (the datasets without where they are stored)."""

    datasets: list[JobDatasetVersion] = []
    checkpoint_from_id: str | None = None  # the job ``spec.checkpoint_from`` resolved to (None: no checkpoints)
    env: dict[str, str] = {}  # a study trial's DLCLOUD_* variables, set by the platform
    register_model: ModelTarget | None = None  # the spec's register_model with path, format and signature decided


class JobDetail(Job):
    # the user's spec as stored: defaults filled in, each secret_env value shown as SECRET_MASK (what the
    # platform decided of it, register_model completed among it, is ``resolved``)
    spec: dict[str, Any]
    resolved: JobResolved = JobResolved()
    environment_hash: str | None  # the build of the environment the job runs in (None for default)
    queue_position: int | None
    wait_reason: str | None
    estimated_start: datetime | None = None  # while it waits, where the scheduler can tell
    max_run_time: float | None = None  # seconds: the declaration the scheduler plans with
    preempt_requested: bool = False  # being stopped for another job
    preempt_reason: str | None = None
    events: list[JobEvent]
    attempts: list[JobAttempt]
    # while it runs: where each port it publishes is reached on the host, {"8888": "127.0.0.1:41234"}
    endpoints: dict[str, str] = {}


class QueueEntry(Response):
    """One waiting job in the scheduler's queue (``GET /queue``)."""

    position: int  # 1-based, in the queue's order (priority, then submit time) across the tenants shown
    id: str
    name: str
    tenant: str
    user: str
    state: JobState
    priority: int
    priority_class: str | None
    gpus: int
    cpus: float
    memory: int
    preemptible: bool
    preemptions: int
    submitted_at: datetime
    wait_seconds: float
    wait_reason: str | None
    estimated_start: datetime | None


class CodeUpload(Response):
    id: str
    kind: str
    filename: str
    sha256: str
    size: int
    created_at: datetime
