"""SimulatedExecutor: an in-memory executor that runs nothing, for the scheduler benchmark and tests.

``start`` records the workload as running; the test or benchmark ends it with ``finish``. ``stop`` ends it
at once as if SIGTERM killed it (exit code -15, stopped). A ``timeout_seconds`` is honoured on ``poll``
against the injected clock, so simulated time works. State lives only in this object: unlike the local
executor, a new instance knows nothing of attempts an earlier one started (poll reports them "lost"). It keeps
no checkpoint directories, so a workload's ``checkpoint_from`` is accepted and there is nothing to copy. Its
logs are lines in memory, one list per replica, holding what ``write_log`` added (never capped).

Its environments (``SimulatedEnvironments``) are described as the local executor's are, and never built.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from dlcloud.errors import InvalidState, NotFound
from dlcloud.executors.base import (
    LAUNCH_FAILED,
    AttemptReport,
    Executor,
    InputsUnavailable,
    LogReader,
    Workload,
    check_inputs,
)
from dlcloud.executors.environments import BuildResult, BuildSpec, Cancellation
from dlcloud.executors.host_venvs import BuildLog, HostVenvBackend
from dlcloud.settings import Settings
from dlcloud.storage.objects import ObjectStore


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Attempt:
    workload: Workload
    report: AttemptReport
    logs: dict[str, list[str]] = field(default_factory=dict)  # lines by replica name ("" for one process)

    def replicas(self) -> list[str]:
        return [r.name for r in self.workload.replicas] or [""]


class _MemoryLog(LogReader):
    """One replica's lines, the list the attempt appends to (so a follower sees what is added later)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.offset = 0  # the next line to read

    def exists(self) -> bool:
        return bool(self.lines)

    def open_end(self) -> Iterator[str]:
        self.offset = len(self.lines)
        return (self.lines[i] for i in range(self.offset - 1, -1, -1))

    def read(self, limit: int) -> tuple[list[str], bool]:
        out: list[str] = []
        used = 0
        while self.offset < len(self.lines) and used < limit:
            out.append(self.lines[self.offset])
            used += len(out[-1].encode())
            self.offset += 1
        return out, self.offset < len(self.lines)

    def rest(self) -> list[str]:
        return []  # every line is complete

    def close(self) -> None:
        self.lines = []


class SimulatedEnvironments(HostVenvBackend):
    """Environments as this host would have them (its Python versions and packages, so the catalogue and the
    spec hashes are the local executor's) that are never built: a build is READY at once, empty, with one
    log line saying so. Nothing runs in them, and a real build runs user code (sdists' setup code) with no
    sandbox here, where the simulated executor reports user code as isolated."""

    name = "simulated"

    def _build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult:
        log_file = self._log_path(spec_hash)
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(log_file, "w", encoding="utf-8") as f:
            BuildLog(f).system("build skipped: the simulated executor runs nothing, so nothing is built")
        return BuildResult(size_bytes=0, built=True)


class SimulatedExecutor(Executor):
    """Runs nothing; attempts are dictionary entries keyed by handle. ``clock`` returns the current (maybe
    simulated) time. It keeps the executor contract: inputs are checked against the object store at start
    (missing or damaged: the attempt ends with LAUNCH_FAILED), a handle starts once, stop is graceful."""

    name = "simulated"

    def __init__(self, clock: Callable[[], datetime] = _utc_now) -> None:
        super().__init__()
        self.clock = clock
        self._attempts: dict[str, _Attempt] = {}
        self._next_pid = 100_000

    def environments(self, settings: Settings, objects: ObjectStore) -> SimulatedEnvironments:
        """Builds nothing, so it reads no wheel from ``objects``."""
        return SimulatedEnvironments(settings.envs_dir)

    def _start(self, handle: str, workload: Workload) -> None:
        if handle in self._attempts:
            raise InvalidState(f"attempt {handle} was already started; every attempt needs a new handle")
        try:
            if self._objects is not None:
                check_inputs(self._objects, workload)
        except InputsUnavailable as exc:
            now = self.clock()
            report = AttemptReport(
                state="exited", exit_code=LAUNCH_FAILED, started_at=now, finished_at=now, message=exc.message
            )
            self._attempts[handle] = _Attempt(workload, report)
            return
        self._next_pid += 1
        report = AttemptReport(state="running", started_at=self.clock(), pid=self._next_pid)
        self._attempts[handle] = _Attempt(workload, report)

    def _poll(self, handle: str) -> AttemptReport:
        attempt = self._attempts.get(handle)
        if attempt is None:
            return AttemptReport(
                state="lost", message=f"attempt {handle} is unknown to this simulated executor", launched=False
            )
        timeout = attempt.workload.timeout_seconds
        started = attempt.report.started_at
        expired = timeout is not None and started is not None and self.clock() >= started + timedelta(seconds=timeout)
        if attempt.report.state == "running" and expired:
            self._end(attempt, -signal.SIGTERM, timed_out=True, message=f"timed out after {timeout} s")
        return attempt.report

    def _stop(self, handle: str) -> None:
        attempt = self._attempts.get(handle)
        if attempt is not None and attempt.report.state == "running":
            self._end(attempt, -signal.SIGTERM, stopped=True, message="stopped")

    def log_replicas(self, handle: str) -> list[str]:
        attempt = self._attempts.get(handle)
        return attempt.replicas() if attempt is not None else []

    def open_log(self, handle: str, replica: str) -> LogReader:
        return _MemoryLog(self._log(handle, replica))

    def write_log(self, handle: str, text: str, *, replica: str = "", stream: str = "stdout") -> None:
        """Add a line to the attempt's log (of ``replica``), at the clock's time, as its process would."""
        when = self.clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self._log(handle, replica).append(f"{when} {stream} {text}\n")

    def _log(self, handle: str, replica: str) -> list[str]:
        attempt = self._attempts.get(handle)
        if attempt is None or replica not in attempt.replicas():
            raise NotFound(f"this attempt has no log of replica {replica!r}")
        return attempt.logs.setdefault(replica, [])

    def save_outputs(self, handle: str, key: str, admit: Callable[[int], None] | None = None) -> bool:
        return False  # nothing runs, nothing writes outputs (nor checkpoints: ``checkpoints_bytes`` is 0)

    def archive_logs(self, handle: str, key: str) -> bool:
        return False  # nothing runs, nothing writes a log

    def remove_job(self, tenant_id: str, job_id: str) -> None:
        for handle in [h for h, a in self._attempts.items() if a.workload.job_id == job_id]:
            if self._attempts[handle].report.state != "running":
                del self._attempts[handle]

    def finish(self, handle: str, exit_code: int = 0, message: str = "") -> None:
        """End a running attempt with ``exit_code`` (what a real process exiting would look like)."""
        attempt = self._attempts.get(handle)
        if attempt is None:
            raise NotFound(f"attempt {handle} is unknown to this simulated executor")
        if attempt.report.state == "running":
            self._end(attempt, exit_code, message=message)

    def running(self) -> dict[str, Workload]:
        """The workloads currently running by handle, in start order."""
        return {h: a.workload for h, a in self._attempts.items() if a.report.state == "running"}

    def _end(
        self, attempt: _Attempt, exit_code: int, *, timed_out: bool = False, stopped: bool = False, message: str = ""
    ) -> None:
        attempt.report = replace(
            attempt.report,
            state="exited",
            exit_code=exit_code,
            finished_at=self.clock(),
            timed_out=timed_out,
            stopped=stopped,
            message=message,
        )
