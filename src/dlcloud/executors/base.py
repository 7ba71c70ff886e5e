"""The Executor ABC and the value types that cross it.

A Workload is one attempt of one job: one process, or a gang of replicas (``Workload.replicas``) that the
executor starts together and reports on one by one (``AttemptReport.replicas``). Which replica's exit
decides what stays above the executor (``services/gangs.py``); the executor only materialises and reports.
The executor starts it, and afterwards ``poll`` reports its
state from what the executor recorded (for the local executor: files on disk written by a detached
launcher), so the control plane can crash and restart without losing or re-running anything.
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dlcloud.executors.environments import EnvironmentBackend
    from dlcloud.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replica:
    """One process of a gang, fully decided above the executor (``services/recipes.py``)."""

    name: str  # <role>-<index> (pytorch with procs_per_worker > 1: <role>-<index>.<local rank>)
    role: str
    index: int
    env: dict[str, str] = field(default_factory=dict)  # added over Workload.env
    command: str | None = None  # None: Workload.command
    gpus: tuple[int, ...] = ()
    cpus: float = 1.0
    memory_bytes: int = 0
    ports: tuple[int, ...] = ()
    decides: bool = True  # its exit 0 is needed for success (False: runs until the gang is stopped, e.g. TF ps)
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written into its directory first (an MPI hostfile)


@dataclass(frozen=True)
class Workload:
    """One attempt of a job, fully decided: what to run, where, with which resources."""

    job_id: str
    tenant_id: str
    attempt: int
    attempt_dir: Path  # created by the executor; holds code/, logs and the launcher's records
    command: str  # the main command, run with /bin/sh -c in the code directory
    env: dict[str, str] = field(default_factory=dict)  # added to a minimal base environment
    code_archive: Path | None = None  # a validated .tar.gz unpacked into <attempt_dir>/code
    package: Path | None = None  # a wheel or sdist installed into <attempt_dir>/packages (PYTHONPATH)
    venv: Path | None = None  # a runtime environment to run in (activated: bin/ first on PATH, VIRTUAL_ENV)
    gpus: tuple[int, ...] = ()  # exclusive GPU indices -> CUDA_VISIBLE_DEVICES
    cpus: float = 1.0
    memory_bytes: int = 0  # 0 = no limit
    timeout_seconds: float | None = None  # enforced by the launcher, survives control-plane restarts
    grace_seconds: float = 10.0  # SIGTERM -> SIGKILL on stop and timeout
    # Phases around the main command, each run like it (same env, directory, limits). pre failing skips main;
    # post runs after main whatever happened to it (also after a stop or timeout), within post_timeout_seconds.
    pre_command: str | None = None
    post_command: str | None = None
    post_timeout_seconds: float = 300.0
    # a gang: each replica runs the phases in its own directory <attempt_dir>/replicas/<name>/ with its own
    # env, GPUs and limits; gpus / cpus / memory_bytes above are then the gang's totals. Empty: one process.
    replicas: tuple[Replica, ...] = ()
    log_max_bytes: int = 256 * 1024 * 1024  # the cap of the log (of each replica's): its end is kept
    # directories the job writes that outlive the attempt (checkpoints, outputs): created by the executor,
    # the only ones besides its own work directory that a sandboxed job may write
    data_dirs: tuple[Path, ...] = ()
    # directories the job reads and never writes (dataset versions): in a sandbox, bound read-only at the
    # same path
    readonly_dirs: tuple[Path, ...] = ()
    # the tenant's sandbox number (TenantRow.sandbox_slot): the executor derives the Unix uid from it
    sandbox_slot: int | None = None


@dataclass(frozen=True)
class ReplicaReport:
    """What the executor knows about one replica of a gang attempt."""

    name: str
    role: str
    index: int
    decides: bool
    state: Literal["pending", "running", "exited", "lost"]
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    timed_out: bool = False
    stopped: bool = False
    message: str = ""
    last_lines: tuple[str, ...] = ()  # the last lines of its log, for replicas that exited non-zero
    post_exit_code: int | None = None
    post_timed_out: bool = False


@dataclass(frozen=True)
class AttemptReport:
    """What the executor knows about one attempt."""

    state: Literal["pending", "running", "exited", "lost"]
    exit_code: int | None = None  # for exited: the process's code; negative = killed by that signal
    started_at: datetime | None = None
    finished_at: datetime | None = None
    timed_out: bool = False
    stopped: bool = False  # exited because stop() was called
    message: str = ""  # e.g. why it is lost, launcher errors (unpack failure, ...)
    pid: int | None = None
    launched: bool = True  # False: the attempt was recorded but its workload never reached the executor
    post_exit_code: int | None = None  # the post command's exit code; None when none ran
    post_timed_out: bool = False  # the post command was ended by its post_timeout
    replicas: tuple[ReplicaReport, ...] = ()  # a gang's replicas; the fields above then summarise them


def replica_sort_key(name: str) -> tuple[str, int, int]:
    """worker-2 before worker-10; worker-1.0 before worker-1.1."""
    role, _, rest = name.rpartition("-")
    index, _, local = rest.partition(".")
    return (role, int(index) if index.isdigit() else 0, int(local) if local.isdigit() else 0)


REPLICAS_DIR = "replicas"


# A job log is capped (Workload.log_max_bytes) by keeping its end: past half the cap, output.log becomes
# output.log.1 (the older half is dropped) and the new output.log starts with a ``system`` line
# ``log truncated: N earlier bytes dropped (cap C)``. The local launcher writes this (Launcher.rotate_log).
ROTATED_LOG_SUFFIX = ".1"
LOG_TRUNCATED = "log truncated: "  # the text of a system line marking lines left out


def replica_log_files(attempt_dir: Path) -> dict[str, Path]:
    """An attempt's output.log files by replica name ("" for a single-process attempt); each may have an
    older half beside it (``log_segments``)."""
    replicas = attempt_dir / REPLICAS_DIR
    if replicas.is_dir():
        names = sorted((d.name for d in replicas.iterdir() if d.is_dir()), key=replica_sort_key)
        return {n: replicas / n / "output.log" for n in names}
    return {"": attempt_dir / "output.log"}


def log_segments(log: Path) -> list[Path]:
    """The files of one log, oldest first: output.log.1 (once the log reached half its cap), output.log."""
    return [log.with_name(log.name + ROTATED_LOG_SUFFIX), log]


class Executor(abc.ABC):
    """Starts, polls and stops Workloads. Public methods log; implementations fill the ``_`` hooks."""

    name: str = "base"

    @classmethod
    def from_settings(cls, settings: Settings) -> Executor:
        """The executor as ``dlcloud up`` builds it from the settings (``settings.executor`` names the class)."""
        return cls()

    def start(self, workload: Workload) -> None:
        log.info(
            "starting job %s attempt %d (gpus=%s cpus=%s)",
            workload.job_id,
            workload.attempt,
            list(workload.gpus),
            workload.cpus,
        )
        self._start(workload)

    def poll(self, attempt_dir: Path) -> AttemptReport:
        return self._poll(attempt_dir)

    def stop(self, attempt_dir: Path) -> None:
        log.info("stopping attempt %s", attempt_dir)
        self._stop(attempt_dir)

    def isolation(self) -> tuple[bool, str]:
        """Whether user code this executor runs is sandboxed, and how, in words for the start-up banner."""
        return True, f"the {self.name} executor runs no user code on this host"

    def sandbox_prefix(self, writable: Sequence[Path], readable: Sequence[Path]) -> list[str] | None:
        """The argv prefix that runs a one-off process on user input (model inspection) sandboxed, able to
        write only ``writable`` and to read, beyond the system, only ``readable``; None: no sandbox here."""
        return None

    def build_sandbox(self) -> Any:
        """How environment builds on this host are sandboxed (``venvs.BuildSandbox``), or None; the
        executor's own ``environments`` backend uses it."""
        return None

    @abc.abstractmethod
    def environments(self, settings: Settings) -> EnvironmentBackend:
        """The backend that builds the runtime environments this executor's workloads run in (built once, at
        the entry point, and kept on the ``Platform``)."""

    @property
    def jobs_run_as_root(self) -> bool:
        """Whether job processes run as root (then e.g. mpirun needs --allow-run-as-root)."""
        return os.geteuid() == 0

    def reap(self) -> None:  # noqa: B027 - optional hook, most executors have nothing to reap
        """Collect finished child processes (called regularly by the supervisor)."""

    def log_files(self, attempt_dir: Path) -> list[Path]:
        """The attempt's log files in reading order (a gang: one per replica, see ``replica_log_files``)."""
        return list(replica_log_files(attempt_dir).values())

    @abc.abstractmethod
    def _start(self, workload: Workload) -> None: ...

    @abc.abstractmethod
    def _poll(self, attempt_dir: Path) -> AttemptReport: ...

    @abc.abstractmethod
    def _stop(self, attempt_dir: Path) -> None: ...
