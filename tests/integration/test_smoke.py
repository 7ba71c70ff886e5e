"""The in-process platform answers signed calls and runs a job end to end on both databases."""

from __future__ import annotations

from tests.conftest import wait_for


def test_whoami_is_the_bootstrap_admin(env):
    who = env.admin.whoami()
    assert who.user == "admin"
    assert who.role == "platform-admin"


def test_job_runs_to_success(running_env, tmp_path):
    c = running_env.admin
    c.jobs.submit({"name": "hello", "command": "echo hello-from-job"})
    job = wait_for(lambda: (j := c.jobs.get("hello")).state in ("SUCCEEDED", "FAILED") and j, what="job end")
    assert job.state == "SUCCEEDED"
    lines = [line.text for line in c.jobs.logs("hello")]
    assert "hello-from-job" in lines
