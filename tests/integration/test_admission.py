"""Admission limits (docs/quotas-and-usage.md): request rate limits per access key, per tenant and per job
attempt (429 rate_limited with Retry-After, counted after authentication, a refused request taking nothing),
and the platform's default cap on queued jobs; what ``dlcloud quota`` shows and how the CLI fails. On SQLite
and PostgreSQL.

The buckets run on a stopped clock (``SteppedClock``) that only the test moves, so every edge is exact."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from dlcloud.cli import admin as cli_admin
from dlcloud.cli import jobs as cli_jobs
from dlcloud.cli.main import main
from dlcloud.client import Client, Credentials
from dlcloud.errors import QuotaExceeded, RateLimited
from dlcloud.services import admission
from dlcloud.services import metrics as metrics_svc
from dlcloud.services.admission import RateLimits
from dlcloud.store.rows import AttemptRow, JobRow, TenantRow, utcnow
from tests.conftest import Env, SteppedClock, assert_api_error

API = "/api/v1"
WHOAMI = f"{API}/whoami"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SteppedClock:
    """The buckets' clock, stopped: a bucket refills only when the test moves it."""
    stepped = SteppedClock()
    monkeypatch.setattr(admission, "time", stepped)
    return stepped


def limit(env: Env, **settings: Any) -> None:
    """From now on the API's rate limits are built from ``settings`` (the rest as configured). Set after the
    test's users exist, so that the admin's setup calls are not what the limits count."""
    env.app.state.rate_limits = RateLimits(env.settings.model_copy(update=settings))


def whoami(env: Env, client: Client):
    creds = client.transport.creds
    return env.signed(creds, "GET", WHOAMI)


def _rate_limited(resp, limit_name: str, retry_after: int) -> dict:
    err = assert_api_error(resp, 429, "rate_limited", "too many requests")
    assert resp.headers["Retry-After"] == str(retry_after)
    assert err["details"]["limit"] == limit_name
    assert err["details"]["retry_after_seconds"] == retry_after
    assert f"retry in {retry_after} s" in err["message"]
    return err


# ---- per access key ----


def test_a_key_over_its_rate_is_429_with_retry_after_and_other_keys_are_not(env: Env, clock: SteppedClock) -> None:
    alice = env.new_tenant_user("vision", "alice")
    bob = env.new_tenant_user("vision", "bob")
    carol = env.new_tenant_user("audio", "carol")
    limit(env, api_rate_limit_per_key=2.0, api_rate_limit_per_key_burst=3, api_rate_limit_per_tenant=0)

    for _ in range(3):  # the burst
        assert whoami(env, alice).status_code == 200
    err = _rate_limited(whoami(env, alice), "access_key", 1)  # one token in 0.5 s: Retry-After rounds up
    key = alice.transport.creds.access_key
    assert err["message"] == (
        f"too many requests from access key {key}: at most 2 request(s) per second are allowed per access key, "
        "in bursts of up to 3; retry in 1 s (the Retry-After header)"
    )
    assert err["details"] == {"limit": "access_key", "requests_per_second": 2.0, "burst": 3, "retry_after_seconds": 1}
    # another key of the same tenant, and another tenant's, are unaffected
    assert whoami(env, bob).status_code == 200
    assert whoami(env, carol).status_code == 200
    # refusals take nothing: half a second later exactly one request is admitted again
    clock.advance(0.25)
    _rate_limited(whoami(env, alice), "access_key", 1)
    clock.advance(0.25)
    assert whoami(env, alice).status_code == 200
    _rate_limited(whoami(env, alice), "access_key", 1)
    # the SDK raises RateLimited with the header's seconds
    with pytest.raises(RateLimited, match="at most 2 request") as info:
        alice.whoami()
    assert info.value.retry_after == 1


def test_retry_after_is_the_whole_seconds_until_a_token(env: Env, clock: SteppedClock) -> None:
    alice = env.new_tenant_user("vision", "alice")
    limit(env, api_rate_limit_per_key=0.25, api_rate_limit_per_key_burst=1, api_rate_limit_per_tenant=0)
    assert whoami(env, alice).status_code == 200
    _rate_limited(whoami(env, alice), "access_key", 4)
    clock.advance(2.5)
    _rate_limited(whoami(env, alice), "access_key", 2)
    clock.advance(1.5)
    assert whoami(env, alice).status_code == 200


def test_every_kind_of_route_is_limited_but_health_readiness_and_metrics_never(env: Env, clock: SteppedClock) -> None:
    alice = env.new_tenant_user("vision", "alice")
    limit(env, api_rate_limit_per_key=1.0, api_rate_limit_per_key_burst=1)
    creds = alice.transport.creds
    assert env.signed(creds, "GET", f"{API}/jobs").status_code == 200
    _rate_limited(env.signed(creds, "GET", f"{API}/jobs"), "access_key", 1)
    _rate_limited(env.signed(creds, "POST", f"{API}/jobs", {"name": "j", "command": "true"}), "access_key", 1)
    _rate_limited(env.signed(creds, "GET", f"{API}/quota"), "access_key", 1)
    for path in ("/healthz", "/readyz", "/metrics"):
        for _ in range(5):
            assert env.http.get(path).status_code == 200, path
    assert _stored_jobs(env, "vision") == 0  # the refused submit did nothing


def test_unauthenticated_requests_spend_no_budget(env: Env, clock: SteppedClock) -> None:
    alice = env.new_tenant_user("vision", "alice")
    limit(
        env,
        api_rate_limit_per_key=1.0,
        api_rate_limit_per_key_burst=2,
        api_rate_limit_per_tenant=1.0,
        api_rate_limit_per_tenant_burst=2,
    )
    key = alice.transport.creds.access_key
    forged = Credentials("http://testserver", key, "not-the-secret")
    for _ in range(20):  # a flood naming alice's key id and her tenant
        assert_api_error(env.signed(forged, "GET", WHOAMI), 401, "bad_signature")
        assert_api_error(env.http.get(WHOAMI), 401, "missing_signature")
    # ... spent none of her key's burst, nor her tenant's
    for _ in range(2):
        assert whoami(env, alice).status_code == 200
    _rate_limited(whoami(env, alice), "access_key", 1)


# ---- per tenant ----


def test_a_tenant_over_its_rate_is_429_for_all_its_keys_and_no_other_tenant(env: Env, clock: SteppedClock) -> None:
    alice = env.new_tenant_user("vision", "alice")
    bob = env.new_tenant_user("vision", "bob")
    carol = env.new_tenant_user("audio", "carol")
    limit(
        env,
        api_rate_limit_per_key=1.0,
        api_rate_limit_per_key_burst=3,
        api_rate_limit_per_tenant=1.0,
        api_rate_limit_per_tenant_burst=4,
    )
    for _ in range(3):
        assert whoami(env, alice).status_code == 200
    _rate_limited(whoami(env, alice), "access_key", 1)  # her key is out; the refusal took no tenant token
    assert whoami(env, bob).status_code == 200  # the tenant's fourth
    err = _rate_limited(whoami(env, bob), "tenant", 1)
    assert "tenant 'vision' (all its access keys together)" in err["message"]
    assert "at most 1 request(s) per second are allowed per tenant, in bursts of up to 4" in err["message"]
    assert err["details"]["burst"] == 4
    assert whoami(env, carol).status_code == 200  # another tenant: its own bucket
    # both buckets out: the longer wait is the one reported
    _rate_limited(whoami(env, alice), "access_key", 1)
    clock.advance(1.0)
    assert whoami(env, bob).status_code == 200
    _rate_limited(whoami(env, alice), "tenant", 1)


# ---- per job attempt: the metrics push ----


def _attempt_token(env: Env, job_id: str) -> str:
    """Record a running attempt 1 of a queued job, as the control loop would; its metrics token."""
    with env.platform.db.write() as s:
        job = s.get(JobRow, job_id)
        s.add(
            AttemptRow(
                job_id=job_id,
                tenant_id=job.tenant_id,
                user_id=job.user_id,
                number=1,
                host="testhost",
                gpus=[],
                cpus=1.0,
                memory=0,
                handle=f"test/{job_id}/1",
                started_at=utcnow() - timedelta(seconds=1),
            )
        )
        tenant_id = job.tenant_id
    return metrics_svc.issue_token(env.platform, tenant_id, job_id, 1)


def _push(env: Env, job_id: str, token: str, step: int):
    body = json.dumps({"points": [{"step": step, "metrics": {"loss": 1.0}}]}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return env.http.post(f"{API}/jobs/{job_id}/metrics", content=body, headers=headers)


def test_metrics_pushes_have_their_own_bucket_per_job_attempt(env: Env, clock: SteppedClock) -> None:
    alice = env.new_tenant_user("vision", "alice")
    first = alice.jobs.submit({"name": "first", "command": "true"}).id
    second = alice.jobs.submit({"name": "second", "command": "true"}).id
    token_1, token_2 = _attempt_token(env, first), _attempt_token(env, second)
    limit(
        env,
        api_rate_limit_per_key=1.0,
        api_rate_limit_per_key_burst=1,
        api_rate_limit_per_tenant=1.0,
        api_rate_limit_per_tenant_burst=1,
        api_rate_limit_per_job=0.5,
        api_rate_limit_per_job_burst=2,
    )
    # alice floods with her key: her key and her tenant are out
    assert whoami(env, alice).status_code == 200
    _rate_limited(whoami(env, alice), "access_key", 1)
    # ... and her jobs still push
    assert _push(env, first, token_1, 1).status_code == 204
    assert _push(env, first, token_1, 2).status_code == 204
    err = _rate_limited(_push(env, first, token_1, 3), "job", 2)
    assert f"job {first} (attempt 1)" in err["message"]
    assert _push(env, second, token_2, 1).status_code == 204  # another job: its own bucket
    # a bad token spends nothing of the job's bucket
    clock.advance(2.0)
    assert_api_error(_push(env, first, token_1 + "x", 4), 401, "invalid_token")
    assert _push(env, first, token_1, 4).status_code == 204
    # and the pushes took nothing of her key's budget
    assert whoami(env, alice).status_code == 200


# ---- the default cap on queued jobs ----


def _stored_jobs(env: Env, tenant: str) -> int:
    with env.platform.db.read() as s:
        tenant_id = s.scalar(select(TenantRow.id).where(TenantRow.name == tenant))
        return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.tenant_id == tenant_id)))


def test_the_default_queued_jobs_cap_refuses_with_a_clear_429_and_stores_nothing(env: Env) -> None:
    env.settings.default_max_queued_jobs = 3
    crowd = env.new_tenant_user("crowd", "alice")  # no quota of its own
    own = env.new_tenant_user("own", "bob", quota={"max_queued_jobs": 5})
    for i in range(3):
        crowd.jobs.submit({"name": f"j{i}", "command": "true"})
    with pytest.raises(QuotaExceeded, match="already has 3 queued job") as info:
        crowd.jobs.submit({"name": "one-more", "command": "true"})
    assert "the platform's default limit for a tenant without its own max_queued_jobs is 3" in info.value.message
    assert info.value.details == {"resource": "max_queued_jobs", "limit": 3, "queued": 3, "source": "platform default"}
    assert _stored_jobs(env, "crowd") == 3
    # on the wire: the quota error's 429, without Retry-After (waiting alone does not empty a queue)
    resp = env.signed(crowd.transport.creds, "POST", f"{API}/jobs", {"name": "one-more", "command": "true"})
    assert_api_error(resp, 429, "quota_exceeded", "platform's default limit")
    assert "Retry-After" not in resp.headers
    assert _stored_jobs(env, "crowd") == 3
    # a tenant's own limit wins over the default, above it too
    for i in range(5):
        own.jobs.submit({"name": f"j{i}", "command": "true"})
    with pytest.raises(QuotaExceeded, match="the limit is 5"):
        own.jobs.submit({"name": "j5", "command": "true"})
    # 0: no default cap
    env.settings.default_max_queued_jobs = 0
    crowd.jobs.submit({"name": "one-more", "command": "true"})
    assert _stored_jobs(env, "crowd") == 4


def test_quota_report_shows_the_cap_in_force_and_the_rate_limits(env: Env) -> None:
    crowd = env.new_tenant_user("crowd", "alice")
    own = env.new_tenant_user("own", "bob", quota={"max_queued_jobs": 5})
    report = crowd.accounting.quota()
    assert report.limits.max_queued_jobs is None  # the tenant's quota as set
    assert report.admission.model_dump(mode="json") == {
        "max_queued_jobs": 1000,
        "max_queued_jobs_source": "platform default",
        "rate_limit_per_key": {"requests_per_second": 50.0, "burst": 200},
        "rate_limit_per_tenant": {"requests_per_second": 200.0, "burst": 1000},
        "processes_per_job": 4096,
        "processes_per_tenant": 16384,  # no running-jobs quota: the platform's cap
        "disk_per_job": 50 * 1024**3,
    }
    # a tenant with a running-jobs quota: job_pids_max for each of its jobs
    limited = env.new_tenant_user("limited", "lea", quota={"max_running_jobs": 2})
    assert limited.accounting.quota().admission.processes_per_tenant == 2 * 4096
    assert own.accounting.quota().admission.max_queued_jobs == 5
    assert own.accounting.quota().admission.max_queued_jobs_source == "tenant quota"
    env.settings.default_max_queued_jobs = 0
    env.settings.api_rate_limit_per_tenant = 0
    report = crowd.accounting.quota().admission
    assert (report.max_queued_jobs, report.max_queued_jobs_source) == (None, "none")
    assert report.rate_limit_per_tenant is None


# ---- the CLI ----


def _dlcloud(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, client: Client, *args: str):
    """``dlcloud ARGS`` through its real entry point, its SDK calls going to the in-process API as ``client``:
    (exit code, stdout, stderr)."""
    for module in (cli_admin, cli_jobs):
        monkeypatch.setattr(module, "client", lambda ctx: client)
    monkeypatch.setattr(sys, "argv", ["dlcloud", *args])
    monkeypatch.setenv("COLUMNS", "250")
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_shows_the_limits_and_fails_cleanly(
    env: Env, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    env.settings.default_max_queued_jobs = 1
    alice = env.new_tenant_user("crowd", "alice")
    code, out, _ = _dlcloud(monkeypatch, capsys, alice, "quota")
    assert code == 0
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert "queued jobs 0 1 (platform default)" in rows
    assert "requests (your key) 50/s, bursts of 200" in rows
    assert "requests (tenant) 200/s, bursts of 1000" in rows

    code, _, _ = _dlcloud(monkeypatch, capsys, alice, "jobs", "submit", "--name", "a", "--command", "true")
    assert code == 0
    code, _, err = _dlcloud(monkeypatch, capsys, alice, "jobs", "submit", "--name", "b", "--command", "true")
    assert code == 1
    assert "error (quota_exceeded): tenant 'crowd' already has 1 queued job(s), the platform's default" in err
    assert "Traceback" not in err
    assert _stored_jobs(env, "crowd") == 1

    limit(env, api_rate_limit_per_key=1.0, api_rate_limit_per_key_burst=1)
    assert _dlcloud(monkeypatch, capsys, alice, "quota")[0] == 0
    code, _, err = _dlcloud(monkeypatch, capsys, alice, "quota")
    assert code == 1
    assert "error (rate_limited): too many requests from access key" in err
    assert "retry in 1 s" in err
    assert "Traceback" not in err


def test_a_signed_request_under_the_default_limits_is_admitted(env: Env) -> None:
    """The defaults let ordinary use through: a burst of 100 calls of one member at once."""
    alice = env.new_tenant_user("vision", "alice")
    creds = alice.transport.creds
    statuses = {env.signed(creds, "GET", WHOAMI).status_code for _ in range(100)}
    assert statuses == {200}
