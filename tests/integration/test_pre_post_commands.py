"""pre_command and post_command through the real control loop and local executor: post runs after success,
failure, cancel and timeout (also when a restarted control plane re-adopts a launcher running post),
the job's state and exit code stay the command's, and the log keeps each phase in its own section."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dlcloud.control.loop import ControlLoop
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.jobs import JobDetail
from tests.conftest import WAIT_FOR_GO, assert_api_error, release, wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
# post leaves the exit status it saw in the job's output directory
POST = 'echo "post saw $DLCLOUD_EXIT_CODE"; echo "$DLCLOUD_EXIT_CODE" > "$DLCLOUD_OUTPUT_DIR/post-marker"'


def _wait_end(client, name, timeout=60.0):
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end"
    )


def _marker(env, job: JobDetail) -> Path:
    """The file POST wrote into the job's DLCLOUD_OUTPUT_DIR (runs/<tenant-id>/<job-id>/outputs)."""
    (path,) = (env.settings.data_dir / "runs").glob(f"*/{job.id}/outputs/post-marker")
    return path


def _texts(client, name: str, **kwargs) -> list[str]:
    return [line.text for line in client.jobs.logs(name, **kwargs)]


def test_post_runs_after_success_with_its_own_log_section(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "ok", "command": "echo training", "pre_command": "echo fetching", "post_command": POST})
    job = _wait_end(c, "ok")
    assert job.state == "SUCCEEDED" and job.exit_code == 0 and job.reason == "exit code 0"
    assert _marker(running_env, job).read_text() == "0\n"
    lines = list(c.jobs.logs("ok"))
    printed = [(line.section, line.text) for line in lines if line.stream == "stdout"]
    assert printed == [("pre", "fetching"), ("main", "training"), ("post", "post saw 0")]
    assert {line.section for line in c.jobs.logs("ok", section="post")} == {"post"}
    assert "post saw 0" in _texts(c, "ok", section="post")
    assert "post_command exited with code 0" in _texts(c, "ok", section="post")
    assert _texts(c, "ok", section="pre")[-1] == "pre_command exited with code 0"
    main = _texts(c, "ok", section="main")
    assert "training" in main and "fetching" not in main and "post saw 0" not in main
    assert _texts(c, "ok", section="post", tail=1) == ["post_command exited with code 0"]


def test_failure_runs_post_with_the_code_and_keeps_it(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "bad", "command": "exit 3", "post_command": POST})
    job = _wait_end(c, "bad")
    assert job.state == "FAILED" and job.exit_code == 3
    assert _marker(running_env, job).read_text() == "3\n"


def test_failing_pre_command_skips_the_command(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "nopre", "command": "echo main-ran", "pre_command": "exit 4", "post_command": POST})
    job = _wait_end(c, "nopre")
    assert job.state == "FAILED" and job.exit_code == 4
    assert "pre_command exited with code 4; the command did not run" in job.reason
    assert "main-ran" not in _texts(c, "nopre")
    assert _marker(running_env, job).read_text() == "4\n"


def test_failing_post_command_does_not_fail_the_job_but_is_recorded(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "badpost", "command": "true", "post_command": "exit 6"})
    job = _wait_end(c, "badpost")
    assert job.state == "SUCCEEDED" and job.exit_code == 0
    assert job.reason == "exit code 0; post_command failed with exit code 6"
    assert job.events[-1].reason == job.reason


def test_cancel_runs_post_and_ends_cancelled(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "stopme", "command": "echo started; exec sleep 60", "post_command": POST})
    wait_for(lambda: "started" in _texts(c, "stopme"), what="the command to start")
    c.jobs.cancel("stopme")
    job = _wait_end(c, "stopme")
    assert job.state == "CANCELLED" and job.exit_code == -15
    assert _marker(running_env, job).read_text() == "143\n"
    assert "post saw 143" in _texts(c, "stopme", section="post")


def test_timeout_runs_post_and_ends_timed_out(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "slow", "command": "exec sleep 60", "timeout": "1s", "post_command": POST})
    job = _wait_end(c, "slow")
    assert job.state == "TIMED_OUT" and job.exit_code == -15
    assert _marker(running_env, job).read_text() == "143\n"


def test_post_timeout_bounds_post(running_env):
    c = running_env.admin
    spec = {"name": "hang", "command": "true", "post_command": "exec sleep 60", "post_timeout": "0.5s"}
    c.jobs.submit(spec)
    job = _wait_end(c, "hang")
    assert job.state == "SUCCEEDED"
    assert job.reason == "exit code 0; post_command timed out (exit code -15)"


def test_restarted_control_plane_readopts_a_launcher_running_post(tmp_path, db_url):
    """Cancel, then the control plane goes away while post runs; a new one re-adopts the attempt, stops it
    again (which must not end post), and records it CANCELLED once post has finished."""
    from tests.conftest import build_env, make_settings

    env = build_env(make_settings(tmp_path, db_url), LocalExecutor())
    stop = threading.Event()
    t = threading.Thread(target=env.control.run, args=(stop,), daemon=True)
    t.start()
    c = env.admin
    post = f'echo post-ready; {WAIT_FOR_GO}; echo "$DLCLOUD_EXIT_CODE" > '
    post += '"$DLCLOUD_OUTPUT_DIR/post-marker"'
    c.jobs.submit({"name": "adopt", "command": "echo started; exec sleep 60", "post_command": post})
    wait_for(lambda: "started" in _texts(c, "adopt"), what="the command to start")
    c.jobs.cancel("adopt")
    wait_for(lambda: "post-ready" in _texts(c, "adopt", section="post"), what="post to start")
    stop.set()
    env.control.wake()
    t.join(timeout=10)
    assert c.jobs.get("adopt").state == "RUNNING"  # the attempt outlives its control plane

    fresh = ControlLoop(env.platform, LocalExecutor())
    fresh.tick()  # re-adopts: the cancel is still pending, so it sends the stop again
    wait_for(
        lambda: "stop requested: post_command may finish (at most 300 s)" in _texts(c, "adopt", section="post"),
        what="the launcher to take the second stop",
    )
    fresh.tick()
    assert c.jobs.get("adopt").state == "RUNNING"  # post still runs
    release(env.settings.data_dir, c.jobs.get("adopt").id)
    wait_for(lambda: (fresh.tick(), c.jobs.get("adopt").state in TERMINAL)[1], what="the job to end")
    job = c.jobs.get("adopt")
    assert job.state == "CANCELLED" and len(job.attempts) == 1
    assert _marker(env, job).read_text() == "143\n"
    env.platform.db.dispose()


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"post_command": "true", "post_timeout": "2h"}, "post_timeout must be at most 1h"),
        ({"post_timeout": "1m"}, "'post_timeout' goes with 'post_command'"),
    ],
)
def test_bad_post_timeout_is_refused(env, fields, fragment):
    resp = env.signed(env.admin_creds, "POST", "/api/v1/jobs", {"name": "x", "command": "true", **fields})
    assert_api_error(resp, 422, "validation_error", fragment)


def test_unknown_log_section_is_refused(env):
    env.admin.jobs.submit({"name": "queued", "command": "true"})
    resp = env.signed(env.admin_creds, "GET", "/api/v1/jobs/queued/logs", query="section=during")
    assert_api_error(resp, 422, "validation_error")
