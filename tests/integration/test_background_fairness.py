"""No tenant slows another through the background work its jobs cause (docs/isolation.md#background-work-a-job-causes).

TensorBoard event files (docs/metrics.md#sharing-the-reader): the review's flood — jobs of one tenant at a sliver
of a CPU writing valid non-scalar records as fast as they can — scaled to a 2-core CI machine, on the running
platform with real jobs, sandboxes and readers. Another tenant's metrics keep their unloaded lag (at most twice
it, measured in the same test before the flood), and another tenant's job that exits while the flood's last
readings go on is recorded ended at once (within 2 s of the exit its executor recorded).

Outputs: one tenant's attempt whose outputs take long to save holds no other tenant's end (a save that waits for
the test stands for a large copy; no clock involved)."""

from __future__ import annotations

import base64
import inspect
import os
import shlex
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from dlcloud.client import Client
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.store.rows import AttemptRow, JobMetricRow
from tests import tensorboard_files
from tests.conftest import WAIT_FOR_GO, Env, build_env, control_running, make_settings, release, wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
FLOOD_JOBS = 4
FLOOD_CPU = 0.05  # the review's jobs ran at 0.01: the same sliver, with room for the Python they start
FLOOD_FIRST_MIB, FLOOD_MORE_MIB = 16, 0.5  # at once, then every half second until cancelled
POINTS = 10  # points of the other tenant's job per measured window (one every 0.4 s)
RECORD = tensorboard_files.framed(tensorboard_files.blob_event(1, time.time(), "image", os.urandom(6 * 1024)))

# as fast as a job of 0.05 CPU writes: one record, built by the test (a job this slow would take a minute to import
# TensorBoard), appended again and again
FLOOD_JOB = f"""
import base64, os, time
record = base64.b64decode({base64.b64encode(RECORD).decode()!r})
path = os.path.join(os.environ["DLCLOUD_TENSORBOARD_DIR"], "events.out.tfevents.flood")
with open(path, "ab") as f:
    f.write(record * {FLOOD_FIRST_MIB * 1024 * 1024 // len(RECORD)})
    f.flush()
    while True:
        time.sleep(0.5)
        f.write(record * {int(FLOOD_MORE_MIB * 1024 * 1024) // len(RECORD)})
        f.flush()
"""

# a point every 0.4 s, stamped with the time it is written, until the test lets it end
STEADY_JOB = (
    inspect.getsource(tensorboard_files)
    + """
import os, time
path = os.path.join(os.environ["DLCLOUD_TENSORBOARD_DIR"], "events.out.tfevents.steady")
go = os.path.join(os.environ["DLCLOUD_OUTPUT_DIR"], "go")
step = 0
while not os.path.exists(go):
    with open(path, "ab") as f:
        f.write(framed(scalar_event(step, time.time(), {"loss": float(step)})))
    step += 1
    time.sleep(0.4)
"""
)


class Lags:
    """Watches a job's metric from the database: when each step was written (its event's wall time) and when it was
    first seen stored, every 50 ms, on a thread of its own."""

    def __init__(self, env: Env, job_id: str) -> None:
        self.env, self.job_id = env, job_id
        self.seen: dict[int, tuple[float, float]] = {}  # step -> (written, seen stored)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self.env.platform.db.read() as s:
                q = select(JobMetricRow.step, JobMetricRow.time).where(JobMetricRow.job_id == self.job_id)
                rows = s.execute(q).all()
            now = time.time()
            for step, written in rows:
                self.seen.setdefault(step, (written.timestamp(), now))
            self._stop.wait(0.05)

    def written_after(self, since: float) -> list[float]:
        """The lags of the points written after ``since`` and seen stored so far."""
        return [seen - written for written, seen in list(self.seen.values()) if written >= since]

    def window(self, start: float, end: float) -> list[float]:
        return [seen - written for written, seen in list(self.seen.values()) if start <= written < end]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def running(tmp_path: Path, db_url: str) -> Iterator[Env]:
    settings = make_settings(tmp_path, db_url, tensorboard_interval_seconds=0.5)
    with control_running(build_env(settings, LocalExecutor())) as env:
        yield env


def _python(script: str) -> str:
    return "python -c " + shlex.quote(script)


def _state(client: Client, name: str) -> str:
    return client.jobs.get(name).state


def _attempt(env: Env, job_id: str) -> AttemptRow:
    with env.platform.db.read() as s:
        row = s.scalar(select(AttemptRow).where(AttemptRow.job_id == job_id, AttemptRow.number == 1))
        assert row is not None
        s.expunge(row)
        return row


def _read(env: Env, attempt_ids: list[int]) -> int:
    """The bytes of these attempts' event files read so far."""
    assert env.control is not None
    return sum(env.control.ingester.read_bytes(i) for i in attempt_ids)


@pytest.mark.serial  # its bound (2x the unloaded lag, measured in the same test) wants a machine to itself
def test_a_tenant_flooding_the_event_file_reader_slows_neither_another_tenants_metrics_nor_its_jobs_ends(running):
    env = running
    assert env.control is not None
    ingester = env.control.ingester
    calm = env.new_tenant_user("calm", "calm-user")
    flood = env.new_tenant_user("flood", "flood-user")

    # unloaded: the other tenant's job's points, as the platform reads them with nothing else to read
    steady = calm.jobs.submit({"name": "steady", "command": _python(STEADY_JOB)})
    lags = Lags(env, steady.id)
    try:
        wait_for(lambda: lags.seen, timeout=120, what="the steady job's first point")
        t0 = time.time()
        wait_for(lambda: len(lags.written_after(t0)) >= POINTS, timeout=120, what="unloaded points")
        t1 = time.time()
        unloaded = lags.window(t0, t1)

        # the flood: its jobs write faster than anyone reads, and their reading is under way
        floods = [
            flood.jobs.submit({"name": f"flood-{i}", "command": _python(FLOOD_JOB), "resources": {"cpu": FLOOD_CPU}})
            for i in range(FLOOD_JOBS)
        ]
        wait_for(lambda: all(_state(flood, j.name) == "RUNNING" for j in floods), timeout=120, what="the flood")
        flooding = [_attempt(env, j.id).id for j in floods]
        wait_for(lambda: _read(env, flooding) > 0, timeout=120, what="a pass over the flood's files")
        t2, before = time.time(), _read(env, flooding)
        # a window that holds a whole pass over the flood's files at least
        wait_for(
            lambda: len(lags.written_after(t2)) >= POINTS and _read(env, flooding) > before,
            timeout=120,
            what="loaded points",
        )
        t3 = time.time()
        loaded = lags.window(t2, t3)
    finally:
        lags.close()
    mean_unloaded, mean_loaded = sum(unloaded) / len(unloaded), sum(loaded) / len(loaded)
    read_mib = _read(env, flooding) / 2**20
    print(f"lag of another tenant's metrics: unloaded {mean_unloaded:.2f} s (n={len(unloaded)}), "
          f"under the flood {mean_loaded:.2f} s (n={len(loaded)}); flood read: {read_mib:.1f} MiB")  # fmt: skip
    assert mean_loaded <= 2 * mean_unloaded, (unloaded, loaded)
    release(env.settings.data_dir, steady.id)

    # the flood's jobs cancelled: once their processes are gone their last readings come, and another tenant's
    # job that exits meanwhile is recorded ended at once
    hi = calm.jobs.submit({"name": "echo-hi", "command": f"{WAIT_FOR_GO}; echo hi"})
    wait_for(lambda: _state(calm, "echo-hi") == "RUNNING", timeout=120, what="echo-hi to run")
    for j in floods:
        flood.jobs.cancel(j.name)
    handles = [_attempt(env, j.id).handle for j in floods]
    wait_for(
        lambda: all(env.control.executor.poll(h).state == "exited" for h in handles),  # as the executor recorded
        timeout=120,
        what="the flood's processes to exit",
    )
    release(env.settings.data_dir, hi.id)
    wait_for(lambda: _state(calm, "echo-hi") in TERMINAL, timeout=300, interval=0.02, what="echo-hi to end")
    seen = datetime.now(UTC)
    exited = _attempt(env, hi.id).finished_at  # the exit time the executor recorded
    assert exited is not None and _state(calm, "echo-hi") == "SUCCEEDED"
    wait_for(lambda: all(_state(flood, j.name) == "CANCELLED" for j in floods), timeout=120, what="cancels")
    reading = [j.name for j in floods if not ingester.settled(j.id)]
    print(f"echo-hi recorded ended {(seen - exited).total_seconds():.2f} s after its exit; still read: {reading}")
    assert (seen - exited).total_seconds() <= 2.0
    assert reading  # the flood's last readings went on after echo-hi's end was recorded: it did not wait for them
    assert "hi" in [line.text for line in calm.jobs.logs("echo-hi")]

    _wait_end(calm, "steady")
    for j in floods:  # their files go: what is left of their last readings with them
        flood.jobs.delete(j.name)
    wait_for(lambda: ingester.load() == (0, 0), timeout=120, what="the reader to be idle")


def _wait_end(client: Client, name: str) -> None:
    wait_for(lambda: _state(client, name) in TERMINAL, timeout=120, what=f"{name} to end")


class SlowSaves(SimulatedExecutor):
    """Saves the outputs of the jobs in ``slow`` only once the test lets them go, as a copy of large outputs would
    take its time: the rest is the simulated executor's."""

    def __init__(self) -> None:
        super().__init__()
        self.slow: set[str] = set()
        self.saving, self.go = threading.Event(), threading.Event()

    def save_outputs(self, handle, key, admit=None) -> bool:
        if any(f"/{job}/" in handle for job in self.slow):
            self.saving.set()
            assert self.go.wait(60)
        return super().save_outputs(handle, key, admit)


def test_one_tenants_slow_output_save_holds_no_other_tenants_end(tmp_path: Path, db_url: str) -> None:
    executor = SlowSaves()
    env = build_env(make_settings(tmp_path, db_url), executor)
    control = env.control
    assert control is not None
    control.supervisor.savers.start()  # as the loop's run does; the test drives the ticks
    try:
        with env.http:
            large = env.new_tenant_user("large", "large-user")
            small = env.new_tenant_user("small", "small-user")
            big = large.jobs.submit({"name": "big-outputs", "command": "true"})
            tiny = small.jobs.submit({"name": "tiny", "command": "true"})

            def ticked(client: Client, name: str, state: str) -> bool:
                control.tick()
                return _state(client, name) == state

            wait_for(lambda: ticked(large, "big-outputs", "RUNNING") and ticked(small, "tiny", "RUNNING"))
            executor.slow.add(big.id)
            for job in (big, tiny):
                executor.finish(_attempt(env, job.id).handle, 0)
            wait_for(lambda: ticked(small, "tiny", "SUCCEEDED"), what="the other tenant's end")
            assert executor.saving.is_set() and _state(large, "big-outputs") == "RUNNING"  # still saving
            executor.go.set()
            wait_for(lambda: ticked(large, "big-outputs", "SUCCEEDED"), what="its own end, once saved")
    finally:
        executor.go.set()
        control.supervisor.savers.shutdown()
        env.platform.db.dispose()
