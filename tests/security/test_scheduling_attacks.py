"""Attacks on fair, preemptive scheduling by a member of one tenant against another: what the scheduler writes
into the attacker's own jobs (wait reasons, estimated starts, preemption events), the queue and describe, and
``/metrics`` must never name another tenant, its jobs or its users (docs/isolation.md, "Scheduling"); a member
cannot raise its priority, change scheduling terms or preempt another tenant's job without being owed capacity;
bad numbers (NaN durations, ``true`` for a priority) are refused with nothing created.

The scheduling pass runs in-process (``control.scheduling.run()``: it records attempts and starts nothing), on
SQLite and PostgreSQL, with members' signed requests.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator

import pytest
from pydantic import SecretStr
from sqlalchemy import func, insert, select
from starlette.testclient import TestClient
from typer.testing import CliRunner

from dlcloud.api.app import create_app
from dlcloud.cli import admin as cli_admin
from dlcloud.cli.main import app as cli_app
from dlcloud.client import Credentials
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.settings import GpuSpec
from dlcloud.store.ids import new_id
from dlcloud.store.rows import JobRow, utcnow
from tests.conftest import Env, assert_api_error, build_env, make_settings

H100 = "NVIDIA H100 80GB HBM3"
ONE_GPU = {"gpus": 1, "cpu": 1, "memory": "1Gi"}
TWO_GPUS = {"gpus": 2, "cpu": 1, "memory": "1Gi"}


@pytest.fixture
def make_env(tmp_path, db_url) -> Iterator:
    """``make_env(policy, gpus=2, **settings)``: the in-process API with a control loop that is driven by hand."""
    made: list[Env] = []

    def make(policy: str = "fair-share", n_gpus: int = 2, **overrides: object) -> Env:
        gpus = [GpuSpec(index=i, name=H100) for i in range(n_gpus)]
        settings = make_settings(tmp_path, db_url, gpu_inventory=gpus, scheduling_policy=policy, **overrides)
        e = build_env(settings, LocalExecutor())
        e.http.__enter__()
        made.append(e)
        return e

    yield make
    for e in made:
        e.http.__exit__(None, None, None)
        e.platform.db.dispose()


def _member(env: Env, tenant: str, user: str, role: str = "member", quota: dict | None = None) -> Credentials:
    if tenant not in {t.name for t in env.admin.tenants.list()}:
        env.admin.tenants.create(tenant, quota or {})
    env.admin.users.create(user, tenant=tenant, role=role)
    key = env.admin.keys.create(user=user, tenant=tenant)
    return Credentials("http://testserver", key.access_key, key.secret_key)


def _submit(env: Env, creds: Credentials, name: str, **spec: object) -> dict:
    resp = env.signed(creds, "POST", "/api/v1/jobs", {"name": name, "command": "sleep 600", **spec})
    assert resp.status_code == 201, resp.text
    return resp.json()


def _get(env: Env, creds: Credentials, path: str, query: str = ""):
    resp = env.signed(creds, "GET", path, query=query)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _pass(env: Env) -> None:
    assert env.control is not None
    env.control.scheduling.run()  # records attempts, starts no process


def _seen_by(env: Env, creds: Credentials, jobs: list[str]) -> str:
    """Everything the member can read about its ``jobs``: describe (reasons, events, preemption) and the queue."""
    texts = [json.dumps(_get(env, creds, f"/api/v1/jobs/{j}")) for j in jobs]
    texts.append(json.dumps(_get(env, creds, "/api/v1/queue")))
    return "\n".join(texts)


def _secrets_of(env: Env, tenant: str, user: str, jobs: list[dict]) -> list[str]:
    """What identifies another tenant: its name and id, its user, its jobs' names and ids."""
    tid = next(t.id for t in env.admin.tenants.list() if t.name == tenant)
    return [tenant, tid, user, *(j["name"] for j in jobs), *(j["id"] for j in jobs)]


def _assert_none_in(text: str, secrets: list[str]) -> None:
    for s in secrets:
        assert not re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text), f"{s!r} leaked into: {text}"


def test_wait_behind_another_tenants_reserved_job_does_not_name_it(make_env):
    env = make_env("priority-backfill")
    mallory = _member(env, "mallory-lab", "mallory")
    victim = _member(env, "victim-lab", "vera")
    hold = _submit(env, victim, "vera-secret-hold", resources=TWO_GPUS, max_run_time="1h")
    _pass(env)
    big = _submit(env, victim, "vera-secret-big", resources=TWO_GPUS)
    mine = _submit(env, mallory, "probe", resources=ONE_GPU)
    also = _submit(env, victim, "vera-secret-next", resources=ONE_GPU)
    _pass(env)

    seen = _seen_by(env, mallory, ["probe"])
    _assert_none_in(seen, _secrets_of(env, "victim-lab", "vera", [hold, big, also]))
    reason = _get(env, mallory, "/api/v1/jobs/probe")["wait_reason"]
    assert reason.startswith("waiting behind a job of another tenant (reserved, estimated start "), reason
    # the same text names the reserved job to its own tenant
    theirs = _get(env, victim, "/api/v1/jobs/vera-secret-next")["wait_reason"]
    assert theirs.startswith("waiting behind job vera-secret-big (reserved"), theirs
    assert mine["id"] not in theirs and "mallory" not in theirs


def test_fair_share_position_counts_other_tenants_without_naming_them(make_env):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory")
    others = [(_member(env, f"other-{i}", f"user-{i}"), f"other-{i}", f"user-{i}") for i in range(2)]
    _submit(env, mallory, "hog", resources=TWO_GPUS)
    _pass(env)
    theirs = [(t, u, _submit(env, c, f"secret-{t}", resources=ONE_GPU)) for c, t, u in others]
    _submit(env, mallory, "probe", resources=ONE_GPU)
    _pass(env)

    seen = _seen_by(env, mallory, ["hog", "probe"])
    for t, u, job in theirs:
        _assert_none_in(seen, _secrets_of(env, t, u, [job]))
    reason = _get(env, mallory, "/api/v1/jobs/probe")["wait_reason"]
    # its own share, and that two tenants come first: never which
    assert "fair share: tenant mallory-lab uses 100% (dominant: GPUs), behind 2 other tenants" in reason, reason


def test_reclaim_names_neither_the_victim_nor_the_preemptor_across_tenants(make_env):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory", quota={"gpus": 2})
    env.admin.tenants.update("mallory-lab", scheduling={"guarantee": {"gpus": 2}})
    victim = _member(env, "victim-lab", "vera")
    lent = _submit(env, victim, "vera-secret-borrowed", resources=TWO_GPUS)
    _pass(env)
    _submit(env, mallory, "probe", resources=ONE_GPU)
    _pass(env)

    # the victim learns it was preempted for a reclaim, not by whom
    got = _get(env, victim, "/api/v1/jobs/vera-secret-borrowed")
    assert got["preempt_requested"] is True
    assert got["preempt_reason"] == "preempted by a job of another tenant (reclaim): its tenant reclaims its guarantee"
    _assert_none_in(_seen_by(env, victim, ["vera-secret-borrowed"]), ["probe", "mallory-lab", "mallory"])
    # the preemptor learns it stops a job of another tenant, not which
    seen = _seen_by(env, mallory, ["probe"])
    _assert_none_in(seen, _secrets_of(env, "victim-lab", "vera", [lent]))
    events = [e["reason"] for e in _get(env, mallory, "/api/v1/jobs/probe")["events"]]
    assert "reclaiming its tenant's guarantee: stopping a job of another tenant to make room" in events, events


def test_catching_up_names_neither_the_victims_nor_the_preemptor_across_tenants(make_env):
    # mallory's tenant is guaranteed 1 GPU and asks for 2; vera's tenant (no guarantee) borrows all 8: mallory's
    # job takes two of vera's jobs (reason "share": vera's tenant keeps 6 of 8, more than mallory's 2)
    env = make_env("fair-share", n_gpus=8, cpu_capacity=64, memory_capacity_bytes=64 * 1024**3)
    mallory = _member(env, "mallory-lab", "mallory", quota={"gpus": 2})
    env.admin.tenants.update("mallory-lab", scheduling={"guarantee": {"gpus": 1}})
    victim = _member(env, "victim-lab", "vera")
    lent = [_submit(env, victim, f"vera-secret-{i}", resources=ONE_GPU) for i in range(8)]
    _pass(env)
    _submit(env, mallory, "probe", resources=TWO_GPUS)
    _pass(env)

    stopped = [j for j in lent if _get(env, victim, f"/api/v1/jobs/{j['name']}")["preempt_requested"]]
    assert len(stopped) == 2
    for j in stopped:
        got = _get(env, victim, f"/api/v1/jobs/{j['name']}")
        assert got["preempt_reason"] == (
            "preempted by a job of another tenant (share): its tenant, short of its guarantee, holds a smaller "
            "share than this job's tenant"
        )
    _assert_none_in(_seen_by(env, victim, [j["name"] for j in lent]), ["probe", "mallory-lab", "mallory"])
    seen = _seen_by(env, mallory, ["probe"])
    _assert_none_in(seen, _secrets_of(env, "victim-lab", "vera", lent))
    events = [e["reason"] for e in _get(env, mallory, "/api/v1/jobs/probe")["events"]]
    assert "preemption (share): stopping a job of another tenant to make room" in events, events


def test_priority_preemption_stays_inside_the_tenant_and_names_its_own_jobs(make_env):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory")
    victim = _member(env, "victim-lab", "vera")
    mine_low = _submit(env, mallory, "mine-low", resources=ONE_GPU, priority=-1000)
    theirs = _submit(env, victim, "vera-low", resources=ONE_GPU, priority=-1000)
    _pass(env)
    # the highest priority there is, many times: only its own tenant's job is preempted
    for i in range(3):
        _submit(env, mallory, f"urgent-{i}", resources=ONE_GPU, priority=1000)
    _pass(env)
    _pass(env)
    assert _get(env, victim, "/api/v1/jobs/vera-low")["preempt_requested"] is False
    mine = _get(env, mallory, "/api/v1/jobs/mine-low")
    assert mine["preempt_requested"] is True
    assert mine["preempt_reason"].startswith("preempted by urgent-0 (priority)"), mine["preempt_reason"]
    assert mine_low["id"] not in mine["preempt_reason"]
    _assert_none_in(_seen_by(env, mallory, ["mine-low", "urgent-0"]), _secrets_of(env, "victim-lab", "vera", [theirs]))


def test_describe_position_does_not_count_another_tenants_queue(make_env):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory")
    victim = _member(env, "victim-lab", "vera")
    for i in range(5):
        _submit(env, victim, f"vera-{i}", priority=1000)
    _submit(env, mallory, "probe")
    got = _get(env, mallory, "/api/v1/jobs/probe")
    assert got["queue_position"] == 1, got
    assert got["wait_reason"] == "waiting for the scheduler", got
    assert [e["position"] for e in _get(env, mallory, "/api/v1/queue")] == [1]
    # the platform admin still sees the whole queue's order
    assert [e.name for e in env.admin.jobs.queue()] == [f"vera-{i}" for i in range(5)] + ["probe"]


def test_open_metrics_show_no_tenant_and_per_tenant_metrics_need_the_scrape_token(make_env):
    env = make_env("fair-share")
    victim = _member(env, "victim-lab", "vera")
    _submit(env, victim, "vera-1")
    text = env.http.get("/metrics").text
    assert "victim-lab" not in text and "tenant=" not in text, text
    assert "dlcloud_queue_length 1.0" in text and "dlcloud_gpus_total 2.0" in text, text

    token = "scrape-" + "x" * 24
    settings = env.settings.model_copy(update={"metrics_scrape_token": SecretStr(token)})
    guarded = TestClient(create_app(dataclasses.replace(env.platform, settings=settings)))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}):
        resp = guarded.get("/metrics", headers=headers)
        assert_api_error(resp, 401, "unauthenticated", "scrape token")
    # a member's signed request is no scrape token either
    signed = env.signed(victim, "GET", "/metrics").request.headers
    assert guarded.get("/metrics", headers=dict(signed)).status_code == 401
    ok = guarded.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    assert 'dlcloud_queue_length{tenant="victim-lab"} 1.0' in ok.text, ok.text


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_run_time": float("nan")}, "max_run_time"),
        ({"timeout": float("nan")}, "timeout"),
        ({"grace_period": float("nan")}, "grace_period"),
        ({"post_timeout": float("nan")}, "post_timeout"),
        ({"max_run_time": float("inf")}, "max_run_time"),
        ({"max_run_time": -5}, "max_run_time"),
        ({"priority": True}, "priority"),
        ({"priority": "1000"}, "priority"),
        ({"priority": 10**30}, "priority"),
        ({"priority": 5, "priority_class": "high"}, "not both"),
        ({"priority_class": "x" * 64}, "priority_class"),
        ({"preemptible": "maybe"}, "preemptible"),
    ],
)
def test_bad_scheduling_fields_are_refused_and_nothing_is_created(make_env, extra, field):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory")
    resp = env.signed(mallory, "POST", "/api/v1/jobs", {"name": "bad", "command": "true", **extra})
    assert_api_error(resp, 422, "validation_error", field)
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 0


def test_priority_outside_the_range_by_class_or_number_is_refused(make_env):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory")
    env.admin.tenants.update("mallory-lab", scheduling={"priority_min": -10, "priority_max": 10})
    for extra in ({"priority": 11}, {"priority_class": "high"}, {"priority": -11}, {"priority_class": "low"}):
        resp = env.signed(mallory, "POST", "/api/v1/jobs", {"name": "up", "command": "true", **extra})
        assert_api_error(resp, 400, "priority_not_allowed", "may only use priorities -10..10")
    # a non-preemptible job beyond the guarantee (none) is refused too
    resp = env.signed(mallory, "POST", "/api/v1/jobs", {"name": "np", "command": "true", "preemptible": False})
    assert_api_error(resp, 400, "invalid_spec", "non-preemptible")
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 0


def test_members_and_tenant_admins_cannot_change_scheduling_terms(make_env):
    env = make_env("fair-share")
    before = env.admin.tenants.get("default").scheduling
    for role in ("member", "tenant-admin"):
        creds = _member(env, "mallory-lab", f"mallory-{role}", role=role)
        for target in ("mallory-lab", "default"):
            body = {"scheduling": {"weight": 1000, "guarantee": {"gpus": 2}, "priority_max": 1000}}
            resp = env.signed(creds, "PATCH", f"/api/v1/tenants/{target}", body)
            assert resp.status_code in (403, 404), resp.text
            assert resp.json()["error"]["code"] in ("permission_denied", "not_found")
    assert env.admin.tenants.get("default").scheduling == before
    assert env.admin.tenants.get("mallory-lab").scheduling.weight == 1.0


def test_bad_terms_through_the_cli_change_nothing(make_env, monkeypatch):
    env = make_env("fair-share")
    env.admin.tenants.create("t1", {"gpus": 2})
    before = env.admin.tenants.get("t1").scheduling
    monkeypatch.setattr(cli_admin, "client", lambda ctx: env.admin)
    for args in (
        ["--priority-range", "1:2:3"],
        ["--priority-range", ":"],
        ["--priority-range", "a:b"],
        ["--priority-range", "5:-5"],
        ["--priority-range=-5000:5"],
        ["--weight", "nan"],
        ["--weight", "inf"],
        ["--weight", "-1"],
        ["--guarantee-cpus", "nan"],
        ["--guarantee-gpus", "3"],
    ):
        res = CliRunner().invoke(cli_app, ["tenants", "update", "t1", *args], env={"COLUMNS": "250"})
        assert res.exit_code != 0, (args, res.output)
    assert env.admin.tenants.get("t1").scheduling == before


def test_a_queue_of_ten_thousand_jobs_is_bounded_and_shows_only_the_callers(make_env):
    env = make_env("fair-share")
    mallory = _member(env, "mallory-lab", "mallory")
    victim = _member(env, "victim-lab", "vera")
    template = _submit(env, victim, "vera-0")
    with env.platform.db.write() as s:
        row = s.get(JobRow, template["id"])
        assert row is not None
        base = {c.name: getattr(row, c.key) for c in JobRow.__table__.columns}
        now = utcnow()
        copies = [{**base, "id": new_id("j-"), "name": f"vera-{i}", "created_at": now} for i in range(1, 10_000)]
        for lo in range(0, len(copies), 2000):
            s.execute(insert(JobRow.__table__), copies[lo : lo + 2000])
    _submit(env, mallory, "probe")
    mine = _get(env, mallory, "/api/v1/queue", "limit=10000")
    assert [(e["position"], e["name"]) for e in mine] == [(1, "probe")]
    assert len(_get(env, victim, "/api/v1/queue")) == 1000  # the default limit
    assert len(_get(env, victim, "/api/v1/queue", "limit=10000")) == 10_000
    assert_api_error(env.signed(victim, "GET", "/api/v1/queue", query="limit=10001"), 422, "validation_error")
    assert_api_error(env.signed(victim, "GET", "/api/v1/queue", query="limit=0"), 422, "validation_error")
    # a pass over it writes reasons that name nothing of the other tenant into the probe
    _pass(env)
    _assert_none_in(_seen_by(env, mallory, ["probe"]), ["victim-lab", "vera", "vera-0", template["id"]])
