"""``checkpoint_from``: a job whose checkpoint directory starts as a copy of another job's, on SQLite and
PostgreSQL. The name resolves in the caller's tenant only, to a job that has ended, never the job itself,
through the API and through ``create_job_row`` (the study driver's path) alike; a refused submit leaves no row.
Then real jobs on the local executor: B continues from A's checkpoint and A's stays as it was; a source
deleted after the submit fails the launch; one that never ran gives an empty directory."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dlcloud.errors import InvalidSpec, InvalidState, NotFound
from dlcloud.schemas.jobs import JobSpec
from dlcloud.services import jobs
from dlcloud.services.auth import Caller, Role
from dlcloud.store.rows import JobRow, TenantRow, UserRow
from tests.conftest import WAIT_FOR_GO, Env, assert_api_error, release, wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
JOBS = "/api/v1/jobs"


def _rows(env: Env) -> int:
    with env.platform.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


def _wait_end(client, name: str, timeout: float = 60.0) -> dict:
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end"
    )


def _admin_caller(env: Env) -> Caller:
    with env.platform.db.read() as s:
        tenant = s.scalars(select(TenantRow).where(TenantRow.name == "default")).one()
        user = s.scalars(select(UserRow).where(UserRow.tenant_id == tenant.id, UserRow.name == "admin")).one()
        return Caller(tenant.id, tenant.name, user.id, user.name, Role(user.role), env.admin_creds.access_key)


def _checkpoint_dir(env: Env, job_id: str):
    (path,) = env.settings.runs_dir.glob(f"*/{job_id}/checkpoints")
    return path


def test_another_tenants_job_is_not_found_like_one_that_does_not_exist(env: Env) -> None:
    other = env.new_tenant_user("other", "olga")
    other.jobs.submit({"name": "theirs", "command": "true"})
    theirs = other.jobs.cancel("theirs")  # ended: only the tenant keeps it from being named
    before = _rows(env)
    for ref in ("theirs", theirs.id, "nosuch"):
        spec = {"name": "mine", "command": "true", "checkpoint_from": ref}
        err = assert_api_error(env.signed(env.admin_creds, "POST", JOBS, spec), 404, "not_found", f"job {ref!r}")
        assert "other" not in err["message"] and "CANCELLED" not in err["message"]
    assert _rows(env) == before  # nothing was created
    with pytest.raises(NotFound, match="checkpoint_from: job 'theirs' not found"):
        env.admin.jobs.submit({"name": "mine", "command": "true", "checkpoint_from": "theirs"})


def test_a_job_that_has_not_ended_or_the_job_itself_is_refused(env: Env) -> None:
    c = env.admin  # no control loop: jobs stay queued
    c.jobs.submit({"name": "first", "command": "true"})
    before = _rows(env)
    spec = {"name": "second", "command": "true", "checkpoint_from": "first"}
    err = assert_api_error(env.signed(env.admin_creds, "POST", JOBS, spec), 409, "invalid_state", "is QUEUED")
    assert "checkpoint_from takes a job that has ended" in err["message"]
    assert err["details"] == {"checkpoint_from": "first", "state": "QUEUED"}
    spec = {"name": "selfish", "command": "true", "checkpoint_from": "selfish"}
    assert_api_error(env.signed(env.admin_creds, "POST", JOBS, spec), 400, "invalid_spec", "names this job itself")
    assert _rows(env) == before
    # ended, never having run: accepted, the name kept as given, no checkpoints to copy (no id)
    c.jobs.cancel("first")
    c.jobs.submit({"name": "second", "command": "true", "checkpoint_from": "first"})
    second = c.jobs.get("second")
    assert second.spec["checkpoint_from"] == "first" and second.resolved.checkpoint_from_id is None


def test_the_study_drivers_path_resolves_and_checks_it_the_same_way(env: Env) -> None:
    """``create_job_row`` in the caller's transaction, as the study driver calls it to resume a trial."""
    other = env.new_tenant_user("other", "olga")
    other.jobs.submit({"name": "theirs", "command": "true"})
    other.jobs.cancel("theirs")
    env.admin.jobs.submit({"name": "queued", "command": "true"})
    caller = _admin_caller(env)
    before = _rows(env)
    for ref, error, match in [
        ("theirs", NotFound, "job 'theirs' not found"),
        ("queued", InvalidState, "is QUEUED"),
        ("trial-1", InvalidSpec, "names this job itself"),
    ]:
        spec = JobSpec(name="trial-1", command="true", checkpoint_from=ref)
        with pytest.raises(error, match=match), env.platform.db.write() as s:
            jobs.create_job_row(s, env.platform, caller, spec, trial_env={"DLCLOUD_TRIAL": "1"})
    assert _rows(env) == before
    with env.platform.db.write() as s:  # make the queued job one that ran, as a paused trial's job has
        row = s.scalars(select(JobRow).where(JobRow.name == "queued")).one()
        row.state, row.attempt = "CANCELLED", 1
        source_id = row.id
    with env.platform.db.write() as s:
        spec = JobSpec(name="trial-1", command="true", checkpoint_from="queued")
        row = jobs.create_job_row(s, env.platform, caller, spec, trial_env={"DLCLOUD_TRIAL": "1"})
        assert row.spec["checkpoint_from"] == "queued" and row.platform_state.checkpoint_from_id == source_id
        assert row.platform_state.env == {"DLCLOUD_TRIAL": "1"} and "DLCLOUD_TRIAL" not in row.spec["env"]
    assert _rows(env) == before + 1


def test_a_running_job_is_refused(running_env: Env) -> None:
    c = running_env.admin
    busy = c.jobs.submit({"name": "busy", "command": WAIT_FOR_GO})
    wait_for(lambda: c.jobs.get("busy").state == "RUNNING", what="busy to run")
    with pytest.raises(InvalidState, match="job 'busy' is RUNNING; checkpoint_from takes a job that has ended"):
        c.jobs.submit({"name": "next", "command": "true", "checkpoint_from": "busy"})
    assert all(j.name != "next" for j in c.jobs.list())
    release(running_env.settings.data_dir, busy.id)
    assert _wait_end(c, "busy").state == "SUCCEEDED"


def test_a_job_continues_from_another_jobs_checkpoints_and_leaves_them_as_they_were(running_env: Env) -> None:
    """A real job A writes its checkpoint, and, as an attacker would, links to the server's key and a FIFO; B
    starts from a copy: reads A's state, appends to it in place; A's file stays as A left it."""
    c = running_env.admin
    key = running_env.settings.resolved_server_key_file
    write = (
        'cd "$DLCLOUD_CHECKPOINT_DIR" && echo "epoch 3" > state && mkdir -p sub && echo deep > sub/f && '
        f"ln -s {key} key && ln -s {key.parent} data && mkfifo pipe"
    )
    a = c.jobs.submit({"name": "a", "command": write})
    assert _wait_end(c, "a").state == "SUCCEEDED"
    cont = (
        'cd "$DLCLOUD_CHECKPOINT_DIR" && echo "resumed from $(cat state)" && [ "$(cat sub/f)" = deep ] && '
        '[ ! -e key ] && [ ! -L key ] && [ ! -e data ] && [ ! -e pipe ] && echo "epoch 6" >> state'
    )
    b = c.jobs.submit({"name": "b", "command": cont, "checkpoint_from": "a"})
    job = _wait_end(c, "b")
    assert job.state == "SUCCEEDED", (job.reason, [x.text for x in c.jobs.logs("b")])
    assert "resumed from epoch 3" in [x.text for x in c.jobs.logs("b")]
    assert job.spec["checkpoint_from"] == "a" and job.resolved.checkpoint_from_id == a.id
    assert "checkpoint_from_id" not in job.spec
    assert (_checkpoint_dir(running_env, b.id) / "state").read_text() == "epoch 3\nepoch 6\n"
    assert (_checkpoint_dir(running_env, a.id) / "state").read_text() == "epoch 3\n"


def test_a_source_deleted_after_the_submit_fails_the_launch_and_one_never_run_starts_empty(
    running_env: Env,
) -> None:
    c = running_env.admin
    c.jobs.submit({"name": "a", "command": 'echo x > "$DLCLOUD_CHECKPOINT_DIR/x"'})
    assert _wait_end(c, "a").state == "SUCCEEDED"
    # both GPUs held: jobs that need one wait in the queue
    blocker = c.jobs.submit({"name": "blocker", "command": WAIT_FOR_GO, "resources": {"gpus": 2}})
    wait_for(lambda: c.jobs.get("blocker").state == "RUNNING", what="blocker to run")
    c.jobs.submit({"name": "never", "command": "true", "resources": {"gpus": 1}})
    c.jobs.cancel("never")
    c.jobs.submit({"name": "b", "command": "echo ran", "checkpoint_from": "a", "resources": {"gpus": 1}})
    assert c.jobs.get("b").state == "QUEUED"
    c.jobs.delete("a")
    release(running_env.settings.data_dir, blocker.id)
    job = _wait_end(c, "b")
    assert job.state == "FAILED" and job.exit_code == 125, job.reason
    assert "was deleted after this job was submitted" in job.reason, job.reason
    assert "ran" not in [x.text for x in c.jobs.logs("b")]
    c.jobs.submit({"name": "c", "command": '[ -z "$(ls -A "$DLCLOUD_CHECKPOINT_DIR")" ]', "checkpoint_from": "never"})
    assert _wait_end(c, "c").state == "SUCCEEDED"
