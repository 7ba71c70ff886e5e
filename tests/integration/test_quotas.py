"""Quotas, queueing, capacity, priorities and usage accounting, end to end on SQLite and PostgreSQL.

The control loop is driven by hand (``schedule`` / ``supervise``) against a SimulatedExecutor, so every
step is deterministic; the simulated clock decides how long an attempt held its resources.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select

from dlcloud import signing
from dlcloud.client import Client
from dlcloud.errors import QuotaExceeded
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.schemas.jobs import JobSpec
from dlcloud.services import recipes
from dlcloud.store.ids import new_id
from dlcloud.store.rows import AttemptRow, JobEventRow, JobRow, JobWaitRow, TenantRow, UserRow, utcnow
from tests.conftest import Env, ShiftedClock, build_env, make_settings

GiB = 1024**3


@pytest.fixture
def sim_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """The in-process API plus a control loop over a SimulatedExecutor, driven by the test."""
    e = build_env(make_settings(tmp_path, db_url), SimulatedExecutor(clock=ShiftedClock()))
    with e.http:
        yield e
    e.platform.db.dispose()


@pytest.fixture
def fifo_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """``sim_env`` under the fifo policy: the first job that does not fit blocks every job behind it."""
    e = build_env(make_settings(tmp_path, db_url, scheduling_policy="fifo"), SimulatedExecutor(clock=ShiftedClock()))
    with e.http:
        yield e
    e.platform.db.dispose()


def executor(env: Env) -> SimulatedExecutor:
    assert env.control is not None and isinstance(env.control.executor, SimulatedExecutor)
    return env.control.executor


def spec(name: str, gpus: int = 0, cpu: float = 1, priority: int = 0) -> dict:
    return {
        "name": name,
        "command": "true",
        "resources": {"gpus": gpus, "cpu": cpu, "memory": "1Gi"},
        "priority": priority,
    }


def enqueue(env: Env, tenant: str, user: str, count: int, gpus: int) -> None:
    """Queue ``count`` jobs named bulk-<i> at once: the rows ``submit_job`` writes, without 3 requests each."""
    with env.platform.db.write() as s:
        tenant_id, user_id = s.execute(
            select(TenantRow.id, UserRow.id)
            .join(UserRow, UserRow.tenant_id == TenantRow.id)
            .where(TenantRow.name == tenant, UserRow.name == user)
        ).one()
        now = utcnow()
        jobs, events = [], []
        for i in range(count):
            job_spec = JobSpec.model_validate(spec(f"bulk-{i}", gpus=gpus))
            created = now - timedelta(microseconds=count - i)
            jobs.append(
                {
                    "id": new_id("j-"),
                    "tenant_id": tenant_id,
                    "user_id": user_id,
                    "name": job_spec.name,
                    "spec": job_spec.model_dump(mode="json"),
                    "command": recipes.shell_command(job_spec),
                    "state": "QUEUED",
                    "reason": "submitted",
                    "priority": 0,
                    "gpus": gpus,
                    "cpus": job_spec.resources.cpu,
                    "memory": job_spec.resources.memory,
                    "max_restarts": 0,
                    "backoff_seconds": 10.0,
                    "attempt": 0,
                    "restarts": 0,
                    "cancel_requested": False,
                    "created_at": created,
                }
            )
            events.append(
                {
                    "job_id": jobs[-1]["id"],
                    "tenant_id": tenant_id,
                    "time": created,
                    "to_state": "QUEUED",
                    "reason": f"submitted by {user}",
                    "attempt": 0,
                }
            )
        s.execute(insert(JobRow), jobs)
        s.execute(insert(JobEventRow), events)


def live_attempts(env: Env, tenant: str | None = None) -> list[tuple[str, list[int], float]]:
    """(job name, GPUs, CPUs) of every attempt that holds resources."""
    with env.platform.db.read() as s:
        q = (
            select(JobRow.name, AttemptRow.gpus, AttemptRow.cpus)
            .join(JobRow, JobRow.id == AttemptRow.job_id)
            .join(TenantRow, TenantRow.id == AttemptRow.tenant_id)
            .where(AttemptRow.finished_at.is_(None))
        )
        if tenant is not None:
            q = q.where(TenantRow.name == tenant)
        return [(n, list(g), c) for n, g, c in s.execute(q)]


def running_names(env: Env) -> list[str]:
    """Names of the jobs the executor runs, in start order."""
    with env.platform.db.read() as s:
        names = {i: n for i, n in s.execute(select(JobRow.id, JobRow.name))}
    return [names[w.job_id] for w in executor(env).running().values()]


def finish(env: Env, *names: str, exit_code: int = 0) -> None:
    """End the running attempts of these jobs, then let the control loop see it."""
    ex = executor(env)
    with env.platform.db.read() as s:
        ids = set(s.scalars(select(JobRow.id).where(JobRow.name.in_(names))))
    ended = [h for h, w in ex.running().items() if w.job_id in ids]
    assert len(ended) == len(names), f"not all of {names} are running"
    for handle in ended:
        ex.finish(handle, exit_code)
    assert env.control is not None
    env.control.supervise()


def schedule_concurrently(env: Env, passes: int = 6) -> int:
    control = env.control
    assert control is not None
    with ThreadPoolExecutor(max_workers=passes) as pool:
        return sum(pool.map(lambda _: control.schedule(), range(passes)))


def assert_no_gpu_shared(env: Env) -> None:
    gpus = [g for _, gs, _ in live_attempts(env) for g in gs]
    assert len(gpus) == len(set(gpus)), f"a GPU is held twice: {gpus}"
    assert set(gpus) <= {0, 1}


# -- (a) the queue limit under concurrent submits ---------------------------------------------------------
def test_concurrent_submits_never_exceed_max_queued_jobs(env: Env) -> None:
    owner = env.new_tenant_user("burst", "alice", quota={"max_queued_jobs": 37})
    creds = owner.transport.creds

    def submit(i: int) -> str:
        c = env.client(creds)  # one SDK client per call, all sharing the in-process app
        try:
            c.jobs.submit(spec(f"job-{i}"))
            return "accepted"
        except QuotaExceeded as exc:
            assert exc.code == "quota_exceeded"
            assert "limit is 37" in exc.message
            return "refused"

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(submit, range(110)))
    assert outcomes.count("accepted") == 37
    assert outcomes.count("refused") == 73

    with env.platform.db.read() as s:
        tenant_id = s.scalar(select(TenantRow.id).where(TenantRow.name == "burst"))
        stored = s.scalar(select(func.count()).select_from(JobRow).where(JobRow.tenant_id == tenant_id))
    assert stored == 37
    assert len(owner.jobs.list(limit=1000)) == 37
    assert owner.accounting.quota().usage.queued_jobs == 37

    # on the wire it is an HTTP 429 with the error body of the contract
    body = json.dumps(spec("one-more")).encode()
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, "POST", "/api/v1/jobs", "", hashlib.sha256(body).hexdigest()
    ).headers
    resp = env.http.post("/api/v1/jobs", content=body, headers={**headers, "Content-Type": "application/json"})
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "quota_exceeded"
    assert resp.json()["error"]["details"] == {
        "resource": "max_queued_jobs",
        "limit": 37,
        "queued": 37,
        "source": "tenant quota",
    }


# -- (b) running quotas ---------------------------------------------------------------------------------
def test_running_quota_is_never_overcommitted(sim_env: Env) -> None:
    env = sim_env
    bob = env.new_tenant_user("capped", "bob", quota={"gpus": 1, "max_running_jobs": 2})
    # alternating GPU and CPU jobs: at most 1 GPU and 2 jobs may be live at any time
    names = [f"q{i}" for i in range(10)]
    for i, name in enumerate(names):
        bob.jobs.submit(spec(name, gpus=1 if i % 2 == 0 else 0))

    assert schedule_concurrently(env) == 2
    for _ in range(3):
        assert env.control is not None and env.control.schedule() == 0
    assert sorted(n for n, _, _ in live_attempts(env)) == ["q0", "q1"]

    quota = bob.accounting.quota()
    assert quota.limits.gpus == 1 and quota.limits.max_running_jobs == 2
    assert quota.usage.model_dump(mode="json") == {
        "gpus": 1,
        "cpus": 2.0,
        "memory": 2 * GiB,
        "running_jobs": 2,
        "queued_jobs": 8,
        "storage": 0,
    }

    waiting = bob.jobs.get("q3")
    assert waiting.state == "QUEUED"
    assert waiting.queue_position == 2  # behind q2
    assert waiting.wait_reason == "tenant quota: 2 of 2 running jobs in use"

    # another tenant's job is not held up by bob's quota
    env.admin.jobs.submit(spec("outsider", gpus=1))
    assert env.control.schedule() == 1
    assert "outsider" in running_names(env)
    finish(env, "outsider")

    done: list[str] = []
    while len(done) < len(names):
        live = [n for n, _, _ in live_attempts(env, "capped")]
        assert 1 <= len(live) <= 2
        finish(env, *live)
        done += live
        schedule_concurrently(env)
        env.control.schedule()
        held = live_attempts(env, "capped")
        assert len(held) <= 2, held
        assert sum(len(g) for _, g, _ in held) <= 1, held
        assert_no_gpu_shared(env)
        usage = bob.accounting.quota().usage
        assert usage.running_jobs == len(held)
        assert usage.gpus == sum(len(g) for _, g, _ in held)

    assert sorted(done) == sorted(names)  # every job ran exactly once
    assert {j.state for j in bob.jobs.list()} == {"SUCCEEDED"}
    assert all(len(bob.jobs.get(n).attempts) == 1 for n in names)


def test_gpu_quota_lets_cpu_jobs_pass(sim_env: Env) -> None:
    env = sim_env
    bob = env.new_tenant_user("gpu-capped", "bob", quota={"gpus": 1})
    for name, gpus in (("g1", 1), ("g2", 1), ("c1", 0), ("c2", 0)):
        bob.jobs.submit(spec(name, gpus=gpus))
    assert env.control is not None and env.control.schedule() == 3
    assert sorted(running_names(env)) == ["c1", "c2", "g1"]
    g2 = bob.jobs.get("g2")
    assert g2.queue_position == 1
    assert g2.wait_reason == "tenant quota: needs 1 GPU(s), 1 of 1 in use"
    finish(env, "g1")
    assert env.control.schedule() == 1
    assert bob.jobs.get("g2").wait_reason is None
    assert bob.accounting.quota().usage.gpus == 1


# -- (c) capacity and priority --------------------------------------------------------------------------
def test_big_job_waits_for_capacity_and_blocks_the_line(fifo_env: Env) -> None:
    env, c = fifo_env, fifo_env.admin
    control = env.control
    assert control is not None
    c.jobs.submit(spec("small-1", gpus=1))
    assert control.schedule() == 1

    c.jobs.submit(spec("big", gpus=2))
    c.jobs.submit(spec("small-2", gpus=1))
    assert schedule_concurrently(env) == 0
    big = c.jobs.get("big")
    assert big.state == "QUEUED" and big.queue_position == 1
    assert big.wait_reason == "waiting for capacity: needs 2 GPU(s), 1 free"
    # small-2 would fit on the free GPU but must not overtake the big job (no backfill)
    small2 = c.jobs.get("small-2")
    assert small2.state == "QUEUED" and small2.queue_position == 2
    assert small2.wait_reason == "waiting behind 1 earlier job(s) in the queue"

    finish(env, "small-1")
    assert control.schedule() == 1
    assert running_names(env) == ["big"]
    assert sorted(live_attempts(env)[0][1]) == [0, 1]
    assert c.jobs.get("small-2").wait_reason == "waiting for capacity: needs 1 GPU(s), 0 free"

    # a higher-priority job submitted later goes first
    c.jobs.submit(spec("urgent", gpus=1, priority=10))
    assert control.schedule() == 0
    assert c.jobs.get("urgent").queue_position == 1
    small2 = c.jobs.get("small-2")
    assert small2.queue_position == 2
    # behind a job that waits for capacity, small-2 has no reason of its own any more
    assert small2.wait_reason == "waiting behind 1 earlier job(s) in the queue"
    finish(env, "big")
    assert control.schedule() == 2
    assert running_names(env) == ["urgent", "small-2"]
    assert_no_gpu_shared(env)
    c.jobs.submit(spec("late", gpus=1, priority=10))
    assert control.schedule() == 0
    assert c.jobs.get("late").wait_reason == "waiting for capacity: needs 1 GPU(s), 0 free"


def test_priority_orders_the_queue(sim_env: Env) -> None:
    env, c = sim_env, sim_env.admin
    control = env.control
    assert control is not None
    c.jobs.submit(spec("hog", gpus=2))
    assert control.schedule() == 1
    for name, prio in (("p0-a", 0), ("p5", 5), ("p0-b", 0), ("p9", 9), ("neg", -3)):
        c.jobs.submit(spec(name, gpus=1, priority=prio))
    assert control.schedule() == 0
    assert [c.jobs.get(n).queue_position for n in ("p9", "p5", "p0-a", "p0-b", "neg")] == [1, 2, 3, 4, 5]
    finish(env, "hog")
    assert control.schedule() == 2
    assert running_names(env) == ["p9", "p5"]
    finish(env, "p9", "p5")
    assert control.schedule() == 2
    assert running_names(env) == ["p0-a", "p0-b"]


def test_the_scheduler_reads_a_long_queue_to_its_end(fifo_env: Env) -> None:
    """The queue is read in chunks as the planner walks it; jobs deep in it are planned like the first (fifo:
    the one policy that stops reading at a job that does not fit)."""
    env = fifo_env
    control = env.control
    assert control is not None
    hog = env.new_tenant_user("hog", "hugo", quota={"gpus": 1})
    hog.jobs.submit(spec("hog-0", gpus=1))
    assert control.schedule() == 1
    enqueue(env, "hog", "hugo", 1200, gpus=1)  # all over hog's GPU quota
    env.admin.jobs.submit(spec("after-the-hog", gpus=1))
    assert control.schedule() == 1
    assert running_names(env) == ["hog-0", "after-the-hog"]
    deep = hog.jobs.get("bulk-1100")
    assert deep.queue_position == 1101
    assert deep.wait_reason == "tenant quota: needs 1 GPU(s), 1 of 1 in use"

    # a job ahead of them all that cannot fit blocks the line: the reasons behind it no longer apply
    env.admin.jobs.submit(spec("urgent-big", gpus=2, priority=5))
    assert control.schedule() == 0
    assert env.admin.jobs.get("urgent-big").wait_reason == "waiting for capacity: needs 2 GPU(s), 0 free"
    deep = hog.jobs.get("bulk-1100")
    assert deep.queue_position == 1101  # hog's member counts hog's queue: the admin's job is another tenant's
    assert deep.wait_reason == "waiting behind 1100 earlier job(s) in the queue"
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobWaitRow)) == 1


# -- (d) usage accounting -------------------------------------------------------------------------------
def test_usage_reports_gpu_seconds_per_user(sim_env: Env) -> None:
    env = sim_env
    control = env.control
    assert control is not None
    clock = executor(env).clock
    assert isinstance(clock, ShiftedClock)
    alice = env.new_tenant_user("acct", "alice", role="tenant-admin")
    bob = env.new_tenant_user("acct", "bob")

    # attempts start at the real time of a pass and end at the clock's: each also counts the real time between
    # (``spent`` bounds it; exact lower bounds, upper bounds however slow the machine)
    began = time.monotonic()
    alice.jobs.submit(spec("a-big", gpus=2, cpu=2))
    assert control.schedule() == 1
    clock.offset = timedelta(seconds=100)  # the attempt ends 100 s after it started
    finish(env, "a-big")

    alice.jobs.submit(spec("a-small", gpus=1, cpu=1))
    bob.jobs.submit(spec("b-one", gpus=1, cpu=4))
    assert control.schedule() == 2
    clock.offset = timedelta(seconds=50)
    finish(env, "a-small")
    clock.offset = timedelta(seconds=30)
    finish(env, "b-one")
    spent = time.monotonic() - began + 1  # and the rounding of stored times

    window = {
        "since": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
        "until": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
    }
    rows = {r.user: r for r in alice.accounting.usage(**window).rows}
    assert set(rows) == {"alice", "bob"}
    a, b = rows["alice"], rows["bob"]
    assert (a.tenant, a.jobs, a.attempts) == ("acct", 2, 2)
    assert (b.tenant, b.jobs, b.attempts) == ("acct", 1, 1)
    # GPU-seconds = GPUs x held seconds: alice 2 x 100 + 1 x 50, bob 1 x 30 (plus real time spent in the test)
    assert 250 - 1 <= a.gpu_seconds <= 250 + 3 * spent
    assert 30 - 1 <= b.gpu_seconds <= 30 + spent
    assert 250 - 1 <= a.cpu_seconds <= 250 + 3 * spent
    assert 120 - 4 <= b.cpu_seconds <= 120 + 4 * spent
    assert a.gpu_seconds > b.gpu_seconds > 0
    assert b.cpu_seconds > b.gpu_seconds

    # a member sees only their own usage; the platform admin sees every tenant
    assert [r.user for r in bob.accounting.usage(**window).rows] == ["bob"]
    everyone = env.admin.accounting.usage(all_tenants=True, **window).rows
    assert {(r.tenant, r.user) for r in everyone} == {("acct", "alice"), ("acct", "bob")}
    # a window that ends before the attempts began counts nothing
    early = alice.accounting.usage(
        since=(datetime.now(UTC) - timedelta(hours=2)).isoformat(),
        until=(datetime.now(UTC) - timedelta(hours=1)).isoformat(),
    )
    assert early.rows == []


def test_usage_of_a_running_attempt_grows(sim_env: Env) -> None:
    env = sim_env
    assert env.control is not None
    c: Client = env.admin
    c.jobs.submit(spec("still-running", gpus=2))
    assert env.control.schedule() == 1
    first = c.accounting.usage().rows[0].gpu_seconds
    second = wait_until_more(c, first)
    assert second > first >= 0


def wait_until_more(c: Client, before: float) -> float:
    from tests.conftest import wait_for

    return wait_for(
        lambda: (v := c.accounting.usage().rows[0].gpu_seconds) > before and v,
        timeout=10,
        what="GPU-seconds of a running attempt to grow",
    )
