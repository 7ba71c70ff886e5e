"""The replica state machine: every write of ``job_replicas.state`` goes through this module.

    (placed) running ──> succeeded | failed   (it exited: by its exit code)
                    ├──> stopped              (the platform stopped it: cancel, preemption, timeout, its gang's end)
                    └──> lost                 (the executor lost it, or lost the whole attempt)

A gang attempt's replicas are added ``running`` when it is placed (``placed``, by the scheduling pass) and
given their end when the attempt's end is recorded (``record_ends``, by the supervision), in that transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from dlcloud.executors.base import AttemptReport, ReplicaReport
from dlcloud.schemas.jobs import ReplicaState
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import JobRow


def placed(job: JobRow, host: str, name: str, role: str, index: int, **held: Any) -> dict[str, Any]:
    """The record of one replica of ``job``'s attempt being placed: running, no exit code yet. ``held``: its
    ``gpus``, ``cpus``, ``memory`` and ``ports``."""
    return {
        "job_id": job.id,
        "tenant_id": job.tenant_id,
        "attempt": job.attempt,
        "name": name,
        "role": role,
        "index": index,
        "host": host,
        **held,
        "state": ReplicaState.RUNNING.value,
        "exit_code": None,
    }


def end_state(report: ReplicaReport) -> ReplicaState:
    """How a replica ended, by what the executor reported of it."""
    if report.state == "lost":
        return ReplicaState.LOST
    if report.stopped or report.timed_out:
        return ReplicaState.STOPPED
    if report.state == "exited":
        return ReplicaState.SUCCEEDED if report.exit_code == 0 else ReplicaState.FAILED
    return ReplicaState.LOST


def record_ends(s: Session, job: JobRow, report: AttemptReport, lost: bool = False) -> None:
    """The end of each replica of ``job``'s attempt that just ended, on its record. A replica the report does
    not name keeps its state, unless the whole attempt was ``lost``."""
    if not job.replica_groups:
        return
    by_name: dict[str, ReplicaReport] = {r.name: r for r in report.replicas}
    for row in job_store.attempt_replicas(s, job.id, job.attempt):
        r = by_name.get(row.name)
        if r is None:
            if lost:
                row.state = ReplicaState.LOST.value
            continue
        row.exit_code = r.exit_code
        row.state = end_state(r).value
