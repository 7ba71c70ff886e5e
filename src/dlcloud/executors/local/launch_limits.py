"""Limits of one local attempt, set up by its launcher: cgroups (CPU, memory, processes), the network namespace
every phase joins, and the disk its writable directories may take. Standard library only (the launcher imports it).

- cgroups: v2 where ours is delegated (``memory.max``, ``cpu.max``, ``pids.max`` in ``<own cgroup>/<name>``),
  else v1 as root (one directory per controller: memory, cpu, pids), else rlimits (``RLIMIT_DATA``, and as
  root ``RLIMIT_NPROC`` for the tenant's uid). Names are random (``dlcloud-<16 hex>``): what a job can read of
  ``/sys/fs/cgroup`` names no job or tenant.
- network: ``join_network`` opens the attempt's namespace (made by ``netns_holder.py``), after checking it is
  the one the holder reported and not this process's own; ``child_setup`` then ``setns``-es every child into it
  before it execs, so no phase ever starts in the host's network.
- disk: ``DiskMeter`` adds up the blocks of the writable directories (never following links) at an interval
  that keeps its own cost near a tenth of a core at worst; the launcher stops the attempt when they pass the
  limit. ``RLIMIT_FSIZE`` bounds any single file at the same limit between two measures.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any

CPU_PERIOD_US = 100_000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
NETWORK_READY_FILE = "network-ready.json"
NETWORK_FAILED_FILE = "network-failed.json"


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def cgroup_name() -> str:
    """A name for an attempt's cgroup that says nothing of whose it is."""
    return f"dlcloud-{os.urandom(8).hex()}"


def find_cgroup2_dir(
    proc_cgroup: str = "/proc/self/cgroup", proc_mountinfo: str = "/proc/self/mountinfo"
) -> str | None:
    """This process's own cgroup v2 directory, when a cgroup2 hierarchy is mounted and we belong to it.

    Works for a pure v2 host (/sys/fs/cgroup), a hybrid one (/sys/fs/cgroup/unified) and containers that
    see a bind-mounted part of the hierarchy (mount root other than "/").
    """
    try:
        own = next(
            (line[3:].strip() for line in _read_text(proc_cgroup).splitlines() if line.startswith("0::")),
            None,
        )
        mountinfo = _read_text(proc_mountinfo).splitlines()
    except OSError:
        return None
    if own is None or own.endswith("(deleted)"):
        return None
    for line in mountinfo:
        left, sep, right = line.partition(" - ")
        if not sep or right.split()[0] != "cgroup2":
            continue
        fields = left.split()
        root, mount_point = fields[3], fields[4]
        # The mount shows the hierarchy from `root`; our path must lie below it to be reachable here.
        if root == "/":
            rel = own
        elif own == root or own.startswith(root.rstrip("/") + "/"):
            rel = own[len(root.rstrip("/")) :]
        else:
            continue
        path = os.path.join(mount_point, rel.lstrip("/"))
        if os.path.isdir(path):
            return path
    return None


def create_cgroup(name: str, cpus: float, memory_bytes: int, pids_max: int = 0) -> str | None:
    """Create ``<own cgroup>/<name>`` with memory.max, cpu.max (and pids.max where the pids controller is
    there), or return None if cgroup v2 is unusable.

    Usable means: a cgroup2 hierarchy with the ``memory`` and ``cpu`` controllers available in our cgroup
    and enabled (or enableable) for its children, and a child cgroup we may create and configure. A
    non-root cgroup that holds processes cannot enable controllers for children (EBUSY): then we fall back.
    """
    parent = find_cgroup2_dir()
    if parent is None:
        return None
    wanted = {"memory", "cpu"}
    try:
        available = set(_read_text(os.path.join(parent, "cgroup.controllers")).split())
        if not wanted <= available:
            return None
        if pids_max > 0 and "pids" in available:
            wanted.add("pids")
        missing = wanted - set(_read_text(os.path.join(parent, "cgroup.subtree_control")).split())
        if missing:
            _write_file(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in sorted(missing)))
        path = os.path.join(parent, name)
        os.mkdir(path)
    except OSError:
        return None
    try:
        _write_file(os.path.join(path, "memory.max"), str(memory_bytes) if memory_bytes > 0 else "max")
        quota = "max" if cpus <= 0 else str(max(1000, int(cpus * CPU_PERIOD_US)))
        _write_file(os.path.join(path, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        if "pids" in wanted:
            _write_file(os.path.join(path, "pids.max"), str(pids_max))
    except OSError:
        remove_cgroup(path)
        return None
    if memory_bytes > 0:
        # Best effort: without these, swap stretches the limit and an OOM kills one process of a gang.
        for file, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            with contextlib.suppress(OSError):
                _write_file(os.path.join(path, file), value)
    return path


def remove_cgroup(path: str) -> None:
    """Kill whatever is left in the cgroup (also processes that left the process group) and remove it."""
    try:
        if os.path.exists(os.path.join(path, "cgroup.kill")):
            _write_file(os.path.join(path, "cgroup.kill"), "1")
        else:
            for pid in _read_text(os.path.join(path, "cgroup.procs")).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 2.0
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)


def create_cgroups_v1(
    name: str, cpus: float, memory_bytes: int, pids_max: int = 0, root: str = "/sys/fs/cgroup"
) -> list[str] | None:
    """As root on a cgroup v1 host: ``<root>/memory/<name>`` with memory.limit_in_bytes and
    ``<root>/cpu/<name>`` with a CFS quota; None when v1 is not usable here (not root, not mounted, no
    permission). The directories are not in any sandbox's view as writable, so a job cannot change them."""
    dirs: list[str] = []
    try:
        if memory_bytes > 0:
            mem = os.path.join(root, "memory", name)
            os.mkdir(mem)
            dirs.append(mem)
            _write_file(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
            with contextlib.suppress(OSError):  # without swap accounting swap can stretch it: best effort
                _write_file(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        if cpus > 0:
            cpu = os.path.join(root, "cpu", name)
            os.mkdir(cpu)
            dirs.append(cpu)
            _write_file(os.path.join(cpu, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write_file(os.path.join(cpu, "cpu.cfs_quota_us"), str(max(1000, int(cpus * CPU_PERIOD_US))))
        if pids_max > 0 and os.path.isdir(os.path.join(root, "pids")):
            pids = os.path.join(root, "pids", name)
            os.mkdir(pids)
            dirs.append(pids)
            _write_file(os.path.join(pids, "pids.max"), str(pids_max))
    except OSError:
        for d in dirs:
            remove_cgroup(d)
        return None
    return dirs or None


def has_pids_limit(cgroups: Sequence[str]) -> bool:
    return any(os.path.exists(os.path.join(c, "pids.max")) for c in cgroups)


def nproc_limit(workload: dict[str, Any], cgroups: Sequence[str], sandboxed: bool, unprivileged: bool) -> int:
    """RLIMIT_NPROC for the attempt's processes, where no pids cgroup bounds them (0: none). As root, the
    tenant's uid (all its jobs together: ``nproc_max``); unprivileged, the sandbox's own user namespace counts
    its processes alone, so it is the replica's pids limit (``pids_max``). Unsandboxed: none (the limit would
    count the control plane's own processes)."""
    if has_pids_limit(cgroups) or not sandboxed:
        return 0
    return int(workload.get("pids_max" if unprivileged else "nproc_max") or 0)


def child_setup(
    cgroups: Sequence[str],
    data_limit: int = 0,
    namespaces: Sequence[tuple[int, int]] = (),
    nproc: int = 0,
    fsize: int = 0,
) -> Callable[[], None] | None:
    """The function run in the child between fork and exec: join the cgroups (or lower RLIMIT_DATA), lower
    RLIMIT_NPROC / RLIMIT_FSIZE, then enter the attempt's namespaces (``(fd, CLONE_NEW*)``, user first).
    A failure raises: the child then never execs (``Popen`` reports it), so nothing runs outside its limits."""
    if not cgroups and data_limit <= 0 and not namespaces and nproc <= 0 and fsize <= 0:
        return None
    setns = ctypes.CDLL(None, use_errno=True).setns if namespaces else None  # resolved before the fork

    def setup() -> None:
        for cgroup in cgroups:
            _write_file(os.path.join(cgroup, "cgroup.procs"), str(os.getpid()))
        for limit, value in ((resource.RLIMIT_DATA, data_limit), (resource.RLIMIT_NPROC, nproc)):
            if value > 0:
                _lower(limit, value)
        if fsize > 0:
            _lower(resource.RLIMIT_FSIZE, fsize)
        for fd, kind in namespaces:
            assert setns is not None
            if setns(fd, kind) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot enter the job's namespaces: {os.strerror(err)}")

    return setup


def _lower(limit: int, value: int) -> None:
    _soft, hard = resource.getrlimit(limit)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))


# --------------------------------------------------------------------------------------------------
# The attempt's network namespace


def start_holder(directory: str, holder: Any) -> None:
    """Start the attempt's network holder (``netns_holder.main``) as a fork of this process, detached: its own
    session and process group (the executor ends it with the group), reparented away from us, its output in
    ``network.log``. Returns as soon as the intermediate child is gone; a failure to fork is written where the
    launchers look for it."""
    try:
        first = os.fork()
    except OSError as exc:
        holder.write_failed(directory, f"could not start its holder: {exc.strerror}")
        return
    if first:
        os.waitpid(first, 0)
        return
    try:  # the intermediate child: a new session, then the holder in a group of its own, and away
        os.setsid()
        if os.fork():
            os._exit(0)
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(os.path.join(directory, "network.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 65536)
        code = holder.main(["netns_holder", directory])
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            holder.write_failed(directory, f"its holder failed: {exc}")
        code = 1
    os._exit(code)


class NetworkError(Exception):
    """The attempt's network namespace is not there or not the one the holder made; the message says why."""


def join_network(
    directory: str, holder: Any, userns: bool, timeout: float, stopped: Callable[[], bool]
) -> list[tuple[int, int]]:
    """Wait for the holder in ``directory`` to report its namespace, open it (and, unprivileged, its user
    namespace) and check it: the holder's inside process still the one it reported (``holder.start_ticks``), the
    namespace the one it reported and not ours. Returns ``(fd, CLONE_NEW*)`` pairs for ``child_setup``
    (close-on-exec fds). ``stopped()`` true ends the wait early (NetworkError)."""
    ready_path = os.path.join(directory, NETWORK_READY_FILE)
    failed_path = os.path.join(directory, NETWORK_FAILED_FILE)
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not os.path.exists(ready_path):
        if os.path.exists(failed_path):
            with open(failed_path, encoding="utf-8") as f:
                why = str(json.load(f).get("message") or "unknown error")
            raise NetworkError(f"the job's network namespace could not be made: {why}")
        if stopped():
            raise NetworkError("stopped while the job's network namespace was being made")
        if time.monotonic() >= deadline:
            raise NetworkError(f"the job's network namespace was not ready within {timeout:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.005)  # the job waits: a look costs ~10 us, one too late up to the whole delay
    with open(ready_path, encoding="utf-8") as f:
        ready: dict[str, Any] = json.load(f)
    pid = int(ready["inside_pid"])
    kinds = [("user", CLONE_NEWUSER)] if userns else []
    if ready.get("mntns_inode") is not None:  # the job's volumes (job_view.py)
        kinds.append(("mnt", CLONE_NEWNS))
    opened: list[tuple[int, int]] = []
    try:
        for name, kind in [*kinds, ("net", CLONE_NEWNET)]:
            opened.append((os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), kind))
        net_inode = os.fstat(opened[-1][0]).st_ino
        mnt = [os.fstat(fd).st_ino for fd, kind in opened if kind == CLONE_NEWNS]
        if holder.start_ticks(pid) != ready.get("inside_start_ticks") or net_inode != ready.get("netns_inode"):
            raise NetworkError("the job's network namespace is gone (its holder process ended)")
        if mnt and mnt[0] != ready.get("mntns_inode"):
            raise NetworkError("the job's mount namespace is gone (its holder process ended)")
        if net_inode == os.stat("/proc/self/ns/net").st_ino:
            raise NetworkError("the job's network namespace is the host's: refusing to run in it")
    except OSError as exc:
        for fd, _ in opened:
            os.close(fd)
        raise NetworkError(f"the job's network namespace is gone: {exc.strerror}") from None
    except NetworkError:
        for fd, _ in opened:
            os.close(fd)
        raise
    return opened


# --------------------------------------------------------------------------------------------------
# Disk


class DiskMeter:
    """What the attempt's writable directories take on disk, measured now and then (blocks, links never
    followed, each inode once); ``due`` spaces the measures so that they cost at most ~10 % of one core."""

    MIN_INTERVAL = 1.0
    MAX_INTERVAL = 30.0

    def __init__(self, directories: Sequence[str], limit: int) -> None:
        self.directories = list(directories)
        self.limit = limit
        self.next_at = time.monotonic() + 0.5
        self.used = 0
        self.reason = ""  # why the attempt was stopped for its disk use ("": it was not)
        self.stopped_phases: set[str] = set()

    def over(self, phase: str) -> str | None:
        """Measure; past the limit, why (once per phase: the caller stops that phase), else None."""
        used = self.measure()
        if used <= self.limit or phase in self.stopped_phases:
            return None
        self.stopped_phases.add(phase)
        limit = format_bytes(self.limit)
        why = f"its directories took {format_bytes(used)} on disk, over the job's disk limit of {limit}"
        self.reason = f"stopped: {why}"
        return why

    def note_failure(self, code: int) -> None:
        """A command that failed with a file stopped at the limit (RLIMIT_FSIZE: SIGXFSZ, or EFBIG where it is
        ignored, as in Python) left its directories at the limit: that is why it failed."""
        if self.reason or code == 0:
            return
        if code == -signal.SIGXFSZ or self.measure() >= self.limit:
            self.reason = f"stopped: a file it wrote reached the job's disk limit of {format_bytes(self.limit)}"

    def due(self, now: float) -> bool:
        return self.limit > 0 and now >= self.next_at

    def measure(self) -> int:
        started = time.monotonic()
        seen: set[tuple[int, int]] = set()
        total = 0
        stack = list(self.directories)
        while stack:
            path = stack.pop()
            with contextlib.suppress(OSError), os.scandir(path) as it:
                for entry in it:
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
                        if stat.S_ISDIR(st.st_mode):
                            stack.append(entry.path)
        spent = time.monotonic() - started
        self.next_at = time.monotonic() + min(self.MAX_INTERVAL, max(self.MIN_INTERVAL, spent * 10))
        self.used = total
        return total


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
