"""The launcher's phases: pre_command, the command, post_command; their log sections, exit codes, and the
stop protocol (a stop or timeout ends pre/main, then post still runs, bounded by post_timeout)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from dlcloud.executors.local import launcher
from tests.job_files import touch_for_job
from tests.unit.executors.test_launcher import finish, lines, logged, start, wait_for

# Each phase prints its name, the environment it sees and its process group (field 5 of /proc/$$/stat).
REPORT = 'echo "$DLCLOUD_PHASE pwd=$PWD foo=$FOO path=$PATH pid=$$ pgid=$(cut -d" " -f5 /proc/$$/stat)"'


def _fields(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split()[1:])


def test_phases_run_in_order_each_in_its_own_group_with_the_same_environment(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "FOO": "bar"}
    attempt_dir, proc = start(
        tmp_path,
        REPORT + "; echo main-err >&2",
        pre_command=REPORT,
        post_command=REPORT + "; echo post-err >&2",
        env=env,
    )
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 0 and result["post_exit_code"] == 0 and result["post_timed_out"] is False
    assert result["message"] == ""
    out = [text for text in lines(attempt_dir) if text.split()[0] in ("pre", "main", "post")]
    assert [text.split()[0] for text in out] == ["pre", "main", "post"]
    seen = [_fields(text) for text in out]
    for fields in seen:
        assert fields["pwd"] == str(attempt_dir / "code")
        assert fields["foo"] == "bar" and fields["path"] == "/usr/bin:/bin"
        assert fields["pgid"] == fields["pid"]  # a group leader: its own process group
    assert len({fields["pgid"] for fields in seen}) == 3
    # the sections: each phase's output under its own stream names
    assert lines(attempt_dir, "pre:stdout") == [out[0]]
    assert lines(attempt_dir, "stdout") == [out[1]]
    assert lines(attempt_dir, "stderr") == ["main-err"]
    assert lines(attempt_dir, "post:stdout") == [out[2]]
    assert lines(attempt_dir, "post:stderr") == ["post-err"]
    assert any(text.startswith("starting pre_command: ") for text in lines(attempt_dir, "pre:system"))
    assert "pre_command exited with code 0" in lines(attempt_dir, "pre:system")
    assert "command exited with code 0" in lines(attempt_dir, "system")
    assert any(
        text.startswith("starting post_command (DLCLOUD_EXIT_CODE=0): ") for text in lines(attempt_dir, "post:system")
    )
    assert "post_command exited with code 0" in lines(attempt_dir, "post:system")
    assert json.loads((attempt_dir / "child.json").read_text())["role"] == "post"


def test_failing_pre_command_skips_the_command_and_post_sees_its_code(tmp_path: Path) -> None:
    attempt_dir, proc = start(
        tmp_path, "echo main-ran", pre_command="echo preparing; exit 4", post_command='echo "post $DLCLOUD_EXIT_CODE"'
    )
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 4 and result["post_exit_code"] == 0
    assert result["message"] == "pre_command exited with code 4; the command did not run"
    assert lines(attempt_dir, "pre:stdout") == ["preparing"]
    assert lines(attempt_dir, "stdout") == []
    assert lines(attempt_dir, "post:stdout") == ["post 4"]
    assert "command skipped: pre_command exited with code 4" in lines(attempt_dir, "system")


@pytest.mark.parametrize("main_code", [0, 3])
def test_post_sees_the_exit_code_and_its_own_failure_does_not_change_it(tmp_path: Path, main_code: int) -> None:
    post = 'echo "post $DLCLOUD_EXIT_CODE $DLCLOUD_PHASE"; exit 9'
    attempt_dir, proc = start(tmp_path, f"exit {main_code}", post_command=post)
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == main_code
    assert result["post_exit_code"] == 9 and result["post_timed_out"] is False
    assert lines(attempt_dir, "post:stdout") == [f"post {main_code} post"]
    expected = f"post_command exited with code 9 (ignored: the attempt keeps exit code {main_code})"
    assert expected in lines(attempt_dir, "post:system")


def test_no_post_command_means_no_post_record(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "true")
    result = finish(attempt_dir, proc)
    assert result["post_exit_code"] is None and result["post_timed_out"] is False


@pytest.mark.parametrize(
    ("main", "code", "status"),
    [
        ("echo ready; exec sleep 30", -signal.SIGTERM, 143),  # SIGTERM ends it
        ("trap '' TERM; echo ready; while :; do sleep 0.05; done", -signal.SIGKILL, 137),  # SIGKILL after grace
    ],
)
def test_post_runs_after_a_stop_with_the_killed_command_status(
    tmp_path: Path, main: str, code: int, status: int
) -> None:
    post = 'echo "post $DLCLOUD_EXIT_CODE"'
    attempt_dir, proc = start(tmp_path, main, post_command=post, grace_seconds=0.3)
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    proc.send_signal(signal.SIGTERM)
    result = finish(attempt_dir, proc)
    assert result["stopped"] is True and result["timed_out"] is False and result["message"] == "stopped"
    assert result["exit_code"] == code and result["post_exit_code"] == 0
    assert lines(attempt_dir, "post:stdout") == [f"post {status}"]
    system = lines(attempt_dir, "system")
    assert f"command exited with code {code} (stopped)" in system
    assert any(text.startswith("stop requested: SIGTERM") for text in system)


def test_a_stop_during_post_lets_it_finish(tmp_path: Path) -> None:
    post = 'echo post-ready; while [ ! -f go ]; do sleep 0.02; done; echo "post $DLCLOUD_EXIT_CODE"'
    attempt_dir, proc = start(tmp_path, "echo ready; exec sleep 30", post_command=post, grace_seconds=0.3)
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: logged(attempt_dir, "post:stdout post-ready"))
    proc.send_signal(signal.SIGTERM)  # a second stop (e.g. from a restarted control plane) must not end post
    wait_for(lambda: logged(attempt_dir, "post:system stop requested: post_command may finish"))
    assert proc.poll() is None
    touch_for_job(attempt_dir / "code" / "go")
    result = finish(attempt_dir, proc)
    assert result["stopped"] is True and result["exit_code"] == -signal.SIGTERM
    assert result["post_exit_code"] == 0 and result["post_timed_out"] is False
    assert lines(attempt_dir, "post:stdout") == ["post-ready", "post 143"]


def test_a_stop_after_the_command_ended_does_not_end_post(tmp_path: Path) -> None:
    post = "echo post-ready; while [ ! -f go ]; do sleep 0.02; done; echo post-done"
    attempt_dir, proc = start(tmp_path, "echo main-done", post_command=post)
    wait_for(lambda: logged(attempt_dir, "post:stdout post-ready"))
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: logged(attempt_dir, "post:system stop requested: post_command may finish"))
    touch_for_job(attempt_dir / "code" / "go")
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 0 and result["stopped"] is False  # the command ended by itself
    assert lines(attempt_dir, "post:stdout") == ["post-ready", "post-done"]


def test_post_runs_after_a_timeout(tmp_path: Path) -> None:
    attempt_dir, proc = start(
        tmp_path,
        "exec sleep 30",
        post_command='echo "post $DLCLOUD_EXIT_CODE"',
        timeout_seconds=0.5,
        grace_seconds=1.0,
    )
    result = finish(attempt_dir, proc)
    assert result["timed_out"] is True and result["stopped"] is False
    assert result["exit_code"] == -signal.SIGTERM and "timed out" in result["message"]
    assert result["post_exit_code"] == 0
    assert lines(attempt_dir, "post:stdout") == ["post 143"]


def test_the_job_timeout_does_not_cover_post(tmp_path: Path) -> None:
    post = "echo post-ready; while [ ! -f go ]; do sleep 0.02; done; echo post-done"
    attempt_dir, proc = start(tmp_path, "true", post_command=post, timeout_seconds=3.0)
    wait_for(lambda: logged(attempt_dir, "post:stdout post-ready"))
    # let the job's deadline pass while post runs (counted from the launcher's start)
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 3.2, timeout=10)
    touch_for_job(attempt_dir / "code" / "go")
    result = finish(attempt_dir, proc)
    assert result["timed_out"] is False and result["exit_code"] == 0 and result["post_exit_code"] == 0
    assert lines(attempt_dir, "post:stdout") == ["post-ready", "post-done"]


@pytest.mark.parametrize(
    ("post", "post_code"),
    [
        ("trap 'echo post got TERM; exit 5' TERM; echo post-ready; while :; do sleep 0.05; done", 5),
        ("trap '' TERM; echo post-ready; while :; do sleep 0.05; done", -signal.SIGKILL),
    ],
)
def test_post_timeout_is_enforced(tmp_path: Path, post: str, post_code: int) -> None:
    # post_timeout leaves the shell time to set its trap even on a loaded machine
    attempt_dir, proc = start(tmp_path, "exit 2", post_command=post, post_timeout_seconds=1.5, grace_seconds=0.3)
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 2 and result["timed_out"] is False  # the attempt keeps the command's code
    assert result["post_timed_out"] is True and result["post_exit_code"] == post_code
    system = lines(attempt_dir, "post:system")
    assert any(text.startswith("post_command still running after its post_timeout of 1.5 s") for text in system)
    assert (
        f"post_command exited with code {post_code} (timed out after 1.5 s; ignored: the attempt keeps exit code 2)"
        in system
    )


def test_a_stop_during_pre_skips_the_command_and_runs_post(tmp_path: Path) -> None:
    attempt_dir, proc = start(
        tmp_path,
        "echo main-ran",
        pre_command="echo pre-ready; exec sleep 30",
        post_command='echo "post $DLCLOUD_EXIT_CODE"',
    )
    wait_for(lambda: logged(attempt_dir, "pre:stdout pre-ready"))
    proc.send_signal(signal.SIGTERM)
    result = finish(attempt_dir, proc)
    assert result["stopped"] is True and result["exit_code"] == -signal.SIGTERM
    assert result["message"] == "stopped while pre_command ran; the command did not run"
    assert lines(attempt_dir, "stdout") == []
    assert lines(attempt_dir, "post:stdout") == ["post 143"]
    assert any(text.startswith("stop requested: SIGTERM") for text in lines(attempt_dir, "pre:system"))


def test_nothing_runs_post_when_the_code_was_never_prepared(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "true", post_command="echo post-ran", stop_requested=True)
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == launcher.LAUNCH_FAILED and result["post_exit_code"] is None
    other = tmp_path / "other"
    other.mkdir()
    attempt_dir, proc = start(other, "true", post_command="echo post-ran", code_archive=str(other / "missing.tgz"))
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == launcher.LAUNCH_FAILED and result["post_exit_code"] is None
    assert lines(attempt_dir, "post:stdout") == []


def test_shell_status_follows_the_shell_convention() -> None:
    assert launcher.shell_status(0) == 0
    assert launcher.shell_status(3) == 3
    assert launcher.shell_status(-signal.SIGTERM) == 143
    assert launcher.shell_status(-signal.SIGKILL) == 137
    assert launcher.stream_name("main", "stdout") == "stdout"
    assert launcher.stream_name("post", "system") == "post:system"
