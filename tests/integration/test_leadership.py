"""One scheduler leader, fenced (``control/leader.py``): losing the lock session ends leadership within one
pass, a new leader takes the next epoch, and whatever the deposed leader still tries to write is refused.

Two leaders run in this process with their own ``Database`` (as two ``dlcloud up`` processes would). What
kills a leader's lock: PostgreSQL, ``pg_terminate_backend`` on its lock session; SQLite, the lock file
removed from under it (the next process then locks a new one).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from dlcloud.control.leader import ADVISORY_LOCK_ID, Leadership, LeadershipLost
from dlcloud.control.loop import ControlLoop
from dlcloud.executors.base import Executor
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.store.db import Database
from dlcloud.store.rows import AttemptRow, JobEventRow, JobRow, LeadershipRow
from tests.conftest import Env, wait_for
from tests.job_files import touch_for_job

pytestmark = pytest.mark.serial  # lease expiry and takeover timings: run alone (make test)


@dataclasses.dataclass
class Node:
    """One would-be leader: its own database handle, election and control loop."""

    db: Database
    leadership: Leadership
    control: ControlLoop


@pytest.fixture
def nodes(env: Env) -> Iterator[Callable[[Executor, str], Node]]:
    made: list[Node] = []

    def make(executor: Executor, holder: str) -> Node:
        db = Database(env.settings.resolved_database_url, pool_size=5)
        leadership = Leadership(db, env.settings.data_dir, holder=holder)
        platform = dataclasses.replace(env.platform, db=db, wake=lambda: None)
        node = Node(db, leadership, ControlLoop(platform, executor, leadership))
        made.append(node)
        return node

    yield make
    for n in made:
        n.control.builds.shutdown()
        n.leadership.release()
        n.db.dispose()


def _break_lock(env: Env) -> None:
    """Take the current leader's lock away from it, as an operator or a network failure would."""
    url = env.settings.resolved_database_url
    if url.startswith("sqlite"):
        (env.settings.data_dir / "scheduler.lock").unlink()
        return
    engine = create_engine(url, poolclass=NullPool)
    holders = text(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
        " AND classid::bigint = :hi AND objid::bigint = :lo"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    key = {"hi": ADVISORY_LOCK_ID >> 32, "lo": ADVISORY_LOCK_ID & 0xFFFFFFFF}
    with engine.connect() as conn:
        (pid,) = conn.execute(holders, key).scalars().all()
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
        conn.commit()
        wait_for(lambda: not conn.execute(holders, key).scalars().all(), timeout=10, what="the session to end")
        conn.commit()
    engine.dispose()


def _epoch(env: Env) -> tuple[int, str] | None:
    with env.platform.db.read() as s:
        row = s.get(LeadershipRow, 1)
        return (row.epoch, row.holder) if row else None


def test_one_leader_at_a_time_and_each_takes_the_next_epoch(env: Env, nodes):
    a, b = nodes(SimulatedExecutor(), "a"), nodes(SimulatedExecutor(), "b")
    assert a.leadership.try_acquire()
    assert not b.leadership.try_acquire()
    assert (a.leadership.epoch, _epoch(env)) == (1, (1, "a"))
    a.leadership.verify()  # still held
    a.leadership.release()
    assert b.leadership.try_acquire()
    assert (b.leadership.epoch, _epoch(env)) == (2, (2, "b"))
    with pytest.raises(LeadershipLost):
        a.leadership.verify()


def test_a_lost_lock_session_stops_the_leader_within_one_pass_and_another_takes_over(env: Env, nodes):
    a, b = nodes(LocalExecutor(), "a"), nodes(LocalExecutor(), "b")
    assert a.leadership.try_acquire()
    stop = threading.Event()
    threads = [threading.Thread(target=a.control.run, args=(stop,), daemon=True)]
    threads[0].start()
    try:
        c = env.admin
        # it runs until told: a file in its own outputs directory (the one host path a sandboxed job sees)
        waits = 'while [ ! -e "$DLCLOUD_OUTPUT_DIR/go" ]; do sleep 0.05; done; echo done'
        job_id = c.jobs.submit({"name": "long", "command": waits}).id
        wait_for(lambda: c.jobs.get("long").state == "RUNNING", what="the job to run under the first leader")

        _break_lock(env)
        threads[0].join(timeout=5)  # the pass after the loss ends the loop (passes are 0.05 s apart)
        assert not threads[0].is_alive() and not stop.is_set(), "the deposed loop kept leading"
        with pytest.raises(LeadershipLost, match="lock"):
            a.leadership.verify()

        assert wait_for(b.leadership.try_acquire, timeout=10, what="the second node to lead")
        assert _epoch(env) == (2, "b")
        threads.append(threading.Thread(target=b.control.run, args=(stop,), daemon=True))
        threads[1].start()
        assert c.jobs.get("long").state == "RUNNING"
        touch_for_job(next(env.settings.runs_dir.glob(f"*/{job_id}/outputs")) / "go")
        # the job kept running through the handover; the new leader adopts its end
        job = wait_for(lambda: (j := c.jobs.get("long")).state == "SUCCEEDED" and j, what="the job to end")
        assert [x.text for x in c.jobs.logs("long") if x.stream == "stdout"] == ["done"]
        assert len(job.attempts) == 1 and job.restarts == 0
    finally:
        stop.set()
        for n, t in zip((a, b), threads, strict=False):
            n.control.wake()
            t.join(timeout=10)


def test_a_deposed_leader_writes_nothing(env: Env, nodes):
    executor = SimulatedExecutor()
    a, b = nodes(executor, "a"), nodes(executor, "b")
    assert a.leadership.try_acquire()
    c = env.admin
    c.jobs.submit({"name": "queued", "command": "true"})
    _break_lock(env)
    assert wait_for(b.leadership.try_acquire, timeout=10, what="the second node to lead")

    # the deposed leader has not noticed yet (no pass since): each write is refused by the epoch check
    with pytest.raises(LeadershipLost, match=r"newer leader took epoch 2 \(ours was 1\)"):
        a.control.schedule()
    job = c.jobs.get("queued")
    assert (job.state, job.attempts) == ("QUEUED", [])
    with pytest.raises(LeadershipLost), a.leadership.write() as s:
        s.execute(JobRow.__table__.update().values(reason="written by the deposed leader"))
    assert c.jobs.get("queued").reason != "written by the deposed leader"
    with pytest.raises(LeadershipLost):  # and it stays lost until it releases and wins an election again
        a.leadership.verify()
    assert executor.running() == {}

    assert b.control.schedule() == 1
    assert c.jobs.get("queued").state == "STARTING"


def test_a_takeover_waits_for_the_fenced_write_in_flight(env: Env, nodes):
    """The new epoch is taken after the former leader's open transaction ends, never in its middle."""
    a, b = nodes(SimulatedExecutor(), "a"), nodes(SimulatedExecutor(), "b")
    assert a.leadership.try_acquire()
    c = env.admin
    c.jobs.submit({"name": "j", "command": "true"})
    with a.leadership.write() as s:
        _break_lock(env)
        took: list[bool] = []
        taker = threading.Thread(target=lambda: took.append(wait_for(b.leadership.try_acquire, timeout=30)))
        taker.start()
        taker.join(timeout=0.5)
        assert taker.is_alive(), "the new leader took the epoch while the old leader's write was open"
        s.execute(JobRow.__table__.update().values(reason="the last write of epoch 1"))
    taker.join(timeout=30)
    assert took == [True] and _epoch(env) == (2, "b")
    assert c.jobs.get("j").reason == "the last write of epoch 1"


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_takeover_ends_the_open_transaction_of_a_frozen_leader(env: Env, nodes):
    """A former leader stuck inside a fenced transaction holds the epoch row: the new leader waits a moment,
    then ends its session, and what it wrote is rolled back."""
    a, b = nodes(SimulatedExecutor(), "a"), nodes(SimulatedExecutor(), "b")
    assert a.leadership.try_acquire()
    env.admin.jobs.submit({"name": "j", "command": "true"})
    with pytest.raises(DBAPIError), a.leadership.write() as s:
        s.execute(JobRow.__table__.update().values(reason="written by a frozen leader"))
        _break_lock(env)
        assert wait_for(b.leadership.try_acquire, timeout=30, what="the second node to lead")
    assert _epoch(env) == (2, "b")
    assert env.admin.jobs.get("j").reason != "written by a frozen leader"
    with pytest.raises(LeadershipLost):
        a.leadership.verify()


def test_the_same_failed_attempt_is_handled_once_across_a_takeover(env: Env, nodes):
    """The duplicate-restart bug: the deposed leader and the new one both saw attempt 1 fail."""
    executor = SimulatedExecutor()  # one host: both leaders see the same processes
    a, b = nodes(executor, "a"), nodes(executor, "b")
    assert a.leadership.try_acquire()
    c = env.admin
    c.jobs.submit({"name": "flaky", "command": "exit 3", "restart": {"max_restarts": 3, "backoff_seconds": 0}})
    assert a.control.schedule() == 1
    (handle,) = executor.running()
    executor.finish(handle, exit_code=3)

    _break_lock(env)
    assert wait_for(b.leadership.try_acquire, timeout=10, what="the second node to lead")
    with pytest.raises(LeadershipLost):
        a.control.supervise()  # it saw the failure, but may not record it
    b.control.supervise()
    a.control.supervise()  # nothing live left to look at: reads only
    with pytest.raises(LeadershipLost):
        a.control.schedule()  # the restart is not placed twice either
    b.control.supervise()  # nothing left to handle

    with env.platform.db.read() as s:
        job = s.scalars(select(JobRow).where(JobRow.name == "flaky")).one()
        restarts = s.scalars(
            select(JobEventRow).where(JobEventRow.job_id == job.id, JobEventRow.to_state == "RESTARTING")
        ).all()
        (attempt,) = s.scalars(select(AttemptRow).where(AttemptRow.job_id == job.id)).all()
        assert (job.state, job.restarts) == ("RESTARTING", 1)
        assert [e.reason for e in restarts] == ["attempt 1 failed with exit code 3; restart 1 of 3 after 0 s"]
        assert (attempt.outcome, attempt.exit_code) == ("failed", 3)
    assert b.control.schedule() == 1  # attempt 2, by the new leader only
    assert [w.attempt for w in executor.running().values()] == [2]


def test_a_deposed_environment_builder_records_nothing(env: Env, nodes):
    a, b = nodes(SimulatedExecutor(), "a"), nodes(SimulatedExecutor(), "b")
    assert a.leadership.try_acquire()
    created = env.admin.environments.create(
        "e1", requirements=["nonexistent-pkg-dlcloud==9.9"], inherit=True, no_index=True
    )
    _break_lock(env)
    assert wait_for(b.leadership.try_acquire, timeout=10, what="the second node to lead")
    with pytest.raises(LeadershipLost):
        a.control.builds.build(created.spec_hash)
    assert env.admin.environments.get("e1").state == "BUILDING"
