"""The standalone launcher, run the way LocalExecutor runs it: ``python -I -S launcher.py <attempt_dir>``."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlcloud.executors.local import launcher
from tests.job_files import touch_for_job

LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) ((?:pre:|post:)?(?:stdout|stderr|system)) (.*)$")


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


def start(
    tmp_path: Path, command: str, *, stop_requested: bool = False, **fields: Any
) -> tuple[Path, subprocess.Popen[bytes]]:
    """Write workload.json as the executor would and start the launcher on it."""
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir(mode=0o700)
    if stop_requested:
        (attempt_dir / launcher.STOP_REQUEST_FILE).touch()
    workload = {
        "job_id": "job1",
        "tenant_id": "t1",
        "attempt": 1,
        "attempt_dir": str(attempt_dir),
        "command": command,
        "env": {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"},
        "code_archive": None,
        "package": None,
        "gpus": [],
        "cpus": 1.0,
        "memory_bytes": 0,
        "timeout_seconds": None,
        "grace_seconds": 5.0,
        "python": sys.executable,
    }
    workload.update(fields)
    (attempt_dir / "workload.json").write_text(json.dumps(workload))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", launcher.__file__, str(attempt_dir)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    return attempt_dir, proc


def finish(attempt_dir: Path, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> dict[str, Any]:
    """Wait for the launcher to exit and return exit.json."""
    assert proc.wait(timeout=timeout) == 0
    return json.loads((attempt_dir / "exit.json").read_text())


def lines(attempt_dir: Path, stream: str | None = None) -> list[str]:
    """output.log as texts, checking every line's format; only ``stream``'s lines (post:stdout, ...) when given."""
    out = []
    for raw in (attempt_dir / "output.log").read_text().splitlines():
        m = LINE.match(raw)
        assert m, f"badly formatted log line: {raw!r}"
        if stream is None or m.group(2) == stream:
            out.append(m.group(3))
    return out


def logged(attempt_dir: Path, text: str) -> bool:
    path = attempt_dir / "output.log"
    return path.exists() and text in path.read_text()


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group pgid."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = launcher.read_proc_stat(int(name))
            except OSError:
                continue
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                return True
    return False


def child_env(attempt_dir: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines(attempt_dir, "stdout") if "=" in line)


def test_stdout_and_stderr_are_logged_with_timestamps_and_stream_names(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "echo out1; echo err1 >&2; echo out2; printf 'no newline'")
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 0
    assert result["timed_out"] is False and result["stopped"] is False and result["message"] == ""
    assert lines(attempt_dir, "stdout") == ["out1", "out2", "no newline"]
    assert lines(attempt_dir, "stderr") == ["err1"]
    assert any("starting: echo out1" in text for text in lines(attempt_dir, "system"))
    stamp = LINE.match((attempt_dir / "output.log").read_text().splitlines()[0])
    assert stamp is not None and stamp.group(1).endswith("Z")


def test_records_launcher_and_child(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "echo hi")
    result = finish(attempt_dir, proc)
    record = json.loads((attempt_dir / "launcher.json").read_text())
    assert record["pid"] == proc.pid
    assert isinstance(record["proc_start_ticks"], int) and record["proc_start_ticks"] > 0
    assert record["started_at"].endswith("Z") and record["limits"] in ("cgroup2", "cgroup1", "rlimit")
    child = json.loads((attempt_dir / "child.json").read_text())
    assert child["pgid"] == child["pid"] != proc.pid
    assert child["sid"] == proc.pid and child["role"] == "command"
    assert result["finished_at"] >= record["started_at"]
    assert not list(attempt_dir.glob("*.tmp.*"))
    assert (attempt_dir / "code").is_dir()


def test_exit_code_is_recorded(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "exit 3")
    assert finish(attempt_dir, proc)["exit_code"] == 3


def test_sigterm_to_launcher_stops_the_command_gracefully(tmp_path: Path) -> None:
    script = "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    attempt_dir, proc = start(tmp_path, script)
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    proc.send_signal(signal.SIGTERM)
    result = finish(attempt_dir, proc)
    assert result["stopped"] is True and result["timed_out"] is False
    assert result["exit_code"] == 7
    assert "got TERM" in lines(attempt_dir, "stdout")
    assert any("stop requested" in text for text in lines(attempt_dir, "system"))


def test_command_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    script = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
    attempt_dir, proc = start(tmp_path, script, grace_seconds=0.5)
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    result = finish(attempt_dir, proc)
    assert time.monotonic() - sent >= 0.5
    assert result["stopped"] is True
    assert result["exit_code"] == -signal.SIGKILL
    assert any("SIGKILL" in text for text in lines(attempt_dir, "system"))


def test_timeout_terminates_the_command(tmp_path: Path) -> None:
    started = time.monotonic()
    attempt_dir, proc = start(tmp_path, "exec sleep 30", timeout_seconds=0.5, grace_seconds=1.0)
    result = finish(attempt_dir, proc)
    assert time.monotonic() - started < 25  # well before the command's own 30 s
    assert result["timed_out"] is True and result["stopped"] is False
    assert result["exit_code"] == -signal.SIGTERM
    assert "timed out" in result["message"]


def test_sigint_and_sighup_are_ignored(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "echo ready; while [ ! -f go ]; do sleep 0.02; done; echo done")
    wait_for(lambda: logged(attempt_dir, "stdout ready"))
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)  # give a wrongly handled signal the chance to kill it
    assert proc.poll() is None
    touch_for_job(attempt_dir / "code" / "go")
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 0 and result["stopped"] is False
    assert lines(attempt_dir, "stdout")[-1] == "done"


def test_leftover_processes_holding_the_pipes_are_killed(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "sleep 60 & echo started")
    result = finish(attempt_dir, proc, timeout=launcher.PIPE_DRAIN_SECONDS + 10)
    assert result["exit_code"] == 0
    assert lines(attempt_dir, "stdout") == ["started"]
    child = json.loads((attempt_dir / "child.json").read_text())
    assert not group_alive(child["pgid"])


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_code_archive_is_unpacked_into_code_dir(tmp_path: Path) -> None:
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(_tar_gz({"hello.txt": b"hello from archive\n", "pkg/data.txt": b"nested\n"}))
    attempt_dir, proc = start(tmp_path, "cat hello.txt pkg/data.txt; pwd", code_archive=str(archive))
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == 0
    assert lines(attempt_dir, "stdout") == ["hello from archive", "nested", str(attempt_dir / "code")]


def test_archive_escaping_the_code_dir_fails_preparation(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(_tar_gz({"../evil.txt": b"x"}))
    attempt_dir, proc = start(tmp_path, "echo should-not-run", code_archive=str(archive))
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == launcher.LAUNCH_FAILED
    assert "cannot unpack code archive" in result["message"]
    assert not (attempt_dir / "evil.txt").exists()
    assert lines(attempt_dir, "stdout") == []


def test_missing_archive_fails_preparation(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "true", code_archive=str(tmp_path / "missing.tar.gz"))
    result = finish(attempt_dir, proc)
    assert result["exit_code"] == launcher.LAUNCH_FAILED
    assert "preparation failed" in result["message"]


def _wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel for package 'dlc_testpkg'."""
    files = {
        "dlc_testpkg/__init__.py": b"VALUE = 42\n",
        "dlc_testpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: dlc-testpkg\nVersion: 1.0\n",
        "dlc_testpkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("dlc_testpkg-1.0.dist-info/RECORD,,")
    files["dlc_testpkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / "dlc_testpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_package_is_installed_and_put_on_pythonpath(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    command = "python -c 'import dlc_testpkg, os; print(dlc_testpkg.VALUE); print(os.environ[\"PYTHONPATH\"])'"
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "PYTHONPATH": "/x"}
    attempt_dir, proc = start(tmp_path, command, package=str(wheel), env=env)
    result = finish(attempt_dir, proc, timeout=60)
    assert result["exit_code"] == 0, (attempt_dir / "output.log").read_text()
    assert lines(attempt_dir, "stdout") == ["42", f"{attempt_dir / 'packages'}:/x"]
    assert (attempt_dir / "packages" / "dlc_testpkg" / "__init__.py").exists()
    assert any(text.startswith("pip: ") for text in lines(attempt_dir, "system"))


def test_failing_package_install_is_a_preparation_failure(tmp_path: Path) -> None:
    bad = tmp_path / "broken-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip file")
    attempt_dir, proc = start(tmp_path, "echo should-not-run", package=str(bad))
    result = finish(attempt_dir, proc, timeout=60)
    assert result["exit_code"] == launcher.LAUNCH_FAILED
    assert "pip install" in result["message"]
    assert lines(attempt_dir, "stdout") == []


def test_environment_is_exactly_the_workload_env_plus_launcher_variables(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "FOO": "bar baz", "OMP_NUM_THREADS": "7"}
    attempt_dir, proc = start(tmp_path, "env", env=env, gpus=[1, 3], cpus=2.5)
    assert finish(attempt_dir, proc)["exit_code"] == 0
    seen = child_env(attempt_dir)
    assert seen["FOO"] == "bar baz"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1,3"  # unsandboxed: the host's indices
    assert seen["DLCLOUD_GPUS"] == "1,3"
    assert seen["PYTHONUNBUFFERED"] == "1"
    assert seen["OMP_NUM_THREADS"] == "7"  # the user's setting wins
    assert seen["MKL_NUM_THREADS"] == seen["OPENBLAS_NUM_THREADS"] == "2"
    assert seen["DLCLOUD_PHASE"] == "main"
    added = {
        "CUDA_VISIBLE_DEVICES",
        "DLCLOUD_GPUS",
        "PYTHONUNBUFFERED",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "DLCLOUD_PHASE",
    }
    set_by_shell = {"PWD", "SHLVL", "_", "OLDPWD"}
    assert set(seen) - set_by_shell == set(env) | added


def test_no_gpus_means_empty_cuda_visible_devices(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "env")
    assert finish(attempt_dir, proc)["exit_code"] == 0
    assert child_env(attempt_dir)["CUDA_VISIBLE_DEVICES"] == ""


def test_memory_limit_is_applied(tmp_path: Path) -> None:
    limit = 512 * 1024 * 1024
    attempt_dir, proc = start(tmp_path, "cat /proc/self/limits; cat /proc/self/cgroup", memory_bytes=limit)
    assert finish(attempt_dir, proc)["exit_code"] == 0
    record = json.loads((attempt_dir / "launcher.json").read_text())
    out = lines(attempt_dir, "stdout")
    if record["limits"] == "rlimit":  # this machine: no usable cgroup v2 controllers
        data = next(line for line in out if line.startswith("Max data size"))
        assert data.split()[3:5] == [str(limit), str(limit)]
    elif record["limits"] == "cgroup1":  # root on a cgroup v1 host: memory and cpu controllers
        name = os.path.basename(record["cgroup"])
        assert any(":memory:" in line and line.endswith(name) for line in out), out
        assert not any(os.path.exists(d) for d in record["cgroups"])  # removed at the end
    else:
        assert record["limits"] == "cgroup2"
        assert any(line.startswith("0::") and line.endswith(os.path.basename(record["cgroup"])) for line in out)
        assert not os.path.exists(record["cgroup"])  # removed at the end


def test_stop_requested_before_start_runs_nothing(tmp_path: Path) -> None:
    attempt_dir, proc = start(tmp_path, "echo should-not-run", stop_requested=True)
    result = finish(attempt_dir, proc)
    assert result["stopped"] is True
    assert result["exit_code"] == launcher.LAUNCH_FAILED
    assert lines(attempt_dir, "stdout") == []


def test_launcher_error_still_writes_exit_json(tmp_path: Path) -> None:
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir()
    (attempt_dir / "workload.json").write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "-I", "-S", launcher.__file__, str(attempt_dir)], capture_output=True, timeout=30
    )
    assert proc.returncode == 1
    result = json.loads((attempt_dir / "exit.json").read_text())
    assert result["exit_code"] == launcher.LAUNCH_FAILED
    assert result["message"].startswith("launcher error: JSONDecodeError")


def _fake_proc(tmp_path: Path, own: str, mount_root: str, mount_point: Path) -> tuple[str, str]:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text(f"4:memory:/x\n0::{own}\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"41 31 0:38 {mount_root} {mount_point} rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    return str(cgroup), str(mountinfo)


def test_find_cgroup2_dir_on_a_v2_host(tmp_path: Path) -> None:
    mount = tmp_path / "sys-fs-cgroup"
    (mount / "user.slice" / "dlcloud.service").mkdir(parents=True)
    files = _fake_proc(tmp_path, "/user.slice/dlcloud.service", "/", mount)
    assert launcher.find_cgroup2_dir(*files) == str(mount / "user.slice" / "dlcloud.service")


def test_find_cgroup2_dir_in_a_container_seeing_part_of_the_hierarchy(tmp_path: Path) -> None:
    mount = tmp_path / "sys-fs-cgroup"
    (mount / "inner").mkdir(parents=True)
    files = _fake_proc(tmp_path, "/docker/abc/inner", "/docker/abc", mount)
    assert launcher.find_cgroup2_dir(*files) == str(mount / "inner")
    other = _fake_proc(tmp_path, "/elsewhere", "/docker/abc", mount)
    assert launcher.find_cgroup2_dir(*other) is None


def test_no_cgroup2_mount_means_rlimit_fallback(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw,nosuid - proc proc rw\n")
    assert launcher.find_cgroup2_dir(str(cgroup), str(mountinfo)) is None
