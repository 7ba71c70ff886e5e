"""The scheduling pass, on SQLite and PostgreSQL. Its writes: a placing pass costs the same statements whether it
places 3 jobs or 30 (no query, flush or UPDATE per placed job), the wait reasons of many queued jobs are written in
one go, and an idle pass over an unchanged queue writes nothing. What it reads: the queued jobs it keeps from pass to
pass (``QueueCache``) are those of the queue as it is now: a job whose row changed is planned as it is now, a hold
is that of its environment's build now, and jobs that left the queue are dropped."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select, update

from dlcloud.client import Client
from dlcloud.control.queue_cache import EnvironmentHolds, QueueCache
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.store import waits
from dlcloud.store.queue import QUEUE_ORDER
from dlcloud.store.rows import (
    AttemptRow,
    EnvironmentBuildRow,
    JobEventRow,
    JobRow,
    JobWaitRow,
    TenantRow,
    WaitReasonRow,
    utcnow,
)
from tests.conftest import Env, build_env, make_settings
from tests.integration.test_quotas import enqueue, executor, finish, running_names, spec

GiB = 1024**3


@pytest.fixture
def roomy_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """A control loop over a SimulatedExecutor on a host with room for 64 one-CPU jobs."""
    settings = make_settings(tmp_path, db_url, cpu_capacity=64, memory_capacity_bytes=128 * GiB)
    e = build_env(settings, SimulatedExecutor())
    with e.http:
        yield e
    e.platform.db.dispose()


def _statements_of_a_pass(env: Env) -> tuple[int, int]:
    """(jobs placed, statements sent to the database: an executemany counts once) of one scheduling pass."""
    placed, sent = _sent_by_a_pass(env)
    return placed, len(sent)


def _sent_by_a_pass(env: Env) -> tuple[int, list[str]]:
    """(jobs placed, the statements sent to the database) of one scheduling pass."""
    sent: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        sent.append(statement)

    return _a_pass_watched(env, count), sent


def _a_pass_watched(env: Env, listener: Any) -> int:
    """One scheduling pass with ``listener`` on the engine's ``before_cursor_execute``; the jobs it placed."""
    engine = env.platform.db.engine
    event.listen(engine, "before_cursor_execute", listener)
    try:
        assert env.control is not None
        return env.control.schedule()
    finally:
        event.remove(engine, "before_cursor_execute", listener)


def test_a_placing_pass_sends_as_many_statements_for_30_jobs_as_for_3(roomy_env: Env) -> None:
    for tenant in ("small", "large"):
        roomy_env.new_tenant_user(tenant, "alice")
    enqueue(roomy_env, "small", "alice", 3, gpus=0)
    placed_3, statements_3 = _statements_of_a_pass(roomy_env)
    enqueue(roomy_env, "large", "alice", 30, gpus=0)
    placed_30, statements_30 = _statements_of_a_pass(roomy_env)

    assert (placed_3, placed_30) == (3, 30)
    assert statements_30 == statements_3
    with roomy_env.platform.db.read() as s:
        states = s.scalars(select(JobRow.state)).all()
        attempts = s.scalar(select(AttemptRow.id).order_by(AttemptRow.id.desc()).limit(1))
        placed_events = s.scalars(select(JobEventRow.reason).where(JobEventRow.to_state == "STARTING")).all()
    assert states == ["STARTING"] * 33
    assert attempts == 33
    assert len(placed_events) == 33 and all("attempt 1 placed on testhost" in r for r in placed_events)


def _rows_written(env: Env, *tables: str) -> tuple[int, dict[str, list[str]]]:
    """(jobs placed, per table: the statements of one scheduling pass writing it, once per row an executemany
    writes; a DELETE once)."""
    sent: dict[str, list[str]] = {table: [] for table in tables}

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        words = statement.split()
        if words[0].upper() in ("UPDATE", "INSERT", "DELETE"):
            table = words[1] if words[0].upper() == "UPDATE" else words[2]
            if table in sent:
                sent[table].extend([statement] * (len(parameters) if executemany else 1))

    return _a_pass_watched(env, count), sent


def test_jobs_that_wait_for_the_same_reason_share_one_row_which_alone_is_rewritten_when_the_reason_changes(
    sim_env: Env,
) -> None:
    """40 jobs of one tenant wait: the first for capacity, 39 behind it. When the hog ends, two start and the reason
    of the other 38 changes (their tenant's share, the job they wait behind): the pass rewrites the two shared rows
    and moves the new first job to the other, and writes no row of the other 37."""
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    enqueue(env, "default", "admin", 40, gpus=1)
    assert control.schedule() == 0
    before = env.admin.jobs.get("bulk-39").wait_reason
    assert before.startswith("waiting behind job bulk-0 (reserved")
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobWaitRow)) == 40
        assert s.scalar(select(func.count()).select_from(WaitReasonRow)) == 2
    finish(env, "hog")

    placed, written = _rows_written(env, "wait_reasons", "job_waits", "jobs")
    assert placed == 2
    after = env.admin.jobs.get("bulk-39").wait_reason
    assert after.startswith("waiting behind job bulk-2 (reserved") and "tenant default uses 100%" in after
    assert env.admin.jobs.get("bulk-3").wait_reason == after
    assert env.admin.jobs.get("bulk-2").wait_reason.startswith("waiting for capacity: needs 1 GPU(s), 0 free")
    assert [st.split()[0] for st in written["wait_reasons"]] == ["UPDATE", "UPDATE"]
    assert sorted(st.split()[0] for st in written["job_waits"]) == ["DELETE", "UPDATE"]  # the placed; bulk-2
    assert len(written["jobs"]) == 2  # the placed
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobWaitRow)) == 38
        assert s.scalar(select(func.count()).select_from(WaitReasonRow)) == 2
    placed, written = _rows_written(env, "wait_reasons", "job_waits", "jobs")
    assert placed == 0 and written == {"wait_reasons": [], "job_waits": [], "jobs": []}


def test_set_waits_shares_a_row_per_tenant_and_text_moves_jobs_and_drops_what_no_job_takes(env: Env) -> None:
    """The same text in two tenants is two rows (a job reads only its own tenant's); a job whose text changes alone
    moves to another row; a row no job takes is deleted with the waits still pointing to it."""
    env.new_tenant_user("lab", "alice")
    enqueue(env, "lab", "alice", 4, gpus=0)
    enqueue(env, "default", "admin", 2, gpus=0)
    db = env.platform.db
    with db.read() as s:
        jobs = {(t, n): i for i, t, n in s.execute(select(JobRow.id, TenantRow.name, JobRow.name).join(TenantRow))}
        lab, default = (s.scalar(select(TenantRow.id).where(TenantRow.name == n)) for n in ("lab", "default"))

    def current(s) -> dict[str, int]:
        return dict(s.execute(select(JobWaitRow.job_id, JobWaitRow.wait_id)).all())

    start = utcnow().replace(microsecond=250000)
    lab_jobs = [jobs["lab", f"bulk-{i}"] for i in range(4)]
    with db.write() as s:
        conn = s.connection()
        waits.set_waits(
            conn,
            waits.read_waits(conn),
            {
                (lab, "waiting for capacity", start): [(j, None) for j in lab_jobs[:3]],
                (lab, "environment 'x' is building", None): [(lab_jobs[3], None)],
                (default, "waiting for capacity", start): [(jobs["default", f"bulk-{i}"], None) for i in range(2)],
            },
        )
    with db.read() as s:
        shared, pointing = waits.read_waits(s.connection()), current(s)
    assert sorted(shared.values(), key=str) == sorted(
        [(lab, "waiting for capacity", start), (lab, "environment 'x' is building", None)]
        + [(default, "waiting for capacity", start)],
        key=str,
    )
    assert len({pointing[j] for j in lab_jobs[:3]}) == 1
    assert env.admin.jobs.get("bulk-0").wait_reason == "waiting for capacity"
    assert env.admin.jobs.get("bulk-0").estimated_start is not None

    # every text changes; lab's third job joins its fourth's; the default tenant's jobs wait for nothing specific
    later = start.replace(microsecond=500000)
    building = shared and pointing[lab_jobs[3]]
    with db.write() as s:
        conn = s.connection()
        waits.set_waits(
            conn,
            waits.read_waits(conn),
            {
                (lab, "waiting for capacity: 0 free", later): [(j, pointing[j]) for j in lab_jobs[:2]],
                (lab, "environment 'x' is building", later): [(j, pointing[j]) for j in lab_jobs[2:]],
            },
            gone=[jobs["default", "bulk-0"]],  # bulk-1 still points to the row no job takes now
        )
    with db.read() as s:
        shared2, pointing2 = waits.read_waits(s.connection()), current(s)
    assert set(pointing2) == set(lab_jobs)
    assert pointing2[lab_jobs[0]] == pointing[lab_jobs[0]]  # kept its row, rewritten
    assert pointing2[lab_jobs[2]] == pointing2[lab_jobs[3]] == building  # moved to the building one's
    assert sorted(shared2) == sorted({pointing[lab_jobs[0]], building})
    assert shared2[building] == (lab, "environment 'x' is building", later)
    # a row of another tenant is never shown, whatever points to it
    with db.write() as s:
        s.execute(insert(JobWaitRow).values(job_id=jobs["default", "bulk-1"], wait_id=building))
    assert env.admin.jobs.get("bulk-1").wait_reason == "waiting behind 5 earlier job(s) in the queue"  # every tenant's
    assert env.admin.jobs.get("bulk-1").estimated_start is None


def test_set_waits_moves_many_jobs_at_once_each_to_its_row(env: Env) -> None:
    """Enough moves for one statement over arrays on PostgreSQL (``MOVE_ALL_MIN``): each job ends on its row."""
    env.new_tenant_user("lab", "alice")
    enqueue(env, "lab", "alice", 40, gpus=0)
    db = env.platform.db
    with db.read() as s:
        ids = s.scalars(select(JobRow.id).order_by(JobRow.name)).all()
        lab = s.scalar(select(TenantRow.id).where(TenantRow.name == "lab"))
    a, b = (lab, "waiting for capacity", None), (lab, "waiting behind job x", None)
    with db.write() as s:
        conn = s.connection()
        waits.set_waits(
            conn, waits.read_waits(conn), {a: [(j, None) for j in ids[:20]], b: [(j, None) for j in ids[20:]]}
        )
    with db.read() as s:
        first = dict(s.execute(select(JobWaitRow.job_id, JobWaitRow.wait_id)).all())
    row_a, row_b = first[ids[0]], first[ids[20]]
    assert row_a != row_b
    # half of each group goes to the other's row: 20 moves, to two rows
    swapped = ids[:10] + ids[30:], ids[20:30] + ids[10:20]
    assert len(swapped[0]) + len(swapped[1]) == 40 and waits.MOVE_ALL_MIN <= 20
    with db.write() as s:
        conn = s.connection()
        waits.set_waits(
            conn,
            waits.read_waits(conn),
            {a: [(j, first[j]) for j in swapped[0]], b: [(j, first[j]) for j in swapped[1]]},
        )
    with db.read() as s:
        now = dict(s.execute(select(JobWaitRow.job_id, JobWaitRow.wait_id)).all())
        shared = waits.read_waits(s.connection())
    assert {j: now[j] for j in ids} == {**{j: row_a for j in swapped[0]}, **{j: row_b for j in swapped[1]}}
    assert shared == {row_a: a, row_b: b}


def test_a_whole_read_hands_the_queue_to_the_planner_in_queue_order(sim_env: Env) -> None:
    """Read unordered and sorted by the pass: the order the database gives (priority, submit time, then id, ties
    included), and again after a priority changes while the job waits."""
    env = sim_env
    enqueue(env, "default", "admin", 30, gpus=1)
    db = env.platform.db
    with db.write() as s:
        ids = s.scalars(select(JobRow.id).order_by(JobRow.created_at)).all()
        tied = utcnow()
        for i, job_id in enumerate(ids):
            values: dict[str, Any] = {"priority": (i * 7) % 3}
            if i % 4 == 0:
                values["created_at"] = tied  # same submit time: the id decides
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**values))
    cache = QueueCache()

    def read() -> tuple[list[str], list[str]]:
        with db.read() as s:
            conn = s.connection()
            got = [job.id for job in cache.read(conn, [], EnvironmentHolds(conn), whole=True)]
            want = conn.execute(select(JobRow.id).where(JobRow.state == "QUEUED").order_by(*QUEUE_ORDER)).scalars()
            return got, list(want)

    got, want = read()
    assert got == want and len(got) == 30
    cache.keep([])  # as if the pass had read nothing: the next read builds every job again ...
    _update_job(env, "bulk-29", priority=9)
    got, want = read()
    assert got == want and got[0] == ids[29]
    _update_job(env, "bulk-28", priority=10)  # ... or only the job whose priority changed
    got, want = read()
    assert got == want and got[0] == ids[28]


@pytest.fixture
def sim_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """The API plus a control loop over a SimulatedExecutor (fair-share, 2 GPUs), driven by the test."""
    e = build_env(make_settings(tmp_path, db_url), SimulatedExecutor())
    with e.http:
        yield e
    e.platform.db.dispose()


def _update_job(env: Env, name: str, **values: Any) -> None:
    with env.platform.db.write() as s:
        s.execute(update(JobRow).where(JobRow.name == name).values(**values))


def _queued(env: Env) -> int:
    with env.platform.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.state == "QUEUED")) or 0)


def _hog_the_host(env: Env) -> None:
    """Another tenant's job takes both GPUs: what is queued next waits."""
    assert env.control is not None
    env.new_tenant_user("other", "olga").jobs.submit(spec("hog", gpus=2))
    assert env.control.schedule() == 1


def test_attempts_that_end_together_are_recorded_in_one_transaction_each_in_its_own_savepoint(
    sim_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ends a supervision pass sees go to the database in one write transaction; recording one that fails is
    rolled back alone (its job stays RUNNING, nothing of it written) and tried again at the next pass."""
    import dlcloud.services.job_states as job_states

    env, control = sim_env, sim_env.control
    assert control is not None
    for name in ("one", "two", "three"):
        env.admin.jobs.submit(spec(name, cpu=0.5))
    assert control.schedule() == 3
    control.supervise()  # STARTING -> RUNNING
    two = env.admin.jobs.get("two").id
    end_attempt, failed = job_states.end_attempt, []

    ends_in: set[int] = set()  # the write transactions (by their number) that recorded an end

    def flaky(s: Any, job: JobRow, *args: Any, **kwargs: Any) -> Any:
        ends_in.add(len(writes))
        if job.id == two and not failed:
            failed.append(job.id)
            raise RuntimeError("the database said no")
        return end_attempt(s, job, *args, **kwargs)

    monkeypatch.setattr(job_states, "end_attempt", flaky)
    writes = []
    write = control.supervisor.write

    def counted() -> Any:
        writes.append(1)
        return write()

    monkeypatch.setattr(control.supervisor, "write", counted)
    finish_all = executor(env)
    for handle in list(finish_all.running()):
        finish_all.finish(handle, 0)
    control.supervise()
    # (the storage quota's writes of each attempt's checkpoints and outputs are transactions of their own)
    assert len(ends_in) == 1 and failed == [two]
    assert {n: env.admin.jobs.get(n).state for n in ("one", "two", "three")} == {
        "one": "SUCCEEDED", "two": "RUNNING", "three": "SUCCEEDED"}  # fmt: skip
    with env.platform.db.read() as s:
        row = s.execute(select(AttemptRow.finished_at, JobRow.exit_code).join(JobRow, JobRow.id == AttemptRow.job_id)
                        .where(JobRow.id == two)).one()  # fmt: skip
    assert tuple(row) == (None, None)
    control.supervise()
    assert env.admin.jobs.get("two").state == "SUCCEEDED"


def test_a_whole_read_reads_the_queues_index_alone(env: Env) -> None:
    """What a pass reads of every queued job, every pass, is in the queue's index: not the jobs' ~1 KB rows (it halved
    the read of 10,000 queued jobs, bench/scheduler.py). A column added to what changes must go into the index."""
    from dlcloud.store.queue import CHANGING, QUEUE_CHANGING

    [index] = [i for i in JobRow.__table__.indexes if i.name == "ix_jobs_queue"]
    assert {c.key for c in (JobRow.id, JobRow.state, *CHANGING)} <= {c.key for c in index.columns}
    db = env.platform.db
    if not db.is_sqlite:
        return  # PostgreSQL picks an index-only scan by its statistics and the table's visibility map
    with db.read() as s:
        conn = s.connection()
        sql = str(QUEUE_CHANGING.compile(conn, compile_kwargs={"literal_binds": True}))
        plan = [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
    assert any("USING COVERING INDEX ix_jobs_queue" in step for step in plan), plan


def test_a_pass_pauses_the_garbage_collector_and_gives_it_back_even_when_it_fails(
    sim_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from dlcloud.scheduler import pass_core

    assert sim_env.control is not None
    sim_env.admin.jobs.submit(spec("one", gpus=1))
    during: list[bool] = []

    def failing_plan(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.isenabled())
        raise RuntimeError("the planner broke")

    monkeypatch.setattr(pass_core, "decide", failing_plan)  # the pass's core, as the simulator drives it
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="the planner broke"):
        sim_env.control.schedule()
    assert during == [False] and gc.isenabled()


@pytest.mark.parametrize(
    ("name", "values"),
    [
        pytest.param("newer", {"priority": 5}, id="priority"),
        pytest.param("newer", {"reclaiming": True}, id="reclaiming"),  # an earlier pass preempted for it
        pytest.param("older", {"not_before": timedelta(hours=1)}, id="restart-backoff"),
        pytest.param("older", {"attained_gpu_seconds": 1e6}, id="attained-service"),  # back after long service
    ],
)
def test_a_queued_job_whose_row_changed_is_planned_as_it_is_now(
    sim_env: Env, name: str, values: dict[str, Any]
) -> None:
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    env.admin.jobs.submit(spec("older", gpus=2))
    env.admin.jobs.submit(spec("newer", gpus=2))
    assert control.schedule() == 0  # both wait, as the pass has read them
    assert len(control.scheduling.queue) == 2

    now = utcnow()
    _update_job(env, name, **{k: now + v if isinstance(v, timedelta) else v for k, v in values.items()})
    finish(env, "hog")
    assert control.schedule() == 1
    assert running_names(env) == ["newer"]


def test_a_queued_jobs_hold_is_its_environment_build_as_it_is_now(sim_env: Env) -> None:
    """The job's row does not change, its environment's build does: held while it builds, failed when it fails."""
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    env.admin.jobs.submit(spec("trainer", gpus=2))
    _update_job(env, "trainer", environment="torch", environment_hash="h-torch")
    with env.platform.db.write() as s:
        s.execute(
            insert(EnvironmentBuildRow),
            [{"spec_hash": "h-torch", "state": "READY", "spec": {}, "error": None, "created_at": utcnow()}],
        )
    assert control.schedule() == 0
    assert env.admin.jobs.get("trainer").wait_reason.startswith("waiting for capacity")

    def build(state: str, error: str | None = None) -> None:
        with env.platform.db.write() as s:
            s.execute(
                update(EnvironmentBuildRow)
                .where(EnvironmentBuildRow.spec_hash == "h-torch")
                .values(state=state, error=error)
            )

    build("BUILDING")  # rebuilt (a new version of a package it pins, say)
    assert control.schedule() == 0
    assert env.admin.jobs.get("trainer").wait_reason == "environment 'torch' is building"
    build("READY")
    assert control.schedule() == 0
    assert env.admin.jobs.get("trainer").wait_reason.startswith("waiting for capacity")
    build("FAILED", "no matching distribution for torch==9.9")
    assert control.schedule() == 0
    job = env.admin.jobs.get("trainer")
    assert job.state == "FAILED"
    assert "environment 'torch' failed to build: no matching distribution" in job.reason
    assert len(control.scheduling.queue) == 0


def test_the_pass_keeps_the_queued_jobs_and_no_others(sim_env: Env) -> None:
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    enqueue(env, "default", "admin", 20, gpus=1)
    assert control.schedule() == 0
    assert len(control.scheduling.queue) == _queued(env) == 20
    for i in range(5):
        env.admin.jobs.cancel(f"bulk-{i}")
    finish(env, "hog")
    assert control.schedule() == 2
    assert len(control.scheduling.queue) == _queued(env) == 13
    for _ in range(3):
        finish(env, *running_names(env))
        assert control.schedule() == 2
    assert len(control.scheduling.queue) == _queued(env) == 7


def test_an_idle_pass_over_an_unchanged_queue_writes_nothing(sim_env: Env) -> None:
    """Every GPU is busy, jobs wait (one holds the reservation): once their reasons are written, a pass reads and
    plans, and sends no UPDATE or INSERT."""
    env, control = sim_env, sim_env.control
    assert control is not None
    _hog_the_host(env)
    for name in ("big", "small-1", "small-2"):
        env.admin.jobs.submit(spec(name, gpus=2 if name == "big" else 1))
    control.schedule()
    control.schedule()  # the reasons settle
    assert env.admin.jobs.get("big").wait_reason.startswith("waiting for capacity")
    placed, sent = _sent_by_a_pass(env)
    assert placed == 0
    writes = [st for st in sent if st.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    assert writes == []


@pytest.fixture
def nodes_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """``sim_env`` on three nodes of two GPUs (as a cluster would have; the local executor is one node)."""
    gpus = tuple(Gpu(i, "NVIDIA H100", 81_559, f"n{i // 2}") for i in range(6))
    e = build_env(make_settings(tmp_path, db_url), SimulatedExecutor(), Inventory("testhost", gpus, 64.0, 128 * GiB))
    with e.http:
        yield e
    e.platform.db.dispose()


def _move_a_job(env: Env) -> Client:
    """Three nodes of two GPUs; b's 1-GPU jobs sit on nodes 0 and 1, inside b's guarantee, node 2 is free: the
    default tenant's gang of two 2-GPU replicas, inside its guarantee, needs two whole nodes. The pass moves b's
    younger job (the least work lost, never preempted) from node 1 to node 0's free GPU 1, which is held for it.
    Returns b's client."""
    control = env.control
    assert control is not None
    b = env.new_tenant_user("b", "bob")
    env.admin.tenants.update("b", scheduling={"guarantee": {"gpus": 2}})
    env.admin.tenants.update("default", scheduling={"guarantee": {"gpus": 4}})
    b.jobs.submit(spec("b-first", gpus=1))
    env.admin.jobs.submit(spec("filler", gpus=1))
    assert control.schedule() == 2  # b-first on GPU 0, filler on GPU 1
    b.jobs.submit(spec("b-second", gpus=1))
    assert control.schedule() == 1  # GPU 2: node 0 is full
    finish(env, "filler")
    env.admin.jobs.submit({**spec("gang", cpu=1), "framework": "pytorch", "replicas": {"worker": 2},
                           "resources": {"gpus": 2, "cpu": 1, "memory": "1Gi"}})  # fmt: skip
    assert control.schedule() == 0
    with env.platform.db.read() as s:
        rows = {r.name: r for r in s.execute(select(JobRow.name, JobRow.preempt_requested, JobRow.hold_gpus,
                                                    JobRow.reclaiming, JobRow.hold_until))}  # fmt: skip
    assert rows["b-second"][1:4] == (True, [1], True)  # moved, GPU 1 held for it, considered first once queued
    assert rows["b-second"].hold_until > utcnow()
    assert not rows["b-first"].preempt_requested
    assert env.admin.jobs.get("gang").wait_reason == (
        "preempting 1 job(s) to gather whole nodes (they resume at once on GPUs left free)"
    )
    return b


def _running_gpus(env: Env) -> dict[str, list[int]]:
    with env.platform.db.read() as s:
        q = select(JobRow.name, AttemptRow.gpus).join(AttemptRow, AttemptRow.job_id == JobRow.id)
        return dict(s.execute(q.where(AttemptRow.finished_at.is_(None))).all())  # type: ignore[arg-type]


def test_a_moved_job_resumes_on_the_gpus_held_for_it(nodes_env: Env) -> None:
    """While the moved job stops and is queued again, another job that could take its GPU waits; then the gang
    starts on nodes 1 and 2, and the moved job on GPU 1."""
    env, control = nodes_env, nodes_env.control
    assert control is not None
    b = _move_a_job(env)
    c = env.new_tenant_user("c", "carol")
    c.jobs.submit(spec("late", gpus=1))  # GPU 1 is the only one free and not the gang's
    assert control.schedule() == 0
    assert c.jobs.get("late").state == "QUEUED"
    assert env.admin.jobs.get("gang").wait_reason == "waiting for 1 stopping job(s) to free their resources"
    control.supervise()  # asks the executor to stop b-second ...
    control.supervise()  # ... and sees it stopped: PREEMPTED, then QUEUED again
    assert b.jobs.get("b-second").state == "QUEUED"
    assert control.schedule() == 2
    got = _running_gpus(env)
    assert got["b-second"] == [1] and sorted(got["gang"]) == [2, 3, 4, 5] and "late" not in got
    with env.platform.db.read() as s:
        after = s.execute(select(JobRow.hold_gpus, JobRow.hold_until).where(JobRow.name == "b-second")).one()
    assert tuple(after) == (None, None)  # placed: nothing held for it any more
    assert c.jobs.get("late").state == "QUEUED"


def test_a_moved_job_that_takes_longer_than_the_grace_period_to_stop_holds_nothing(nodes_env: Env) -> None:
    """A job may set a long grace period and take it: once the server's grace period and a tick have passed, its
    GPUs are free for others (a tenant cannot keep GPUs idle by getting its own job moved)."""
    env, control = nodes_env, nodes_env.control
    assert control is not None
    _move_a_job(env)
    _update_job(env, "b-second", hold_until=utcnow() - timedelta(seconds=1))
    c = env.new_tenant_user("c", "carol")
    c.jobs.submit(spec("late", gpus=1))
    assert control.schedule() == 1
    assert _running_gpus(env)["late"] == [1]


def test_a_job_moved_onto_a_borrowed_job_evicted_with_it_waits_for_it_to_stop(
    nodes_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three nodes of two GPUs, no GPU free: b's jobs (inside its guarantee) on nodes 0 and 1, c's borrowed ones
    beside them and on node 2. The default tenant's gang (inside its guarantee) needs two whole nodes: c's borrowed
    GPUs are scattered over all three. It evicts c's jobs on nodes 1 and 2, moves b-second onto c-1's GPU on node 0
    and evicts c-1 too (a chain). c-1 takes its grace period: b-second, queued again first, waits for GPU 1 instead
    of starting on GPU 2 (the gang's node); once c-1 stopped, it resumes there."""
    env, control = nodes_env, nodes_env.control
    assert control is not None
    b, c = env.new_tenant_user("b", "bob"), env.new_tenant_user("c", "carol")
    env.admin.tenants.update("b", scheduling={"guarantee": {"gpus": 2}})
    env.admin.tenants.update("default", scheduling={"guarantee": {"gpus": 4}})
    for client, name in ((b, "b-first"), (c, "c-1"), (b, "b-second"), (c, "c-3"), (c, "c-4"), (c, "c-5")):
        client.jobs.submit(spec(name, gpus=1))
        assert control.schedule() == 1
    assert _running_gpus(env) == {"b-first": [0], "c-1": [1], "b-second": [2], "c-3": [3], "c-4": [4], "c-5": [5]}
    env.admin.jobs.submit({**spec("gang", cpu=1), "framework": "pytorch", "replicas": {"worker": 2},
                           "resources": {"gpus": 2, "cpu": 1, "memory": "1Gi"}})  # fmt: skip
    assert control.schedule() == 0
    with env.platform.db.read() as s:
        rows = {r.name: r for r in s.execute(select(JobRow.name, JobRow.preempt_requested, JobRow.hold_gpus))}
    assert {n for n, r in rows.items() if r.preempt_requested} == {"c-1", "b-second", "c-3", "c-4", "c-5"}
    assert rows["b-second"].hold_gpus == [1]
    assert env.admin.jobs.get("gang").wait_reason == (
        "preempting 5 job(s) to reclaim its guarantee, moving 1 to gather whole nodes"
    )
    ex = executor(env)
    c1 = next(h for h, w in ex.running().items() if w.job_id == c.jobs.get("c-1").id)
    stop = ex._stop
    monkeypatch.setattr(ex, "_stop", lambda handle: None if handle == c1 else stop(handle))
    control.supervise()  # asks the executor to stop them: c-1 takes its grace period ...
    control.supervise()  # ... the others are PREEMPTED, then QUEUED again
    assert b.jobs.get("b-second").state == "QUEUED" and "c-1" in _running_gpus(env)
    assert control.schedule() == 1
    assert sorted(_running_gpus(env)["gang"]) == [2, 3, 4, 5]
    assert b.jobs.get("b-second").wait_reason == (
        "moved: waiting for 1 GPU(s) held for it that a stopping job still holds"
    )
    stop(c1)  # it stopped at last
    control.supervise()
    assert control.schedule() == 1
    assert _running_gpus(env)["b-second"] == [1]


def test_a_tenant_short_of_its_guarantee_over_the_hour_runs_its_large_job_in_a_turn(nodes_env: Env) -> None:
    """Three nodes of two GPUs. The default tenant (guaranteed 4) has run six 1-GPU jobs for two hours; b
    (guaranteed 2) has waited 30 minutes with a gang of two 2-GPU replicas, larger than its guarantee: no share
    rule can start it (the default tenant would keep less than b), a turn does. Its victims stop, it is placed for
    its turn (``turn_until``, and an event says so); until then the default tenant's jobs inside its guarantee take
    nothing back; after it, they reclaim the gang."""
    env, control = nodes_env, nodes_env.control
    assert control is not None
    b = env.new_tenant_user("b", "bob")
    env.admin.tenants.update("b", scheduling={"guarantee": {"gpus": 2}})
    env.admin.tenants.update("default", scheduling={"guarantee": {"gpus": 4}})
    for i in range(6):
        env.admin.jobs.submit(spec(f"d{i}", gpus=1))
    assert control.schedule() == 6
    with env.platform.db.write() as s:  # what the pass reads of the last hour: the attempts' GPU-seconds
        s.execute(update(AttemptRow).values(started_at=utcnow() - timedelta(hours=2)))
    b.jobs.submit({**spec("gang", cpu=1), "framework": "pytorch", "replicas": {"worker": 2},
                   "resources": {"gpus": 2, "cpu": 1, "memory": "1Gi"}})  # fmt: skip
    _update_job(env, "gang", created_at=utcnow() - timedelta(minutes=30))
    assert control.schedule() == 0
    assert b.jobs.get("gang").wait_reason == (
        "preempting 4 job(s) for its tenant's turn (short of its guarantee over the turn window)"
    )
    with env.platform.db.read() as s:
        asked = s.scalars(select(JobRow.name).where(JobRow.preempt_requested)).all()
        granted = s.scalar(select(JobRow.turn_seconds).where(JobRow.name == "gang"))
    assert len(asked) == 4 and granted == 1800.0  # b needs 2 GPUs x 1 hour: at 4 GPUs, half an hour
    assert control.schedule() == 0  # while they stop, the gang waits for them: no more victims
    with env.platform.db.read() as s:
        assert len(s.scalars(select(JobRow.name).where(JobRow.preempt_requested)).all()) == 4
    control.supervise()  # asks the executor to stop them ...
    control.supervise()  # ... and sees them stopped: queued again
    assert control.schedule() == 1
    gang = b.jobs.get("gang")
    assert gang.state in ("STARTING", "RUNNING")
    gang_attempt = select(AttemptRow.turn_until).join(JobRow, JobRow.id == AttemptRow.job_id)
    gang_attempt = gang_attempt.where(JobRow.name == "gang", AttemptRow.finished_at.is_(None))
    with env.platform.db.read() as s:
        until = s.scalar(gang_attempt)
        assert s.scalar(select(JobRow.turn_seconds).where(JobRow.name == "gang")) is None  # given to the attempt
    assert until is not None and timedelta(minutes=29) < until - utcnow() <= timedelta(minutes=30)
    assert any("its tenant's turn until" in e.reason for e in gang.events)
    # during the turn the default tenant's queued jobs, inside its guarantee, take nothing back, and say why
    assert control.schedule() == 0
    waiting = [env.admin.jobs.get(j.name) for j in env.admin.jobs.list(states=["QUEUED"])]
    assert waiting and all("run other tenants' turns, the first ending" in j.wait_reason for j in waiting)
    # the one at the head of the line also says when it may start: once the turn has ended and the gang has had its
    # stop grace
    (head,) = [j for j in waiting if "once the turns it needs have ended" in j.wait_reason]
    grace = timedelta(seconds=env.settings.stop_grace_seconds)
    assert abs(head.estimated_start - (until + grace)) < timedelta(seconds=1)
    with env.platform.db.read() as s:
        assert not s.scalar(select(JobRow.preempt_requested).where(JobRow.name == "gang"))
    # the turn is over: the gang is borrowed beyond b's guarantee, and is reclaimed
    with env.platform.db.write() as s:
        ids = s.scalars(select(JobRow.id).where(JobRow.name == "gang")).all()
        s.execute(
            update(AttemptRow).where(AttemptRow.job_id.in_(ids)).values(turn_until=utcnow() - timedelta(seconds=1))
        )
    control.schedule()
    with env.platform.db.read() as s:
        assert s.scalar(select(JobRow.preempt_requested).where(JobRow.name == "gang"))


def test_guaranteed_gpus_a_tenant_stopped_using_stay_free_for_it_then_are_lent(nodes_env: Env) -> None:
    """Three nodes of two GPUs. b (guaranteed 2) ran two 1-GPU jobs that have just ended; the default tenant
    borrows the other 4 GPUs, its last two jobs wait and say why; b's next job starts at once, nothing preempted.
    Once b's jobs ended more than ``scheduling_lend_after_seconds`` ago, its idle GPU is lent."""
    env, control = nodes_env, nodes_env.control
    assert control is not None and env.settings.scheduling_lend_after_seconds == 600.0
    b = env.new_tenant_user("b", "bob")
    env.admin.tenants.update("b", scheduling={"guarantee": {"gpus": 2}})
    b.jobs.submit(spec("b1", gpus=1))
    b.jobs.submit(spec("b2", gpus=1))
    assert control.schedule() == 2
    finish(env, "b1", "b2")
    for i in range(6):
        env.admin.jobs.submit(spec(f"d{i}", gpus=1))
    assert control.schedule() == 4
    assert env.admin.jobs.get("d4").wait_reason.startswith(
        "waiting for capacity: needs 1 GPU(s), 0 free; 2 idle GPU(s) kept for the return of tenants that used them "
        "within the last 10 min (inside their guarantees)"
    )
    b.jobs.submit(spec("b3", gpus=1))
    assert control.schedule() == 1
    assert b.jobs.get("b3").state in ("STARTING", "RUNNING")
    with env.platform.db.read() as s:
        assert not s.scalars(select(JobRow.name).where(JobRow.preempt_requested)).all()
    # b holds 1 of the 2 it held lately: one GPU stays kept; once b1 and b2 ended 11 minutes ago, it is lent
    assert control.schedule() == 0
    with env.platform.db.write() as s:
        s.execute(
            update(AttemptRow)
            .where(AttemptRow.finished_at.is_not(None))
            .values(started_at=utcnow() - timedelta(minutes=12), finished_at=utcnow() - timedelta(minutes=11))
        )
    assert control.schedule() == 1
    assert sorted(running_names(env)) == ["b3", "d0", "d1", "d2", "d3", "d4"]


def test_recent_usage_counts_the_window_and_a_turn_through_its_end_and_the_peak(env: Env) -> None:
    """What turns weigh of each tenant: GPU-seconds of its attempts over the window, live or ended in it; an attempt
    placed for a turn counts through the turn's end even if it ended sooner (a tenant cannot take turn after turn
    with jobs that fail or are cancelled at once). What the pass keeps idle for its return: the most GPUs its
    attempts held at once over the lending window (a turn's end does not count: the attempt no longer holds), of
    those that ran shorter than the window or still run."""
    from dlcloud.control.planner_inputs import recent_usage

    env.admin.jobs.submit(spec("j"))
    now = utcnow()
    with env.platform.db.write() as s:
        job_id, tenant_id, user_id = s.execute(select(JobRow.id, JobRow.tenant_id, JobRow.user_id)).one()
        attempt = {"job_id": job_id, "tenant_id": tenant_id, "user_id": user_id, "host": "h", "cpus": 1.0,
                   "memory": GiB, "handle": "x"}  # fmt: skip
        rows = [
            {"number": 1, "gpus": [0, 1], "started_at": now - timedelta(hours=2), "finished_at": None},  # 2 x 3600
            {"number": 2, "gpus": [2], "started_at": now - timedelta(minutes=90),
             "finished_at": now - timedelta(minutes=30)},  # 1 x 1800
            {"number": 3, "gpus": [3], "started_at": now - timedelta(hours=3),
             "finished_at": now - timedelta(hours=2)},  # before the window: 0
            {"number": 4, "gpus": [4, 5, 6, 7], "started_at": now - timedelta(minutes=10),
             "finished_at": now - timedelta(minutes=9), "turn_until": now + timedelta(minutes=20)},  # 4 x 600
            {"number": 5, "gpus": [], "started_at": now - timedelta(minutes=10), "finished_at": None},  # no GPUs
            {"number": 6, "gpus": [0, 1, 2], "started_at": now - timedelta(hours=3),
             "finished_at": now - timedelta(hours=2), "turn_until": now - timedelta(minutes=40)},  # 3 x 1200
            {"number": 7, "gpus": [4], "started_at": now - timedelta(hours=3),
             "finished_at": now - timedelta(hours=2), "turn_until": now - timedelta(minutes=61)},  # turn before: 0
            {"number": 8, "gpus": list(range(8, 16)), "started_at": now - timedelta(hours=5),
             "finished_at": now - timedelta(minutes=2)},  # 8 x 3480; ran longer than the window: not kept for
        ]  # fmt: skip
        s.execute(insert(AttemptRow), [{**attempt, "turn_until": None, **r} for r in rows])
    with env.platform.db.read() as s:
        hour = recent_usage(s.connection(), now, 3600.0, 3600.0)
        short = recent_usage(s.connection(), now, 0.0, 300.0)
        off = recent_usage(s.connection(), now, 0.0, 0.0)
    assert hour.gpu_s == {tenant_id: pytest.approx(2 * 3600 + 1800 + 4 * 600 + 3 * 1200 + 8 * 3480)}
    # the live 2 with the 4 of ten minutes ago; #6 ended 2 hours ago; #8's 8 ran for hours (no return expected)
    assert hour.peak_gpus == {tenant_id: 2 + 4}
    assert (short.gpu_s, short.peak_gpus) == (None, {tenant_id: 2})  # the last 5 minutes: the live attempt only
    assert (off.gpu_s, off.peak_gpus) == (None, None)


def test_recent_gpu_seconds_read_the_attempts_by_their_indexes_not_the_whole_history(env: Env) -> None:
    """Every pass with turns reads the attempts that count towards usage; the attempts are the usage record and are
    never deleted, so each term of the read must have an index (a scan of a 300,000-attempt history: ~30 ms a pass,
    with the indexes ~6, both databases). PostgreSQL is asked with sequential scans off: it scans anyway only when
    some term has no index."""
    from dlcloud.store.scheduling import recent_attempts

    db = env.platform.db
    with db.read() as s:
        conn = s.connection()
        sql = str(recent_attempts(utcnow()).compile(conn, compile_kwargs={"literal_binds": True}))
        if db.is_sqlite:
            plan = [str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
            assert not any(step.startswith("SCAN") for step in plan), plan
            assert any("ix_attempts_turns" in step for step in plan), plan
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            plan = [str(row[0]) for row in conn.exec_driver_sql("EXPLAIN " + sql)]
            assert not any("Seq Scan" in step for step in plan), plan
            assert any("ix_attempts_turns" in step for step in plan), plan
