"""Jobs through the real control loop and local executor: success, failure, restarts, cancel, timeout,
a control-plane restart that re-adopts a running attempt, and secret env."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading

import pytest
from sqlalchemy import text

from dlcloud.control.loop import ControlLoop
from dlcloud.errors import InvalidSpec, InvalidState
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.jobs import SECRET_MASK
from tests.conftest import WAIT_FOR_GO, assert_api_error, release, wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


def _wait_end(client, name, timeout=60.0):
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end"
    )


def _wait_state(client, name, state, timeout=60.0):
    return wait_for(lambda: (j := client.jobs.get(name)).state == state and j, timeout=timeout, what=f"{name} {state}")


def test_failing_command_is_failed_with_its_exit_code(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "bad", "command": "echo about to fail; exit 3"})
    job = _wait_end(c, "bad")
    assert job.state == "FAILED"
    assert job.exit_code == 3
    assert "exit code 3" in job.reason
    assert [a.outcome for a in job.attempts] == ["failed"]


def test_restart_policy_retries_until_success(running_env):
    c = running_env.admin
    # fails on attempts 1 and 2, succeeds on 3; the checkpoint dir is shared by all attempts
    script = (
        'n=$(cat "$DLCLOUD_CHECKPOINT_DIR/count" 2>/dev/null || echo 0); n=$((n+1)); '
        'echo $n > "$DLCLOUD_CHECKPOINT_DIR/count"; echo "attempt $DLCLOUD_ATTEMPT run $n"; '
        '[ "$n" -ge 3 ]'
    )
    c.jobs.submit({"name": "flaky", "command": script, "restart": {"max_restarts": 3, "backoff_seconds": 0.1}})
    job = _wait_end(c, "flaky")
    assert job.state == "SUCCEEDED"
    assert job.attempt == 3 and job.restarts == 2
    assert [a.outcome for a in job.attempts] == ["failed", "failed", "succeeded"]
    states = [e.to_state for e in job.events]
    assert states.count("RESTARTING") == 2
    texts = [line.text for line in c.jobs.logs("flaky")]
    assert "attempt 1 run 1" in texts and "attempt 3 run 3" in texts


def test_restarts_exhausted_is_failed(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "always-bad", "command": "exit 1", "restart": {"max_restarts": 1, "backoff_seconds": 0}})
    job = _wait_end(c, "always-bad")
    assert job.state == "FAILED"
    assert job.attempt == 2
    assert "restarts exhausted" in job.reason


def test_cancel_running_job_sends_sigterm(running_env):
    c = running_env.admin
    c.jobs.submit(
        {
            "name": "sleeper",
            "command": "trap 'echo got-sigterm; exit 143' TERM; echo started; while true; do sleep 0.1; done",
        }
    )
    _wait_state(c, "sleeper", "RUNNING")
    wait_for(lambda: "started" in [x.text for x in c.jobs.logs("sleeper")], what="script start")
    c.jobs.cancel("sleeper")
    job = _wait_end(c, "sleeper")
    assert job.state == "CANCELLED"
    assert "got-sigterm" in [x.text for x in c.jobs.logs("sleeper")]
    with pytest.raises(InvalidState, match="already ended"):
        c.jobs.cancel("sleeper")


def test_cancel_queued_job_never_runs(env):
    c = env.admin  # no control loop: the job stays queued
    c.jobs.submit({"name": "waiting", "command": "echo never"})
    assert c.jobs.cancel("waiting").state == "CANCELLED"
    job = c.jobs.get("waiting")
    assert job.attempts == []


def test_timeout_kills_the_job(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "slow", "command": "sleep 60", "timeout": "1s"})
    job = _wait_end(c, "slow", timeout=30)
    assert job.state == "TIMED_OUT"
    assert "timeout" in job.reason


def test_delete_requires_a_finished_job(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "busy", "command": "sleep 30"})
    _wait_state(c, "busy", "RUNNING")
    with pytest.raises(InvalidState, match="cancel it first"):
        c.jobs.delete("busy")
    c.jobs.cancel("busy")
    _wait_end(c, "busy")
    c.jobs.delete("busy")
    assert all(j.name != "busy" for j in c.jobs.list())


def test_gpus_are_assigned_through_cuda_visible_devices(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "gpu", "command": 'echo "cvd=$CUDA_VISIBLE_DEVICES"', "resources": {"gpus": 2}})
    job = _wait_end(c, "gpu")
    assert job.state == "SUCCEEDED"
    assert "cvd=0,1" in [x.text for x in c.jobs.logs("gpu")]
    assert job.attempts[0].gpus == [0, 1]


def test_control_plane_restart_readopts_running_attempt(tmp_path, db_url):
    """The control loop stops (as in a crash) while a job runs; a new loop adopts it and records one attempt."""
    from tests.conftest import build_env, make_settings

    env = build_env(make_settings(tmp_path, db_url), LocalExecutor())
    stop = threading.Event()
    t = threading.Thread(target=env.control.run, args=(stop,), daemon=True)
    t.start()
    c = env.admin
    c.jobs.submit({"name": "survivor", "command": f"echo begin; {WAIT_FOR_GO}; echo end"})
    _wait_state(c, "survivor", "RUNNING")
    stop.set()
    env.control.wake()
    t.join(timeout=10)
    release(env.settings.data_dir, c.jobs.get("survivor").id)  # it finishes while no control plane watches
    wait_for(lambda: (tmp_path / "data").exists(), what="data dir")
    fresh = ControlLoop(env.platform, LocalExecutor())
    wait_for(lambda: (fresh.tick(), c.jobs.get("survivor").state in TERMINAL)[1], what="adoption")
    job = c.jobs.get("survivor")
    assert job.state == "SUCCEEDED"
    assert len(job.attempts) == 1
    assert [x.text for x in c.jobs.logs("survivor") if x.stream == "stdout"] == ["begin", "end"]
    env.platform.db.dispose()


def test_secret_env_reaches_every_replica_and_no_read_shows_it(running_env, caplog):
    """A secret_env value is in the environment of each replica of a gang, encrypted in the job row, and in
    no read: describe, list, the audit log, the job's events and the server's log."""
    caplog.set_level(logging.DEBUG)
    c = running_env.admin
    secret = "s3cret-" + secrets.token_hex(8)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    c.jobs.submit(
        {
            "name": "secretive",
            "replicas": {"worker": 2},
            "command": 'printf %s "$API_TOKEN" | sha256sum; echo "plain=$PLAIN"',
            "env": {"PLAIN": "visible"},
            "secret_env": {"API_TOKEN": secret},
        }
    )
    job = _wait_end(c, "secretive")
    assert job.state == "SUCCEEDED", job.reason
    texts = [x.text for x in c.jobs.logs("secretive")]
    assert sum(t.startswith(digest) for t in texts) == 2, texts  # both replicas got the value itself
    assert texts.count("plain=visible") == 2
    assert job.spec["secret_env"] == {"API_TOKEN": SECRET_MASK}
    assert job.spec["env"] == {"PLAIN": "visible"}
    audit = c.accounting.audit(limit=1000)
    assert any(e.action == "jobs.submit" and e.resource == "secretive" for e in audit)
    reads = json.dumps([job, c.jobs.list(), audit, texts], default=lambda model: model.model_dump(mode="json"))
    assert secret not in reads
    assert not [r.getMessage() for r in caplog.records if secret in r.getMessage()]
    with running_env.platform.db.engine.connect() as conn:
        row = conn.execute(text("SELECT spec FROM jobs WHERE name = 'secretive'")).scalar_one()
        events = conn.execute(text("SELECT reason FROM job_events")).scalars().all()
    raw = row if isinstance(row, str) else json.dumps(row)
    assert "API_TOKEN" in raw and secret not in raw and secret not in json.dumps(events)
    token = json.loads(raw)["secret_env"]["API_TOKEN"]
    assert running_env.platform.box.decrypt(token.encode()) == secret


def test_secret_env_is_checked_like_env(env):
    c = env.admin
    with pytest.raises(InvalidSpec, match="TOKEN given in both env and secret_env"):
        c.jobs.submit({"name": "twice", "command": "true", "env": {"TOKEN": "a"}, "secret_env": {"TOKEN": "b"}})
    cases = {"DLCLOUD_JOB_TOKEN": "secret_env DLCLOUD_JOB_TOKEN is set by dlcloud", "1BAD": "secret_env.1BAD"}
    for key, fragment in cases.items():
        resp = env.signed(
            env.admin_creds, "POST", "/api/v1/jobs", {"name": "bad", "command": "true", "secret_env": {key: "v"}}
        )
        err = assert_api_error(resp, 422, "validation_error")
        assert fragment in err["message"] + json.dumps(err["details"]), err
    assert c.jobs.list() == []
