"""Helpers shared by the benchmark scripts (run as ``python bench/<name>.py``)."""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def machine() -> str:
    """CPU model, cores, Python and kernel: printed with every table."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return f"{model}, {cores} cores ({usable} usable), Python {platform.python_version()}, Linux {platform.release()}"


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def load_average() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A server in a child process with a throwaway HOME; ``stop()`` is always safe to call."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name
        self.port = free_port()
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(
        self, argv: list[str], ready_path: str, timeout: float = 60.0, extra_env: dict[str, str] | None = None
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
        env.update(extra_env or {})
        env["HOME"] = str(self.root / "home")
        env["XDG_CONFIG_HOME"] = str(self.root / "config")
        (self.root / "home").mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.endpoint + ready_path, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready in {timeout:g} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class DlcloudServer(Process):
    """``dlcloud up`` on a free port with its own data dir."""

    def __init__(self, root: Path, name: str = "dlcloud") -> None:
        super().__init__(root, name)
        self.data_dir = root / name
        self.isolation = ""  # what it printed at start

    def start(
        self,
        log_level: str = "warning",
        sandbox: str = "auto",
        extra_args: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> tuple[str, str]:
        """Returns the bootstrap admin's (access_key, secret_key). ``sandbox``: ``auto`` or ``off``;
        ``extra_args``: more options of ``dlcloud up``; ``extra_env``: settings (``DLCLOUD_...``) for it."""
        argv = [sys.executable, "-m", "dlcloud.cli.main", "up", "--port", str(self.port)]
        argv += ["--data-dir", str(self.data_dir), "--no-profile", "--log-level", log_level, "--sandbox", sandbox]
        self._spawn(argv + (extra_args or []), "/readyz", extra_env=extra_env)
        self.isolation = self._isolation_line()
        if sandbox != "off" and not self.isolation.startswith("bubblewrap"):
            self.stop()
            raise RuntimeError(f"{self.name}: the sandbox is not active here (install bubblewrap): {self.isolation}")
        boot = json.loads((self.data_dir / "bootstrap-admin.json").read_text())
        return boot["access_key"], boot["secret_key"]

    def _isolation_line(self, timeout: float = 10.0) -> str:
        """What ``dlcloud up`` printed after ``isolation:`` at start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("isolation: "):
                    return line.removeprefix("isolation: ").strip()
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} printed no isolation line:\n{self.log_path.read_text()}")


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3... of /proc/PID/stat (after the command name), or None if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_tree(root: int) -> dict[int, str]:
    """``root`` and its descendants (the API workers of ``dlcloud up``; Ray's raylet, workers and replicas),
    each with its start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            starts[int(entry.name)] = fields[19]
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts:
            tree[pid] = starts[pid]
            todo.extend(children.get(pid, ()))
    return tree


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0
    for pid in process_tree(root):
        if (fields := proc_stat(pid)) is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")
