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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from dlcloud.executors.base import Egress
from dlcloud.executors.local import job_view, netns_holder
from dlcloud.executors.local import launcher as launcher_mod

log = logging.getLogger(__name__)

SLIRP_DNS = netns_holder.SLIRP_DNS


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


TUN = "/dev/net/tun"


def egress_tools() -> tuple[str, str] | None:
    """(slirp4netns, nft) where both are installed and the tun device can be opened: what egress other than
    ``none`` needs."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
    slirp, nft = shutil.which("slirp4netns", path=path), shutil.which("nft", path=path)
    return (slirp, nft) if slirp and nft and os.access(TUN, os.R_OK | os.W_OK) else None


def describe(job_network: str, default_egress: str, volumes: str = "") -> str:
    """The network part of the start-up banner; ``volumes``: why the holder cannot make overlays of the jobs'
    directories here ("": it can, ``probe_volumes``)."""
    if job_network != "private":
        return "jobs share the host's network (job_network=host); job directories bound as they are"
    tools = (
        "internet and allow-lists available"
        if egress_tools()
        else f"only 'none' (slirp4netns or nft missing, or {TUN} not readable and writable here)"
    )
    dirs = (
        "job directories as overlays (mountinfo names no host path)"
        if not volumes
        else f"job directories bound as they are (no overlays here: {volumes}; mountinfo names their host paths)"
    )
    return f"a network namespace per job reaching only the API; egress by default {default_egress!r}, {tools}; {dirs}"


def probe_volumes(base: Path, userns: bool) -> str:
    """ "" when the holder can make the overlays of job directories under ``base`` (the runs directory) on this
    host, else why not: tried once, in a child in namespaces of its own, as the holder would."""
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".volumes-probe-", dir=base))
    except OSError as exc:
        return f"could not try ({exc.strerror})"
    argv = [sys.executable, "-I", "-S", netns_holder.__file__, "--probe", str(tmp), "1" if userns else "0"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        said = proc.stdout.strip()
        return "" if said == "ok" else said or proc.stderr.strip()[-300:] or f"the probe exited with {proc.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not try ({exc})"
    finally:
        job_view.remove_work_dirs(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_allow(entries: tuple[str, ...]) -> list[str]:
    """The allow-list as addresses and CIDRs: host names resolved now (every address they have); a name that does
    not resolve allows nothing."""
    out: list[str] = []
    for entry in entries:
        try:
            out.append(str(ipaddress.ip_network(entry, strict=False)))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(entry, None, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            log.warning("egress allow-list: %s does not resolve (%s): it allows nothing", entry, exc)
            continue
        out += sorted({str(info[4][0]) for info in infos})
    return out


def egress_record(egress: Egress) -> dict[str, object] | str:
    """network.json's ``egress``, or why the policy cannot be had on this host."""
    if egress.mode == "none":
        return {"mode": "none"}
    tools = egress_tools()
    if tools is None:
        return (
            f"its tenant's network policy (egress {egress.mode!r}) needs slirp4netns, nft and a usable {TUN} on "
            "this host, which it lacks; ask an administrator"
        )
    return {"mode": egress.mode, "allow": resolve_allow(egress.allow), "slirp4netns": tools[0], "nft": tools[1]}


def configure(
    directory: Path,
    api_url: str | None,
    userns: bool,
    egress: Egress = Egress(),
    ends: tuple[Path, ...] = (),
    volumes: dict[str, object] | None = None,
    publish: tuple[str, tuple[int, ...]] = ("127.0.0.1", ()),
) -> None:
    """Configure the holder of the attempt in ``directory``: the attempt's first launcher starts it (a fork of
    itself, detached in a session of its own: no second interpreter on the way to the job's first line). A
    holder left by an earlier start of the same attempt that crashed before its launchers is ended first.
    ``volumes`` (``job_view.holder_volumes``): what it mounts in the mount namespace it makes too. ``publish``:
    (the host address, the ports inside) it forwards from a free port of that address each."""
    _end_holder(directory)
    for name in (netns_holder.READY_FILE, netns_holder.FAILED_FILE):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    listen, target = relay_addresses(api_url)
    policy = egress_record(egress)
    if isinstance(policy, str):
        launcher_mod.write_json_atomic(str(directory / netns_holder.FAILED_FILE), {"message": policy})
        return
    launcher_mod.write_json_atomic(
        str(directory / netns_holder.CONFIG_FILE),
        {
            "listen": listen,
            "target": target,
            "userns": userns,
            "egress": policy,
            "ends": [str(p) for p in ends],
            "volumes": volumes,
            "publish": {"address": publish[0], "ports": list(publish[1])},
        },
    )


def stop(directory: Path) -> None:
    """End the holder of the attempt in ``directory``, if it still runs, and remove its overlays' work
    directories (the attempt is over)."""
    if _end_holder(directory):
        job_view.remove_work_dirs(directory)


def _end_holder(directory: Path) -> bool:
    """End the holder of the attempt in ``directory`` if it still runs; whether it had started."""
    ready = _read(directory / netns_holder.READY_FILE)
    if ready is None:
        return False
    pid, ticks = ready.get("pid"), ready.get("proc_start_ticks")
    if isinstance(pid, int) and launcher_mod.proc_start_ticks(pid) == ticks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the holder leads its session's only group: both halves go
    return True


HOST_PUBLISHED_FILE = "published.json"  # with job_network=host: the ports, where the job itself listens


def endpoints(directory: Path) -> dict[int, str]:
    """Where the ports the attempt in ``directory`` publishes are reached on the host: the holder's forwards
    while it runs, else (host network) the job's own ports."""
    ready = _read(directory / netns_holder.READY_FILE)
    if ready is not None:
        pid, ticks = ready.get("pid"), ready.get("proc_start_ticks")
        published = ready.get("published")
        if not isinstance(pid, int) or launcher_mod.proc_start_ticks(pid) != ticks or not isinstance(published, dict):
            return {}
        return {int(port): f"{at[0]}:{at[1]}" for port, at in published.items() if isinstance(at, list)}
    host = _read(directory / HOST_PUBLISHED_FILE)
    return {int(p): str(at) for p, at in host.items()} if host else {}


def _read(path: Path) -> dict[str, object] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def record(directory: Path, userns: bool, make: bool) -> dict[str, object]:
    """workload.json's ``sandbox.network``: where the launcher finds the attempt's namespace, and whether it
    starts the holder (the attempt's first launcher does)."""
    return {"dir": str(directory), "userns": userns, "make": make}


def host_port_is_free(port: int) -> bool:
    """Whether nothing on this host is bound to ``port`` (TCP, all interfaces)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
