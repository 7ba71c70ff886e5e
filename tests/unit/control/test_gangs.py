"""Whole-gang outcome from replica reports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dlcloud.control import gangs
from dlcloud.executors.base import AttemptReport, ReplicaReport

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def rep(name: str, state: str = "running", code: int | None = None, at: int = 0, **kw) -> ReplicaReport:
    role, _, index = name.rpartition("-")
    finished = T0 + timedelta(seconds=at) if state == "exited" else None
    return ReplicaReport(name, role, int(index), kw.pop("decides", True), state, code, finished_at=finished, **kw)  # type: ignore[arg-type]


def test_first_failure_is_the_culprit_and_ends_the_gang() -> None:
    v = gangs.verdict((rep("worker-0"), rep("worker-1", "exited", 3, at=5, last_lines=("oops",))))
    assert v.over and not v.succeeded and v.culprit is not None and v.culprit.name == "worker-1"
    assert gangs.failure_message(v.culprit) == "worker-1 exited with code 3; last lines: oops"


def test_replicas_stopped_after_a_failure_are_not_culprits() -> None:
    replicas = (rep("worker-0", "exited", -15, at=9, stopped=True), rep("worker-1", "exited", 3, at=5))
    s = gangs.summarize(AttemptReport(state="exited", replicas=replicas))
    assert s.exit_code == 3 and not s.stopped and s.message.startswith("worker-1 exited with code 3")


def test_success_needs_every_deciding_replica_and_stops_the_rest() -> None:
    running_ps = rep("ps-0", decides=False)
    assert not gangs.verdict((rep("chief-0"), running_ps)).over
    v = gangs.verdict((rep("chief-0", "exited", 0), running_ps))
    assert v.over and v.succeeded
    done = (rep("chief-0", "exited", 0, at=1), rep("ps-0", "exited", -15, at=3, stopped=True, decides=False))
    s = gangs.summarize(AttemptReport(state="exited", replicas=done))
    assert s.exit_code == 0 and not s.stopped
    assert not gangs.verdict((rep("worker-0", "exited", 0), rep("worker-1"))).over  # pytorch: all decide


def test_all_stopped_is_a_stop_and_a_timeout_is_a_timeout() -> None:
    stopped = (rep("worker-0", "exited", -15, stopped=True), rep("worker-1", "exited", -15, stopped=True))
    assert gangs.summarize(AttemptReport(state="exited", replicas=stopped)).stopped
    timed = (rep("worker-0", "exited", -15, at=1, timed_out=True), rep("worker-1", "exited", 1, at=2))
    s = gangs.summarize(AttemptReport(state="exited", replicas=timed))
    assert s.timed_out and not s.stopped


def test_a_lost_replica_fails_the_gang() -> None:
    v = gangs.verdict((rep("worker-0"), rep("worker-1", "lost", message="launcher vanished")))
    assert v.over and v.culprit is not None
    assert gangs.failure_message(v.culprit) == "worker-1 was lost: launcher vanished"
