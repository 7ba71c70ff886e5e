"""The network of local attempts, host side: each attempt (a gang's replicas together) gets a network namespace of
its own, made and held by a detached holder process (``netns_holder.py``), which also relays connections made
inside to the control plane's API, and to nothing else.

Invariants:
- ``start`` is called once per attempt directory, before its launchers; the launchers wait for the holder's
  ``network-ready.json`` and never run a phase outside the namespace (``launch_limits.join_network``).
- ``stop`` ends the holder (its whole process group) once every launcher of the attempt has ended; it is
  idempotent and checks the recorded start ticks, so no reused pid is signalled.
- The holder runs as the control plane's user, outside every sandbox; as root its inside half drops to
  ``nobody`` once the namespace is up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from dlcloud.executors.local import launcher as launcher_mod
from dlcloud.executors.local import netns_holder

log = logging.getLogger(__name__)

HOLDER_PATH = Path(netns_holder.__file__).resolve()
HOLDER_LOG = "network.log"


def relay_addresses(api_url: str | None) -> tuple[list[object] | None, list[object] | None]:
    """(where the relay listens inside the namespace, where it connects outside) for jobs that reach the API at
    ``api_url``: the same loopback address and port on both sides, so ``DLCLOUD_METRICS_URL`` is unchanged. An
    API URL that is not on loopback gets no relay (the job reaches it, if at all, by the egress policy)."""
    if not api_url:
        return None, None
    parts = urlsplit(api_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if host == "localhost":
        host = "127.0.0.1"
    try:
        if not ipaddress.ip_address(host).is_loopback:
            return None, None
    except ValueError:
        return None, None
    return [host, port], [host, port]


def start(directory: Path, api_url: str | None, userns: bool, env: dict[str, str]) -> None:
    """Start the holder of the attempt in ``directory`` (detached, its own session); returns at once. A holder
    left by an earlier start of the same attempt that crashed before its launchers is ended first."""
    stop(directory)
    for name in (netns_holder.READY_FILE, netns_holder.FAILED_FILE):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    listen, target = relay_addresses(api_url)
    launcher_mod.write_json_atomic(
        str(directory / netns_holder.CONFIG_FILE), {"listen": listen, "target": target, "userns": userns}
    )
    log_fd = os.open(directory / HOLDER_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        subprocess.Popen(
            [sys.executable, "-I", "-S", str(HOLDER_PATH), str(directory)],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        launcher_mod.write_json_atomic(
            str(directory / netns_holder.FAILED_FILE), {"message": f"could not start its holder: {exc.strerror}"}
        )
    finally:
        os.close(log_fd)


def stop(directory: Path) -> None:
    """End the holder of the attempt in ``directory``, if it still runs."""
    ready = _read(directory / netns_holder.READY_FILE)
    if ready is None:
        return
    pid, ticks = ready.get("pid"), ready.get("proc_start_ticks")
    if isinstance(pid, int) and launcher_mod.proc_start_ticks(pid) == ticks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the holder leads its session's only group: both halves go


def _read(path: Path) -> dict[str, object] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def record(directory: Path, userns: bool) -> dict[str, object]:
    """workload.json's ``sandbox.network``: where the launcher finds the attempt's namespace."""
    return {"dir": str(directory), "userns": userns}
