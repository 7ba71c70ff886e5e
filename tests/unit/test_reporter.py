"""dlcloud.report against a real local HTTP server: batching, retries across an outage, the give-up and buffer
bounds, a refused token, bad names, no job environment, forked workers and the flush at interpreter exit."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud import reporter as metrics
from dlcloud.reporter import Reporter
from tests.conftest import wait_for
from tests.metrics_stub import MetricsStub

SRC = str(Path(metrics.__file__).parents[1])


@pytest.fixture
def stub() -> Iterator[MetricsStub]:
    s = MetricsStub()
    s.start()
    yield s
    s.stop()


@pytest.fixture
def make_reporter(stub: MetricsStub):
    def make(**kwargs: object) -> Reporter:
        opts: dict = {"flush_interval": 0.05, "retry_initial": 0.02, "retry_max": 0.1, "request_timeout": 5.0}
        opts.update(kwargs)
        return Reporter(stub.push_url, "tok-123", "worker-1", **opts)

    return make


@pytest.fixture
def job_env(stub: MetricsStub, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The variables a job has, and a fresh process reporter before and after."""
    monkeypatch.setenv("DLCLOUD_METRICS_URL", stub.push_url)
    monkeypatch.setenv("DLCLOUD_METRICS_TOKEN", "tok-123")
    monkeypatch.setenv("DLCLOUD_REPLICA", "worker-0")
    metrics._reset()
    yield
    metrics.flush(2)
    metrics._reset()


def _warnings(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dlcloud.report" and fragment in r.getMessage()]


def test_points_are_batched_with_the_token_and_the_contract_shape(stub, make_reporter):
    r = make_reporter(flush_interval=0.2)
    r.report(0, {"loss": 1.5, "acc": 0.25})
    r.report(None, {"loss": 1.0})  # the automatic step counts this process's reports without a step: 0
    r.report(None, {"loss": 0.5})
    wait_for(lambda: len(stub.points()) == 3, timeout=10, what="the points")
    (push,) = stub.pushes()  # one request: the timer sent the three together
    assert push.path == "/api/v1/jobs/train/metrics/push"
    assert push.headers["Authorization"] == "Bearer tok-123"
    first, second, third = push.body["points"]
    assert first["step"] == 0 and first["metrics"] == {"loss": 1.5, "acc": 0.25}
    assert first["replica"] == "worker-1"
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert (second["step"], second["metrics"]) == (0, {"loss": 1.0})
    assert (third["step"], third["metrics"]) == (1, {"loss": 0.5})


def test_a_full_batch_goes_without_waiting_for_the_timer(stub, make_reporter):
    r = make_reporter(flush_interval=600, batch_size=5)
    for step in range(5):
        r.report(step, {"x": step})
    wait_for(lambda: stub.steps("x") == [0, 1, 2, 3, 4], timeout=10, what="the size-triggered batch")


def test_flush_with_no_timeout_sends_now_without_waiting(stub, make_reporter):
    r = make_reporter(flush_interval=600)
    r.report(1, {"val_accuracy": 0.5})
    assert r.flush(0) is False  # it started the send and did not wait for it
    # the timer would wait 600 s: the point arrives because flush(0) sent it
    wait_for(lambda: stub.steps("val_accuracy") == [1], timeout=10, what="the point sent at once")


def test_numpy_like_values_and_many_metrics_split_into_points_of_100(stub, make_reporter):
    class Scalar:  # a numpy scalar or a one-element tensor
        def item(self) -> float:
            return 2.5

    r = make_reporter()
    r.report(7, {f"m{i}": i for i in range(150)} | {"s": Scalar()})
    assert r.flush(10)
    points = stub.points()
    assert [len(p["metrics"]) for p in points] == [100, 51]
    assert {p["step"] for p in points} == {7}
    assert points[1]["metrics"]["s"] == 2.5


def test_metrics_reported_across_an_outage_arrive_once_after_recovery(stub, make_reporter):
    r = make_reporter()
    r.report(0, {"loss": 1.0})
    assert r.flush(10)
    stub.stop()  # connections refused
    for step in range(1, 4):
        r.report(step, {"loss": 1.0 / (step + 1)})
    stub.push_status = 503
    stub.start()
    for step in range(4, 6):
        r.report(step, {"loss": 1.0 / (step + 1)})
    wait_for(lambda: stub.pushes(503), timeout=10, what="a push answered 503")
    assert not r.flush(0.2)  # still failing: flush gives up at its timeout
    stub.push_status = 204
    assert r.flush(10)
    assert stub.steps("loss") == [0, 1, 2, 3, 4, 5]  # in order, none twice


def test_points_older_than_the_give_up_bound_are_dropped_with_one_line(stub, make_reporter, caplog):
    r = make_reporter(give_up_after=0.3)
    stub.stop()
    for step in range(5):
        r.report(step, {"x": 1.0})
    started = time.monotonic()
    wait_for(lambda: r.pending() == 0, timeout=10, what="the old points to be dropped")
    assert time.monotonic() - started < 5
    assert len(_warnings(caplog, "unreachable")) == 1
    stub.start()
    r.report(10, {"x": 2.0})
    assert r.flush(10)
    assert stub.steps("x") == [10]


def test_the_buffer_keeps_the_newest_points_and_says_so_once(stub, make_reporter, caplog):
    r = make_reporter(max_buffer=10, retry_initial=5, retry_max=5)
    stub.stop()
    for step in range(25):
        r.report(step, {"x": float(step)})
    assert r.pending() <= 10
    assert len(_warnings(caplog, "dropping the oldest")) == 1
    stub.start()
    assert r.flush(10)
    assert stub.steps("x") == list(range(15, 25))


def test_a_refused_token_stops_sending_with_one_line(stub, make_reporter, caplog):
    stub.push_status = 401
    r = make_reporter()
    r.report(0, {"x": 1.0})
    r.flush(10)
    wait_for(lambda: r.pending() == 0, timeout=10, what="the buffer to be cleared")
    r.report(1, {"x": 1.0})
    r.flush(1)
    assert len(stub.pushes(401)) == 1
    assert len(_warnings(caplog, "token was refused")) == 1


def test_a_rejected_batch_is_dropped_and_later_ones_still_go(stub, make_reporter, caplog):
    stub.push_status = 422
    r = make_reporter()
    r.report(0, {"x": 1.0})
    assert r.flush(10)
    stub.push_status = 204
    r.report(1, {"x": 1.0})
    assert r.flush(10)
    assert stub.steps("x") == [1]
    assert len(_warnings(caplog, "HTTP 422")) == 1


def test_too_large_batches_are_halved(stub, make_reporter):
    stub.push_status = 413
    r = make_reporter(flush_interval=600)
    for step in range(4):
        r.report(step, {"x": 1.0})
    assert r.flush(10)
    assert [len(p.body["points"]) for p in stub.pushes(413)][:2] == [4, 2]


def test_bad_names_values_and_steps_are_dropped_with_one_warning_each(stub, make_reporter, caplog):
    r = make_reporter()
    for _ in range(3):
        r.report(0, {"bad name": 1.0, "ok": 2.0, "nan": float("nan"), "text": "high"})
    r.report(-1, {"ok": 3.0})
    r.report(1, {"x" * 129: 1.0})
    assert r.flush(10)
    assert [p["metrics"] for p in stub.points()] == [{"ok": 2.0}] * 3
    assert len(_warnings(caplog, "'bad name' dropped")) == 1
    assert len(_warnings(caplog, "nan=nan dropped")) == 1
    assert len(_warnings(caplog, "text='high' dropped")) == 1
    assert len(_warnings(caplog, "step=-1")) == 1
    assert len(_warnings(caplog, "x" * 129)) == 1


def test_reports_from_many_threads_all_arrive(stub, make_reporter):
    r = make_reporter(batch_size=50)

    def work(k: int) -> None:
        for i in range(250):
            r.report(k * 1000 + i, {"x": float(i)})

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.flush(20)
    steps = stub.steps("x")
    assert sorted(steps) == sorted(k * 1000 + i for k in range(4) for i in range(250))


def test_outside_a_job_report_is_a_no_op_with_one_warning(monkeypatch, caplog):
    monkeypatch.delenv("DLCLOUD_METRICS_URL", raising=False)
    monkeypatch.delenv("DLCLOUD_METRICS_TOKEN", raising=False)
    metrics._reset()
    import dlcloud

    try:
        dlcloud.report(step=1, loss=0.5)
        dlcloud.report(loss=0.4)
        assert dlcloud.flush(1) is True
        assert len(_warnings(caplog, "not set")) == 1
    finally:
        metrics._reset()


def test_report_through_the_package_uses_the_job_variables(stub, job_env):
    import dlcloud

    dlcloud.report(step=3, loss=0.2, acc=0.9)
    dlcloud.report(**{"train/loss": 0.1})
    assert dlcloud.flush(10)
    points = stub.points()
    assert [(p["step"], p["metrics"], p["replica"]) for p in points] == [
        (3, {"loss": 0.2, "acc": 0.9}, "worker-0"),
        (0, {"train/loss": 0.1}, "worker-0"),
    ]


def test_a_forked_child_reports_while_the_parent_is_reporting(stub, job_env):
    import dlcloud

    stop = threading.Event()

    def busy() -> None:  # keeps the reporter's lock busy while the fork happens
        i = 0
        while not stop.is_set():
            dlcloud.report(step=i, parent=1.0)
            i += 1

    t = threading.Thread(target=busy)
    t.start()
    try:
        wait_for(lambda: metrics._reporter is not None, what="the reporter")
        pid = os.fork()
        if pid == 0:  # the child: its own reporter, no lock or thread inherited
            code = 1
            try:
                dlcloud.report(step=5, child=1.0)
                code = 0 if dlcloud.flush(10) else 2
            finally:
                os._exit(code)
        stop.set()  # the parent's busy loop would starve the test server (in this process) of the GIL
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.02)
    finally:
        stop.set()
        t.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert dlcloud.flush(10)
    assert stub.steps("child") == [5]
    assert stub.steps("parent")


def _report_in_worker() -> None:
    import dlcloud

    dlcloud.report(step=9, worker=1.0)  # no flush: the process ends through os._exit, past atexit


def test_a_multiprocessing_worker_flushes_when_it_ends(stub, job_env):
    import dlcloud

    dlcloud.report(step=0, parent=1.0)
    proc = multiprocessing.get_context("fork").Process(target=_report_in_worker)
    proc.start()
    proc.join(20)
    assert proc.exitcode == 0
    assert stub.steps("worker") == [9]  # sent before the worker was gone
    assert dlcloud.flush(10)
    assert stub.steps("parent") == [0]


def _run_python(code: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
    base["PYTHONPATH"] = SRC
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60)
    return res, time.monotonic() - started


def test_a_process_flushes_its_metrics_at_exit(stub):
    env = {"DLCLOUD_METRICS_URL": stub.push_url, "DLCLOUD_METRICS_TOKEN": "tok-123"}
    res, _ = _run_python("import dlcloud; dlcloud.report(step=1, x=1.0)", env)
    assert res.returncode == 0, res.stderr
    assert stub.steps("x") == [1]
    assert stub.points()[0]["replica"] == ""


def test_a_process_exits_within_seconds_when_the_api_is_down(stub):
    stub.stop()
    env = {"DLCLOUD_METRICS_URL": stub.push_url, "DLCLOUD_METRICS_TOKEN": "tok-123"}
    res, took = _run_python("import dlcloud; dlcloud.report(step=1, x=1.0)", env)
    assert res.returncode == 0, res.stderr
    assert took < metrics.EXIT_TIMEOUT + 20  # an interpreter's start and exit on a loaded machine: not a hang
    assert "1 metric points were not sent before exit" in res.stderr


def test_importing_dlcloud_imports_nothing_heavy():
    res, _ = _run_python(
        "import sys, dlcloud; print(sorted(m for m in sys.modules if m.startswith(('dlcloud', 'httpx'))))", {}
    )
    assert res.stdout.strip() == "['dlcloud']", res.stderr
