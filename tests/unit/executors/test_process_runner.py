"""ProcessRunner (the local executor's process layer): start / poll / stop through the attempt directory,
across control-plane restarts."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dlcloud.errors import InvalidState
from dlcloud.executors import AttemptReport
from dlcloud.executors.local import launcher
from dlcloud.executors.local import runner as runner_mod
from dlcloud.executors.local.runner import ProcessRunner, Run, stop_deadline
from dlcloud.executors.local.sandbox import Sandbox
from tests.job_files import touch_for_job

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z ((?:pre:|post:)?(?:stdout|stderr|system)) (.*)$")


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll predicate until it returns something truthy; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


@pytest.fixture(params=["sandboxed", "bare"])
def executor(request: pytest.FixtureRequest) -> Iterator[ProcessRunner]:
    """Both ways of running: in bubblewrap sandboxes, and bare (``dlcloud up --sandbox off``)."""
    ex = ProcessRunner(sandbox=Sandbox(False, "off in this test")) if request.param == "bare" else ProcessRunner()
    if request.param == "sandboxed":
        assert ex.sandbox.enabled, ex.sandbox.reason
    yield ex
    ex.reap()


def workload(attempt_dir: Path, command: str, **fields: Any) -> Run:
    return Run(job_id="job1", tenant_id="t1", attempt=1, attempt_dir=attempt_dir, command=command, **fields)


def wait_state(ex: ProcessRunner, attempt_dir: Path, state: str, timeout: float = 15.0) -> AttemptReport:
    def check() -> AttemptReport | None:
        report = ex.poll(attempt_dir)
        return report if report.state == state else None

    report: AttemptReport = wait_for(check, timeout)
    return report


def output(attempt_dir: Path, stream: str) -> list[str]:
    out = []
    for raw in (attempt_dir / "output.log").read_text().splitlines():
        m = LINE.match(raw)
        assert m, f"badly formatted log line: {raw!r}"
        if m.group(1) == stream:
            out.append(m.group(2))
    return out


def logged(attempt_dir: Path, text: str) -> bool:
    path = attempt_dir / "output.log"
    return path.exists() and text in path.read_text()


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group pgid."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                st = launcher.read_proc_stat(int(name))
            except OSError:
                continue
            if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
                return True
    return False


def test_runs_command_and_reports_exit(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "jobs" / "job1" / "1"
    executor.start(workload(attempt_dir, "echo to-out; echo to-err >&2"))
    assert executor.poll(attempt_dir).state in ("pending", "running", "exited")
    report = wait_state(executor, attempt_dir, "exited")
    assert report.exit_code == 0 and not report.timed_out and not report.stopped and report.message == ""
    assert report.started_at is not None and report.finished_at is not None
    assert report.started_at <= report.finished_at and report.started_at.tzinfo is not None
    assert report.pid == json.loads((attempt_dir / "launcher.json").read_text())["pid"]
    assert output(attempt_dir, "stdout") == ["to-out"]
    assert output(attempt_dir, "stderr") == ["to-err"]
    assert executor.log_files(attempt_dir) == {"": attempt_dir / "output.log"}
    for d in (tmp_path / "jobs", tmp_path / "jobs" / "job1", attempt_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((attempt_dir / "workload.json").stat().st_mode) == 0o600


def test_exit_code_is_reported(executor: ProcessRunner, tmp_path: Path) -> None:
    executor.start(workload(tmp_path / "a", "exit 3"))
    assert wait_state(executor, tmp_path / "a", "exited").exit_code == 3


def test_attempt_dir_cannot_be_reused(executor: ProcessRunner, tmp_path: Path) -> None:
    executor.start(workload(tmp_path / "a", "true"))
    with pytest.raises(InvalidState, match="already used"):
        executor.start(workload(tmp_path / "a", "true"))
    wait_state(executor, tmp_path / "a", "exited")


def test_stop_delivers_sigterm(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    script = "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    executor.start(workload(attempt_dir, script, grace_seconds=120.0))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    assert executor.poll(attempt_dir).state == "running"
    started = time.monotonic()
    executor.stop(attempt_dir)
    assert time.monotonic() - started < 60  # stop never waits for the grace period (120 s)
    report = wait_state(executor, attempt_dir, "exited")
    assert report.stopped and report.exit_code == 7 and report.message == "stopped"
    assert "got TERM" in output(attempt_dir, "stdout")


def test_stop_ends_the_command_then_runs_post(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    post = 'echo "post $DLCLOUD_EXIT_CODE $DLCLOUD_PHASE"; exit 4'
    executor.start(workload(attempt_dir, "echo ready; exec sleep 30", pre_command="echo pre", post_command=post))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    executor.stop(attempt_dir)
    report = wait_state(executor, attempt_dir, "exited")
    assert report.stopped and report.exit_code == -signal.SIGTERM
    assert report.post_exit_code == 4 and not report.post_timed_out
    assert output(attempt_dir, "pre:stdout") == ["pre"]
    assert output(attempt_dir, "post:stdout") == ["post 143 post"]
    assert json.loads((attempt_dir / "workload.json").read_text())["post_command"] == post


def test_stop_deadline_leaves_room_for_the_grace_period_and_post() -> None:
    phase = 10 + launcher.PIPE_DRAIN_SECONDS + 1
    plain = stop_deadline({"grace_seconds": 10})
    assert plain == phase + runner_mod.STOP_MARGIN_SECONDS
    assert stop_deadline({"grace_seconds": 10, "post_command": "x", "post_timeout_seconds": 60}) == plain + 60 + phase
    assert stop_deadline({"grace_seconds": 10, "post_command": "x"}) == plain + 300 + phase


def test_a_launcher_stuck_after_a_stop_is_killed_with_its_command(
    monkeypatch: pytest.MonkeyPatch, executor: ProcessRunner, tmp_path: Path
) -> None:
    # the fallback of the stop protocol: past grace + post_timeout + margin the executor SIGKILLs itself
    monkeypatch.setattr(runner_mod, "STOP_MARGIN_SECONDS", 0.0)
    monkeypatch.setattr(launcher, "PIPE_DRAIN_SECONDS", 0.0)  # only this process's arithmetic
    attempt_dir = tmp_path / "a"
    fields: dict[str, Any] = {"grace_seconds": 0.1, "post_command": "true", "post_timeout_seconds": 0.1}
    executor.start(workload(attempt_dir, "echo ready; exec sleep 30", **fields))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    launcher_pid = json.loads((attempt_dir / "launcher.json").read_text())["pid"]
    pgid = json.loads((attempt_dir / "child.json").read_text())["pgid"]
    os.kill(launcher_pid, signal.SIGSTOP)  # a launcher that no longer acts on anything
    executor.stop(attempt_dir)
    report = wait_state(executor, attempt_dir, "lost")
    assert "gone" in report.message
    wait_for(lambda: not group_alive(pgid))


def test_stop_kills_command_ignoring_sigterm_after_grace(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    executor.start(workload(attempt_dir, "trap '' TERM; echo ready; while :; do sleep 0.05; done", grace_seconds=0.5))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    executor.stop(attempt_dir)
    report = wait_state(executor, attempt_dir, "exited")
    assert report.stopped and report.exit_code == -signal.SIGKILL


def test_stop_right_after_start_is_not_lost(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    executor.start(workload(attempt_dir, "sleep 30"))
    executor.stop(attempt_dir)  # most likely before the launcher has written launcher.json
    report = wait_state(executor, attempt_dir, "exited")
    assert report.stopped


def test_stop_after_exit_is_harmless(executor: ProcessRunner, tmp_path: Path) -> None:
    executor.start(workload(tmp_path / "a", "exit 0"))
    wait_state(executor, tmp_path / "a", "exited")
    executor.stop(tmp_path / "a")
    executor.stop(tmp_path / "never-started")
    report = executor.poll(tmp_path / "a")
    assert report.state == "exited" and not report.stopped


def test_timeout(executor: ProcessRunner, tmp_path: Path) -> None:
    executor.start(workload(tmp_path / "a", "exec sleep 30", timeout_seconds=0.5, grace_seconds=1.0))
    report = wait_state(executor, tmp_path / "a", "exited")
    assert report.timed_out and not report.stopped
    assert report.exit_code == -signal.SIGTERM


def test_attempt_survives_the_process_that_started_it(tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    starter = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dlcloud.executors.local.runner import ProcessRunner, Run\n"
        "ProcessRunner().start(Run('job1', 't1', 1, Path(sys.argv[1]),"
        " 'echo ready; while [ ! -f go ]; do sleep 0.02; done; echo done'))\n"
    )
    subprocess.run([sys.executable, "-c", starter, str(attempt_dir)], check=True, timeout=30)
    restarted = ProcessRunner()  # a new control plane: nothing in memory about this attempt
    report = wait_state(restarted, attempt_dir, "running")
    assert report.pid is not None and report.started_at is not None
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    touch_for_job(attempt_dir / "code" / "go")
    report = wait_state(restarted, attempt_dir, "exited")
    assert report.exit_code == 0
    assert output(attempt_dir, "stdout") == ["ready", "done"]


def test_new_executor_can_stop_attempt_of_previous_one(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    executor.start(workload(attempt_dir, "echo ready; exec sleep 30"))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    restarted = ProcessRunner()
    restarted.stop(attempt_dir)
    report = wait_state(restarted, attempt_dir, "exited")
    assert report.stopped and report.exit_code == -signal.SIGTERM


def test_killed_launcher_and_command_are_lost(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    executor.start(workload(attempt_dir, "echo ready; exec sleep 30"))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    launcher_pid = json.loads((attempt_dir / "launcher.json").read_text())["pid"]
    child = json.loads((attempt_dir / "child.json").read_text())
    os.kill(launcher_pid, signal.SIGKILL)
    os.killpg(child["pgid"], signal.SIGKILL)
    report = wait_state(executor, attempt_dir, "lost")
    assert "gone" in report.message and report.exit_code is None
    assert ProcessRunner().poll(attempt_dir).state == "lost"


def test_stop_kills_command_whose_launcher_died(executor: ProcessRunner, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "a"
    executor.start(workload(attempt_dir, "trap '' TERM; echo ready; while :; do sleep 0.05; done", grace_seconds=0.3))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    os.kill(json.loads((attempt_dir / "launcher.json").read_text())["pid"], signal.SIGKILL)
    wait_state(executor, attempt_dir, "lost")
    pgid = json.loads((attempt_dir / "child.json").read_text())["pgid"]
    if executor.sandbox.enabled:  # a sandbox dies with its launcher (bwrap --die-with-parent)
        wait_for(lambda: not group_alive(pgid))
        return
    assert group_alive(pgid)
    ProcessRunner().stop(attempt_dir)  # SIGTERM is ignored: SIGKILL follows after the grace period
    wait_for(lambda: not group_alive(pgid))


def test_unknown_attempt_is_lost(executor: ProcessRunner, tmp_path: Path) -> None:
    report = executor.poll(tmp_path / "nothing-here")
    assert report.state == "lost" and "never started" in report.message


def test_reap_leaves_no_zombie_launcher(executor: ProcessRunner, tmp_path: Path) -> None:
    executor.start(workload(tmp_path / "a", "true"))
    pid = wait_state(executor, tmp_path / "a", "exited").pid
    assert pid is not None

    def reaped() -> bool:
        executor.reap()
        return launcher.read_proc_stat(pid) is None

    wait_for(reaped)
    assert executor.poll(tmp_path / "a").state == "exited"


def test_env_has_workload_env_but_not_server_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DLCLOUD_SECRET_KEY", "server-secret")
    monkeypatch.setenv("SOME_SERVER_VAR", "server-only")
    ex = ProcessRunner()
    attempt_dir = tmp_path / "a"
    ex.start(workload(attempt_dir, "env; echo ready; while [ ! -f go ]; do sleep 0.02; done", env={"FOO": "bar"}))
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    launcher_pid = json.loads((attempt_dir / "launcher.json").read_text())["pid"]
    launcher_environ = Path(f"/proc/{launcher_pid}/environ").read_bytes()
    touch_for_job(attempt_dir / "code" / "go")
    assert wait_state(ex, attempt_dir, "exited").exit_code == 0
    ex.reap()
    env = dict(line.split("=", 1) for line in output(attempt_dir, "stdout") if "=" in line)
    assert env["FOO"] == "bar"
    assert "DLCLOUD_SECRET_KEY" not in env and "SOME_SERVER_VAR" not in env
    assert b"server-secret" not in launcher_environ
    assert b"server-secret" not in (attempt_dir / "workload.json").read_bytes()
    assert env["PATH"].split(":")[0] == os.path.dirname(os.path.abspath(sys.executable))
    assert env["PYTHONUNBUFFERED"] == "1"


def test_base_env_replaces_inherited_variables(tmp_path: Path) -> None:
    ex = ProcessRunner(python="/opt/py/bin/python3", base_env={"PATH": "/usr/bin:/bin", "X": "1", "DLCLOUD_X": "2"})
    assert ex.base_env == {"PATH": "/opt/py/bin:/usr/bin:/bin", "X": "1"}
    job = workload(tmp_path / "a", "true", env={"X": "from-job", "DLCLOUD_JOB": "job1"})
    assert ex.build_env(job) == {"PATH": "/opt/py/bin:/usr/bin:/bin", "X": "from-job", "DLCLOUD_JOB": "job1"}


def test_gpus_set_cuda_visible_devices(executor: ProcessRunner, tmp_path: Path) -> None:
    show = 'echo "[$CUDA_VISIBLE_DEVICES] [$DLCLOUD_GPUS]"'
    executor.start(workload(tmp_path / "a", show, gpus=(0, 2)))
    executor.start(workload(tmp_path / "b", show))
    assert wait_state(executor, tmp_path / "a", "exited").exit_code == 0
    assert wait_state(executor, tmp_path / "b", "exited").exit_code == 0
    # in a sandbox only the GPUs' own device nodes exist, which CUDA numbers from 0
    visible = "0,1" if executor.sandbox.enabled else "0,2"
    assert output(tmp_path / "a", "stdout") == [f"[{visible}] [0,2]"]
    assert output(tmp_path / "b", "stdout") == ["[] []"]


def test_code_archive_is_unpacked(executor: ProcessRunner, tmp_path: Path) -> None:
    archive = tmp_path / "code.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"print('trained')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    executor.start(workload(tmp_path / "a", "python train.py", code_archive=archive))
    assert wait_state(executor, tmp_path / "a", "exited").exit_code == 0
    assert (tmp_path / "a" / "code" / "train.py").exists()
    assert output(tmp_path / "a", "stdout") == ["trained"]


def test_memory_limit_uses_rlimit_without_cgroup2(executor: ProcessRunner, tmp_path: Path) -> None:
    limit = 768 * 1024 * 1024
    attempt_dir = tmp_path / "a"
    executor.start(workload(attempt_dir, "grep 'Max data size' /proc/self/limits", memory_bytes=limit))
    assert wait_state(executor, attempt_dir, "exited").exit_code == 0
    record = json.loads((attempt_dir / "launcher.json").read_text())
    if record["limits"] == "rlimit":
        assert output(attempt_dir, "stdout")[0].split()[3:5] == [str(limit), str(limit)]
    else:  # a host with usable cgroups: the limit is memory.max / memory.limit_in_bytes, RLIMIT_DATA as it was
        assert record["limits"] in ("cgroup2", "cgroup1") and record["cgroup"]


def test_a_job_over_its_memory_limit_fails_and_cannot_raise_it(executor: ProcessRunner, tmp_path: Path) -> None:
    limit = 128 * 1024 * 1024
    attempt_dir = tmp_path / "a"
    grab = "python3 -c \"b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('grabbed')\""
    raise_it = "for f in /sys/fs/cgroup/memory/dlcloud-*/memory.limit_in_bytes; do echo -1 > $f && echo raised; done"
    executor.start(workload(attempt_dir, f"{raise_it}; {grab}", memory_bytes=limit))
    report = wait_state(executor, attempt_dir, "exited", timeout=60)
    assert report.exit_code != 0, output(attempt_dir, "stdout")
    assert "grabbed" not in output(attempt_dir, "stdout") and "raised" not in output(attempt_dir, "stdout")


def test_launcher_that_cannot_be_spawned_is_reported_at_once(
    monkeypatch: pytest.MonkeyPatch, executor: ProcessRunner, tmp_path: Path
) -> None:
    def no_spawn(*args: Any, **kwargs: Any) -> None:
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    executor.start(workload(tmp_path / "a", "true"))
    report = executor.poll(tmp_path / "a")
    assert report.state == "exited" and report.exit_code == launcher.LAUNCH_FAILED
    assert "no more processes" in report.message


def test_a_stop_before_a_gang_starts_reaches_every_replica(executor: ProcessRunner, tmp_path: Path) -> None:
    """A stop that came while the attempt was prepared (the marker in the attempt directory, before gang.json
    existed) stops every replica, also those that a later read of gang.json would not have found yet."""
    from dlcloud.executors.base import Replica

    attempt_dir = tmp_path / "gang"
    attempt_dir.mkdir()
    (attempt_dir / launcher.STOP_REQUEST_FILE).touch()
    replicas = tuple(Replica(name=f"worker-{i}", role="worker", index=i, decides=i == 0) for i in range(3))
    executor.start(workload(attempt_dir, "exec sleep 30", replicas=replicas, grace_seconds=1.0))
    report = wait_state(executor, attempt_dir, "exited")
    assert [(r.name, r.stopped or r.exit_code == launcher.LAUNCH_FAILED) for r in report.replicas] == [
        (f"worker-{i}", True) for i in range(3)
    ]
