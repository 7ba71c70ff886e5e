"""Sandboxes for user code on this host, built with bubblewrap (``bwrap``).

Every process that runs user-supplied code or build steps (job phases, the pip install of a job's
package, environment builds, model inspection) starts under the argv prefix that ``Sandbox.wrap`` returns.

What a sandboxed process gets (see docs/isolation.md for what this does and does not isolate):
- its own mount namespace: a read-only root made of the system directories (``/usr``, ``/etc``, the
  ``/bin``-style links), the Python installations it needs and ``/sys``, all read-only; writable are only
  the directories named in its ``View`` (a job's: /job/code, /job/checkpoints, ...) and a private
  ``/tmp`` (the View's, or a tmpfs). The data directory, the server key, the database, the bootstrap key
  and every other job's files are not in its view: nothing above the bound directories is mounted;
- its own PID and IPC namespaces (``/proc`` shows only its own processes) and a private ``/dev`` with only
  the standard nodes and the GPUs it was given; unprivileged, also its own user namespace (no nested ones);
- as root: the unprivileged uid/gid of its tenant (``Sandbox.uid_for``), with no capabilities and
  no-new-privileges, set by ``setpriv`` inside the sandbox, so even an escape lands on a user that owns
  nothing of the platform's;
- the network its View says: the attempt's own namespace, which the launcher joins before bwrap starts
  (``joins_network``; jobs), none at all (``network=False``: the event-file reader, model inspection), or the
  host's (environment builds; jobs with ``job_network=host``).

Invariants:
- ``wrap`` never mounts a path that is not a system directory, a Python installation, or named in the
  View. ``writable`` and ``readonly`` paths are seen at their host paths; ``mounts`` and ``binds`` at the path
  the View names (a job's directories: at the neutral paths of ``job_view.py``).
- Signals: the outer bwrap process leads the caller's process group. A SIGTERM to the group kills bwrap,
  which SIGKILLs the sandbox (``--die-with-parent``): graceful stops must signal the group's other
  members (``launcher.signal_group_except``). SIGKILL to the group ends the whole sandbox, including
  processes that left the group.
- bwrap reports a process killed by signal N as exit status 128+N.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# read-only system directories; the ones that are symlinks (merged /usr) are recreated as links
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
GPU_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
BUILD_SLOT = 0  # environment builds are shared by tenants: they run as the first uid of the range


@dataclass(frozen=True)
class View:
    """What one sandboxed process may see besides the system: host paths, at the same paths or where named."""

    writable: tuple[Path, ...] = ()
    readonly: tuple[Path, ...] = ()
    # read-only, at another path: (host path, path in the sandbox), e.g. a dataset at /datasets/<name>, so the
    # job learns nothing of where the host keeps it
    mounts: tuple[tuple[Path, str], ...] = ()
    # writable, at another path: (host path, path in the sandbox), e.g. a job's checkpoints at /job/checkpoints
    binds: tuple[tuple[Path, str], ...] = ()
    tmp: Path | None = None  # mounted at /tmp (private when None: an empty directory on the sandbox's root)
    shm: Path | None = None  # mounted at /dev/shm (a gang's replicas share one); None: private
    gpus: tuple[int, ...] = ()
    cwd: Path | None = None
    network: bool = True  # False: a network namespace of its own, with nothing in it (not even loopback's peers)
    # True: the process is started inside the attempt's network namespace (the launcher joins it, and, unprivileged,
    # the user namespace that owns it: bwrap then runs as uid 0 there and must drop what that gives)
    joins_network: bool = False
    user_namespaces: bool = False  # it may make user namespaces of its own (else, unprivileged: --disable-userns)


@dataclass(frozen=True)
class Sandbox:
    """How this host sandboxes user code, decided once at start (``probe``).

    ``enabled`` False means processes run as the control plane's own user, without namespaces: the
    reason says why, and ``dlcloud up`` then runs only one tenant's jobs unless told otherwise.
    """

    enabled: bool
    reason: str = ""
    bwrap: str = "bwrap"
    setpriv: str | None = None  # set when running as root: per-tenant uids
    uid_start: int = 200_000
    uid_count: int = 100_000
    python_paths: tuple[Path, ...] = ()  # Python installations every sandbox sees read-only
    disable_userns: bool = True
    extra: tuple[str, ...] = field(default=())

    @property
    def per_tenant_uids(self) -> bool:
        return self.enabled and self.setpriv is not None

    def describe(self) -> str:
        """One line for the start-up banner and ``/readyz``-style reports."""
        if not self.enabled:
            return f"no sandbox ({self.reason})"
        if self.per_tenant_uids:
            last = self.uid_start + self.uid_count - 1
            return (
                "bubblewrap sandbox: mount, PID and IPC namespaces; jobs run as per-tenant uids "
                f"{self.uid_start}-{last} without capabilities"
            )
        return "bubblewrap sandbox: mount, PID, IPC and user namespaces; jobs run as the control plane's uid"

    def uid_for(self, slot: int | None) -> int | None:
        """The uid (= gid) of a tenant's sandboxes, or None when the sandbox keeps the control plane's."""
        if not self.per_tenant_uids:
            return None
        slot = BUILD_SLOT if slot is None else slot
        if not 0 <= slot < self.uid_count:
            raise ValueError(f"tenant slot {slot} is outside the sandbox uid range of {self.uid_count} uids")
        return self.uid_start + slot

    def wrap(self, view: View, uid: int | None) -> list[str]:
        """The argv prefix that runs a command in a sandbox with ``view`` (append the command to it).

        Unprivileged control plane: bwrap makes a user namespace (``--disable-userns`` forbids more).
        Root: bwrap runs privileged (so it can bind paths the tenant's uid could not reach, like a Python
        under /root) without a user namespace, and ``setpriv`` inside drops to ``uid`` with no capabilities,
        no-new-privileges (set-uid binaries gain nothing) before the command starts.
        """
        argv = [self.bwrap]
        if uid is None:
            no_more = self.disable_userns and not view.user_namespaces
            argv += ["--unshare-user", *(["--disable-userns"] if no_more else [])]
            if view.joins_network:  # the control plane's uid and gid inside, as without a joined namespace
                argv += ["--uid", str(os.getuid()), "--gid", str(os.getgid()), "--cap-drop", "ALL"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try", "--die-with-parent"]
        if not view.network and not view.joins_network:
            argv.append("--unshare-net")
        argv += ["--proc", "/proc", "--dev", "/dev"]
        bound: list[str] = []
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
                bound.append(d)
        if os.path.isdir("/sys"):
            argv += ["--ro-bind", "/sys", "/sys"]
            bound.append("/sys")
        # /tmp first: binds below /tmp (a data directory there) then land on top of it, not under it
        argv += ["--bind", str(view.tmp), "/tmp"] if view.tmp is not None else ["--perms", "1777", "--tmpfs", "/tmp"]
        readonly = _outermost((*self.python_paths, *view.readonly), bound)
        writable = [os.path.realpath(p) for p in view.writable]
        made: set[str] = {"/", "/tmp", *bound}
        for p in (*readonly, *writable):
            # the parents bwrap creates would copy the host's modes (/root is 0700): make them 0755, empty
            for parent in reversed(Path(p).parents):
                q = str(parent)
                if q in made or any(q.startswith(b.rstrip("/") + "/") for b in bound):
                    continue
                argv += ["--perms", "0755", "--dir", q]
                made.add(q)
        for _, dest in (*view.mounts, *view.binds):
            for parent in reversed(Path(dest).parents):
                q = str(parent)
                if q not in made and not any(q.startswith(b.rstrip("/") + "/") for b in bound):
                    argv += ["--perms", "0755", "--dir", q]
                    made.add(q)
        for p in readonly:
            argv += ["--ro-bind", p, p]
        for p in writable:
            argv += ["--bind", p, p]
        for src, dest in view.mounts:
            argv += ["--ro-bind", os.path.realpath(src), dest]
        for src, dest in view.binds:
            argv += ["--bind", os.path.realpath(src), dest]
        if view.shm is not None:
            argv += ["--bind", str(view.shm), "/dev/shm"]
        for dev in (*(f"/dev/nvidia{g}" for g in view.gpus), *GPU_CONTROL_DEVICES) if view.gpus else ():
            if os.path.exists(dev):
                argv += ["--dev-bind", dev, dev]
        argv += ["--remount-ro", "/"]
        if view.cwd is not None:
            argv += ["--chdir", str(view.cwd)]
        argv += [*self.extra, "--"]
        if uid is not None:
            assert self.setpriv is not None
            argv += [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
            argv += ["--bounding-set=-all", "--no-new-privs", "--"]
        return argv


def _outermost(paths: Iterable[Path | str], bound: Sequence[str]) -> list[str]:
    """Absolute real paths, without those already inside a bound directory or inside another one."""
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
        if any(p == b or p.startswith(b.rstrip("/") + "/") for b in (*bound, *out)):
            continue
        out.append(p)
    return out


def python_installations(pythons: Iterable[str]) -> tuple[Path, ...]:
    """The directories a sandbox needs to run these interpreters and import dlcloud: each one's prefix and
    base prefix (a venv's ``home``), and the directory dlcloud itself is imported from (an editable
    install lives outside site-packages)."""
    dirs: set[Path] = {Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parents[3]}
    for python in pythons:
        prefix = Path(os.path.abspath(python)).parent.parent
        dirs.add(prefix)
        dirs.update(venv_homes(prefix))
    return tuple(sorted(dirs))


def venv_homes(venv: Path) -> list[Path]:
    """The installation a venv was made from (``home`` in pyvenv.cfg: its bin directory) — bind its parent."""
    try:
        text = (venv / "pyvenv.cfg").read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            out.append(Path(os.path.realpath(value.strip())).parent)
    return out


def probe(
    enabled: bool = True,
    uid_start: int = 200_000,
    uid_count: int = 100_000,
    pythons: Iterable[str] = (),
) -> Sandbox:
    """Find out whether sandboxes work here: bwrap present, namespaces allowed, the interpreter reachable
    (one real run of the first of ``pythons`` in a sandbox, as the uid jobs would get). The result says
    why not when they do not."""
    if not enabled:
        return Sandbox(False, "turned off (--sandbox off)")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Sandbox(False, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    setpriv = None
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return Sandbox(False, "running as root but setpriv (util-linux) is missing, so jobs cannot drop to a uid")
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False).stdout
    sandbox = Sandbox(
        True,
        bwrap=bwrap,
        setpriv=setpriv,
        uid_start=uid_start,
        uid_count=uid_count,
        python_paths=python_installations(pythons),
        disable_userns="--disable-userns" in help_text,
    )
    pythons = list(pythons)
    check = [pythons[0], "-I", "-c", "pass"] if pythons else ["/bin/sh", "-c", "exit 0"]
    argv = sandbox.wrap(View(), sandbox.uid_for(BUILD_SLOT)) + check
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, check=False, env={"PATH": "/usr/bin:/bin"}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Sandbox(False, f"bubblewrap could not start a sandbox: {exc}")
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return Sandbox(False, f"bubblewrap could not start a sandbox (user namespaces disallowed?): {why[0]}")
    return sandbox


def give_to(path: Path, uid: int | None, recursive: bool = False) -> None:
    """Make ``path`` (and, recursively, what is below it) owned by ``uid``; links themselves, never followed."""
    if uid is None:
        return
    os.chown(path, uid, uid, follow_symlinks=False)
    if not recursive:
        return
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def seal_for_readers(path: Path) -> None:
    """Make a built tree owned by root and read-only to everyone else: directories 0755, files 0644 (0755
    when executable by the owner); links untouched. Used for environments after their build."""
    for root, dirs, files in os.walk(path):
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chown(p, 0, 0)
                os.chmod(p, 0o755)
        for name in files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                os.chown(p, 0, 0, follow_symlinks=False)
                continue
            os.chown(p, 0, 0)
            os.chmod(p, 0o755 if os.stat(p).st_mode & 0o100 else 0o644)
    os.chown(path, 0, 0)
    os.chmod(path, 0o755)
