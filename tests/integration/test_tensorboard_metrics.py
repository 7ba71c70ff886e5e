"""TensorBoard event files as job metrics (docs/metrics.md), on the running platform (SQLite and PostgreSQL):
real jobs write with ``torch.utils.tensorboard.SummaryWriter`` and ``tf.summary`` into DLCLOUD_TENSORBOARD_DIR
and their owner reads the scalars back — read while the job runs, and what it wrote in its last moment too;
a control-plane restart reads every file again and stores nothing twice; a job's hostile event files are
bounded and block neither the ingester nor another job; a gang's replicas each write their own."""

from __future__ import annotations

import inspect
import logging
import math
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud.control.loop import ControlLoop
from dlcloud.executors import event_files
from dlcloud.executors.event_files import EventScalar
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.jobs import JobDetail
from dlcloud.services import metrics
from dlcloud.store.rows import AttemptRow, JobMetricRow, JobRow, utcnow
from tests import tensorboard_files
from tests.conftest import Env, build_env, make_settings, release, wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
WAIT_FOR_GO = """
import os, time
while not os.path.exists(os.path.join(os.environ["DLCLOUD_OUTPUT_DIR"], "go")):
    time.sleep(0.05)
"""

TORCH_JOB = f"""
import os
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter(os.environ["DLCLOUD_TENSORBOARD_DIR"])
for step in range(5):
    w.add_scalar("loss", 0.5 ** step, step)
    w.add_scalar("train/accuracy", step / 8, step)
w.flush()
print("first half written", flush=True)
{WAIT_FOR_GO}
for step in range(5, 10):
    w.add_scalar("loss", 0.5 ** step, step)
w.add_scalar("last", 42.0, 1000)  # in the last moment: close() writes it, the process exits
w.close()
"""

TF_JOB = """
import os
import tensorflow as tf
top = os.environ["DLCLOUD_TENSORBOARD_DIR"]
train = tf.summary.create_file_writer(os.path.join(top, "train"))
validation = tf.summary.create_file_writer(os.path.join(top, "validation"))
for step in range(4):
    with train.as_default():
        tf.summary.scalar("epoch_loss", 1.0 / (step + 1), step=step)
    with validation.as_default():
        tf.summary.scalar("epoch_accuracy", 0.5 + step / 10, step=step)
        tf.summary.histogram("weights", [1.0, 2.0, 3.0], step=step)  # not a scalar: left out
train.close()
validation.close()
"""

# attacker-controlled bytes in its own TensorBoard directory, then a record it completes only later
HOSTILE_JOB = (
    inspect.getsource(tensorboard_files)
    + f"""
import os, time
top, now = os.environ["DLCLOUD_TENSORBOARD_DIR"], time.time()
def put(name, data):
    path = os.path.join(top, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)
put("events.out.tfevents.garbage", os.urandom(65536))
put("events.out.tfevents.huge", framed(scalar_event(1, now, {{"before_huge": 1.0}})) + huge_header(2**62) + b"x" * 99)
torn = framed(scalar_event(2, now, {{"torn": 2.0}}))
put("a-torn/events.out.tfevents.torn", framed(scalar_event(1, now, {{"torn": 1.0}})) + torn[:7])
put("tags/events.out.tfevents.tags", framed(scalar_event(0, now, {{f"tag{{i}}": float(i) for i in range(5000)}})))
print("hostile files written", flush=True)
{WAIT_FOR_GO}
put("a-torn/events.out.tfevents.torn", torn[7:])
"""
)

# another job, writing plain event files while the hostile one runs
PLAIN_JOB = (
    inspect.getsource(tensorboard_files)
    + f"""
import os, time
path = os.path.join(os.environ["DLCLOUD_TENSORBOARD_DIR"], "events.out.tfevents.plain")
def put(step):
    with open(path, "ab") as f:
        f.write(framed(scalar_event(step, time.time(), {{"loss": 1.0 + step}})))
for step in range(3):
    put(step)
{WAIT_FOR_GO}
put(3)
"""
)

GANG_JOB = (
    inspect.getsource(tensorboard_files)
    + """
import os, time
index = int(os.environ["DLCLOUD_REPLICA_INDEX"])
path = os.path.join(os.environ["DLCLOUD_TENSORBOARD_DIR"], "events.out.tfevents.%d" % index)
with open(path, "ab") as f:
    f.write(framed(scalar_event(0, time.time(), {"loss": float(index)})))
"""
)


def _python(script: str) -> str:
    return "python -c " + shlex.quote(script)


@dataclass
class Platform:
    """The running platform, whose control plane the test can restart (a new loop, a new executor)."""

    env: Env
    stop: threading.Event
    thread: threading.Thread

    @property
    def control(self) -> ControlLoop:
        assert self.env.control is not None
        return self.env.control

    def restart(self) -> None:
        self.stop.set()
        self.control.wake()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        self.env.control = ControlLoop(self.env.platform, LocalExecutor())
        self._start()

    def _start(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.control.run, args=(self.stop,), daemon=True)
        self.thread.start()


@pytest.fixture
def platform(tmp_path: Path, db_url: str) -> Iterator[Platform]:
    env = build_env(make_settings(tmp_path, db_url, tensorboard_interval_seconds=0.2), LocalExecutor())
    p = Platform(env, threading.Event(), threading.Thread())
    p._start()
    with env.http:
        yield p
    p.stop.set()
    p.control.wake()
    p.thread.join(timeout=60)
    env.platform.db.dispose()


def _wait_end(env: Env, name: str, timeout: float = 240.0) -> JobDetail:
    """The job ended and succeeded, and its event files had their last reading (which comes after the end)."""
    job = wait_for(
        lambda: (j := env.admin.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"{name} to end"
    )
    assert job.state == "SUCCEEDED", [line.text for line in env.admin.jobs.logs(name)]
    assert env.control is not None
    wait_for(lambda: env.control.ingester.settled(job.id), timeout=timeout, what=f"{name}'s last reading")
    return job


def _series(env: Env, name: str) -> dict[tuple[str, int, str], list[tuple[int, float]]]:
    answer = env.admin.jobs.metrics(name, max_points=10_000)
    return {(s.metric, s.attempt, s.replica): [(p.step, p.value) for p in s.points] for s in answer.series}


def _rows(env: Env, job_id: str) -> int:
    with env.platform.db.read() as s:
        q = select(func.count()).select_from(JobMetricRow).where(JobMetricRow.job_id == job_id)
        return int(s.scalar(q) or 0)


def _attempt_id(env: Env, job_id: str) -> int:
    with env.platform.db.read() as s:
        return int(s.scalar(select(AttemptRow.id).where(AttemptRow.job_id == job_id, AttemptRow.number == 1)) or 0)


def test_a_summary_writer_jobs_scalars_are_read_while_it_runs_again_after_a_restart_and_to_its_last(platform):
    env = platform.env
    env.settings.tensorboard_interval_seconds = 1.0
    started = datetime.now().astimezone()
    job = env.admin.jobs.submit({"name": "tb-torch", "command": _python(TORCH_JOB)})
    first = {
        ("loss", 1, ""): [(s, 0.5**s) for s in range(5)],
        ("train/accuracy", 1, ""): [(s, s / 8) for s in range(5)],
    }
    wait_for(lambda: _series(env, "tb-torch") == first, timeout=180, what="the first half, read while it runs")
    assert env.admin.jobs.get("tb-torch").state == "RUNNING"
    assert _rows(env, job.id) == 10

    # a restarted control plane reads the files again from their start: the same rows, none twice
    platform.restart()
    attempt = _attempt_id(env, job.id)
    wait_for(lambda: platform.control.ingester.stored(attempt)[0] >= 10, timeout=60, what="the files read again")
    assert _rows(env, job.id) == 10 and _series(env, "tb-torch") == first

    release(env.settings.data_dir, job.id)
    _wait_end(env, "tb-torch")
    series = _series(env, "tb-torch")
    assert series == {
        ("loss", 1, ""): [(s, 0.5**s) for s in range(10)],
        ("train/accuracy", 1, ""): [(s, s / 8) for s in range(5)],
        ("last", 1, ""): [(1000, 42.0)],  # written as the process ended: read by the attempt's last pass
    }
    assert _rows(env, job.id) == 16
    # each point's time is the event's wall time, as the job wrote it
    answer = env.admin.jobs.metrics("tb-torch", metrics=["last"])
    when = answer.series[0].points[0].time
    assert started <= when <= datetime.now().astimezone()


def test_tf_summary_runs_in_subdirectories_become_metric_prefixes(platform):
    env = platform.env
    env.settings.tensorboard_interval_seconds = 3600.0  # no pass while it runs: its end's last pass reads all
    env.admin.jobs.submit({"name": "tb-tf", "command": _python(TF_JOB)})
    _wait_end(env, "tb-tf")
    series = _series(env, "tb-tf")
    assert set(series) == {("train/epoch_loss", 1, ""), ("validation/epoch_accuracy", 1, "")}
    assert series[("train/epoch_loss", 1, "")] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(4)]
    assert series[("validation/epoch_accuracy", 1, "")] == [(s, pytest.approx(0.5 + s / 10)) for s in range(4)]


def test_hostile_event_files_are_bounded_and_block_neither_the_ingester_nor_another_job(platform, caplog):
    env = platform.env
    caplog.set_level(logging.WARNING, logger="dlcloud.control.tensorboard")
    hostile = env.admin.jobs.submit({"name": "tb-hostile", "command": _python(HOSTILE_JOB)})
    wait_for(
        lambda: ("a-torn/torn", 1, "") in _series(env, "tb-hostile"), timeout=120, what="the hostile job's files read"
    )
    plain = env.admin.jobs.submit({"name": "tb-plain", "command": _python(PLAIN_JOB)})
    wait_for(
        lambda: _series(env, "tb-plain").get(("loss", 1, "")) == [(s, 1.0 + s) for s in range(3)],
        timeout=120,
        what="the other job's points, while the hostile one runs",
    )
    assert platform.control.ingester.running
    for job in (hostile, plain):
        release(env.settings.data_dir, job.id)
    _wait_end(env, "tb-plain")
    _wait_end(env, "tb-hostile")
    assert _series(env, "tb-plain") == {("loss", 1, ""): [(s, 1.0 + s) for s in range(4)]}

    series = _series(env, "tb-hostile")
    assert series[("before_huge", 1, "")] == [(1, 1.0)]  # what came before the huge header
    assert series[("a-torn/torn", 1, "")] == [(1, 1.0), (2, 2.0)]  # the torn record, once the job completed it
    tags = [k for k in series if k[0].startswith("tags/")]
    assert len(series) == event_files.MAX_TAGS  # 5000 tags written: as many followed as one attempt may have
    assert len(tags) == event_files.MAX_TAGS - 2 and all(len(series[k]) == 1 for k in tags)
    logged = [r.getMessage() for r in caplog.records]
    assert sum("events.out.tfevents.garbage: read no more" in m for m in logged) == 1  # said once
    assert any("events.out.tfevents.huge: read no more" in m and "claims" in m for m in logged)


def test_each_gang_replica_writes_its_own_tensorboard_dir(platform):
    env = platform.env
    spec = {"name": "tb-gang", "replicas": {"worker": 2}, "command": _python(GANG_JOB)}
    env.admin.jobs.submit(spec)
    _wait_end(env, "tb-gang")
    assert _series(env, "tb-gang") == {("loss", 1, "worker-0"): [(0, 0.0)], ("loss", 1, "worker-1"): [(0, 1.0)]}


def test_scalars_read_from_event_files_are_checked_like_a_push(env):
    job = env.admin.jobs.submit({"name": "tb-names", "command": "true"})  # no control loop: it stays queued
    with env.platform.db.write() as s:
        row = s.get(JobRow, job.id)
        tenant = row.tenant_id
        s.add(AttemptRow(job_id=row.id, tenant_id=tenant, user_id=row.user_id, number=1, host="h", gpus=[],
                         cpus=1.0, memory=0, handle="t/j/attempt-1", started_at=utcnow()))  # fmt: skip
    now = time.time()
    scalars = [
        EventScalar("", "validation/epoch loss (val)", 1, 0.5, now),  # characters a name may not hold: "_"
        EventScalar("", "run/" + "x" * 130, 1, 1.0, now),  # no name can hold it
        EventScalar("", "nan", 1, math.nan, now),
        EventScalar("", "negative", -1, 1.0, now),
        EventScalar("", "no-time", 2, 2.0, 1e15),  # no plausible wall time: the time it was read
        EventScalar("worker-1", "loss", 3, 3.0, now),
        EventScalar("worker-1", "loss", 3, 4.0, now),  # the same point again: the last wins
    ]
    stored, dropped = metrics.store_event_scalars(env.platform.db.write, tenant, job.id, 1, scalars)
    assert stored == 3 and sum(dropped.values()) == 3 and len(dropped) == 3
    assert _series(env, "tb-names") == {
        ("validation/epoch_loss__val_", 1, ""): [(1, 0.5)],
        ("no-time", 1, ""): [(2, 2.0)],
        ("loss", 1, "worker-1"): [(3, 4.0)],
    }
    answer = env.admin.jobs.metrics("tb-names", metrics=["no-time"])
    assert answer.series[0].points[0].time.year == utcnow().year
