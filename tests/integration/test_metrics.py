"""Job metrics (docs/metrics.md): a real job pushes with the two variables it is given and its owner reads them
back; the token is good for one job attempt only, and not after it ended; bad pushes store nothing;
downsampling; tenancy. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud.client import Credentials
from dlcloud.schemas.jobs import JobDetail
from dlcloud.services import metrics as metrics_svc
from dlcloud.settings import Settings
from dlcloud.store.rows import AttemptRow, JobMetricRow, JobRow, utcnow
from tests.conftest import WAIT_FOR_GO, assert_api_error, release, wait_for

API = "/api/v1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}

# what a user's own client does, from inside the job: the two variables, urllib, nothing else
PUSH = """
import json, os, sys, urllib.request
url, token = os.environ["DLCLOUD_METRICS_URL"], os.environ["DLCLOUD_METRICS_TOKEN"]
attempt = int(os.environ["DLCLOUD_ATTEMPT"])
def push(points):
    body = json.dumps({"points": points}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 204, resp.status
batch = [{"step": s, "metrics": {"loss": 1.0 / (s + 1), "acc": s / 10 + attempt}} for s in range(10)]
push(batch)
push(batch)  # a retried batch: nothing twice
push([{"step": 9, "metrics": {"val/loss": 0.5}, "time": "2026-01-02T03:04:05Z"}])
open(os.path.join(os.environ["DLCLOUD_CHECKPOINT_DIR"], "token-%d" % attempt), "w").write(token)
print("pushed to", url)
"""


def _python(script: str) -> str:
    return "python -c " + shlex.quote(script)


@contextmanager
def api_server(env) -> Iterator[str]:
    """The env's app served by uvicorn on a free loopback port, where jobs can reach it; its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(env.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="dlcloud-api-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=60, what="uvicorn to start")
        assert server.started, "uvicorn did not start"
        port = next(s.getsockname()[1] for srv in server.servers for s in (srv.sockets or ()))
        env.settings.job_api_url = f"http://127.0.0.1:{port}"
        yield env.settings.job_api_url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _wait_end(client, name: str, timeout: float = 120.0) -> JobDetail:
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end"
    )


def _push(env, job_id: str, token: str, body: object, *, raw: bytes | None = None):
    content = raw if raw is not None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return env.http.post(f"{API}/jobs/{job_id}/metrics", content=content, headers=headers)


def _read(env, name: str, query: str = "", creds=None):
    resp = env.signed(creds or env.admin_creds, "GET", f"{API}/jobs/{name}/metrics", query=query)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _series(body: dict) -> dict[tuple[str, int, str], list[tuple[int, float]]]:
    return {
        (s["metric"], s["attempt"], s["replica"]): [(p["step"], p["value"]) for p in s["points"]]
        for s in body["series"]
    }


def _stored(env, job_id: str) -> int:
    with env.platform.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(JobMetricRow).where(JobMetricRow.job_id == job_id)))


def _attempt(env, job_id: str, number: int = 1, *, ended_ago: float | None = None) -> str:
    """Record attempt ``number`` of a queued job, as the control loop would (ended ``ended_ago`` seconds ago,
    or running), and return its metrics token."""
    with env.platform.db.write() as s:
        job = s.get(JobRow, job_id)
        now = utcnow()
        s.add(
            AttemptRow(
                job_id=job_id,
                tenant_id=job.tenant_id,
                user_id=job.user_id,
                number=number,
                host="testhost",
                gpus=[],
                cpus=1.0,
                memory=0,
                handle=f"test/{job_id}/{number}",
                started_at=now - timedelta(seconds=(ended_ago or 0) + 1),
                finished_at=None if ended_ago is None else now - timedelta(seconds=ended_ago),
            )
        )
        tenant = job.tenant_id
    return metrics_svc.issue_token(env.platform, tenant, job_id, number)


def _job(env, name: str, client=None) -> str:
    return (client or env.admin).jobs.submit({"name": name, "command": "true"}).id


# ---- a real job, through the real control loop, pushing over real HTTP ----


def test_a_job_pushes_with_its_two_variables_and_the_owner_reads_them_back(running_env, monkeypatch):
    env, c = running_env, running_env.admin
    with api_server(env) as base:
        job = c.jobs.submit({"name": "pusher", "command": _python(PUSH)})
        done = _wait_end(c, "pusher")
    assert done.state == "SUCCEEDED", [line.text for line in c.jobs.logs("pusher")]
    logs = [line.text for line in c.jobs.logs("pusher")]
    assert f"pushed to {base}/api/v1/jobs/{job.id}/metrics" in logs

    body = _read(env, "pusher")
    assert body["job"] == "pusher"
    series = _series(body)
    assert set(series) == {("acc", 1, ""), ("loss", 1, ""), ("val/loss", 1, "")}
    assert series[("loss", 1, "")] == [(s, 1.0 / (s + 1)) for s in range(10)]  # the retried batch: once
    assert series[("acc", 1, "")] == [(s, s / 10 + 1) for s in range(10)]
    val = next(s for s in body["series"] if s["metric"] == "val/loss")
    assert val["points"] == [{"step": 9, "value": 0.5, "time": "2026-01-02T03:04:05Z"}]
    assert all(not s["downsampled"] for s in body["series"])
    assert _stored(env, job.id) == 21
    only = _series(_read(env, job.id, "metric=loss&metric=val%2Floss&attempt=1&replica="))
    assert set(only) == {("loss", 1, ""), ("val/loss", 1, "")}
    assert _read(env, "pusher", "attempt=2")["series"] == []

    # the token the job was given: this server's, for this job and attempt; good for a last flush after the end
    (token_file,) = (env.settings.data_dir / "runs").glob(f"*/{job.id}/checkpoints/token-1")
    token = token_file.read_text()
    tenant_id = env.admin.tenants.get("default").id
    assert token == metrics_svc.issue_token(env.platform, tenant_id, job.id, 1)
    late = {"points": [{"step": 10, "metrics": {"loss": 0.01}}]}
    assert _push(env, job.id, token, late).status_code == 204
    monkeypatch.setattr(metrics_svc, "TOKEN_GRACE_SECONDS", 0.0)
    assert_api_error(_push(env, job.id, token, late), 401, "invalid_token", "expired")

    c.jobs.delete("pusher")
    assert _stored(env, job.id) == 0  # the job's metrics go with it
    assert_api_error(_push(env, job.id, token, late), 401, "invalid_token", "expired")


def test_each_attempt_has_its_own_token_and_an_ended_attempts_token_stops_working(running_env, monkeypatch):
    env, c = running_env, running_env.admin
    monkeypatch.setattr(metrics_svc, "TOKEN_GRACE_SECONDS", 0.0)
    # attempt 1 pushes and fails; attempt 2 pushes and waits for the test
    script = PUSH + "sys.exit(1 if attempt == 1 else 0)\n"
    command = f"{_python(script)} || exit 1; {WAIT_FOR_GO}"
    with api_server(env):
        job = c.jobs.submit({"name": "twice", "command": command, "restart": {"max_restarts": 1, "backoff_seconds": 0}})
        checkpoints = wait_for(
            lambda: next((env.settings.data_dir / "runs").glob(f"*/{job.id}/checkpoints/token-2"), None),
            timeout=120,
            what="attempt 2 to push",
        ).parent
        first, second = (checkpoints / "token-1").read_text(), (checkpoints / "token-2").read_text()
        assert first != second
        point = {"points": [{"step": 100, "metrics": {"loss": 7.0}}]}
        assert_api_error(_push(env, job.id, first, point), 401, "invalid_token", "expired")
        assert _push(env, job.id, second, point).status_code == 204
        release(env.settings.data_dir, job.id)
        done = _wait_end(c, "twice")
    assert done.state == "SUCCEEDED" and done.attempt == 2
    series = _series(_read(env, "twice", "metric=acc&metric=loss"))
    assert series[("acc", 1, "")] == [(s, s / 10 + 1) for s in range(10)]
    assert series[("acc", 2, "")] == [(s, s / 10 + 2) for s in range(10)]
    assert series[("loss", 2, "")][-1] == (100, 7.0)
    assert all(step < 100 for step, _ in series[("loss", 1, "")])  # the refused push stored nothing
    assert_api_error(_push(env, job.id, second, point), 401, "invalid_token", "expired")


# ---- the token: one job, one attempt, one route ----


def test_a_token_writes_only_its_own_job_and_reads_nothing(env):
    a, b = _job(env, "job-a"), _job(env, "job-b")
    token_a = _attempt(env, a)
    _attempt(env, b)
    point = {"points": [{"step": 1, "metrics": {"loss": 1.0}}]}
    err = assert_api_error(_push(env, b, token_a, point), 401, "invalid_token", "invalid")
    assert "job-a" not in err["message"] and a not in err["message"]
    assert_api_error(_push(env, "job-b", token_a, point), 401, "invalid_token")  # by name: no
    assert _stored(env, b) == 0
    # a forged token: job A's signature on job B's payload
    prefix, payload, mac = token_a.split(".")
    forged = metrics_svc.issue_token(env.platform, "t", b, 1).split(".")[1]
    assert_api_error(_push(env, b, f"{prefix}.{forged}.{mac}", point), 401, "invalid_token", "invalid")
    for bad in ("", "x", "dlm1.e30.", token_a + "x", "a" * 5000):
        resp = _push(env, a, bad, point)
        assert resp.status_code == 401, (bad, resp.text)
    assert _stored(env, a) == 0
    # the token reads nothing and opens no other route
    bearer = {"Authorization": f"Bearer {token_a}"}
    for path in (f"{API}/jobs/job-a/metrics", f"{API}/jobs/job-a", f"{API}/jobs", f"{API}/whoami"):
        assert env.http.get(path, headers=bearer).status_code == 401, path
    assert env.http.post(f"{API}/jobs/job-a/cancel", headers=bearer).status_code == 401
    assert _push(env, a, token_a, point).status_code == 204
    assert _stored(env, a) == 1


def test_a_token_expires_after_its_attempt_ended_and_the_grace(env, monkeypatch):
    job = _job(env, "ended")
    token = _attempt(env, job, ended_ago=5.0)
    point = {"points": [{"step": 1, "metrics": {"loss": 1.0}}]}
    assert _push(env, job, token, point).status_code == 204  # within the 60 s grace
    monkeypatch.setattr(metrics_svc, "TOKEN_GRACE_SECONDS", 2.0)
    err = assert_api_error(_push(env, job, token, point), 401, "invalid_token", "expired")
    assert err["message"] == metrics_svc.EXPIRED_TOKEN
    never = metrics_svc.issue_token(env.platform, "x", job, 7)  # a signed token of an attempt that never was
    assert_api_error(_push(env, job, never, point), 401, "invalid_token")


def test_a_signed_user_request_cannot_push(env):
    job = _job(env, "signed")
    _attempt(env, job)
    resp = env.signed(env.admin_creds, "POST", f"{API}/jobs/{job}/metrics", {"points": []})
    assert_api_error(resp, 401, "unauthenticated", "not a signed user request")
    resp = env.http.post(f"{API}/jobs/{job}/metrics", json={"points": []})
    assert_api_error(resp, 401, "unauthenticated", "metrics token")
    assert _stored(env, job) == 0


def test_a_huge_push_is_refused_before_it_is_read(env):
    job = _job(env, "huge")
    token = _attempt(env, job)
    size = env.settings.max_request_bytes + 1
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Length": str(size)}
    resp = env.http.post(f"{API}/jobs/{job}/metrics", content=b"{" + b" " * (size - 1), headers=headers)
    assert_api_error(resp, 413, "payload_too_large")


# ---- what a push may carry ----

_OK = {"step": 1, "metrics": {"loss": 1.0}}


@pytest.mark.parametrize(
    "points, status, fragment",
    [
        ([{"step": 1, "metrics": {"bad name": 1.0}}], 422, "points.0.metrics"),
        ([{"step": 1, "metrics": {"x" * 129: 1.0}}], 422, "points.0.metrics"),
        ([{"step": 1, "metrics": {"": 1.0}}], 422, "points.0.metrics"),
        ([{"step": -1, "metrics": {"loss": 1.0}}], 422, "points.0.step"),
        ([{"step": 1.5, "metrics": {"loss": 1.0}}], 422, "points.0.step"),
        ([{"step": "3", "metrics": {"loss": 1.0}}], 422, "must be a number"),
        ([{"step": True, "metrics": {"loss": 1.0}}], 422, "must be a number"),
        ([{"step": 1, "metrics": {"loss": "1"}}], 422, "must be a number"),
        ([{"step": 1, "metrics": {"loss": None}}], 422, "points.0.metrics"),
        ([{"step": 1, "metrics": {f"m{i}": 1.0 for i in range(101)}}], 422, "points.0.metrics"),
        ([_OK] * 1001, 422, "points"),
        ([{"step": 1, "metrics": {"loss": 1.0}, "replica": "../x"}], 422, "points.0.replica"),
        ([{"step": 1, "metrics": {"loss": 1.0}, "extra": 1}], 422, "unknown field"),
        ([{"step": 1, "metrics": {"loss": 1.0}, "time": 1795218536}], 422, "ISO 8601"),
        ([_OK, {"step": 2, "metrics": {"loss": float("nan")}}], 400, "finite"),
        ([_OK, {"step": 2, "metrics": {"loss": float("inf")}}], 400, "finite"),
        ([{"step": 2, "metrics": {"loss": float("-inf")}}], 400, "points[0].metrics.loss"),
    ],
)
def test_a_bad_push_is_refused_and_stores_nothing(env, points, status, fragment):
    job = _job(env, "strict")
    token = _attempt(env, job)
    raw = json.dumps({"points": points}).encode()  # Python writes NaN and Infinity as JSON would not
    code = "validation_error" if status == 422 else "invalid_argument"
    assert_api_error(_push(env, job, token, None, raw=raw), status, code, fragment)
    assert _stored(env, job) == 0


def test_a_re_push_overwrites_and_never_duplicates(env):
    job = _job(env, "again")
    token = _attempt(env, job)
    batch = {"points": [{"step": s, "metrics": {"loss": float(s)}, "replica": "worker-1"} for s in range(5)]}
    for _ in range(3):
        assert _push(env, job, token, batch).status_code == 204
    # the same point twice in one batch, and a changed value: the last one sent wins
    fix = {
        "points": [{"step": 2, "metrics": {"loss": 9.0}, "replica": "worker-1"}] * 2
        + [{"step": 2, "metrics": {"loss": 20.0}, "replica": "worker-1"}]
    }
    assert _push(env, job, token, fix).status_code == 204
    assert _push(env, job, token, {"points": []}).status_code == 204
    assert _stored(env, job) == 5
    assert _series(_read(env, "again"))[("loss", 1, "worker-1")] == [(0, 0.0), (1, 1.0), (2, 20.0), (3, 3.0), (4, 4.0)]
    assert _read(env, "again", "replica=worker-2")["series"] == []


def test_long_series_are_downsampled_keeping_the_first_and_last_point(env):
    job = _job(env, "long")
    token = _attempt(env, job)
    steps = [s * 3 for s in range(4500)]  # 0 .. 13497
    for lo in range(0, len(steps), 1000):
        points = [{"step": s, "metrics": {"loss": s / 2, "short": 1.0}} for s in steps[lo : lo + 1000]]
        points = [p if p["step"] < 30 else {**p, "metrics": {"loss": p["step"] / 2}} for p in points]
        assert _push(env, job, token, {"points": points}).status_code == 204
    for max_points in (1, 2, 7, 100, 4499):
        body = _read(env, "long", f"metric=loss&max_points={max_points}")
        (series,) = body["series"]
        got = [(p["step"], p["value"]) for p in series["points"]]
        assert series["downsampled"] is True
        assert 1 <= len(got) <= max_points
        assert got[-1] == (13497, 13497 / 2)
        if max_points > 1:
            assert got[0] == (0, 0.0)
            assert len(got) == max_points  # equal ranges over evenly spaced steps: each has a point
        assert [s for s, _ in got] == sorted({s for s, _ in got})
    full = _read(env, "long", "max_points=10000")
    lengths = {s["metric"]: (len(s["points"]), s["downsampled"]) for s in full["series"]}
    assert lengths == {"loss": (4500, False), "short": (10, False)}
    assert_api_error(
        env.signed(env.admin_creds, "GET", f"{API}/jobs/long/metrics", query="max_points=0"), 422, "validation_error"
    )
    assert_api_error(
        env.signed(env.admin_creds, "GET", f"{API}/jobs/long/metrics", query="max_points=10001"),
        422,
        "validation_error",
    )


def test_another_tenants_job_metrics_are_not_found(env):
    job = _job(env, "mine")
    token = _attempt(env, job)
    assert _push(env, job, token, {"points": [_OK]}).status_code == 204
    other = env.new_tenant_user("other", "eve")
    for name in ("mine", job, "nosuch"):
        resp = env.signed(other.transport.creds, "GET", f"{API}/jobs/{name}/metrics")
        assert_api_error(resp, 404, "not_found", "not found")
    # a member of the same tenant reads them, like GET /jobs/{name}
    env.admin.users.create("bob", tenant="default", role="member")
    key = env.admin.keys.create(user="bob", tenant="default")
    bob = Credentials("http://testserver", key.access_key, key.secret_key)
    assert _series(_read(env, "mine", creds=bob)) == {("loss", 1, ""): [(1, 1.0)]}


def test_the_job_api_url_defaults_to_the_servers_address(tmp_path: Path):
    assert Settings(host="0.0.0.0", port=9000, data_dir=tmp_path).resolved_job_api_url == "http://127.0.0.1:9000"
    assert Settings(host="::", port=9000, data_dir=tmp_path).resolved_job_api_url == "http://127.0.0.1:9000"
    assert Settings(host="::1", port=9000, data_dir=tmp_path).resolved_job_api_url == "http://[::1]:9000"
    given = Settings(job_api_url="http://10.0.0.5:8420/", data_dir=tmp_path)
    assert given.resolved_job_api_url == "http://10.0.0.5:8420"


def test_pushes_are_not_audited_and_the_document_names_the_token(env):
    job = _job(env, "quiet")
    token = _attempt(env, job)
    for step in range(3):
        assert _push(env, job, token, {"points": [{**_OK, "step": step}]}).status_code == 204
    resp = env.signed(env.admin_creds, "GET", f"{API}/audit", query="all=true&limit=10000")
    assert [e for e in resp.json() if e["action"] == "jobs.metrics_push"] == []  # routine, like lease renewals
    doc = env.http.get(f"{API}/openapi.json").json()
    push = doc["paths"][f"{API}/jobs/{{name}}/metrics"]["post"]
    assert push["security"] == [{"jobMetricsToken": []}]
    assert doc["components"]["securitySchemes"]["jobMetricsToken"]["scheme"] == "bearer"
    assert "invalid_token" in push["responses"]["401"]["description"]
    assert {"204", "400", "401", "413", "422"} <= set(push["responses"])
    read = doc["paths"][f"{API}/jobs/{{name}}/metrics"]["get"]
    assert read["security"] == [{"dlcloudSignature": []}] and "404" in read["responses"]
