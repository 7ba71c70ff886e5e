"""Job traces for the simulator: the normalised CSV columns ``job_id, submit_time_s, num_gpus, duration_s, user``.

``/work/shared/data/traces/README.md`` (and ``tests/data/README.md``) describe the Philly trace in this form;
other columns are ignored. Rows are returned sorted by submit time (stable: the file's order breaks ties).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from dlcloud.errors import InvalidArgument

REQUIRED_COLUMNS = ("job_id", "submit_time_s", "num_gpus", "duration_s", "user")


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit_s: float
    gpus: int
    duration_s: float
    tenant: str  # the trace's ``user``: in Philly, a virtual cluster


def _number(row: dict[str, str], column: str, line: int, path: Path, *, integer: bool = False) -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{path}:{line}: {column} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{path}:{line}: {column} must be a finite number >= 0, got {raw!r}")
    if integer and value != int(value):
        raise InvalidArgument(f"{path}:{line}: {column} must be a whole number, got {raw!r}")
    return value


def load_trace(
    path: Path,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    limit_jobs: int | None = None,
) -> list[TraceJob]:
    """The jobs submitted in [``start_s``, ``end_s``) (the trace's own clock), the first ``limit_jobs`` of them
    when set. Raises InvalidArgument naming the file and line of what is wrong."""
    if not path.is_file():
        raise InvalidArgument(f"trace file not found: {path}")
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise InvalidArgument(
                    f"{path}: missing column(s) {', '.join(missing)}; a trace needs {', '.join(REQUIRED_COLUMNS)} "
                    f"(found: {', '.join(reader.fieldnames or ()) or 'no header'})"
                )
            for line, row in enumerate(reader, start=2):
                job_id = (row["job_id"] or "").strip()
                if not job_id:
                    raise InvalidArgument(f"{path}:{line}: job_id is empty")
                if job_id in seen:
                    raise InvalidArgument(f"{path}:{line}: job_id {job_id!r} appears twice")
                seen.add(job_id)
                submit = _number(row, "submit_time_s", line, path)
                gpus = int(_number(row, "num_gpus", line, path, integer=True))
                duration = _number(row, "duration_s", line, path)
                tenant = (row["user"] or "").strip()
                if not tenant:
                    raise InvalidArgument(f"{path}:{line}: user (the tenant) is empty")
                if gpus < 1:
                    continue  # CPU-only work: nothing for a GPU scheduler to place
                jobs.append(TraceJob(job_id, submit, gpus, duration, tenant))
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{path}: not a UTF-8 CSV file ({exc.reason})") from None
    except csv.Error as exc:
        raise InvalidArgument(f"{path}: not a valid CSV file ({exc})") from None
    jobs.sort(key=lambda j: j.submit_s)
    if start_s is not None:
        jobs = [j for j in jobs if j.submit_s >= start_s]
    if end_s is not None:
        jobs = [j for j in jobs if j.submit_s < end_s]
    if limit_jobs is not None:
        jobs = jobs[:limit_jobs]
    return jobs
