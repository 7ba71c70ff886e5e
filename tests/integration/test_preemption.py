"""Preemption for real, on the local executor with declared GPUs: a low-priority two-worker PyTorch DDP job that
checkpoints every step is preempted (SIGTERM, grace period, the whole gang), queued again in its place, resumed
from its checkpoint, and finishes with every step run exactly once; a tenant takes its lent GPUs back the same
way; quotas hold under concurrent submissions while preemptions happen. The job scripts import nothing of
dlcloud (``tests/distributed/scripts/preemptible_steps.py``)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from dlcloud.schemas.jobs import JobDetail
from dlcloud.settings import GpuSpec
from dlcloud.store.rows import AttemptRow
from tests.conftest import Env, wait_for
from tests.integration.test_distributed_training import _outputs, _platform, _upload_scripts, _wait_end

pytestmark = pytest.mark.distributed

STEPS = 24
H100 = "NVIDIA H100 80GB HBM3"
WORKER = {"cpu": 1, "memory": "1Gi", "gpus": 1}


def _ddp(name: str, code: str, **extra: object) -> dict:
    return {
        "name": name,
        "code": code,
        # the first attempt waits after 4 steps until it is preempted: the preemption never comes too late
        "command": f"python preemptible_steps.py --steps {STEPS} --step-sleep 0.25 --hold-first-attempt-after 4",
        "framework": "pytorch",
        "replicas": {"worker": 2},
        "resources": WORKER,
        **extra,
    }


def _steps(out: Path, rank: int) -> list[tuple[int, int]]:
    """(attempt, step) per line of a rank's step log."""
    rows = []
    for line in (out / f"steps-rank{rank}.log").read_text().splitlines():
        attempt, step = line.split()
        rows.append((int(attempt.removeprefix("attempt=")), int(step.removeprefix("step="))))
    return rows


def _steps_done(env: Env, job_id: str) -> int:
    found = list(env.settings.runs_dir.glob(f"*/{job_id}/outputs/steps-rank0.log"))
    return len(found[0].read_text().splitlines()) if found else 0


def _live(env: Env) -> list[list[int]]:
    with env.platform.db.read() as s:
        return [list(g) for (g,) in s.execute(select(AttemptRow.gpus).where(AttemptRow.finished_at.is_(None)))]


def _explain(c, name: str) -> str:
    job = c.jobs.get(name)
    events = "\n".join(f"  {e.from_state} -> {e.to_state}: {e.reason}" for e in job.events)
    return f"job {name}: {job.state} ({job.reason})\n{events}"


def _check_resumed_once(env: Env, c, name: str) -> JobDetail:
    """The preempted DDP job succeeded after one preemption: every step once, attempt 2 after attempt 1's last."""
    job = _wait_end(c, name, timeout=240)
    assert job.state == "SUCCEEDED", _explain(c, name)
    assert job.preemptions == 1 and job.restarts == 0, _explain(c, name)
    assert [a.outcome for a in job.attempts] == ["preempted", "succeeded"], _explain(c, name)
    moves = [(e.from_state, e.to_state) for e in job.events]
    assert ("RUNNING", "PREEMPTED") in moves and ("PREEMPTED", "QUEUED") in moves, moves
    reasons = [e.reason for e in job.events]
    assert any(r.startswith("resumed after preemption 1: attempt 2") for r in reasons), reasons
    out = _outputs(env, job)
    for rank in (0, 1):
        log = _steps(out, rank)
        steps = [s for _, s in log]
        assert sorted(steps) == list(range(STEPS)), log  # every step, none twice
        assert steps == sorted(steps), log  # in order across the attempts
        first = [s for a, s in log if a == 1]
        second = [s for a, s in log if a == 2]
        assert first and second, log  # it was really stopped midway and resumed
        assert second[0] == first[-1] + 1, log  # resumed right after its last saved step
    import json

    results = [json.loads((out / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["steps"] for r in results] == [STEPS, STEPS]
    assert {r["attempt"] for r in results} == {2} and results[0]["start_step"] > 0
    return job


def test_higher_priority_job_preempts_a_ddp_gang_which_resumes_from_its_checkpoint(tmp_path, db_url):
    gpus = [GpuSpec(index=i, name=H100) for i in range(2)]
    with _platform(tmp_path, db_url, gpu_inventory=gpus, stop_grace_seconds=20.0) as env:
        c = env.admin
        code = _upload_scripts(c)
        low = c.jobs.submit(_ddp("low", code, priority_class="low"))
        wait_for(lambda: _steps_done(env, low.id) >= 3, timeout=120, what="the low job to train a few steps")
        c.jobs.submit({"name": "urgent", "command": "sleep 1", "priority_class": "high", "resources": {"gpus": 1}})

        preempting = wait_for(
            lambda: (j := c.jobs.get("low")).preempt_requested and j, timeout=30, what="the preemption"
        )
        assert preempting.preempt_reason.startswith("preempted by urgent (priority)"), preempting
        urgent = _wait_end(c, "urgent", timeout=120)
        assert urgent.state == "SUCCEEDED", _explain(c, "urgent")
        assert urgent.preemptions == 0
        job = _check_resumed_once(env, c, "low")
        # the urgent job ran while the low one was out: between the two attempts
        first, second = job.attempts
        assert first.finished_at <= urgent.attempts[0].started_at <= second.started_at
        assert any("stopping job low" in e.reason for e in urgent.events), urgent.events


def test_a_tenant_reclaims_its_lent_gpus_by_preemption(tmp_path, db_url):
    gpus = [GpuSpec(index=i, name=H100) for i in range(2)]
    # lent at once again: the owner's one-second job would otherwise keep its GPU free for the owner's return for
    # scheduling_lend_after_seconds, and the borrower's 2-GPU job resume only then (test_scheduling_pass.py)
    with _platform(
        tmp_path, db_url, gpu_inventory=gpus, stop_grace_seconds=20.0, scheduling_lend_after_seconds=0
    ) as env:
        admin = env.admin
        owner = env.new_tenant_user("owner", "olga", quota={"gpus": 2})
        admin.tenants.update("owner", scheduling={"guarantee": {"gpus": 2, "cpus": 4, "memory": "8Gi"}})
        borrower = env.new_tenant_user("borrower", "bert", quota={"gpus": 2})
        admin.tenants.update("borrower", scheduling={"guarantee": {"cpus": 1}})  # no GPUs of its own
        code = _upload_scripts(borrower)
        lent = borrower.jobs.submit(_ddp("lent", code))
        wait_for(lambda: _steps_done(env, lent.id) >= 3, timeout=120, what="the borrower to train a few steps")
        events = [e.reason for e in borrower.jobs.get("lent").events]
        assert any(r.startswith("borrowing idle capacity") for r in events), events

        owner.jobs.submit({"name": "mine", "command": "sleep 1", "resources": {"gpus": 1}})
        preempting = wait_for(
            lambda: (j := borrower.jobs.get("lent")).preempt_requested and j, timeout=30, what="the reclaim"
        )
        # another tenant's job: neither tenant learns the other's job names (docs/isolation.md)
        assert preempting.preempt_reason.startswith("preempted by a job of another tenant (reclaim)"), preempting
        mine = _wait_end(owner, "mine", timeout=120)
        assert mine.state == "SUCCEEDED", _explain(owner, "mine")
        reclaim = "reclaiming its tenant's guarantee: stopping a job of another tenant to make room"
        assert any(reclaim == e.reason for e in mine.events), mine.events
        _check_resumed_once(env, borrower, "lent")


def test_quotas_hold_under_concurrent_submissions_with_preemption(tmp_path, db_url):
    """Two tenants of 2 GPUs each (guarantee 1) on 3 GPUs submit at once from several threads, priorities
    mixed so that running jobs get preempted; a watcher reads the live attempts all along: no tenant ever holds
    more than its quota, no GPU is held twice, and every job ends SUCCEEDED."""
    gpus = [GpuSpec(index=i, name=H100) for i in range(3)]
    with _platform(tmp_path, db_url, gpu_inventory=gpus, stop_grace_seconds=2.0) as env:
        clients = {}
        for tenant in ("ta", "tb"):
            clients[tenant] = env.new_tenant_user(tenant, f"{tenant}-user", quota={"gpus": 2})
            env.admin.tenants.update(tenant, scheduling={"guarantee": {"gpus": 1, "cpus": 2, "memory": "4Gi"}})
        tenant_ids = {t.name: t.id for t in env.admin.tenants.list()}
        violations: list[str] = []
        samples = [0]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                with env.platform.db.read() as s:
                    live = s.execute(
                        select(AttemptRow.tenant_id, AttemptRow.gpus).where(AttemptRow.finished_at.is_(None))
                    ).all()
                held = Counter(g for _, gs in live for g in gs)
                per_tenant = Counter()
                for t, gs in live:
                    per_tenant[t] += len(gs)
                if any(n > 1 for n in held.values()):
                    violations.append(f"a GPU held twice: {live}")
                for name in ("ta", "tb"):
                    if per_tenant[tenant_ids[name]] > 2:
                        violations.append(f"{name} over its quota: {live}")
                samples[0] += 1
                done.wait(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        names: list[tuple[str, str]] = []
        lock = threading.Lock()
        # low-priority jobs that hold the 3 GPUs until preempted (their second attempt ends at once)
        long_low = '[ "$DLCLOUD_ATTEMPT" -gt 1 ] || sleep 20'
        for tenant in ("ta", "tb"):
            for i in range(2):
                spec = {"name": f"{tenant}-hold-{i}", "command": long_low, "priority_class": "low"}
                clients[tenant].jobs.submit({**spec, "resources": {"gpus": 1, "cpu": 0.5, "memory": "256Mi"}})
                names.append((tenant, spec["name"]))
        wait_for(lambda: sum(len(a) for a in _live(env)) == 3, timeout=60, what="the low-priority jobs to hold 3 GPUs")

        def submit(tenant: str, k: int) -> None:
            for i in range(3):
                name = f"{tenant}-{k}-{i}"
                spec = {
                    "name": name,
                    "command": "sleep 0.4",
                    "resources": {"gpus": 1, "cpu": 0.5, "memory": "256Mi"},
                    "priority_class": "high" if i % 2 == 0 else "normal",
                }
                clients[tenant].jobs.submit(spec)
                with lock:
                    names.append((tenant, name))

        threads = [threading.Thread(target=submit, args=(t, k)) for t in ("ta", "tb") for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            ended = [_wait_end(clients[t], n, timeout=240) for t, n in names]
        finally:
            done.set()
            watcher.join(timeout=10)
        assert not violations, violations[:5]
        assert samples[0] > 10
        assert {j.state for j in ended} == {"SUCCEEDED"}, [(j.name, j.state, j.reason) for j in ended]
        assert len(ended) == 4 + 18
        held = [j for j in ended if "-hold-" in j.name]
        assert sum(j.preemptions for j in held) >= 1, held  # preemption was in play
        assert all(j.restarts == 0 for j in ended)
