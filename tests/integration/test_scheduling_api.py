"""Fair-scheduling settings through the API and the CLI: tenant guarantees, borrowing limits, weights and
priority ranges (platform admin only, guarantee within the quota), job priority classes and ranges, the queue
as each caller may see it, and what describe shows."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dlcloud.cli import admin as cli_admin
from dlcloud.cli import jobs as cli_jobs
from dlcloud.cli.main import app
from dlcloud.errors import DlcloudError, PermissionDenied, PriorityNotAllowed
from tests.conftest import assert_api_error


def _cli(monkeypatch: pytest.MonkeyPatch, client, *args: str):
    """The real CLI command, its SDK calls going to the in-process API as ``client``."""
    for module in (cli_admin, cli_jobs):
        monkeypatch.setattr(module, "client", lambda ctx: client)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def _cli_error(res) -> str:
    """The error a failed command raised (``dlcloud``'s main prints it as 'error (code): message')."""
    assert res.exit_code != 0
    assert isinstance(res.exception, DlcloudError), res.output
    return f"error ({res.exception.code}): {res.exception.message}"


def test_admin_sets_scheduling_terms_and_reads_them_back(env, monkeypatch):
    env.admin.tenants.create("vision", {"gpus": 8, "cpus": 64, "memory": "256Gi"})
    res = _cli(
        monkeypatch,
        env.admin,
        "tenants",
        "update",
        "vision",
        "--guarantee-gpus",
        "4",
        "--guarantee-cpus",
        "16",
        "--guarantee-memory",
        "64Gi",
        "--borrow-gpus",
        "4",
        "--weight",
        "2",
        "--priority-range",
        "-100:100",
        "-o",
        "json",
    )
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)["scheduling"]
    assert shown == {
        "guarantee": {"gpus": 4, "cpus": 16.0, "memory": 64 * 1024**3},
        "borrow_limit": {"gpus": 4, "cpus": None, "memory": None},
        "weight": 2.0,
        "priority_min": -100,
        "priority_max": 100,
    }
    # what is not given stays; 'unlimited' clears a borrowing limit
    res = _cli(monkeypatch, env.admin, "tenants", "update", "vision", "--borrow-gpus", "unlimited", "-o", "json")
    assert res.exit_code == 0, res.output
    again = env.admin.tenants.get("vision").scheduling
    assert again.model_dump(mode="json") == {**shown, "borrow_limit": {"gpus": None, "cpus": None, "memory": None}}
    # the table form names the terms
    res = _cli(monkeypatch, env.admin, "tenants", "update", "vision", "--weight", "3")
    assert res.exit_code == 0, res.output
    assert "Guarantee" in res.output and "4 GPU" in res.output and "-100..100" in res.output


def test_guarantee_above_the_quota_is_refused(env):
    env.admin.tenants.create("small", {"gpus": 2, "memory": "8Gi"})
    body = {"scheduling": {"guarantee": {"gpus": 3}}}
    err = assert_api_error(env.signed(env.admin_creds, "PATCH", "/api/v1/tenants/small", body), 400, "invalid_argument")
    assert "guarantee of 3 gpus is above its quota of 2" in err["message"], err
    body = {"scheduling": {"guarantee": {"memory": "16Gi"}}}
    err = assert_api_error(env.signed(env.admin_creds, "PATCH", "/api/v1/tenants/small", body), 400, "invalid_argument")
    assert "memory" in err["message"] and "8Gi" in err["message"], err
    # nor may a quota drop below a guarantee already given
    env.admin.tenants.update("small", scheduling={"guarantee": {"gpus": 2}})
    with pytest.raises(DlcloudError, match="above its quota of 1"):
        env.admin.tenants.set_quota("small", {"gpus": 1})
    assert env.admin.tenants.get("small").quota.gpus == 2


def test_bad_priority_range_and_weight_are_refused(env, monkeypatch):
    env.admin.tenants.create("t1")
    for sched, field in (
        ({"priority_min": 10, "priority_max": -10}, "priority_min (10) must not be above priority_max (-10)"),
        ({"priority_min": -2000}, "scheduling.priority_min"),
        ({"weight": 0}, "scheduling.weight"),
        ({"borrow_limit": {"gpus": -1}}, "scheduling.borrow_limit.gpus"),
    ):
        resp = env.signed(env.admin_creds, "PATCH", "/api/v1/tenants/t1", {"scheduling": sched})
        assert_api_error(resp, 422, "validation_error", field)
    res = _cli(monkeypatch, env.admin, "tenants", "update", "t1", "--priority-range", "5")
    assert "--priority-range must be MIN:MAX" in _cli_error(res)


def test_a_member_or_tenant_admin_cannot_update_scheduling_terms(env):
    member = env.new_tenant_user("team", "alice", role="member")
    tadmin = env.new_tenant_user("team", "bob", role="tenant-admin")
    for c in (member, tadmin):
        with pytest.raises(PermissionDenied, match="platform-admin"):
            c.tenants.update("team", scheduling={"guarantee": {"gpus": 1}})
    assert env.admin.tenants.get("team").scheduling.guarantee.gpus == 0


def test_job_priority_must_be_inside_the_tenant_range(env):
    c = env.new_tenant_user("lab", "carol")
    env.admin.tenants.update("lab", scheduling={"priority_min": -50, "priority_max": 50})
    job = c.jobs.submit({"name": "plain", "command": "true"})
    assert job.priority == 0 and job.priority_class == "normal"
    job = c.jobs.submit({"name": "own", "command": "true", "priority": 50})
    assert job.priority == 50 and job.priority_class is None
    with pytest.raises(PriorityNotAllowed, match=r"priority_class 'high' has priority 100.*-50\.\.50"):
        c.jobs.submit({"name": "high", "command": "true", "priority_class": "high"})
    body = {"name": "big", "command": "true", "priority": 51}
    with pytest.raises(PriorityNotAllowed, match="priority 51, but tenant 'lab' may only use priorities -50..50"):
        c.jobs.submit(body)
    with pytest.raises(PriorityNotAllowed, match="unknown priority_class 'urgent'; the classes are: low"):
        c.jobs.submit({"name": "u", "command": "true", "priority_class": "urgent"})
    with pytest.raises(DlcloudError, match="not both"):
        c.jobs.submit({"name": "both", "command": "true", "priority": 1, "priority_class": "low"})


def test_priority_not_allowed_is_a_400_with_its_code(env):
    env.admin.tenants.update("default", scheduling={"priority_min": 0, "priority_max": 10})
    resp = env.signed(env.admin_creds, "POST", "/api/v1/jobs", {"name": "low", "command": "true", "priority": -5})
    err = assert_api_error(resp, 400, "priority_not_allowed", "may only use priorities 0..10")
    assert err["details"] == {"priority": -5, "min": 0, "max": 10}


def test_non_preemptible_job_must_fit_its_guarantee(env):
    c = env.new_tenant_user("np", "dave", quota={"gpus": 2})
    with pytest.raises(DlcloudError, match="non-preemptible job runs only inside its tenant's guarantee"):
        c.jobs.submit({"name": "np", "command": "true", "preemptible": False, "resources": {"gpus": 1}})
    env.admin.tenants.update("np", scheduling={"guarantee": {"gpus": 1, "cpus": 2, "memory": "4Gi"}})
    job = c.jobs.submit({"name": "np", "command": "true", "preemptible": False, "resources": {"gpus": 1}})
    assert job.preemptible is False


def test_queue_shows_each_caller_what_it_may_see(env, monkeypatch):
    alice = env.new_tenant_user("a-team", "alice")
    bob = env.new_tenant_user("b-team", "bob")
    alice.jobs.submit({"name": "a1", "command": "true", "priority_class": "low", "max_run_time": "1h"})
    bob.jobs.submit({"name": "b1", "command": "true", "priority_class": "high"})
    alice.jobs.submit({"name": "a2", "command": "true"})

    everything = env.admin.jobs.queue()
    assert [(e.position, e.tenant, e.name) for e in everything] == [
        (1, "b-team", "b1"),
        (2, "a-team", "a2"),
        (3, "a-team", "a1"),
    ]
    assert everything[0].priority == 100 and everything[0].priority_class == "high"
    assert everything[1].wait_reason == "waiting behind 1 earlier job(s) in the queue"
    assert all(e.wait_seconds >= 0 and e.preemptions == 0 for e in everything)
    assert [e.name for e in alice.jobs.queue()] == ["a2", "a1"]
    assert [e.name for e in bob.jobs.queue()] == ["b1"]

    res = _cli(monkeypatch, alice, "queue", "-o", "json")
    assert res.exit_code == 0, res.output
    assert [e["name"] for e in json.loads(res.output)] == ["a2", "a1"]
    res = _cli(monkeypatch, env.admin, "queue")
    assert res.exit_code == 0, res.output
    for text in ("b-team", "a-team", "b1", "100 (high)", "-100 (low)"):
        assert text in res.output, res.output

    detail = alice.jobs.get("a1")
    assert detail.max_run_time == 3600 and detail.preemptible is True
    assert detail.preemptions == 0 and detail.preempt_requested is False
    # among its tenant's waiting jobs (a2, a1): bob's queue is not alice's to count
    assert detail.queue_position == 2


def test_submit_flags_reach_the_spec(env, monkeypatch):
    res = _cli(
        monkeypatch,
        env.admin,
        "jobs",
        "submit",
        "--name",
        "flags",
        "--command",
        "true",
        "--priority-class",
        "high",
        "--non-preemptible",
        "--max-run-time",
        "30m",
        "-o",
        "json",
    )
    # the default tenant has no guarantee: a non-preemptible job is refused, with the reason
    assert "error (invalid_spec): a non-preemptible job runs only inside its tenant's guarantee" in _cli_error(res)
    res = _cli(
        monkeypatch,
        env.admin,
        "jobs",
        "submit",
        "--name",
        "flags",
        "--command",
        "true",
        "--priority-class",
        "high",
        "--max-run-time",
        "30m",
        "-o",
        "json",
    )
    assert res.exit_code == 0, res.output
    job = env.admin.jobs.get("flags")
    assert job.priority == 100 and job.priority_class == "high"
    assert job.spec["max_run_time"] == 1800 and job.max_run_time == 1800
    res = _cli(monkeypatch, env.admin, "jobs", "describe", "flags")
    assert res.exit_code == 0, res.output
    assert "100 (high)" in res.output and "preemptions 0" in res.output and "Estimated start" in res.output


def test_metrics_show_the_queue_preemptions_and_gpus(env):
    alice = env.new_tenant_user("m-team", "mia")
    alice.jobs.submit({"name": "w1", "command": "true"})
    alice.jobs.submit({"name": "w2", "command": "true"})
    # an open /metrics: platform totals, no tenant (per tenant with a scrape token: tests/security)
    text = env.http.get("/metrics").text
    assert "dlcloud_queue_length 2.0" in text, text
    assert "dlcloud_queue_wait_seconds_max " in text
    assert "dlcloud_queue_wait_seconds_avg " in text
    assert "dlcloud_preemptions_total 0.0" in text
    assert "dlcloud_gpus_allocated 0.0" in text
    assert "dlcloud_gpus_total 2.0" in text
    assert "m-team" not in text
