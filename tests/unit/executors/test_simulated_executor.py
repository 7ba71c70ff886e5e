"""SimulatedExecutor: in-memory attempts for scheduler tests and benchmarks."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from dlcloud.errors import InvalidState, NotFound
from dlcloud.executors import Workload
from dlcloud.executors.registry import get_executor_class
from dlcloud.executors.simulated import SimulatedExecutor


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2024, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def workload(name: str, **fields: object) -> Workload:
    return Workload(job_id=name, tenant_id="t1", attempt=1, command="x", **fields)  # type: ignore[arg-type]


def test_registry_returns_simulated_executor() -> None:
    assert get_executor_class("simulated") is SimulatedExecutor


def test_start_finish_poll() -> None:
    clock = FakeClock()
    ex = SimulatedExecutor(clock=clock)
    ex.start("t1/a/attempt-1", workload("a"))
    report = ex.poll("t1/a/attempt-1")
    assert report.state == "running" and report.started_at == clock.now and report.pid is not None
    assert [w.job_id for w in ex.running().values()] == ["a"]
    clock.now += timedelta(seconds=5)
    ex.finish("t1/a/attempt-1", 3)
    report = ex.poll("t1/a/attempt-1")
    assert report.state == "exited" and report.exit_code == 3 and report.finished_at == clock.now
    assert ex.running() == {}
    with pytest.raises(InvalidState, match="already started"):
        ex.start("t1/a/attempt-1", workload("a"))
    with pytest.raises(NotFound, match="unknown"):
        ex.finish("t1/other/attempt-1")


def test_stop_and_timeout() -> None:
    clock = FakeClock()
    ex = SimulatedExecutor(clock=clock)
    ex.start("t1/a/attempt-1", workload("a"))
    ex.start("t1/b/attempt-1", workload("b", timeout_seconds=60.0))
    ex.stop("t1/a/attempt-1")
    report = ex.poll("t1/a/attempt-1")
    assert report.state == "exited" and report.stopped and report.exit_code == -signal.SIGTERM
    assert ex.poll("t1/b/attempt-1").state == "running"
    clock.now += timedelta(seconds=60)
    report = ex.poll("t1/b/attempt-1")
    assert report.state == "exited" and report.timed_out and not report.stopped


def test_unknown_attempt_is_lost() -> None:
    assert SimulatedExecutor().poll("t1/nothing/attempt-1").state == "lost"
