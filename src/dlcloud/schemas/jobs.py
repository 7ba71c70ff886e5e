"""Jobs on the wire: the job spec (ARCHITECTURE.md "Job spec") and the read models."""

from __future__ import annotations

import shlex
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from dlcloud.schemas.common import DurationSeconds, MemoryBytes, Name, Request, Response

MAX_COMMAND = 16_384
EnvKey = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, Field(max_length=32_768)]
RESERVED_ENV_PREFIXES = ("DLCLOUD_",)
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES"}
DEFAULT_POST_TIMEOUT_SECONDS = 300.0
MAX_POST_TIMEOUT_SECONDS = 3600.0


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


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


class RestartPolicy(Request):
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 0
    backoff_seconds: Annotated[float, Field(ge=0, le=3600)] = 10.0


class JobSpec(Request):
    """What a user submits. ``code`` is an uploaded code id (the CLI uploads directories first)."""

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
    env: Annotated[dict[EnvKey, EnvValue], Field(max_length=256)] = {}
    restart: RestartPolicy = RestartPolicy()
    timeout: DurationSeconds | None = None
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    pre_command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)] | None = None
    post_command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)] | None = None
    post_timeout: DurationSeconds | None = None  # None: DEFAULT_POST_TIMEOUT_SECONDS

    @field_validator("post_timeout")
    @classmethod
    def _post_timeout_bounded(cls, v: float | None) -> float | None:
        if v is not None and v > MAX_POST_TIMEOUT_SECONDS:
            raise ValueError(f"post_timeout must be at most 1h, got {v:g} s")
        return v

    @field_validator("env")
    @classmethod
    def _env_not_reserved(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(
                    f"env {key} is set by dlcloud and cannot be overridden "
                    "(reserved: CUDA_VISIBLE_DEVICES and names starting with DLCLOUD_)"
                )
        return env

    @model_validator(mode="after")
    def _command_or_module(self) -> JobSpec:
        if bool(self.command) == bool(self.module):
            raise ValueError("give exactly one of 'command' (a shell command) or 'module' (a Python module to run)")
        if self.args and not self.module:
            raise ValueError("'args' goes with 'module'; put arguments into 'command' instead")
        if self.post_timeout is not None and not self.post_command:
            raise ValueError("'post_timeout' goes with 'post_command'; add a post_command or leave post_timeout out")
        total = sum(self.replicas.values()) if self.replicas else 1
        if total != 1:
            raise ValueError(
                f"this platform version runs single-replica jobs; replicas {self.replicas} asks for {total} "
                "(use replicas: {worker: 1} or leave it out)"
            )
        return self

    def shell_command(self) -> str:
        """The main command as one shell string."""
        if self.command:
            return self.command
        return shlex.join(["python", "-m", str(self.module), *self.args])


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


class JobDetail(Job):
    spec: dict[str, Any]
    environment_hash: str | None  # the build of the environment the job runs in (None for default)
    queue_position: int | None
    wait_reason: str | None
    events: list[JobEvent]
    attempts: list[JobAttempt]


class CodeUpload(Response):
    id: str
    kind: str
    filename: str
    sha256: str
    size: int
    created_at: datetime
