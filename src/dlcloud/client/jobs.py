"""Jobs and code uploads."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlcloud.client.transport import API, Transport, spec_body
from dlcloud.schemas.jobs import CodeUpload, Job, JobDetail, JobSpec, QueueEntry
from dlcloud.schemas.metrics import JobMetrics

STREAMS = ("stdout", "stderr", "system")
SECTIONS = ("pre", "main", "post")


@dataclass(frozen=True)
class LogLine:
    """One job log line. ``section`` is the phase that wrote it: pre (pre_command), main, post (post_command)."""

    time: str
    stream: str  # stdout | stderr | system
    text: str
    section: str = "main"  # pre | main | post
    replica: str = ""  # the replica that wrote it (worker-1) when several replicas' lines are read together

    @classmethod
    def parse(cls, raw: str) -> LogLine:
        """Parse ``<time> <stream> <text>``; the stream is ``stdout`` for main, ``post:stdout`` for post, and
        ``worker-1/stdout`` for a replica's line among several replicas'."""
        parts = raw.split(" ", 2)
        if len(parts) >= 2:
            replica, _, rest = parts[1].rpartition("/")
            section, _, stream = rest.rpartition(":")
            if stream in STREAMS and section in ("", *SECTIONS):
                return cls(parts[0], stream, parts[2] if len(parts) > 2 else "", section or "main", replica)
        return cls("", "stdout", raw)


class CodeAPI:
    def __init__(self, t: Transport):
        self._t = t

    def upload(
        self,
        file: Path,
        kind: str = "archive",
        filename: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> CodeUpload:
        """Upload a .tar.gz of a directory (kind=archive), a wheel or an sdist; its ``id`` is the code id."""
        params = {"kind": kind, "filename": filename or file.name}
        return self._t.upload(CodeUpload, f"{API}/code", file, params=params, progress=progress)


class JobsAPI:
    def __init__(self, t: Transport):
        self._t = t

    def submit(self, spec: JobSpec | Mapping[str, Any]) -> Job:
        """Submit a job spec whose ``code`` (if any) is an uploaded code id. A mapping is validated as a
        ``JobSpec`` first; what it sets is sent as written.

        ``secret_env`` values reach the job like ``env`` but are stored encrypted; reads show ``"***"``.

        Raises:
            InvalidSpec / dlcloud.errors.DlcloudError with code validation_error: the spec is wrong.
            QuotaExceeded: the tenant's queue is full or the job exceeds the tenant's limits.
            PriorityNotAllowed: an unknown priority class, or a priority outside the tenant's allowed range.
            NotFound: ``checkpoint_from`` names no job of your tenant.
            InvalidState: ``checkpoint_from`` names a job that has not ended.
        """
        return self._t.read(Job, "POST", f"{API}/jobs", json_body=spec_body(JobSpec, spec))

    def queue(self, limit: int = 1000) -> builtins.list[QueueEntry]:
        """The waiting jobs in the scheduler's order, with wait reason and estimated start: a platform admin's
        call shows every tenant's, anyone else's their own tenant's."""
        return self._t.read_list(QueueEntry, f"{API}/queue", params={"limit": limit})

    def list(self, states: builtins.list[str] | None = None, limit: int = 100, offset: int = 0) -> builtins.list[Job]:
        """Your tenant's jobs (``states``: only those in these states), newest first."""
        return self._t.read_list(Job, f"{API}/jobs", params={"state": states, "limit": limit, "offset": offset})

    def get(self, name: str) -> JobDetail:
        """The job with its events, attempts, queue position and wait reason."""
        return self._t.read(JobDetail, "GET", f"{API}/jobs/{name}")

    def cancel(self, name: str) -> Job:
        """Cancel the job (its attempt is stopped); returns it."""
        return self._t.read(Job, "POST", f"{API}/jobs/{name}/cancel")

    def delete(self, name: str) -> None:
        self._t.request("DELETE", f"{API}/jobs/{name}")

    def logs(
        self,
        name: str,
        *,
        follow: bool = False,
        tail: int | None = None,
        section: str = "all",
        replica: str | None = None,
    ) -> Iterator[LogLine]:
        """The job's log lines across its attempts, oldest first: without ``follow`` the end of the log, at
        most the server's ``job_log_response_max_bytes``; a ``system`` line whose text starts with
        ``log truncated:`` stands where earlier lines were left out (here or, past the log's size cap, on disk).

        Args:
            follow: keep streaming until the job reaches a final state.
            tail: only the last ``tail`` lines (of the section), then follow.
            section: ``all``, or only the lines of ``pre`` (pre_command), ``main`` or ``post`` (post_command).
            replica: only the lines of this replica of a distributed job (``worker-1``); default: all
                replicas, interleaved by time, each line's ``replica`` set.

        Raises:
            NotFound: no such job in your tenant.
        """
        params = {
            "follow": follow or None,
            "tail": tail,
            "section": None if section == "all" else section,
            "replica": replica,
        }
        for raw in self._t.stream_lines(f"{API}/jobs/{name}/logs", params=params, timeout=None if follow else 60):
            if raw:
                yield LogLine.parse(raw)

    def metrics(
        self,
        name: str,
        metrics: Sequence[str] | None = None,
        attempt: int | None = None,
        replica: str | None = None,
        max_points: int = 1000,
    ) -> JobMetrics:
        """The job's metric series: ``job`` and ``series``, one series (``metric``, ``attempt``, ``replica``,
        ``points`` of ``step``, ``value``, ``time``, ``downsampled``) per metric, attempt and replica.

        Args:
            metrics: only these metric names; default all.
            attempt: only this attempt (1, 2, ...); default all.
            replica: only this replica of a distributed job (``worker-1``); default all.
            max_points: at most this many points per series (1..10000); longer series come downsampled.

        Raises:
            NotFound: no such job in your tenant.
        """
        params = {
            "metric": [*metrics] if metrics else None,
            "attempt": attempt,
            "replica": replica,
            "max_points": max_points,
        }
        return self._t.read(JobMetrics, "GET", f"{API}/jobs/{name}/metrics", params=params)
