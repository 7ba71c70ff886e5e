"""The Executor ABC and the value types that cross it.

A Workload is one attempt of one job: one process, or a gang of replicas (``Workload.replicas``) that the
executor starts together and reports on one by one (``AttemptReport.replicas``). Which replica's exit
decides what stays above the executor (``control/gangs.py``); the executor only materialises and reports.
The executor starts it, and afterwards ``poll`` reports its
state from what the executor recorded (for the local executor: files on disk written by a detached
launcher), so the control plane can crash and restart without losing or re-running anything.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from dlcloud.errors import DlcloudError, InputsUnavailable
from dlcloud.executors import event_files
from dlcloud.executors.environments import EnvironmentBackend
from dlcloud.executors.event_files import EventCursor, EventRead
from dlcloud.settings import Settings
from dlcloud.storage.objects import Manifest, ObjectStore, StorageError

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
    # (name, text) written, read-only to it, into a directory of the executor's choosing before it starts (an
    # MPI hostfile); an env value starting with REPLICA_FILES_REF names that directory
    files: tuple[tuple[str, str], ...] = ()


# in a Replica's env values, the directory its ``files`` were written to (the executor replaces it)
REPLICA_FILES_REF = "${DLCLOUD_REPLICA_FILES}"


@dataclass(frozen=True)
class Egress:
    """What a job may reach beyond its own network (decided above the executor: the tenant's policy, else the
    platform's): ``none``; ``internet`` (anything but the host's own addresses); ``allow`` (only ``allow``:
    addresses, CIDRs, host names). The executor enforces it or refuses to start the job."""

    mode: Literal["none", "internet", "allow"] = "none"
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredCode:
    """A job's code as the object store keeps it: the executor fetches it (``kind`` archive: a .tar.gz
    unpacked into the work directory; package: a wheel or sdist installed onto PYTHONPATH)."""

    storage_key: str
    sha256: str
    kind: Literal["archive", "package"]


@dataclass(frozen=True)
class DatasetMount:
    """A dataset version the job reads: the stored tree at ``storage_key`` whose manifest hashes to
    ``sha256`` (``Manifest.artifact_sha256``). The executor makes it a read-only directory and puts its path
    in ``DLCLOUD_DATASET_<NAME>`` and ``DLCLOUD_DATASETS``."""

    name: str
    storage_key: str
    sha256: str


@dataclass(frozen=True)
class Workload:
    """One attempt of a job, fully decided above the executor: what to run, with which resources. It names
    nothing of a host: code and data by storage key, the environment by spec hash, GPUs by the inventory's
    indices. Where it runs (directories, uids, addresses, device files) is the executor's business, behind the
    opaque handle it names the attempt with (``Executor.handle``)."""

    job_id: str
    tenant_id: str
    attempt: int
    command: str  # the main command, run with /bin/sh -c in the job's work directory (its code)
    env: dict[str, str] = field(default_factory=dict)  # added to the executor's minimal base environment
    code: StoredCode | None = None
    environment: str | None = None  # the spec hash of a READY runtime environment; None: the default one
    datasets: tuple[DatasetMount, ...] = ()
    gpus: tuple[int, ...] = ()  # exclusive GPUs (inventory indices) -> CUDA_VISIBLE_DEVICES
    cpus: float = 1.0
    memory_bytes: int = 0  # 0 = no limit
    timeout_seconds: float | None = None  # enforced by the executor, survives control-plane restarts
    grace_seconds: float = 10.0  # SIGTERM -> SIGKILL on stop and timeout
    # Phases around the main command, each run like it (same env, directory, limits). pre failing skips main;
    # post runs after main whatever happened to it (also after a stop or timeout), within post_timeout_seconds.
    pre_command: str | None = None
    post_command: str | None = None
    post_timeout_seconds: float = 300.0
    # a gang: each replica runs the phases with its own env, GPUs and limits; gpus / cpus / memory_bytes above
    # are then the gang's totals. Empty: one process.
    replicas: tuple[Replica, ...] = ()
    log_max_bytes: int = 256 * 1024 * 1024  # the cap of the log (of each replica's): its end is kept
    # the tenant's sandbox number (TenantRow.sandbox_slot): the executor derives the Unix uid from it
    sandbox_slot: int | None = None
    # the id of an ended job of the same tenant whose checkpoint directory this job's starts as a copy of
    # (``checkpoint_from`` of the spec; see ``Executor``); None: the job's own, empty at first
    checkpoint_from: str | None = None
    # where the object store keeps this job's saved checkpoints (``storage/checkpoint_store.py``), and those of
    # the job ``checkpoint_from`` names; None: checkpoints stay with the executor alone (settings
    # ``checkpoint_store``). See ``Executor.save_checkpoints``.
    checkpoints_key: str | None = None
    checkpoint_from_key: str | None = None
    # the control plane's API as the job reaches it (its metrics URL's base); the executor makes it reachable
    # from the job's network, and nothing else of the host's
    api_url: str | None = None
    egress: Egress = Egress()
    # ports it serves on inside its own network, to be reachable from the host (``Executor.endpoints``)
    publish: tuple[int, ...] = ()
    # the tenant may make user namespaces in its sandboxes (an admin allowed it); otherwise its jobs cannot
    user_namespaces: bool = False
    # how many processes the tenant may run at once where only a per-uid limit can count them (as root without a
    # pids cgroup), derived from its quota above the executor; 0: the executor's own default
    tenant_processes: int = 0


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
    # running: the last change the attempt made to its job's checkpoint directory (None: none yet), so that a
    # preemption picks the attempts that lose the least work (docs/scheduling.md#preemption)
    checkpoint_at: datetime | None = None


def replica_sort_key(name: str) -> tuple[str, int, int]:
    """worker-2 before worker-10; worker-1.0 before worker-1.1."""
    role, _, rest = name.rpartition("-")
    index, _, local = rest.partition(".")
    return (role, int(index) if index.isdigit() else 0, int(local) if local.isdigit() else 0)


TENSORBOARD_ENV = "DLCLOUD_TENSORBOARD_DIR"  # where an attempt writes TensorBoard event files (docs/metrics.md)
REPLICAS_DIR = "replicas"
MAIN_LOG = "main"  # in archived logs (Executor.archive_logs), the directory of a one-process attempt's log


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


class LogReader(abc.ABC):
    """One log of an attempt (one replica's), as ``Executor.open_log`` gives it: read from its end, then
    followed forwards, so the control plane reads every executor's logs alike, whether the executor keeps them
    in files of this host or elsewhere. Lines come out as ``str`` ending in a newline, ``<ISO time> <stream>
    <text>``; where the executor dropped lines (the cap) or a follower fell too far behind, a ``system`` line
    ``log truncated: ...`` (``LOG_TRUNCATED``) says so.

    Calls block (I/O): the caller makes them in a worker thread, one at a time, and ``close``s the reader.
    """

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether any of the log is there now (False: nothing written yet, or no longer kept here)."""

    @abc.abstractmethod
    def open_end(self) -> Iterator[str]:
        """Position following at the end of the log now; return its complete lines, newest first (lazily:
        what the caller does not take is never read, so the cost is bounded by what it takes)."""

    def tail_done(self) -> None:  # noqa: B027 - optional hook, a reader may hold nothing for its tail
        """The lines of ``open_end`` are no longer wanted: release what reading them held."""

    @abc.abstractmethod
    def read(self, limit: int) -> tuple[list[str], bool]:
        """The complete lines written since the end ``open_end`` found (from the start of what is kept without
        it) or the last read, about ``limit`` bytes at most; and whether more are waiting."""

    @abc.abstractmethod
    def rest(self) -> list[str]:
        """The incomplete last line, once nothing more will be written."""

    @abc.abstractmethod
    def close(self) -> None: ...


LAUNCH_FAILED = 125  # the exit code of an attempt whose workload could not be prepared or launched


class CheckpointsUnavailable(InputsUnavailable):
    """The checkpoints a workload's ``checkpoint_from`` names are gone (that job was deleted after this one was
    submitted) or cannot be copied: the attempt ends with ``LAUNCH_FAILED`` and this message."""


class CheckpointsNotSaved(DlcloudError):
    """The job's checkpoints are past what a save copies (files, bytes, the disk's free space): not saved."""

    code = "checkpoints_not_saved"


def check_inputs(objects: ObjectStore, workload: Workload) -> list[tuple[DatasetMount, Manifest]]:
    """Whether the store holds the workload's code and the dataset versions it names (each dataset's manifest
    hashes to what the workload was given); the manifests, for fetching. Raises InputsUnavailable, or
    StorageError when the store cannot answer."""
    if workload.code is not None and objects.head(workload.code.storage_key) is None:
        raise InputsUnavailable("its code is missing from the server's storage; ask an administrator")
    out = []
    for d in workload.datasets:
        try:
            manifest = objects.tree_manifest(d.storage_key)
        except StorageError:
            raise  # the store is down, not the data: the caller may try again
        except DlcloudError as exc:
            log.error("job %s: dataset %s: %s", workload.job_id, d.name, exc.message)
            manifest = None
        if manifest is None or manifest.artifact_sha256() != d.sha256:
            raise InputsUnavailable(
                f"its dataset {d.name!r} is missing or damaged in the server's storage; ask an administrator"
            )
        out.append((d, manifest))
    return out


class Executor(abc.ABC):
    """Starts, polls and stops Workloads, each attempt named by an opaque handle; owns every host detail.

    The contract (checked against every implementation by tests/unit/executors/test_contract.py):
    - ``handle`` names an attempt before it starts (the control plane records it first, so a crash between
      the record and ``start`` is seen as an attempt that never launched: ``poll`` says lost with
      ``launched=False`` and it is started again). A handle starts at most once.
    - ``start`` does not block on the workload's inputs: code and datasets are fetched from the object store
      behind it, while ``poll`` says "pending". Inputs missing or damaged end the attempt with
      ``LAUNCH_FAILED`` and a message that names no storage location.
    - ``poll`` answers from what the executor recorded, so a new instance (a restarted control plane) reports
      attempts an earlier one started.
    - ``stop`` ends an attempt gracefully (SIGTERM, the grace period, the post command); stopping an ended or
      unknown attempt does nothing.
    - ``log_replicas`` and ``open_log`` read an attempt's logs as lines (``LogReader``: the end, then following
      it), never naming where the executor keeps them (no host path crosses this interface, so an executor
      without a local filesystem reads them alike); when it ends, ``save_outputs`` puts the job's outputs as the
      attempt left them, and ``archive_logs`` its logs, into the object store (so neither depends on the host
      that ran it); ``remove_job`` forgets everything the executor keeps for a deleted job. ``save_outputs`` measures
      the outputs (never following a link) and lets its caller refuse them (``admit``) before copying a byte;
      ``checkpoints_bytes`` says what the job's checkpoints take, as the executor keeps them.
    - Every attempt gets ``DLCLOUD_TENSORBOARD_DIR`` (``TENSORBOARD_ENV``), a directory of the job it may write,
      kept across attempts: a one-process attempt's is the job's TensorBoard directory, a gang replica's the
      subdirectory of it named after the replica. ``read_event_files`` reads the scalars appended there, parsing
      the files in a sandboxed one-off process (``reader_prefix``), never in the caller's. An executor without
      such a directory (``_tensorboard_dir`` None) reads nothing.
    - ``Workload.checkpoint_from``: an executor that keeps checkpoint directories fills the job's with a copy of
      the named job's (of ``Workload.tenant_id``, never another tenant's) while it prepares the first attempt that
      finds the job's own missing, before anything of the job runs; later attempts keep the job's own. The copy
      is the job's, as if it had written it; what the named job wrote is never followed (links), opened
      (special files) nor changed. The named job's directory gone (the job was deleted) ends the attempt with
      ``LAUNCH_FAILED`` (``CheckpointsUnavailable``); a named job that saved no checkpoints gives an empty one.
    - Checkpoints in the object store (``Workload.checkpoints_key``): ``save_checkpoints`` puts a snapshot of
      the job's checkpoint directory there (the control plane asks when an attempt ends, preempted or not, and
      when a running one changed its checkpoints and then left them alone a while); an attempt that finds the
      job's directory missing on its host (another host, or the host's copy lost) starts from the last one saved,
      before anything of the job runs; ``checkpoint_from`` reads the named job's saved checkpoints when its
      directory is not on this host. A save never replaces a saved checkpoint with an empty directory.
    Public methods log; implementations fill the ``_`` hooks.
    """

    name: str = "base"

    def __init__(self) -> None:
        self._objects: ObjectStore | None = None
        self._environments: EnvironmentBackend | None = None
        self._settings: Settings | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **decided: Any) -> Executor:
        """The executor as ``dlcloud up`` builds it from the settings (``settings.executor`` names the class);
        ``decided``: what another process of the same server decided at its start (``decided``), not probed again."""
        return cls()

    def decided(self) -> dict[str, Any]:
        """What this executor decided at its start that the API processes of ``dlcloud up --api-workers N`` must
        share with it (picklable; ``from_settings(settings, **decided)`` in each): e.g. how jobs are sandboxed,
        so that admission and inspection in a worker follow the control process's probe, not one of their own."""
        return {}

    def bind(self, settings: Settings, objects: ObjectStore, environments: EnvironmentBackend) -> None:
        """Where this executor keeps what it owns and reads what workloads name: called once, at the
        composition root (``Platform``), before any other method but ``environments``."""
        self._settings, self._objects, self._environments = settings, objects, environments

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            raise RuntimeError(f"the {self.name} executor is not bound to a platform (Executor.bind)")
        return self._settings

    @property
    def objects(self) -> ObjectStore:
        if self._objects is None:
            raise RuntimeError(f"the {self.name} executor is not bound to a platform (Executor.bind)")
        return self._objects

    @property
    def environment_backend(self) -> EnvironmentBackend:
        if self._environments is None:
            raise RuntimeError(f"the {self.name} executor is not bound to a platform (Executor.bind)")
        return self._environments

    def handle(self, tenant_id: str, job_id: str, attempt: int) -> str:
        """The opaque name of an attempt, recorded before it starts."""
        return f"{tenant_id}/{job_id}/attempt-{attempt}"

    def start(self, handle: str, workload: Workload) -> None:
        log.info(
            "starting job %s attempt %d (gpus=%s cpus=%s)",
            workload.job_id,
            workload.attempt,
            list(workload.gpus),
            workload.cpus,
        )
        self._start(handle, workload)

    def poll(self, handle: str) -> AttemptReport:
        return self._poll(handle)

    def stop(self, handle: str) -> None:
        log.info("stopping attempt %s", handle)
        self._stop(handle)

    def replica_host(self, handle: str) -> str:
        """The address at which the replicas of the attempt reach each other (the rendezvous host)."""
        return "localhost"

    def endpoints(self, handle: str) -> dict[int, str]:
        """Where each port the running attempt publishes (``Workload.publish``) is reached: ``{port: "host:port"}``;
        empty while none is reachable (not yet, or no more)."""
        return {}

    def isolation(self) -> tuple[bool, str]:
        """Whether user code this executor runs is sandboxed, and how, in words for the start-up banner."""
        return True, f"the {self.name} executor runs no user code on this host"

    def sandbox_prefix(self, writable: Sequence[Path], readable: Sequence[Path]) -> list[str] | None:
        """The argv prefix that runs a one-off process on user input (model inspection) sandboxed, able to
        write only ``writable`` and to read, beyond the system, only ``readable``; None: no sandbox here."""
        return None

    def port_is_free(self, port: int) -> bool:
        """Whether ``port`` of the managed range may be handed to an attempt's replicas now, where this
        executor runs them (the control plane keeps which attempt holds which port, ``control/ports.py``). Here
        nothing of the host is bound: every port is."""
        return True

    @property
    def inspects_sandboxed(self) -> bool:
        """Whether ``inspect_model`` runs the artifact's code in a sandbox here (False: as the server's user,
        or not at all): the registry lets only the tenants that may run code unsandboxed ask it then."""
        return False

    def inspect_model(
        self, tree: str, artifact: str, fmt: str, timeout: float
    ) -> subprocess.CompletedProcess[str] | None:
        """Run model inspection (``python -m dlcloud.serving.inspect``, ``model_inspect.run_inspect``) on the
        artifact ``artifact`` (the top-level file or directory) of the tree stored under the key ``tree``,
        fetched from the object store where this executor runs it, in ``sandbox_prefix``'s sandbox where
        ``inspects_sandboxed``; None when it did not finish within ``timeout`` s, or when this executor runs no
        user code (this one: the answer is then "no signature", and nothing of the artifact ran)."""
        return None

    def reader_prefix(self, readable: Sequence[Path], slot: int | None) -> list[str] | None:
        """The argv prefix that runs a one-off process on files a tenant's jobs wrote (its event files)
        sandboxed as those jobs run (the uid of tenant ``slot``: it reads what they wrote and gains nothing they
        lack), able to read, beyond the system, only ``readable``, and to write nothing; None: no sandbox here."""
        return None

    def read_event_files(
        self,
        handle: str,
        cursor: EventCursor,
        *,
        since: float,
        sandbox_slot: int | None,
        replicas: Sequence[str],
        cpus: float = 1.0,
        until: float | None = None,
    ) -> EventRead:
        """The scalars appended to the attempt's TensorBoard event files since ``cursor`` (which it advances),
        from files modified after ``since`` (a Unix time: when the attempt started) and, for an attempt that
        ended, written until ``until`` (its end); ``replicas``: the names of a gang attempt's replicas, whose own
        directories say which replica wrote a file; ``cpus``: the attempt's CPUs, to which the reading is charged
        (``_reader_charge``). Bounded per call (``event_files``); ``EventRead.more`` says data is left for another
        call."""
        top = self._tensorboard_dir(handle)
        if top is None or top.is_symlink() or not top.is_dir():
            return EventRead()
        return event_files.read(
            top,
            cursor,
            since=since,
            until=until,
            replicas=replicas,
            prefix=lambda: self.reader_prefix([top], sandbox_slot),
            charge=lambda: self._reader_charge(cpus),
        )

    def _reader_charge(self, cpus: float) -> contextlib.AbstractContextManager[list[str]]:
        """For one run of the event-file reader: the argv prefix that charges its CPU to a job of ``cpus`` CPUs
        (what the job itself may use), and whatever that needs meanwhile; ``[]``: no charge here."""
        return contextlib.nullcontext([])

    def _tensorboard_dir(self, handle: str) -> Path | None:
        """The job's TensorBoard directory on this host, for the attempt ``handle`` names; None: none here."""
        return None

    def build_sandbox(self) -> Any:
        """How environment builds on this host are sandboxed (``venvs.BuildSandbox``), or None; the
        executor's own ``environments`` backend uses it."""
        return None

    @abc.abstractmethod
    def environments(self, settings: Settings, objects: ObjectStore) -> EnvironmentBackend:
        """The backend that builds the runtime environments this executor's workloads run in (built once, at
        the entry point, and kept on the ``Platform``); uploaded wheels are read from ``objects``."""

    @property
    def jobs_run_as_root(self) -> bool:
        """Whether job processes run as root (then e.g. mpirun needs --allow-run-as-root)."""
        return os.geteuid() == 0

    def reap(self) -> None:  # noqa: B027 - optional hook, most executors have nothing to reap
        """Collect finished child processes (called regularly by the supervisor)."""

    @abc.abstractmethod
    def log_replicas(self, handle: str) -> list[str]:
        """The names of the attempt's logs, one per replica ("" for one process), in replica order; a name
        may have no line yet (``LogReader.exists``). Raises ValueError for a handle of another executor."""

    @abc.abstractmethod
    def open_log(self, handle: str, replica: str) -> LogReader:
        """A reader of one of the attempt's logs (``replica`` from ``log_replicas``); it holds nothing until
        it reads. Raises NotFound for a replica the attempt does not have, ValueError for a handle of
        another executor."""

    @abc.abstractmethod
    def save_outputs(self, handle: str, key: str, admit: Callable[[int], None] | None = None) -> bool:
        """Put the job's outputs directory, as the attempt left it, into the object store as a tree at ``key``;
        False when the job wrote none. Idempotent (a crash after it is followed by another call).

        ``admit(size)``: called once the outputs are measured (the bytes of their regular files, measured without
        following a link) and before any byte of them is read or copied; what it raises refuses them: nothing is
        stored, and the error goes to the caller (the storage quota, ``services/storage_quota.py``)."""

    def save_checkpoints(self, handle: str, key: str) -> bool:
        """Put a snapshot of the job's checkpoint directory, as the attempt ``handle`` has it now, into the object
        store as the job's last saved checkpoints at ``key`` (``storage/checkpoint_store.py``); False when there
        is nothing to save (no directory on this executor, or an empty one). Raises CheckpointsNotSaved when
        they are past the bounds a save copies, StorageError when the store fails. An executor that keeps no
        checkpoint directories saves nothing."""
        return False

    def checkpoints_bytes(self, handle: str) -> int:
        """The disk the job's checkpoint directory takes on this executor, measured without following a link
        (counted in its tenant's storage quota when an attempt ends); 0 for an executor that keeps none."""
        return 0

    @abc.abstractmethod
    def archive_logs(self, handle: str, key: str) -> bool:
        """Put the ended attempt's logs into the object store as a tree at ``key`` (``<replica or "main">/``
        holding ``output.log`` and its older half); False when it has none. Idempotent."""

    @abc.abstractmethod
    def remove_job(self, tenant_id: str, job_id: str) -> None:
        """Forget everything kept for a deleted job (its attempts' directories, checkpoints, outputs)."""

    @abc.abstractmethod
    def _start(self, handle: str, workload: Workload) -> None: ...

    @abc.abstractmethod
    def _poll(self, handle: str) -> AttemptReport: ...

    @abc.abstractmethod
    def _stop(self, handle: str) -> None: ...
