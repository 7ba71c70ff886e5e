"""What a gang's attempt looks like from its replicas' reports: the summary state, and the last lines a failed
replica wrote (for the job's message)."""

from __future__ import annotations

import os
from pathlib import Path

from dlcloud.executors.base import AttemptReport, ReplicaReport, log_segments

LAST_LINES = 5


def last_lines(log: Path, n: int = LAST_LINES) -> tuple[str, ...]:
    """The last ``n`` lines the command wrote (stdout / stderr of any phase) to an output.log."""
    lines: list[str] = []
    for segment in reversed(log_segments(log)):  # output.log, then its older half if it has one
        try:
            with open(segment, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                lines = f.read().decode("utf-8", "replace").splitlines() + lines
        except OSError:
            continue
        if len(lines) > n:
            break
    out = []
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1].rpartition(":")[2] in ("stdout", "stderr"):
            out.append(parts[2][:500])
    return tuple(out[-n:])


def summarize_replicas(reports: tuple[ReplicaReport, ...]) -> AttemptReport:
    """The state of a gang from its replicas': exited once all exited; lost when one is lost and none runs
    any more (a lost one while others run: still running, the control plane stops the rest)."""
    states = {r.state for r in reports}
    started = [r.started_at for r in reports if r.started_at is not None]
    finished = [r.finished_at for r in reports if r.finished_at is not None]
    if states <= {"exited"}:
        state = "exited"
    elif "running" in states:
        state = "running"
    elif "pending" in states:
        state = "pending"
    else:
        state = "lost"
    lost = [r for r in reports if r.state == "lost"]
    message = f"{lost[0].name} was lost: {lost[0].message}" if state == "lost" and lost else ""
    launched = not (state == "lost" and all("never started" in r.message for r in lost) and len(lost) == len(reports))
    return AttemptReport(
        state=state,  # type: ignore[arg-type]
        started_at=min(started) if started else None,
        finished_at=max(finished) if state == "exited" and finished else None,
        message=message,
        launched=launched,
        replicas=reports,
    )
