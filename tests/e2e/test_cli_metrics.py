"""Metrics end to end: a real job reports with ``dlcloud.report`` to a real ``dlcloud up`` — through a
control-plane outage (kill -9, restart) — and its owner reads them with ``dlcloud jobs metrics``; another
tenant cannot, and the job's token is good for nothing else."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import Server
from tests.job_files import touch_for_job

pytestmark = pytest.mark.e2e
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}

TRAIN = textwrap.dedent(
    """
    import json, os, pathlib, time, urllib.request
    import dlcloud

    out = pathlib.Path(os.environ["DLCLOUD_OUTPUT_DIR"])
    for step in range(5):
        dlcloud.report(step=step, loss=1.0 / (step + 1), acc=step / 10)
    dlcloud.flush(10.0)
    (out / "first-half").touch()
    while not (out / "go").exists():  # the test kills and restarts the control plane meanwhile
        time.sleep(0.05)
    for step in range(5, 10):  # while the control plane is down: the reporter keeps them and tries again
        dlcloud.report(step=step, loss=1.0 / (step + 1), acc=step / 10)
    (out / "second-half").touch()
    # the token reads nothing and writes no other job (asked once the API answers again)
    token = os.environ["DLCLOUD_METRICS_TOKEN"]
    base = os.environ["DLCLOUD_METRICS_URL"].split("/api/v1/")[0]
    answers = {}
    for method, path in [("GET", "/api/v1/jobs"), ("GET", "/api/v1/datasets"), ("POST", "/api/v1/jobs/other/metrics")]:
        req = urllib.request.Request(base + path, method=method, headers={"Authorization": "Bearer " + token})
        if method == "POST":
            req.data = json.dumps({"points": [{"step": 0, "metrics": {"x": 1}}]}).encode()
            req.add_header("Content-Type", "application/json")
        while path not in answers:
            try:
                answers[path] = urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as exc:
                answers[path] = exc.code
            except (urllib.error.URLError, ConnectionError):  # refused, or (in the job's own network, where the
                time.sleep(0.2)  # relay takes the connection) reset while the API is down
    dlcloud.flush(60.0)
    print(json.dumps(answers), flush=True)
    """
)


def _member(server: Server, tenant: str, user: str) -> None:
    """A tenant with a member and a CLI profile named after the user (the admin's commands name theirs)."""
    server.cli("--profile", "local", "tenants", "create", tenant)
    server.cli("--profile", "local", "users", "create", user, "--tenant", tenant, "--role", "member")
    key = server.cli_json("--profile", "local", "keys", "create", "--user", user, "--tenant", tenant)
    assert isinstance(key, dict)
    creds = ["--endpoint", server.endpoint, "--access-key", key["access_key"], "--secret-key", key["secret_key"]]
    server.cli("configure", "--profile", user, *creds, "--no-check")


def test_a_job_reports_through_an_outage_and_its_owner_reads_the_series(server: Server) -> None:
    code = server.root / "trainer"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    _member(server, "acme", "alice")
    _member(server, "beta", "bob")
    server.cli(
        "--profile", "alice", "jobs", "submit", "--name", "fit", "--code", str(code), "--command", "python train.py"
    )
    outputs = wait_for(
        lambda: next(iter(server.data_dir.glob("runs/*/*/outputs/first-half")), None), timeout=120, what="5 steps"
    ).parent

    server.kill9()  # the job keeps running and reporting into the void
    touch_for_job(outputs / "go")
    wait_for(lambda: (outputs / "second-half").exists(), timeout=60, what="5 steps reported during the outage")
    server.start()
    job = wait_for(
        lambda: (j := server.cli_json("--profile", "alice", "jobs", "describe", "fit"))["state"] in TERMINAL and j,
        timeout=120,
        what="the job to end",
    )
    assert isinstance(job, dict) and job["state"] == "SUCCEEDED", job.get("reason")

    # every step arrived, those sent while the API was down included (the reporter retried them)
    got = server.cli_json("--profile", "alice", "jobs", "metrics", "fit", "-o", "json")
    assert isinstance(got, dict)
    series = {s["metric"]: s for s in got["series"]}
    assert sorted(series) == ["acc", "loss"]
    assert [p["step"] for p in series["loss"]["points"]] == list(range(10))
    assert [p["value"] for p in series["loss"]["points"]] == pytest.approx([1.0 / (s + 1) for s in range(10)])
    rows = list(
        csv.DictReader(io.StringIO(server.cli("--profile", "alice", "jobs", "metrics", "fit", "-o", "csv").stdout))
    )
    assert len(rows) == 20 and {r["metric"] for r in rows} == {"acc", "loss"}
    table = server.cli("--profile", "alice", "jobs", "metrics", "fit", "-m", "loss").stdout
    assert "loss" in table and "acc" not in table

    # the token was good for its own pushes only
    lines = [ln for ln in server.cli("--profile", "alice", "jobs", "logs", "fit").stdout.splitlines() if "{" in ln]
    answers = json.loads(lines[-1][lines[-1].index("{") :])
    assert all(code in (401, 403) for code in answers.values()), answers
    # another tenant does not see the job, nor its metrics
    refused = server.cli("--profile", "bob", "jobs", "metrics", "fit", check=False)
    assert refused.returncode == 1 and "not_found" in refused.stderr, refused.stderr
