"""Whole-gang semantics of a distributed attempt, from its replicas' reports. Pure functions.

- A replica *fails* when it exits with a non-zero code that no stop or timeout caused, or is lost. The
  first failure (by time) is the gang's: every other replica is stopped (the executor's stop protocol:
  SIGTERM, grace period, SIGKILL, then post) and the attempt fails with that replica's exit code.
- The gang *succeeds* when every deciding replica (``Replica.decides``: all of them for pytorch, jax and
  none; the chief, else worker 0, for tensorflow; the launcher for mpi) exited 0; replicas still running
  (TF ps, MPI worker slots) are then stopped and do not change the outcome.
- A replica that timed out ends the gang as timed out; replicas stopped by a cancellation end it cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dlcloud.executors.base import AttemptReport, ReplicaReport

LAST_LINES = 5


@dataclass(frozen=True)
class Verdict:
    over: bool  # the gang must be stopped: it succeeded, failed or timed out
    succeeded: bool
    culprit: ReplicaReport | None  # the replica whose failure failed the gang
    timed_out: bool


def _failed(r: ReplicaReport) -> bool:
    if r.state == "lost":
        return True
    return r.state == "exited" and r.exit_code != 0 and not r.stopped and not r.timed_out


def _end_order(r: ReplicaReport) -> tuple[bool, str]:
    return (r.finished_at is None, r.finished_at.isoformat() if r.finished_at else "")


def verdict(replicas: tuple[ReplicaReport, ...]) -> Verdict:
    failures = [r for r in replicas if _failed(r)]
    culprit = min(failures, key=_end_order) if failures else None
    timed_out = any(r.timed_out for r in replicas)
    deciding = [r for r in replicas if r.decides]
    succeeded = (
        culprit is None
        and not timed_out
        and bool(deciding)
        and all(r.state == "exited" and r.exit_code == 0 and not r.stopped for r in deciding)
    )
    return Verdict(culprit is not None or succeeded or timed_out, succeeded, culprit, timed_out)


def failure_message(r: ReplicaReport) -> str:
    """``worker-1 exited with code 3; last lines: ...`` (or why it was lost)."""
    if r.state == "lost":
        text = f"{r.name} was lost: {r.message or 'its processes vanished'}"
    else:
        text = f"{r.name} exited with code {r.exit_code}"
        if r.message:
            text += f" ({r.message})"
    if r.last_lines:
        text += "; last lines: " + " | ".join(r.last_lines[-LAST_LINES:])
    return text


def summarize(report: AttemptReport) -> AttemptReport:
    """The attempt's outcome from its replicas, once all of them ended (``report.state == "exited"``)."""
    v = verdict(report.replicas)
    posts = [r for r in report.replicas if r.post_exit_code or r.post_timed_out]
    post = posts[0] if posts else None
    base = replace(
        report, post_exit_code=post.post_exit_code if post else None, post_timed_out=bool(post and post.post_timed_out)
    )
    culprit = v.culprit
    if culprit is not None and not (v.timed_out and _before_culprit_timeout(report.replicas, culprit)):
        return replace(base, exit_code=culprit.exit_code, message=failure_message(culprit))
    if v.timed_out:
        return replace(base, exit_code=-15, timed_out=True, message="")
    if v.succeeded:
        return replace(base, exit_code=0, message="")
    stopped = [r for r in report.replicas if r.stopped]
    code = stopped[0].exit_code if stopped else next((r.exit_code for r in report.replicas), None)
    return replace(base, exit_code=code, stopped=True, message="stopped")


def _before_culprit_timeout(replicas: tuple[ReplicaReport, ...], culprit: ReplicaReport) -> bool:
    """Whether a replica timed out before the culprit failed (then the gang timed out, the failure followed)."""
    times = [r.finished_at for r in replicas if r.timed_out and r.finished_at is not None]
    return bool(times) and culprit.finished_at is not None and min(times) <= culprit.finished_at
