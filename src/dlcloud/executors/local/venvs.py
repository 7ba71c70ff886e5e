"""Runtime environments of the local executor: Python virtual environments built once per spec hash.

This module knows nothing of tenants or the database: it builds the venv of a ``BuildSpec`` (the spec and
its hash are backend-neutral: ``executors/environments.py``); finding interpreters, describing the base
environment (the Python environment the server runs in) and the directory's paths and locks are
``executors/host_venvs.py``, shared with the simulated executor. Services reach it only through
``LocalVenvBackend`` (``environments.py`` beside this module).

Layout under the environments directory (``<data_dir>/envs``)::

    <hash>/                the venv; complete, and read-only, once it holds READY_MARKER
    .locks/<hash>.lock     flock: one builder per hash at a time, across threads and processes
    .logs/<hash>.log       the latest build's log: "<UTC time>Z <stream> <text>" lines (system | stdout)

Invariants:
- Whoever writes ``<hash>/`` holds the hash's lock. A venv directory without READY_MARKER is unfinished
  (a build was interrupted): the next builder deletes it and builds again.
- A venv is built in place, not in a temporary directory renamed at the end: a venv's scripts (``bin/pip``,
  ``bin/activate``) hold its absolute path, so a renamed venv would point at the temporary name. The lock
  and the marker give the same guarantee as a rename: nobody uses a half-built venv.
- A finished venv is never changed: its files and directories are made read-only (``chmod a-w``) before
  the marker is written into it.
- *Inheritance*: an ``inherit`` venv has no pip of its own and a ``.pth`` file that adds the base
  environment's site-packages after its own (``site.addsitedir``, so the base's own ``.pth`` files work
  too). The base's packages are importable and pip sees them as installed, so they are not installed again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dlcloud.executors.environments import BuildCancelled, BuildError, BuildResult, BuildSpec
from dlcloud.executors.host_venvs import (
    BuildLog,
    HostBuild,
    build_env_vars,
    build_lock,
    log_path,
    remove_tree,
    venv_dir,
)

READY_MARKER = ".dlcloud-ready"
SPEC_FILE = "dlcloud-environment.json"
BASE_PTH = "_dlcloud_base.pth"
ERROR_LINES = 8  # pip output kept in a failed build's error
_CREDENTIALS_RE = re.compile(r"(://)[^/@\s]+@")  # user:password@ in an index URL: never logged
_USERINFO_RE = re.compile(r"://([^/@\s]+)@")
PIP_SCRIPT = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


# -- the venv's state ------------------------------------------------------------------------------------


def is_ready(envs_dir: Path, spec_hash: str) -> bool:
    return (venv_dir(envs_dir, spec_hash) / READY_MARKER).exists()


def tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def _make_read_only(path: Path) -> None:
    """chmod a-w on everything below ``path`` (not ``path`` itself: the marker is written into it last)."""
    no_write = ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            p = os.path.join(root, name)
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) & no_write)


def url_credentials(env: dict[str, str]) -> tuple[str, ...]:
    """The ``user:password`` parts (and passwords) of the URLs in ``env``'s values, longest first: a build's
    output is logged with each of them replaced by ``***``."""
    found: set[str] = set()
    for value in env.values():
        for userinfo in _USERINFO_RE.findall(value):
            _user, sep, password = userinfo.partition(":")
            found.update(v for v in (userinfo, password if sep else "") if len(v) >= 4)
    found.update({urllib.parse.unquote(v) for v in found})
    return tuple(sorted(found, key=len, reverse=True))


# -- the build -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildSandbox:
    """How a build's steps that may run user code (venv creation, pip: sdists run their setup code) are
    sandboxed; made by ``LocalExecutor.build_sandbox``."""

    # (the venv being built, paths the step must read) -> the argv prefix; only the venv (and a temporary
    # directory beside it) is writable in the sandbox
    prefix: Callable[[Path, Sequence[str]], list[str]]
    # after a successful build: make the venv readable (never writable) by every tenant's jobs
    seal: Callable[[Path], None]


@dataclass
class Runner:
    """Runs a build's subprocesses; ``cancel`` kills the running ones (the builder is shutting down)."""

    timeout: float = 3600.0
    sandbox: BuildSandbox | None = None
    env: dict[str, str] = field(default_factory=build_env_vars)
    _procs: set[subprocess.Popen[str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def run(
        self, argv: list[str], log: BuildLog, deadline: float, what: str, target: Path | None = None, reads=()
    ) -> list[str]:
        """Run ``argv``, logging its output; returns the output's lines. Raises BuildError on failure.

        With a ``target`` (the venv being built) the step runs sandboxed, able to write only the target and
        to read, beyond the system and the Python installations, only ``reads``."""
        if target is not None and self.sandbox is not None:
            argv = [*self.sandbox.prefix(target, [argv[0], *reads]), *argv]
        with self._lock:
            if self.cancelled:
                raise BuildCancelled()
            try:
                proc = subprocess.Popen(
                    argv,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    start_new_session=True,
                )
            except OSError as exc:  # its text names the program's path on the server: the reason alone
                raise BuildError(f"could not run {what}: {exc.strerror or type(exc).__name__}") from None
            self._procs.add(proc)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(max(deadline - time.monotonic(), 0.0), kill)
        timer.daemon = True
        timer.start()
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            hidden = url_credentials(self.env)
            for raw in proc.stdout:
                text = raw.rstrip("\n")
                for value in hidden:
                    text = text.replace(value, "***")
                lines.append(text)
                if len(lines) > 2000:
                    del lines[:1000]
                log.line("stdout", text)
            code = proc.wait()
        finally:
            timer.cancel()
            with self._lock:
                self._procs.discard(proc)
        if self.cancelled:
            raise BuildCancelled()
        if timed_out.is_set():
            raise BuildError(f"{what} did not finish within the build time limit of {self.timeout:g} s")
        if code != 0:
            raise BuildError(f"{what} failed (exit code {code}){_summary(lines)}")
        return lines


def _summary(lines: list[str]) -> str:
    """pip's error lines, else the last lines of its output."""
    errors = [line.strip() for line in lines if line.strip().startswith("ERROR:")]
    tail = errors[-ERROR_LINES:] or [line.strip() for line in lines if line.strip()][-ERROR_LINES:]
    return (":\n" + "\n".join(tail)) if tail else ""


def materialise(spec: BuildSpec, spec_hash: str, envs_dir: Path, runner: Runner, host: HostBuild) -> BuildResult:
    """Make ``<envs_dir>/<spec_hash>`` a finished venv for ``spec``, building it unless it is there, with what
    this host has for it (``host``: the interpreter, the base environment, the wheels' files).

    Blocks while another builder holds the hash's lock. Raises BuildError (readable message; the venv
    directory is removed) or BuildCancelled.
    """
    envs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = venv_dir(envs_dir, spec_hash)
    with build_lock(envs_dir, spec_hash):
        if (target / READY_MARKER).exists():
            return BuildResult(tree_size(target), built=False)
        log_file = log_path(envs_dir, spec_hash)
        log_file.parent.mkdir(exist_ok=True, mode=0o700)
        with open(log_file, "w", encoding="utf-8") as f:  # the log is that of the latest build
            log = BuildLog(f)
            try:
                size = _build(spec, target, log, runner, host)
            except BuildCancelled:
                log.system("build interrupted: the control plane is stopping; it starts again on the next start")
                with contextlib.suppress(OSError):
                    remove_tree(target)
                raise
            except BaseException as exc:
                log.system(f"build failed: {exc}")
                with contextlib.suppress(OSError):
                    remove_tree(target)
                raise
        return BuildResult(size, built=True)


def _build(spec: BuildSpec, target: Path, log: BuildLog, runner: Runner, host: HostBuild) -> int:
    started = time.monotonic()
    deadline = started + runner.timeout
    if os.path.lexists(target):
        log.system(f"removing the unfinished venv {target.name} of an interrupted build")
        remove_tree(target)
    what = "inherits the server's packages" if spec.inherit else "a clean environment"
    log.system(
        f"build started: Python {spec.python} ({host.interpreter}), {what}, {len(spec.requirements)} "
        f"requirement(s), {len(spec.wheels)} wheel(s)"
    )
    argv = [host.interpreter, "-m", "venv"]
    if spec.inherit:
        argv.append("--without-pip")  # pip comes from the base environment
    target.mkdir(mode=0o755)  # made here, so that a sandboxed step can be given it
    runner.run([*argv, str(target)], log, deadline, "creating the virtual environment", target)
    python = target / "bin" / "python"
    if spec.inherit:
        _inherit(spec, target, python, log, host)
    if spec.requirements or spec.wheels:
        _pip_install(spec, target, python, log, runner, deadline, host)
    with open(target / SPEC_FILE, "w", encoding="utf-8") as f:
        json.dump(spec.to_json(), f, indent=2)
    size = tree_size(target)
    if runner.sandbox is not None:
        runner.sandbox.seal(target)
    _make_read_only(target)
    marker = target / READY_MARKER
    marker.touch()
    marker.chmod(0o444)
    os.chmod(target, 0o555)
    log.system(f"build finished in {time.monotonic() - started:.1f} s ({size / 1024**2:.1f} MiB)")
    return size


def _inherit(spec: BuildSpec, target: Path, python: Path, log: BuildLog, host: HostBuild) -> None:
    site = target / "lib" / f"python{spec.python}" / "site-packages"
    if not site.is_dir():
        raise BuildError(f"the new venv has no {site.relative_to(target)}; cannot add the base environment")
    lines = [f"import site; site.addsitedir({d!r})" for d in host.base_site]
    (site / BASE_PTH).write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name in ("pip", "pip3", f"pip{spec.python}"):
        script = target / "bin" / name
        script.write_text(PIP_SCRIPT.format(python=python), encoding="utf-8")
        script.chmod(0o755)
    log.system(f"inheriting the packages of {host.base_prefix} ({', '.join(host.base_site)})")


def _pip_install(
    spec: BuildSpec, target: Path, python: Path, log: BuildLog, runner: Runner, deadline: float, host: HostBuild
) -> None:
    argv = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if spec.no_index:
        argv.append("--no-index")
    if spec.index_url:
        argv += ["--index-url", spec.index_url]
    for url in spec.extra_index_urls:
        argv += ["--extra-index-url", url]
    # as arguments, never in a requirements file: pip expands ${NAME} in a file from its environment
    argv += spec.requirements
    for sha, path in host.wheel_files:
        if not os.path.isfile(path):
            raise BuildError(
                f"the uploaded wheel {os.path.basename(path)} (sha256 {sha[:12]}) is missing on the server"
            )
        argv.append(path)
    log.system("pip install " + _CREDENTIALS_RE.sub(r"\1***@", " ".join(argv[4:])))
    runner.run(argv, log, deadline, "pip install", target, [path for _sha, path in host.wheel_files])
