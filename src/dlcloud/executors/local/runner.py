"""ProcessRunner: runs each attempt (``Run``) on this host through a detached launcher process.

Invariants:
- The launcher (``launcher.py``, standard library only) runs in its own session and records everything
  in the attempt directory; ``poll`` and ``stop`` read only those files and /proc, so a new
  ``ProcessRunner`` in a restarted control plane handles attempts an earlier process started. The
  Popen objects kept here only serve ``reap`` (no zombies) and a faster "pending"/"lost" answer.
- A pid from a record is trusted only while /proc/<pid>/stat shows the recorded start ticks (no pid reuse).
- The command sees ``base env + workload.env`` and nothing else of the server's environment: variables
  such as DLCLOUD_SECRET_KEY never reach it, nor the launcher (whose /proc/<pid>/environ the job could read).
- Attempt directories are private (0700) and their records 0600: workload.json holds the job's env.
- Stop protocol: ``stop`` sends SIGTERM to the launcher, which stops the running phase (SIGTERM, SIGKILL
  after the grace period) and then runs the post phase, bounded by its post timeout. Only if the launcher
  is still there well after that (``stop_deadline``) does the executor SIGKILL it and its phase's group.

Files in an attempt directory: see ``launcher.py``.

Gangs (``Workload.replicas``): ``gang.json`` (the replicas: name, role, index, decides) is written first,
then each replica gets its own directory ``replicas/<name>/`` holding exactly what a single-process
attempt's directory holds, and its own detached launcher (its env, GPUs, limits and command). ``poll``
reports every replica and summarises their states (exited once all exited); ``stop`` runs the stop protocol
on every replica's launcher. So each replica is re-adopted after a control-plane restart like any attempt.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from dlcloud.errors import InvalidState
from dlcloud.executors.base import (
    REPLICAS_DIR,
    AttemptReport,
    Egress,
    LogReader,
    Replica,
    ReplicaReport,
    replica_log_files,
)
from dlcloud.executors.local import job_view, network, seccomp
from dlcloud.executors.local import launcher as launcher_mod
from dlcloud.executors.local.gang_reports import last_lines, summarize_replicas
from dlcloud.executors.local.sandbox import (
    BUILD_SLOT,
    Sandbox,
    View,
    give_to,
    probe,
    python_installations,
    seal_for_readers,
)
from dlcloud.executors.local.venvs import BuildSandbox
from dlcloud.executors.log_reading import open_file_log

log = logging.getLogger(__name__)

LAUNCHER_PATH = Path(launcher_mod.__file__).resolve()
LAUNCHER_LOG = "launcher.log"
PENDING_SECONDS = 30.0  # how long an attempt without launcher.json may be "pending" before it is "lost"
STOP_MARGIN_SECONDS = 30.0  # slack on top of what a stopping launcher may legitimately need
BASE_ENV_VARS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
GANG_FILE = "gang.json"


def _read_json(path: Path) -> dict[str, Any] | None:
    """A record written atomically by the launcher, or None if it does not exist (yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _is_alive(pid: Any, start_ticks: Any) -> bool:
    """Whether the process that wrote a record still runs: same pid, same start ticks, not a zombie."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        stat = launcher_mod.read_proc_stat(pid)
    except (OSError, ValueError, IndexError):  # /proc hidden or unreadable: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_ticks is None or stat[3] == start_ticks


def _group_members(pgid: int, sid: int | None, min_ticks: int | None) -> list[int]:
    """Pids in process group ``pgid`` of session ``sid`` started no earlier than the group's leader.

    Linux does not hand out a pid while a process group of that id exists, so members found this way
    belong to the recorded group and not to a stranger that reused the number.
    """
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = launcher_mod.read_proc_stat(int(name))
        except (OSError, ValueError, IndexError):
            continue
        if stat is None or stat[0] in ("Z", "X") or stat[1] != pgid:
            continue
        if sid is not None and stat[2] != sid:
            continue
        if min_ticks is not None and stat[3] < min_ticks:
            continue
        members.append(int(name))
    return members


def make_private_dirs(path: Path) -> None:
    """Create path and its missing parents with mode 0700 (os.makedirs applies mode to the leaf only)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask


def _used(attempt_dir: Path) -> InvalidState:
    return InvalidState(f"attempt directory {attempt_dir} was already used; every attempt needs a new one")


def _open_for_readers(path: Path) -> None:
    """Let every uid read ``path`` (and below it): for what a sandbox binds read-only from the data dir. Read
    (and, on directories, search) bits are added, none taken: a stored tree's read-only files stay read-only."""
    if path.is_symlink() or not path.exists():
        return
    if path.is_file():
        _add_mode(str(path), 0o444)
        return
    _add_mode(str(path), 0o555)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                _add_mode(os.path.join(root, name), 0o555)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                _add_mode(os.path.join(root, name), 0o444)


def _add_mode(path: str, bits: int) -> None:
    mode = os.lstat(path).st_mode & 0o7777
    if mode | bits != mode:
        os.chmod(path, mode | bits)


def stop_deadline(workload: dict[str, Any]) -> float:
    """Seconds after a stop by which a healthy launcher has ended: the running phase's grace period and
    pipe drain, then the post phase's (post timeout, grace period, pipe drain), plus a margin."""
    grace = float(workload.get("grace_seconds") or 0.0)
    phase = grace + launcher_mod.PIPE_DRAIN_SECONDS + 1.0
    post = 0.0
    if workload.get("post_command"):
        post_timeout = workload.get("post_timeout_seconds")
        post = (launcher_mod.DEFAULT_POST_TIMEOUT_SECONDS if post_timeout is None else float(post_timeout)) + phase
    return phase + post + STOP_MARGIN_SECONDS


@dataclass(frozen=True)
class Run:
    """One attempt as this host runs it: the ``Workload`` with every host detail filled in by ``LocalExecutor``
    (its directory, the local files of its code, its venv, the directories of its datasets and outputs)."""

    job_id: str
    tenant_id: str
    attempt: int
    attempt_dir: Path  # created here; holds code/, logs and the launcher's records
    command: str  # the main command, run with /bin/sh -c in the code directory
    env: dict[str, str] = field(default_factory=dict)  # added to a minimal base environment
    code_archive: Path | None = None  # a validated .tar.gz unpacked into <attempt_dir>/code
    package: Path | None = None  # a wheel or sdist installed into <attempt_dir>/packages (PYTHONPATH)
    venv: Path | None = None  # a runtime environment to run in (activated: bin/ first on PATH, VIRTUAL_ENV)
    gpus: tuple[int, ...] = ()  # exclusive GPU indices -> CUDA_VISIBLE_DEVICES
    cpus: float = 1.0
    memory_bytes: int = 0  # 0 = no limit
    timeout_seconds: float | None = None  # enforced by the launcher, survives control-plane restarts
    grace_seconds: float = 10.0  # SIGTERM -> SIGKILL on stop and timeout
    pre_command: str | None = None
    post_command: str | None = None
    post_timeout_seconds: float = 300.0
    # a gang: each replica runs the phases in its own directory <attempt_dir>/replicas/<name>/ with its own
    # env, GPUs and limits; gpus / cpus / memory_bytes above are then the gang's totals. Empty: one process.
    replicas: tuple[Replica, ...] = ()
    log_max_bytes: int = 256 * 1024 * 1024
    # directories the job writes that outlive the attempt (checkpoints, outputs): created here, the only ones
    # besides its own work directory that a sandboxed job may write
    data_dirs: tuple[Path, ...] = ()
    # directories the job reads and never writes (dataset versions): in a sandbox, bound read-only at the
    # same path
    readonly_dirs: tuple[Path, ...] = ()
    # in a sandbox, read-only at another path: (host path, path in the sandbox)
    mounts: tuple[tuple[Path, str], ...] = ()
    sandbox_slot: int | None = None  # the tenant's sandbox number: the uid derives from it
    # where the job reaches the control plane's API (a loopback URL is relayed into its network namespace)
    api_url: str | None = None
    private_network: bool = True  # in a sandbox: a network namespace of its own (the gang's replicas share it)
    pids_max: int = 0  # processes and threads of one replica (pids cgroup); 0: no limit
    nproc_max: int = 0  # as root without a pids cgroup: RLIMIT_NPROC of the tenant's uid; 0: none
    disk_max_bytes: int = 0  # what its writable directories may take on disk; 0: no limit
    egress: Egress = Egress()  # what it may reach beyond its own network (with a private network)
    user_namespaces: bool = False  # it may make user namespaces in its sandbox (its tenant is allowed to)
    publish: tuple[int, ...] = ()  # ports it serves on in its network, forwarded from free ports of the address
    publish_address: str = "127.0.0.1"


class ProcessRunner:
    """Runs attempts as processes on this host (decision 2 of ARCHITECTURE.md: jobs outlive the control plane);
    ``LocalExecutor`` gives it ``Run``s. Attempts are named by their directory.

    Args:
        python: the interpreter for jobs (its directory goes first on PATH; pip installs ``package`` with it).
            Default: this process's interpreter.
        base_env: the variables every command starts from, replacing the default (PATH, HOME, LANG, LC_ALL,
            TZ, TMPDIR, USER taken from this process where set). DLCLOUD_* variables are dropped from it.
        sandbox: how user code is sandboxed (``sandbox.probe``); default: probe this host, sandbox if it can.
    """

    def __init__(
        self, python: str | None = None, base_env: dict[str, str] | None = None, sandbox: Sandbox | None = None
    ) -> None:
        # abspath, not realpath: a venv's bin/python is a symlink whose directory matters.
        self.python = os.path.abspath(python or sys.executable)
        self.sandbox = sandbox if sandbox is not None else probe(pythons=[self.python])
        if base_env is None:
            base_env = {k: os.environ[k] for k in BASE_ENV_VARS if k in os.environ}
        env = {k: v for k, v in base_env.items() if not k.startswith("DLCLOUD_")}
        path = env.get("PATH") or DEFAULT_PATH
        env["PATH"] = os.path.dirname(self.python) + os.pathsep + path
        self.base_env = env
        self._lock = threading.Lock()
        self._launchers: dict[Path, subprocess.Popen[bytes]] = {}
        self._launch_records: dict[Path, dict[str, Any]] = {}  # launcher.json is written once: cache it

    # ---- start

    def build_env(self, workload: Run) -> dict[str, str]:
        """The complete environment of the command, before the launcher adds CUDA_VISIBLE_DEVICES & co.

        With a ``venv`` the environment is activated as ``bin/activate`` would: its ``bin`` first on PATH and
        VIRTUAL_ENV set, so ``python`` and ``pip`` in the command are the venv's.
        """
        env = {**self.base_env, **{str(k): str(v) for k, v in workload.env.items()}}
        if self.sandbox.enabled:  # the host's home and temp directories are not in the sandbox's view
            env.update(HOME="/tmp", TMPDIR="/tmp")
            if self.sandbox.per_tenant_uids:
                env["USER"] = env["LOGNAME"] = f"dlcloud-{workload.sandbox_slot}"
        if workload.venv is not None:
            venv = os.path.abspath(workload.venv)
            env["PATH"] = os.path.join(venv, "bin") + os.pathsep + (env.get("PATH") or DEFAULT_PATH)
            env["VIRTUAL_ENV"] = venv
            env.pop("PYTHONHOME", None)
        return env

    def python_for(self, workload: Run) -> str:
        """The interpreter of the workload: its venv's, else the executor's (pip installs ``package`` with it)."""
        if workload.venv is not None:
            return os.path.join(os.path.abspath(workload.venv), "bin", "python")
        return self.python

    def isolation(self) -> tuple[bool, str]:
        return self.sandbox.enabled, self.sandbox.describe()

    def sandbox_prefix(self, writable: Sequence[Path], readable: Sequence[Path]) -> list[str] | None:
        if not self.sandbox.enabled:
            return None
        uid = self.sandbox.uid_for(BUILD_SLOT)
        for d in writable:
            give_to(Path(d), uid, recursive=True)
        if uid is not None:  # uploads are 0600 under 0700 directories: readable where bound, closed on the host
            for p in readable:
                _open_for_readers(Path(p))
        # model inspection loads a tenant's artifact (pickles, predictors): nothing on any network to talk to
        cwd = Path(writable[0]) if writable else None
        view = View(writable=tuple(writable), readonly=tuple(readable), cwd=cwd, network=False)
        return self.sandbox.wrap(view, uid)

    def reader_prefix(self, readable: Sequence[Path], slot: int | None) -> list[str] | None:
        """Sandboxed as tenant ``slot``'s jobs run (their uid), reading ``readable`` where they are and as they
        are: nothing is given away or opened to other uids (what a tenant's jobs wrote stays theirs). No network:
        a reader has nothing to say to anyone."""
        if not self.sandbox.enabled:
            return None
        return self.sandbox.wrap(View(readonly=tuple(readable), network=False), self.sandbox.uid_for(slot))

    def build_sandbox(self) -> BuildSandbox | None:
        """How environment builds are sandboxed here (None: not at all). Builds are shared by tenants, so
        as root they run as the range's first uid (``BUILD_SLOT``) and the finished venv is handed to root,
        read-only to everyone else."""
        if not self.sandbox.enabled:
            return None
        sandbox = self.sandbox
        uid = sandbox.uid_for(BUILD_SLOT)

        def prefix(target: Path, reads: Sequence[str]) -> list[str]:
            tmp = target.parent / f".tmp-{target.name}"
            tmp.mkdir(mode=0o700, exist_ok=True)
            give_to(tmp, uid)
            give_to(target, uid, recursive=True)
            if uid is not None:  # uploaded wheels (0600): readable where bound; their 0700 parents stay closed
                for path in reads[1:]:
                    _open_for_readers(Path(path))
            view = View(writable=(target,), readonly=python_installations(reads[:1]) + tuple(map(Path, reads[1:])))
            return sandbox.wrap(replace(view, tmp=tmp, cwd=target), uid)

        def seal(target: Path) -> None:
            shutil.rmtree(target.parent / f".tmp-{target.name}", ignore_errors=True)
            if uid is not None:
                seal_for_readers(target)

        return BuildSandbox(prefix, seal)

    @property
    def jobs_run_as_root(self) -> bool:
        return os.geteuid() == 0 and not self.sandbox.per_tenant_uids

    def _private_network(self, workload: Run) -> bool:
        return self.sandbox.enabled and workload.private_network

    def _uid(self, workload: Run) -> int | None:
        return self.sandbox.uid_for(workload.sandbox_slot) if self.sandbox.enabled else None

    def start(self, workload: Run) -> None:
        uid = self._uid(workload)
        for d in workload.data_dirs:
            make_private_dirs(Path(d))
            give_to(Path(d), uid)
        if self.sandbox.enabled:
            self._make_volume_dirs(workload)
        attempt_dir = Path(os.path.abspath(workload.attempt_dir))
        if self._launched(workload, attempt_dir):  # started already (a deposed leader and its successor): its
            raise _used(attempt_dir)  # holder, network and volumes are left alone
        if self._private_network(workload):
            self._configure_network(workload, attempt_dir)
        elif workload.publish and not self._private_network(workload):  # the job's ports are the host's own
            make_private_dirs(attempt_dir)
            published = {str(p): f"127.0.0.1:{p}" for p in workload.publish}
            launcher_mod.write_json_atomic(str(attempt_dir / network.HOST_PUBLISHED_FILE), published)
        if workload.replicas:
            self._start_gang(workload)
        else:
            self._start_one(workload)

    def _configure_network(self, workload: Run, attempt_dir: Path) -> None:
        """The holder's configuration: the attempt's network, its egress, its volumes, the ports it publishes."""
        dirs = job_view.launcher_dirs(attempt_dir, workload.replicas)
        volumes = [v for d in dirs for v in self._volumes(workload, d, attempt_dir)]
        files = {"resolv.conf": f"nameserver {network.SLIRP_DNS}\n"} if workload.egress.mode != "none" else {}
        view = job_view.holder_volumes(attempt_dir, volumes, files)
        ends = tuple(d / launcher_mod.EXIT_FILE for d in dirs)
        userns = not self.sandbox.per_tenant_uids
        publish = (workload.publish_address, workload.publish)
        network.configure(attempt_dir, workload.api_url, userns, workload.egress, ends, view, publish)

    def _volumes(self, workload: Run, directory: Path, attempt_dir: Path) -> list[job_view.Volume]:
        """The volumes of the launcher in ``directory`` (the attempt's, or a gang replica's below it)."""
        replica = directory.name if directory != attempt_dir else ""
        return job_view.attempt_volumes(directory, workload.data_dirs, workload.mounts, replica)

    def _make_volume_dirs(self, workload: Run) -> None:
        """Every launcher's own directories (code, packages, files, tmp), the job's, before the holder mounts
        them."""
        for d in job_view.launcher_dirs(Path(os.path.abspath(workload.attempt_dir)), workload.replicas):
            make_private_dirs(d)
            for name in job_view.ATTEMPT_DIRS:
                (d / name).mkdir(mode=0o700, exist_ok=True)
                give_to(d / name, self._uid(workload))

    @staticmethod
    def _launched(workload: Run, attempt_dir: Path) -> bool:
        """Whether a launcher of the attempt was started (a gang.json alone is a start that crashed before any
        launcher: starting it again is safe)."""
        return (attempt_dir / launcher_mod.WORKLOAD_FILE).exists() or any(
            (attempt_dir / REPLICAS_DIR / r.name / launcher_mod.WORKLOAD_FILE).exists() for r in workload.replicas
        )

    def _start_gang(self, workload: Run) -> None:
        attempt_dir = Path(os.path.abspath(workload.attempt_dir))
        make_private_dirs(attempt_dir / REPLICAS_DIR)
        for r in workload.replicas:  # before gang.json: a stop that reads it finds every replica's directory
            make_private_dirs(attempt_dir / REPLICAS_DIR / r.name)
        shm = self._gang_shm(workload, attempt_dir)
        members = [{"name": r.name, "role": r.role, "index": r.index, "decides": r.decides} for r in workload.replicas]
        launcher_mod.write_json_atomic(
            str(attempt_dir / GANG_FILE), {"replicas": members, "shm": str(shm) if shm is not None else None}
        )
        if (attempt_dir / launcher_mod.STOP_REQUEST_FILE).exists():  # a stop came before gang.json was there
            for r in workload.replicas:
                fd = os.open(attempt_dir / REPLICAS_DIR / r.name / launcher_mod.STOP_REQUEST_FILE, os.O_CREAT, 0o600)
                os.close(fd)
        for r in workload.replicas:
            rdir = attempt_dir / REPLICAS_DIR / r.name
            (rdir / job_view.FILES).mkdir(mode=0o700, exist_ok=True)
            for name, text in r.files:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                fd = os.open(rdir / job_view.FILES / name, flags, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                give_to(rdir / job_view.FILES / name, self._uid(workload))  # read-only in the replica's sandbox
            env = {**workload.env, **r.env}
            one = replace(
                workload,
                attempt_dir=rdir,
                command=r.command or workload.command,
                env=env,
                gpus=r.gpus,
                cpus=r.cpus,
                memory_bytes=r.memory_bytes,
                replicas=(),
            )
            self._start_one(one, shm=shm, net_dir=attempt_dir, first=r is workload.replicas[0])

    def _gang_shm(self, workload: Run, attempt_dir: Path) -> Path | None:
        """A /dev/shm shared by the replicas of one gang attempt, and by nobody else (NCCL, gloo and
        DataLoader workers use it): a directory on the host's /dev/shm, removed when the attempt ends."""
        if not self.sandbox.enabled or not os.path.isdir("/dev/shm"):
            return None
        # a random name: the job sees it as its /dev/shm's source in /proc/self/mountinfo
        shm = Path("/dev/shm") / f"dlcloud-{os.urandom(8).hex()}"
        shm.mkdir(mode=0o700)
        give_to(shm, self._uid(workload))
        return shm

    def _start_one(
        self,
        workload: Run,
        shm: Path | None = None,
        net_dir: Path | None = None,
        first: bool = False,
    ) -> None:
        """One launcher; ``net_dir``: the gang's directory, whose network namespace the ``first`` replica's
        launcher makes and the others join (None: a single attempt, which makes its own)."""
        attempt_dir = Path(os.path.abspath(workload.attempt_dir))
        if (attempt_dir / launcher_mod.WORKLOAD_FILE).exists():
            raise _used(attempt_dir)
        make_private_dirs(attempt_dir)
        sandbox = self._sandbox_record(workload, attempt_dir, shm, net_dir or attempt_dir)
        if sandbox is not None and self._private_network(workload):
            userns = not self.sandbox.per_tenant_uids
            sandbox["network"] = network.record(net_dir or attempt_dir, userns, make=net_dir is None or first)
        record = asdict(workload)
        record.update(
            attempt_dir=str(attempt_dir),
            env=self.build_env(workload),
            code_archive=str(workload.code_archive) if workload.code_archive else None,
            package=str(workload.package) if workload.package else None,
            venv=str(workload.venv) if workload.venv else None,
            gpus=list(workload.gpus),
            python=self.python_for(workload),
            data_dirs=[str(d) for d in workload.data_dirs],
            readonly_dirs=[str(d) for d in workload.readonly_dirs],
            mounts=[[str(src), dest] for src, dest in workload.mounts],
            sandbox=sandbox,
        )
        # created exclusively (link fails if it exists): two control planes starting one attempt at once (a
        # deposed leader and its successor) cannot both launch it
        final = attempt_dir / launcher_mod.WORKLOAD_FILE
        tmp = attempt_dir / f"{launcher_mod.WORKLOAD_FILE}.new.{os.getpid()}.{threading.get_ident()}"
        launcher_mod.write_json_atomic(str(tmp), record)
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise _used(attempt_dir) from None
        finally:
            tmp.unlink()
        log_fd = os.open(attempt_dir / LAUNCHER_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(LAUNCHER_PATH), str(attempt_dir)],
                cwd=attempt_dir,
                env=dict(self.base_env),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            # Recorded like any launch failure, so poll() reports it at once instead of "lost" in 30 s.
            log.exception("cannot start the launcher for %s", attempt_dir)
            launcher_mod.write_json_atomic(
                str(attempt_dir / launcher_mod.EXIT_FILE),
                {
                    "exit_code": launcher_mod.LAUNCH_FAILED,
                    "finished_at": launcher_mod.utc_now_iso(),
                    "timed_out": False,
                    "stopped": False,
                    "message": f"could not start the launcher: {exc}",
                },
            )
            return
        finally:
            os.close(log_fd)
        with self._lock:
            self._launchers[attempt_dir] = proc

    def _sandbox_record(
        self, workload: Run, attempt_dir: Path, shm: Path | None, net_dir: Path
    ) -> dict[str, Any] | None:
        """workload.json's ``sandbox``: the argv prefix of every process the launcher starts for the job, the uid
        that must own the directories the launcher fills (code, packages), and ``paths``: where the job sees
        them (job_view) — or None (no sandbox).

        The attempt directory itself (the launcher's records) is never in the view: only the volumes below it
        (``start`` made them), at their neutral paths; with a private network, as the holder's overlays."""
        if not self.sandbox.enabled:
            return None
        uid = self._uid(workload)
        private = self._private_network(workload)
        volumes = self._volumes(workload, attempt_dir, net_dir)
        readonly = [*([Path(workload.venv)] if workload.venv is not None else []), *workload.readonly_dirs]
        paths = {"code": job_view.CODE_AT, "packages": job_view.PACKAGES_AT}
        if workload.package is not None:  # pip installs it inside the sandbox, from the job's read-only files
            copy = attempt_dir / job_view.FILES / Path(workload.package).name
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            with open(workload.package, "rb") as src, open(os.open(copy, flags, 0o600), "wb") as dst:
                shutil.copyfileobj(src, dst)
            give_to(copy, uid)
            paths["package"] = f"{job_view.FILES_AT}/{copy.name}"
        placed = [(job_view.source(v, net_dir if private else None), v) for v in volumes]
        mounts = [(src, v.dest) for src, v in placed if not v.writable]
        if private and workload.egress.mode != "none":  # slirp4netns's resolver, from inside
            mounts.append((net_dir / job_view.VOLUMES_DIR / "resolv.conf", "/etc/resolv.conf"))
        view = View(
            readonly=tuple(readonly),
            mounts=tuple(mounts),
            binds=tuple((src, v.dest) for src, v in placed if v.writable and v.dest != "/tmp"),
            tmp=next(src for src, v in placed if v.dest == "/tmp"),
            shm=shm,
            gpus=workload.gpus,
            cwd=Path(job_view.CODE_AT),
            network=not private,
            joins_network=private,
            user_namespaces=workload.user_namespaces,
        )
        record: dict[str, Any] = {"argv": self.sandbox.wrap(view, uid), "uid": uid, "paths": paths}
        # as root, a seccomp filter keeps user namespaces out (unprivileged, bwrap's --disable-userns does)
        program = seccomp.no_user_namespaces() if uid is not None and not workload.user_namespaces else None
        if program is not None:  # unprivileged, bwrap's --disable-userns does it
            record["seccomp"] = program.hex()
        return record

    # ---- poll

    def _gang_members(self, attempt_dir: Path) -> list[dict[str, Any]] | None:
        gang = _read_json(attempt_dir / GANG_FILE)
        if gang is None:
            return None
        return [m for m in gang.get("replicas") or [] if isinstance(m, dict)]

    def _remove_gang_shm(self, attempt_dir: Path) -> None:
        """The gang's shared /dev/shm goes once every replica ended (their sandboxes, and so every process
        that could still use it, are gone)."""
        shm = (_read_json(attempt_dir / GANG_FILE) or {}).get("shm")
        if isinstance(shm, str) and shm.startswith("/dev/shm/dlcloud-") and os.path.isdir(shm):
            shutil.rmtree(shm, ignore_errors=True)

    def poll(self, attempt_dir: Path) -> AttemptReport:
        attempt_dir = Path(os.path.abspath(attempt_dir))
        members = self._gang_members(attempt_dir)
        if members is None:
            return self._poll_one(attempt_dir)
        reports = []
        for m in members:
            name = str(m.get("name"))
            rdir = attempt_dir / REPLICAS_DIR / name
            one = self._poll_one(rdir)
            failed = one.state == "lost" or (one.state == "exited" and one.exit_code != 0 and not one.stopped)
            reports.append(
                ReplicaReport(
                    name=name,
                    role=str(m.get("role")),
                    index=int(m.get("index") or 0),
                    decides=bool(m.get("decides", True)),
                    state=one.state,
                    exit_code=one.exit_code,
                    started_at=one.started_at,
                    finished_at=one.finished_at,
                    timed_out=one.timed_out,
                    stopped=one.stopped,
                    message=one.message,
                    last_lines=last_lines(rdir / launcher_mod.OUTPUT_LOG) if failed else (),
                    post_exit_code=one.post_exit_code,
                    post_timed_out=one.post_timed_out,
                )
            )
        summary = summarize_replicas(tuple(reports))
        if summary.state in ("exited", "lost"):
            self._remove_gang_shm(attempt_dir)
            network.stop(attempt_dir)
        return summary

    def _poll_one(self, attempt_dir: Path) -> AttemptReport:
        attempt_dir = Path(os.path.abspath(attempt_dir))
        exit_record = _read_json(attempt_dir / launcher_mod.EXIT_FILE)
        launch = self._launch_record(attempt_dir)
        if exit_record is not None:
            return self._exited(attempt_dir, exit_record, launch)
        if launch is not None:
            pid = launch.get("pid")
            if _is_alive(pid, launch.get("proc_start_ticks")):
                return AttemptReport(state="running", started_at=_parse_time(launch.get("started_at")), pid=pid)
            exit_record = _read_json(attempt_dir / launcher_mod.EXIT_FILE)  # it may have just finished
            if exit_record is not None:
                return self._exited(attempt_dir, exit_record, launch)
            return self._lost(
                attempt_dir,
                f"launcher process {pid} is gone and recorded no exit status "
                "(killed, or the host restarted); its command may still run until stopped",
                launch,
            )
        with self._lock:
            proc = self._launchers.get(attempt_dir)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return AttemptReport(state="pending")
            exit_record = _read_json(attempt_dir / launcher_mod.EXIT_FILE)
            if exit_record is not None:  # it wrote exit.json (and launcher.json) and left meanwhile
                return self._exited(attempt_dir, exit_record, self._launch_record(attempt_dir))
            return self._lost(attempt_dir, f"launcher exited with code {code} before it started; see {LAUNCHER_LOG}")
        try:
            spawned = (attempt_dir / launcher_mod.WORKLOAD_FILE).stat().st_mtime
        except FileNotFoundError:
            return AttemptReport(state="lost", message=f"attempt {attempt_dir} was never started here", launched=False)
        if time.time() - spawned < PENDING_SECONDS:
            return AttemptReport(state="pending")
        return self._lost(attempt_dir, f"launcher did not start within {PENDING_SECONDS:g} s; see {LAUNCHER_LOG}")

    def _launch_record(self, attempt_dir: Path) -> dict[str, Any] | None:
        with self._lock:
            cached = self._launch_records.get(attempt_dir)
        if cached is not None:
            return cached
        record = _read_json(attempt_dir / launcher_mod.LAUNCHER_FILE)
        if record is not None:
            with self._lock:
                self._launch_records[attempt_dir] = record
        return record

    def _exited(self, attempt_dir: Path, record: dict[str, Any], launch: dict[str, Any] | None) -> AttemptReport:
        self._forget(attempt_dir)
        network.stop(attempt_dir)
        code = record.get("exit_code")
        return AttemptReport(
            state="exited",
            exit_code=code if isinstance(code, int) else launcher_mod.LAUNCH_FAILED,
            started_at=_parse_time(launch.get("started_at")) if launch else None,
            finished_at=_parse_time(record.get("finished_at")),
            timed_out=bool(record.get("timed_out")),
            stopped=bool(record.get("stopped")),
            message=str(record.get("message") or ""),
            pid=launch.get("pid") if launch else None,
            post_exit_code=post_code if isinstance(post_code := record.get("post_exit_code"), int) else None,
            post_timed_out=bool(record.get("post_timed_out")),
        )

    def _lost(self, attempt_dir: Path, message: str, launch: dict[str, Any] | None = None) -> AttemptReport:
        self._forget(attempt_dir)
        network.stop(attempt_dir)
        return AttemptReport(
            state="lost",
            started_at=_parse_time(launch.get("started_at")) if launch else None,
            message=message,
            pid=launch.get("pid") if launch else None,
        )

    def _forget(self, attempt_dir: Path) -> None:
        with self._lock:
            self._launch_records.pop(attempt_dir, None)

    # ---- stop

    def stop(self, attempt_dir: Path) -> None:
        attempt_dir = Path(os.path.abspath(attempt_dir))
        members = self._gang_members(attempt_dir)
        if members is None:
            self._stop_one(attempt_dir)
            return
        for m in members:
            self._stop_one(attempt_dir / REPLICAS_DIR / str(m.get("name")))

    def _stop_one(self, attempt_dir: Path) -> None:
        attempt_dir = Path(os.path.abspath(attempt_dir))
        if (attempt_dir / launcher_mod.EXIT_FILE).exists() or not attempt_dir.is_dir():
            return
        # The marker first, launcher.json second: a launcher still starting checks the marker after
        # writing launcher.json, so either it sees the marker or we see its pid.
        fd = os.open(attempt_dir / launcher_mod.STOP_REQUEST_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        launch = _read_json(attempt_dir / launcher_mod.LAUNCHER_FILE)
        if launch is None:
            return
        pid, ticks = launch.get("pid"), launch.get("proc_start_ticks")
        if isinstance(pid, int) and _is_alive(pid, ticks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # the launcher stops the phase, escalates after the grace, runs post
            workload = _read_json(attempt_dir / launcher_mod.WORKLOAD_FILE) or {}
            timer = threading.Timer(stop_deadline(workload), self._kill_stuck_launcher, (attempt_dir, pid, ticks))
            timer.daemon = True
            timer.start()
            return
        if (attempt_dir / launcher_mod.EXIT_FILE).exists():
            return
        self._stop_orphaned_group(attempt_dir)

    def _kill_stuck_launcher(self, attempt_dir: Path, pid: int, ticks: Any) -> None:
        """The fallback of the stop protocol: a launcher still running long after a stop is SIGKILLed with
        the group of its current phase (the attempt is then reported lost, and ends CANCELLED)."""
        if (attempt_dir / launcher_mod.EXIT_FILE).exists() or not _is_alive(pid, ticks):
            return
        log.warning("launcher %d of %s still runs long after a stop: killing it", pid, attempt_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        child = _read_json(attempt_dir / launcher_mod.CHILD_FILE) or {}
        pgid = child.get("pgid")
        if isinstance(pgid, int) and _group_members(pgid, child.get("sid"), child.get("proc_start_ticks")):
            launcher_mod.signal_group(pgid, signal.SIGKILL)

    def _stop_orphaned_group(self, attempt_dir: Path) -> None:
        """The launcher died: SIGTERM the command's group ourselves, SIGKILL it after the grace period."""
        child = _read_json(attempt_dir / launcher_mod.CHILD_FILE)
        if child is None or not isinstance(child.get("pgid"), int):
            return
        pgid: int = child["pgid"]
        sid, ticks = child.get("sid"), child.get("proc_start_ticks")
        if not _group_members(pgid, sid, ticks):
            return
        workload = _read_json(attempt_dir / launcher_mod.WORKLOAD_FILE) or {}
        grace = float(workload.get("grace_seconds") or 0.0)
        log.warning("launcher of %s is gone; stopping its process group %d directly", attempt_dir, pgid)
        launcher_mod.signal_group(pgid, signal.SIGTERM)

        def kill_rest() -> None:
            if _group_members(pgid, sid, ticks):
                launcher_mod.signal_group(pgid, signal.SIGKILL)

        timer = threading.Timer(grace, kill_rest)
        timer.daemon = True
        timer.start()

    def log_files(self, attempt_dir: Path) -> dict[str, Path]:
        return replica_log_files(Path(os.path.abspath(attempt_dir)))

    def log_replicas(self, attempt_dir: Path) -> list[str]:
        return list(self.log_files(attempt_dir))

    def open_log(self, attempt_dir: Path, replica: str) -> LogReader:
        return open_file_log(self.log_files(attempt_dir), replica)

    # ---- reap

    def reap(self) -> None:
        with self._lock:
            done = [d for d, proc in self._launchers.items() if proc.poll() is not None]
            for d in done:
                del self._launchers[d]
