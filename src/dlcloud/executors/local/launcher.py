"""The detached launcher of one local attempt: runs its phases, logs them, records how it ended.

Run as ``<python> -I -S launcher.py <attempt_dir>`` by ``LocalExecutor`` in a new session. Standard library
only (never dlcloud nor a third-party package; its siblings ``launch_*.py`` and ``netns_holder.py`` likewise):
it starts fast and keeps working whatever happens to the control plane. The attempt's first launcher forks the
attempt's network holder before anything else (``sandbox.network.make``); every phase joins its namespace.

An attempt runs up to three **phases** after preparing its code directory, each as its own ``/bin/sh -c`` child
in its own process group, with the same environment, working directory and limits: ``pre`` (``pre_command``),
``main`` (``command``) and ``post`` (``post_command``). ``pre`` failing (or being stopped / timed out) skips
``main``. ``post`` runs whenever a phase was started, after success, failure, stop and timeout alike, with
``DLCLOUD_EXIT_CODE`` = the exit status of ``main`` (of ``pre`` when ``main`` was skipped; 128+N for a process
killed by signal N, as the shell reports it). Every phase sees ``DLCLOUD_PHASE`` = its name.

Everything it knows goes to files in the attempt directory, each written atomically (tmp + rename):

``workload.json`` (input, written by the executor)
    job_id, tenant_id, attempt, attempt_dir, command, pre_command, post_command, post_timeout_seconds,
    env (the COMPLETE environment of the phases), code_archive, package, gpus, cpus, memory_bytes, pids_max,
    nproc_max, disk_max_bytes, data_dirs, timeout_seconds, grace_seconds, python, sandbox {argv, uid,
    seccomp, network {dir, userns, make}}.
``launcher.json``
    {"pid", "proc_start_ticks", "started_at", "limits": "cgroup2" | "cgroup1" | "rlimit", "cgroup": path | null,
    "cgroups": [paths]} (cgroup v1: one directory per controller, memory and cpu).
    Written once, right after the signal handlers are installed and before any preparation.
``child.json``
    {"pid", "pgid", "sid", "proc_start_ticks", "role": "prepare" | "pre" | "command" | "post"}, rewritten
    for each process the launcher starts (pip while preparing, then each phase; ``command`` is ``main``).
    ``sid`` is the launcher's session.
``exit.json``
    {"exit_code", "finished_at", "timed_out", "stopped", "message", "post_exit_code", "post_timed_out"}.
    Written last, after every process of the attempt is gone: its presence means the attempt is over.
    ``post_exit_code`` is null when no post phase ran.
``output.log``
    One line per output line: ``<UTC time, microseconds, Z> <stream> <text>``. ``stream`` is ``stdout``,
    ``stderr`` or ``system`` for the main phase and the launcher itself, and the same prefixed with the
    phase (``pre:stdout``, ``post:system``, ...) for the pre and post phases: the log's *sections*.

Exit codes in exit.json: the main command's return code, negative when a signal killed it (-15 SIGTERM,
-9 SIGKILL); ``pre``'s when ``pre`` failed and ``main`` was skipped. ``post`` never changes it: its result
is ``post_exit_code``. ``LAUNCH_FAILED`` (125, as ``docker run`` uses it) means the command did not run to
its end because the launcher could not prepare or start it (bad archive, pip failure, spawn error,
launcher crash), or the attempt was stopped / timed out before ``main`` started; ``message`` then says
why. A command's own return code comes with an empty message unless it was stopped or timed out.

The stop protocol (see docs/local-executor.md):
- SIGTERM to the launcher means "stop the attempt": the launcher sends SIGTERM to the group of the
  running preparation / pre / main process, SIGKILL after ``grace_seconds``, skips what is left of
  pre and main, then runs ``post``. A stop while ``post`` runs does not interrupt it (post is the
  clean-up a stop must not skip); ``post`` is bounded by ``post_timeout_seconds`` (then SIGTERM, and
  SIGKILL after ``grace_seconds``) and is the only phase the job's ``timeout_seconds`` does not cover.
- SIGINT and SIGHUP are ignored (the control plane's terminal may go away). Handlers, not SIG_IGN, so the
  phases start with default dispositions.
- A stop requested before launcher.json exists is seen through the ``stop-requested`` marker file,
  which the launcher checks after writing launcher.json (the executor writes the marker, then reads
  launcher.json: one of the two always sees the other).

Invariants:
- Each phase runs in its own process group (pgid = its pid) inside the launcher's session.
- When a phase's leader exits, the rest of its group is SIGKILLed (after at most ``PIPE_DRAIN_SECONDS``
  waiting for its pipes to close) while the leader is still an unreaped zombie, so the pgid cannot have
  been reused: no orphans are left and no stranger is signalled.
- ``timeout_seconds`` counts from the launcher's start, preparation and pre included.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, BinaryIO

try:  # imported by the executor, as part of the package
    from dlcloud.executors.local import launch_files as files
    from dlcloud.executors.local import launch_limits as limits
    from dlcloud.executors.local import netns_holder
except ImportError:  # run as a script with -I -S: the package is not importable, its own directory is
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launch_files as files  # type: ignore[no-redef]
    import launch_limits as limits  # type: ignore[no-redef]
    import netns_holder  # type: ignore[no-redef]

PrepareError = files.PrepareError
extract_archive = files.extract_archive
chown_tree = files.chown_tree
has_exited = files.has_exited

# the cgroup helpers, under their old names (tests and the executor use them from here)
find_cgroup2_dir = limits.find_cgroup2_dir
create_cgroup = limits.create_cgroup
create_cgroups_v1 = limits.create_cgroups_v1
remove_cgroup = limits.remove_cgroup

WORKLOAD_FILE = "workload.json"
LAUNCHER_FILE = "launcher.json"
CHILD_FILE = "child.json"
EXIT_FILE = "exit.json"
OUTPUT_LOG = "output.log"
STOP_REQUEST_FILE = "stop-requested"
CODE_DIR = "code"
PACKAGES_DIR = "packages"
TMP_DIR = "tmp"

LAUNCH_FAILED = 125
PIPE_DRAIN_SECONDS = 2.0  # after the command exits, how long its pipes may stay open before the group is killed
MAX_LINE_BYTES = 64 * 1024  # longer lines are split so one runaway line cannot exhaust memory
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
NETWORK_WAIT_SECONDS = 30.0  # how long the launcher waits for the attempt's network namespace
DEFAULT_POST_TIMEOUT_SECONDS = 300.0
PHASE_ROLES = {"pre": "pre", "main": "command", "post": "post"}  # phase -> child.json role
PHASE_LABELS = {"pre": "pre_command", "main": "command", "post": "post_command"}


def stream_name(phase: str, stream: str) -> str:
    """The log stream of a phase's line: ``stdout`` for main (and the launcher), ``post:stdout`` for post."""
    return stream if phase in ("main", "prepare") else f"{phase}:{stream}"


def shell_status(returncode: int) -> int:
    """A Popen return code as a shell's ``$?``: -N (killed by signal N) becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def utc_now_iso() -> str:
    """UTC time as ``2024-01-02T03:04:05.123456Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgrp, session, start ticks) of a process from /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot): tells a pid's reuse apart."""
    stat = read_proc_stat(pid)
    return None if stat is None else stat[3]


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write JSON so a reader sees the old file, no file, or the whole new one (mode 0600)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# The launcher


class Launcher:
    """Runs one attempt. Single-threaded: signals set flags and wake the select loop through a pipe."""

    def __init__(self, attempt_dir: str) -> None:
        self.dir = attempt_dir
        self.log: BinaryIO | None = None
        self.timed_out = False
        self.stopped = False
        self.term_requested = False
        self.grace = 10.0
        self.deadline: float | None = None
        self.cgroups: list[str] = []  # the attempt's cgroup (v2), or one per controller (v1)
        self.live_pgid: int | None = None  # the group of a started, not yet reaped child
        # workload.json's "sandbox": every process for the job starts under this argv prefix (bwrap), and
        # what the launcher unpacks for it becomes the sandbox uid's; empty / None when unsandboxed
        self.sandbox_argv: list[str] = []
        self.sandbox_uid: int | None = None
        self.seccomp = b""  # a seccomp program bwrap loads for the job (as root: no user namespaces)
        self.post_timeout = DEFAULT_POST_TIMEOUT_SECONDS
        self.preexec: Callable[[], None] | None = None  # what every child runs before exec (limits, namespaces)
        self.disk: limits.DiskMeter | None = None  # the disk the job's writable directories take
        self.post_deadline: float | None = None
        self.post_timed_out = False
        self.post_exit_code: int | None = None  # None: no post phase ran
        self.term_signals = 0  # SIGTERMs received
        self.terms_noted = 0  # SIGTERMs acted on or logged
        self.started_monotonic = time.monotonic()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    # ---- signals and logging

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: object) -> None:
            self.term_requested = True
            self.term_signals += 1

        def ignore(signum: int, frame: object) -> None:
            pass

        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, ignore)
        signal.signal(signal.SIGHUP, ignore)
        signal.signal(signal.SIGCHLD, ignore)  # only to wake select() when a child exits

    # The log's size cap (see rotate_log). The reader's side of this format: executors/base.py.
    DEFAULT_LOG_MAX_BYTES = 256 * 1024 * 1024  # when workload.json has no log_max_bytes
    MIN_LOG_MAX_BYTES = 16 * 1024
    LOG_MARKER_RESERVE = 256  # bytes of a half kept for its truncation marker line
    ROTATED_LOG_SUFFIX = ".1"
    LOG_TRUNCATED = "log truncated: "

    def open_log(self) -> None:
        """Open output.log for appending, capped at workload.json's ``log_max_bytes``."""
        try:
            with open(self.path(WORKLOAD_FILE), encoding="utf-8") as f:
                cap = int(json.load(f).get("log_max_bytes") or self.DEFAULT_LOG_MAX_BYTES)
        except (OSError, ValueError, TypeError, AttributeError):
            cap = self.DEFAULT_LOG_MAX_BYTES
        self.log_max_bytes = max(cap, self.MIN_LOG_MAX_BYTES)
        fd = os.open(self.path(OUTPUT_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.log = os.fdopen(fd, "ab", buffering=0)
        self.log_size = os.fstat(fd).st_size  # of the current output.log
        self.log_before = 0  # bytes written to earlier output.log files (rotated away)

    def write_line(self, stream: str, text: str) -> None:
        """Append one log line with a single write() (so lines never interleave). A line longer than fits
        in half the log's cap is written as several lines."""
        if self.log is None:
            return
        now = utc_now_iso()
        prefix = f"{now} {stream} ".encode()
        rest = text.encode("utf-8", "replace")
        room = max(1, self.log_max_bytes // 2 - self.LOG_MARKER_RESERVE - len(prefix) - 1)
        while True:
            piece, rest = self.split_utf8(rest, room)
            line = prefix + piece + b"\n"
            if self.log_size > 0 and self.log_size + len(line) > self.log_max_bytes // 2:
                self.rotate_log(now)
            self.log.write(line)
            self.log_size += len(line)
            if not rest:
                return

    def rotate_log(self, now: str) -> None:
        """Keep the end of a log that would pass half its cap: output.log becomes output.log.1, replacing
        (dropping) the older half, and a new output.log starts with the ``system`` line
        ``log truncated: N earlier bytes dropped (cap C)``, N counting every byte written before that file.

        So output.log.1 and output.log together never hold more than the cap, and the newest full half is
        always kept. Read output.log.1 then output.log: the marker comes first (a reader skips the one at
        the top of output.log while output.log.1 exists: its N becomes true once it is output.log.1). A
        follower sees output.log's inode change; the rotated file is complete by then. The marker has the
        time ``now`` of the line that made the rotation, so that times never go back in the log.
        """
        assert self.log is not None
        path = self.path(OUTPUT_LOG)
        try:
            os.replace(path, path + self.ROTATED_LOG_SUFFIX)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            return  # keep appending to the file we have (a full disk, say): over the cap, no line lost
        self.log.close()
        self.log = os.fdopen(fd, "ab", buffering=0)
        self.log_before += self.log_size
        marker = (
            f"{now} system {self.LOG_TRUNCATED}{self.log_before} earlier bytes dropped "
            f"(cap {self.format_bytes(self.log_max_bytes)})\n"
        ).encode()
        self.log.write(marker)
        self.log_size = len(marker)

    @staticmethod
    def split_utf8(data: bytes, size: int) -> tuple[bytes, bytes]:
        """``data`` cut after at most ``size`` bytes, not inside a UTF-8 character where it can help."""
        if len(data) <= size:
            return data, b""
        cut = size
        while cut > size - 4 and cut > 1 and data[cut] & 0xC0 == 0x80:
            cut -= 1
        if data[cut] & 0xC0 == 0x80:
            cut = size
        return data[:cut], data[cut:]

    @staticmethod
    def format_bytes(n: int) -> str:
        """256 MiB, 64 KiB, 1000 bytes."""
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n >= size and n % size == 0:
                return f"{n // size} {unit}"
        return f"{n} bytes"

    def system(self, text: str, phase: str = "main") -> None:
        """dlcloud's own line(s), in the log section of ``phase``."""
        for line in text.splitlines() or [""]:  # one log record per line keeps the format parseable
            self.write_line(stream_name(phase, "system"), line)

    # ---- the whole run

    def run(self) -> None:
        with open(self.path(WORKLOAD_FILE), encoding="utf-8") as f:
            workload: dict[str, Any] = json.load(f)
        network = (workload.get("sandbox") or {}).get("network")
        if isinstance(network, dict) and network.get("make"):  # first: it makes the namespace the others wait for
            limits.start_holder(str(network["dir"]), netns_holder)
        self.install_signal_handlers()
        self.open_log()
        self.grace = max(0.0, float(workload.get("grace_seconds", 10.0)))
        sandbox = workload.get("sandbox") or {}
        self.sandbox_argv = [str(a) for a in sandbox.get("argv") or ()]
        uid = sandbox.get("uid")
        self.sandbox_uid = uid if isinstance(uid, int) else None
        self.seccomp = bytes.fromhex(str(sandbox.get("seccomp") or ""))
        post_timeout = workload.get("post_timeout_seconds")
        if post_timeout is not None:
            self.post_timeout = max(0.0, float(post_timeout))
        timeout = workload.get("timeout_seconds")
        if timeout is not None:
            self.deadline = self.started_monotonic + float(timeout)
        cpus = float(workload.get("cpus", 1.0))
        memory_bytes = int(workload.get("memory_bytes", 0))
        pids_max = int(workload.get("pids_max") or 0)
        name = limits.cgroup_name()
        v2 = create_cgroup(name, cpus, memory_bytes, pids_max)
        v1 = None if v2 is not None or os.geteuid() != 0 else create_cgroups_v1(name, cpus, memory_bytes, pids_max)
        self.cgroups = [v2] if v2 is not None else v1 or []
        kind = "cgroup2" if v2 is not None else "cgroup1" if v1 else "rlimit"
        write_json_atomic(
            self.path(LAUNCHER_FILE),
            {
                "pid": os.getpid(),
                "proc_start_ticks": proc_start_ticks(os.getpid()),
                "started_at": utc_now_iso(),
                "limits": kind,
                "cgroup": self.cgroups[0] if self.cgroups else None,
                "cgroups": self.cgroups,
            },
        )
        if os.path.exists(self.path(STOP_REQUEST_FILE)):
            self.term_requested = True
        self.system(f"launcher started (pid {os.getpid()}, limits {kind})")
        try:
            self.run_attempt(workload, cpus, memory_bytes)
        finally:
            for cgroup in self.cgroups:
                remove_cgroup(cgroup)

    def run_attempt(self, workload: dict[str, Any], cpus: float, memory_bytes: int) -> None:
        env = {str(k): str(v) for k, v in (workload.get("env") or {}).items()}
        gpus = [int(g) for g in workload.get("gpus") or ()]
        env["DLCLOUD_GPUS"] = ",".join(map(str, gpus))  # host indices, for the record
        # a sandbox holds only its GPUs' device nodes, and CUDA numbers the devices it can open from 0
        visible = range(len(gpus)) if self.sandbox_argv else gpus
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible))
        env["PYTHONUNBUFFERED"] = "1"
        # Thread pools sized to the CPU share, also under cgroup2: cpu.max throttles, it does not hide CPUs.
        for var in THREAD_VARS:
            env.setdefault(var, str(max(1, math.floor(cpus))))
        if self.term_requested:
            self.stopped = True
            self.system("stop requested before the command started")
            self.finish(LAUNCH_FAILED, "stopped before the command started")
            return
        try:
            preexec = self.preexec = self.child_setup(workload, memory_bytes)
        except limits.NetworkError as exc:
            self.stopped = self.term_requested  # a stop while the namespace was awaited is a stop
            self.system(str(exc))
            self.finish(LAUNCH_FAILED, self.before_main_message() if self.stopped else str(exc))
            return
        try:
            code_dir = self.prepare(workload, env)
        except PrepareError as exc:
            self.system(f"preparation failed: {exc}")
            self.finish(LAUNCH_FAILED, f"preparation failed: {exc}")
            return
        if self.stop_or_timeout_before_main():
            self.finish(LAUNCH_FAILED, self.before_main_message())
            return

        # From here on a phase has run (or tried to): post_command always follows.
        timeout = workload.get("timeout_seconds")
        pre, post = workload.get("pre_command"), workload.get("post_command")
        code, message = self.run_pre_and_main(str(workload["command"]), pre, timeout, code_dir, env, preexec)
        if post:
            self.run_post(str(post), code, code_dir, env, preexec)
        self.finish(code, message)

    def child_setup(self, workload: dict[str, Any], memory_bytes: int) -> Callable[[], None] | None:
        """What every child runs before it execs: its cgroups or rlimits, then the attempt's network namespace
        (``sandbox.network``: waited for here, NetworkError when it cannot be had) — and the disk meter of the
        directories the job writes."""
        sandbox = workload.get("sandbox") or {}
        network = sandbox.get("network")
        namespaces: list[tuple[int, int]] = []
        if isinstance(network, dict):
            namespaces = limits.join_network(
                str(network["dir"]),
                netns_holder,
                bool(network.get("userns")),
                NETWORK_WAIT_SECONDS,
                lambda: self.term_requested,
            )
        disk = int(workload.get("disk_max_bytes") or 0)
        if disk > 0:
            writable = [self.path(d) for d in (CODE_DIR, PACKAGES_DIR, TMP_DIR)]
            self.disk = limits.DiskMeter([*writable, *map(str, workload.get("data_dirs") or ())], disk)
        nproc = limits.nproc_limit(workload, self.cgroups, bool(self.sandbox_argv), self.sandbox_uid is None)
        return limits.child_setup(self.cgroups, 0 if self.cgroups else memory_bytes, namespaces, nproc, disk)

    def sandboxed(self, command: list[str]) -> tuple[list[str], tuple[int, ...]]:
        """The argv that runs ``command`` in the sandbox, and the fds it needs. bwrap reads its own options from
        an in-memory file (``--args``), so that its argv, which every process of the sandbox can read in
        ``/proc/1/cmdline``, names none of the host's paths (what follows ``--`` is the command, as the job knows
        it); the seccomp filter (``sandbox.seccomp``, as root: no user namespaces) comes the same way."""
        if not self.sandbox_argv:
            return command, ()
        split = self.sandbox_argv.index("--") if "--" in self.sandbox_argv else len(self.sandbox_argv)
        options, rest = self.sandbox_argv[1:split], self.sandbox_argv[split:]
        fds: list[int] = []
        if self.seccomp:
            fds.append(files.memfd(self.seccomp))
            options = ["--seccomp", str(fds[-1]), *options]
        fds.append(files.memfd(("\0".join(options) + "\0").encode()))
        return [self.sandbox_argv[0], "--args", str(fds[-1]), *rest, *command], tuple(fds)

    def stop_or_timeout_before_main(self) -> bool:
        """Whether a stop or the timeout came before the main command could start (and log it)."""
        if self.term_requested or self.stopped:
            self.stopped = True
            self.system("stop requested before the command started")
            return True
        if self.timed_out or (self.deadline is not None and time.monotonic() >= self.deadline):
            self.timed_out = True
            self.system("timed out before the command started")
            return True
        return False

    def before_main_message(self) -> str:
        return "stopped before the command started" if self.stopped else "timed out before the command started"

    def run_pre_and_main(
        self,
        command: str,
        pre: str | None,
        timeout: Any,
        code_dir: str,
        env: dict[str, str],
        preexec: Callable[[], None] | None,
    ) -> tuple[int, str]:
        """Run pre_command (if any), then, unless it failed or a stop or the timeout came, the command.

        Returns the attempt's exit code and exit.json's message.
        """
        if pre:
            code, error = self.run_phase("pre", str(pre), code_dir, env, preexec)
            if error is not None:
                self.system("command skipped: pre_command could not be started")
                return code, f"{error}; the command did not run"
            why = "stopped" if self.stopped else f"timed out after {timeout} s" if self.timed_out else ""
            self.system(f"pre_command exited with code {code}" + (f" ({why})" if why else ""), "pre")
            if why:
                self.system(f"command skipped: pre_command was {'stopped' if self.stopped else 'timed out'}")
                return code, f"{why} while pre_command ran; the command did not run"
            if self.disk_message():
                self.system("command skipped: pre_command passed the disk limit")
                return code, f"{self.disk_message()} while pre_command ran; the command did not run"
            if code != 0:
                self.system(f"command skipped: pre_command exited with code {code}")
                return code, f"pre_command exited with code {code}; the command did not run"
            if self.stop_or_timeout_before_main():
                return LAUNCH_FAILED, self.before_main_message()
        code, error = self.run_phase("main", command, code_dir, env, preexec)
        if error is not None:
            return code, error
        message = f"timed out after {timeout} s" if self.timed_out else "stopped" if self.stopped else ""
        if self.disk is not None:
            self.disk.note_failure(code)
        message = self.disk_message() or message
        self.system(f"command exited with code {code}" + (f" ({message})" if message else ""))
        return code, message

    def run_post(
        self, post: str, code: int, code_dir: str, env: dict[str, str], preexec: Callable[[], None] | None
    ) -> None:
        """Run post_command with DLCLOUD_EXIT_CODE; its result goes to exit.json apart from the exit code."""
        status = shell_status(code)
        self.post_deadline = time.monotonic() + self.post_timeout
        post_env = {**env, "DLCLOUD_EXIT_CODE": str(status)}
        post_code, error = self.run_phase("post", post, code_dir, post_env, preexec, f" (DLCLOUD_EXIT_CODE={status})")
        self.post_exit_code = post_code
        if error is not None:
            return
        notes = [f"timed out after {self.post_timeout:g} s"] if self.post_timed_out else []
        if post_code != 0:
            notes.append(f"ignored: the attempt keeps exit code {code}")
        self.system(f"post_command exited with code {post_code}" + (f" ({'; '.join(notes)})" if notes else ""), "post")

    def run_phase(
        self,
        phase: str,
        command: str,
        code_dir: str,
        env: dict[str, str],
        preexec: Callable[[], None] | None,
        note: str = "",
    ) -> tuple[int, str | None]:
        """Start one phase in its own process group and supervise it: (return code, None), or
        (LAUNCH_FAILED, why) when it could not be started."""
        label = "" if phase == "main" else f" {PHASE_LABELS[phase]}"
        self.system(f"starting{label}{note}: {command}", phase)
        argv, fds = self.sandboxed(["/bin/sh", "-c", command])
        try:
            proc = self.spawn(argv, fds, code_dir, {**env, "DLCLOUD_PHASE": phase}, subprocess.PIPE, preexec)
        except (OSError, subprocess.SubprocessError) as exc:
            error = f"could not start the {PHASE_LABELS[phase]}: {exc}"
            self.system(error, phase)
            return LAUNCH_FAILED, error
        self.record_child(proc.pid, PHASE_ROLES[phase])
        return self.sandbox_status(self.supervise(proc, phase)), None

    def time_out(self, phase: str, pgid: int) -> None:
        """The phase's time limit passed (the job's timeout, or post's own): SIGTERM its group and say so."""
        if phase == "post":
            self.post_timed_out = True
            what = f"post_command still running after its post_timeout of {self.post_timeout:g} s"
        else:
            self.timed_out = True
            what = "timeout"
        self.system(f"{what}: SIGTERM to process group {pgid}, SIGKILL in {self.grace:g} s", phase)
        self.terminate(pgid)

    def over_disk(self, phase: str, pgid: int) -> bool:
        """Measure the job's directories; past the disk limit, SIGTERM the phase (once per phase) and say why."""
        assert self.disk is not None
        why = self.disk.over(phase)
        if why is not None:
            self.system(f"disk limit: {why}: SIGTERM to process group {pgid}, SIGKILL in {self.grace:g} s", phase)
            self.terminate(pgid)
        return why is not None

    def disk_message(self) -> str:
        return self.disk.reason if self.disk is not None else ""

    def sandbox_status(self, code: int) -> int:
        """bwrap reports a command killed by signal N as 128+N: give it back as -N, as for an unsandboxed one."""
        if self.sandbox_argv and 128 < code <= 128 + 64:
            return 128 - code
        return code

    def terminate(self, pgid: int) -> None:
        """SIGTERM to a phase's process group — in a sandbox, to every member but bwrap itself (the group's
        leader), whose death would SIGKILL the sandbox before the command could end gracefully."""
        if self.sandbox_argv:
            signal_group_except(pgid, signal.SIGTERM, pgid)
        else:
            signal_group(pgid, signal.SIGTERM)

    def finish(self, exit_code: int, message: str) -> None:
        for cgroup in self.cgroups:
            remove_cgroup(cgroup)
        self.cgroups = []
        write_json_atomic(
            self.path(EXIT_FILE),
            {
                "exit_code": exit_code,
                "finished_at": utc_now_iso(),
                "timed_out": self.timed_out,
                "stopped": self.stopped,
                "message": message,
                "post_exit_code": self.post_exit_code,
                "post_timed_out": self.post_timed_out,
            },
        )

    def spawn(
        self,
        argv: list[str],
        fds: tuple[int, ...],
        cwd: str,
        env: dict[str, str],
        stderr: int,
        preexec: Callable[[], None] | None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` (from ``sandboxed``) in a process group of its own, stdout a pipe, stderr ``stderr``
        (a pipe of its own or stdout's), passing ``fds`` to it; they are closed here, started or not."""
        try:
            return subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                close_fds=True,
                pass_fds=fds,
                process_group=0,
                preexec_fn=preexec,
            )
        finally:
            for fd in fds:
                os.close(fd)

    def record_child(self, pid: int, role: str) -> None:
        self.live_pgid = pid
        write_json_atomic(
            self.path(CHILD_FILE),
            {
                "pid": pid,
                "pgid": pid,
                "sid": os.getsid(0),
                "proc_start_ticks": proc_start_ticks(pid),
                "role": role,
            },
        )

    # ---- preparation

    def prepare(self, workload: dict[str, Any], env: dict[str, str]) -> str:
        """Unpack the archive and install the package; return the code directory. Raises PrepareError."""
        code_dir = self.path(CODE_DIR)
        os.makedirs(code_dir, mode=0o700, exist_ok=True)
        archive = workload.get("code_archive")
        if archive:
            self.system(f"unpacking {os.path.basename(archive)} into {CODE_DIR}/")
            extract_archive(str(archive), code_dir)
        if self.sandbox_uid is not None:
            chown_tree(code_dir, self.sandbox_uid)
        package = workload.get("package")
        if package:
            packages = self.path(PACKAGES_DIR)
            python = str(workload.get("python") or sys.executable)
            self.system(f"installing {os.path.basename(package)} into {PACKAGES_DIR}/")
            # building an sdist runs its setup code: pip runs in the job's sandbox like the phases
            pip = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
            # a sandboxed job sees its directories at neutral paths (sandbox.paths; job_view.py)
            seen = (workload.get("sandbox") or {}).get("paths") or {}
            packages_seen = str(seen.get("packages") or packages)
            pip += ["--disable-pip-version-check", "--no-input", "--target", packages_seen]
            pip.append(str(seen.get("package") or package))
            argv, fds = self.sandboxed(pip)
            try:
                proc = self.spawn(argv, fds, code_dir, env, subprocess.STDOUT, self.preexec)
            except (OSError, subprocess.SubprocessError) as exc:
                raise PrepareError(f"could not run pip: {exc}") from exc
            self.record_child(proc.pid, "prepare")
            code = self.supervise(proc, "prepare")
            if self.stopped or self.timed_out:
                return code_dir  # the caller reports stop / timeout
            if code != 0:
                raise PrepareError(f"pip install of {os.path.basename(package)} exited with code {code}")
            old = env.get("PYTHONPATH")
            env["PYTHONPATH"] = packages_seen + (os.pathsep + old if old else "")
        return code_dir

    # ---- running a process

    def supervise(self, proc: subprocess.Popen[bytes], phase: str) -> int:
        """Pump the process's pipes into output.log until it exits; enforce stop requests, time and disk limits.

        ``phase`` is ``prepare`` (pip: logged as ``system`` lines prefixed ``pip: ``), or ``pre`` / ``main`` /
        ``post`` (that phase's stdout / stderr). A stop and the job's timeout end every phase but ``post``, which
        only its own ``post_timeout`` ends. Returns the return code (negative: killed by that signal); by then
        every process of the group is gone or SIGKILLed and the leader is reaped."""
        is_post = phase == "post"
        deadline = self.post_deadline if is_post else self.deadline

        def limit_pending() -> bool:
            """Whether this phase's time limit is still to be enforced."""
            return not self.post_timed_out if is_post else not (self.timed_out or self.stopped)

        def emit(stream: str, data: bytes) -> None:
            text = data.decode("utf-8", "replace").removesuffix("\r")
            if phase == "prepare":
                self.system("pip: " + text)
            else:
                self.write_line(stream_name(phase, stream), text)

        pipes = files.Pipes(proc, self.wake_r, emit, MAX_LINE_BYTES)
        select = pipes.select
        pgid = proc.pid
        kill_at: float | None = None
        exited_at: float | None = None
        try:
            while True:
                now = time.monotonic()
                if self.term_requested and not self.stopped and not is_post:
                    self.stopped = True
                    self.system(f"stop requested: SIGTERM to process group {pgid}, SIGKILL in {self.grace:g} s", phase)
                    self.terminate(pgid)
                    kill_at = now + self.grace if kill_at is None else kill_at
                if is_post and self.term_signals > self.terms_noted:
                    # post is the clean-up a stop must not skip: it runs on, bounded by post_timeout
                    self.system(f"stop requested: post_command may finish (at most {self.post_timeout:g} s)", phase)
                self.terms_noted = self.term_signals
                if deadline is not None and now >= deadline and limit_pending():
                    self.time_out(phase, pgid)
                    kill_at = now + self.grace
                if self.disk is not None and exited_at is None and self.disk.due(now) and self.over_disk(phase, pgid):
                    kill_at = now + self.grace if kill_at is None else kill_at
                if kill_at is not None and now >= kill_at:
                    kill_at = None
                    if exited_at is None:
                        self.system(
                            f"still running {self.grace:g} s after SIGTERM: SIGKILL to process group {pgid}", phase
                        )
                        signal_group(pgid, signal.SIGKILL)
                if exited_at is None and has_exited(proc.pid):
                    exited_at = now
                if exited_at is not None and (not pipes.open or now >= exited_at + PIPE_DRAIN_SECONDS):
                    break
                waits = [1.0]
                if exited_at is not None:
                    waits.append(exited_at + PIPE_DRAIN_SECONDS - now)
                if kill_at is not None:
                    waits.append(kill_at - now)
                if deadline is not None and limit_pending():
                    waits.append(deadline - now)
                if self.disk is not None and exited_at is None:
                    waits.append(self.disk.next_at - now)
                select(min(waits))
            # The leader is a zombie we have not reaped, so its pid (= pgid) cannot be reused yet:
            # killing the group now only hits what the command left behind.
            if pipes.open:
                self.system(
                    f"output pipes still open {PIPE_DRAIN_SECONDS:g} s after exit: killing process group", phase
                )
            signal_group(pgid, signal.SIGKILL)
            end = time.monotonic() + 0.5
            while pipes.open and time.monotonic() < end:
                select(end - time.monotonic())
        finally:
            pipes.close_all()
        code = proc.wait()
        self.live_pgid = None
        return code


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_group_except(pgid: int, sig: int, spared: int) -> None:
    """Signal each process of group ``pgid`` but ``spared``. The group cannot be reused while its leader
    (``spared``, unreaped) exists, so every pid found belongs to it."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == spared:
            continue
        try:
            stat = read_proc_stat(int(name))
        except (OSError, ValueError, IndexError):
            continue
        if stat is not None and stat[1] == pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(name), sig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} <attempt_dir>", file=sys.stderr)
        return 2
    launcher = Launcher(os.path.abspath(argv[1]))
    try:
        launcher.run()
    except BaseException as exc:  # the attempt must end with an exit.json whatever went wrong
        traceback.print_exc()  # to launcher.log
        message = f"launcher error: {type(exc).__name__}: {exc}"
        if launcher.live_pgid is not None:  # still unreaped, so the pgid is still ours
            signal_group(launcher.live_pgid, signal.SIGKILL)
        try:
            launcher.system(message)
            if not os.path.exists(launcher.path(EXIT_FILE)):
                launcher.finish(LAUNCH_FAILED, message)
        except OSError:
            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
