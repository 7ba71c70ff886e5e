"""Runtime environments of the local executor: Python virtual environments built once per spec hash.

This module knows nothing of tenants or the database: it finds interpreters, describes the base
environment (the Python environment the server runs in) and builds the venv of a ``BuildSpec`` (the spec and
its hash are backend-neutral: ``executors/environments.py``). Services reach it only through
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
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from dlcloud.executors.environments import BuildCancelled, BuildError, BuildResult, BuildSpec

READY_MARKER = ".dlcloud-ready"
SPEC_FILE = "dlcloud-environment.json"
BASE_PTH = "_dlcloud_base.pth"
ERROR_LINES = 8  # pip output kept in a failed build's error
# all a build's subprocesses see of the server's environment (never DLCLOUD_* or PIP_* variables)
PASSED_VARS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
_CREDENTIALS_RE = re.compile(r"(://)[^/@\s]+@")  # user:password@ in an index URL: never logged
_USERINFO_RE = re.compile(r"://([^/@\s]+)@")
_DIST_RE = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+)\.(?:dist-info|egg-info)$")
PIP_SCRIPT = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


# -- interpreters and the base environment ---------------------------------------------------------------


def python_version(info: Any = None) -> str:
    v = info or sys.version_info
    return f"{v[0]}.{v[1]}"


def probe_interpreter(path: str, timeout: float = 15.0) -> tuple[str, str] | None:
    """(major.minor, sys.executable) of the interpreter at ``path`` if it runs, else None (a pyenv shim of a
    version that is not installed, say, exists on PATH but fails)."""
    code = "import sys; print('%d.%d' % sys.version_info[:2]); print(sys.executable)"
    try:
        proc = subprocess.run(
            [path, "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=build_env_vars(),
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) < 2 or not lines[1]:
        return None
    return lines[0], lines[1]


def _candidates(search_path: str | None) -> dict[str, str]:
    found = {}
    for minor in range(6, 30):
        path = shutil.which(f"python3.{minor}", path=search_path)
        if path is not None:
            found[f"3.{minor}"] = path
    return found


def find_interpreter(version: str, search_path: str | None = None) -> str | None:
    """The interpreter of Python ``version`` on this machine: the server's own for its version, else a
    ``python3.N`` on PATH that runs and is that version; None when there is none."""
    if version == python_version():
        return os.path.abspath(sys.executable)
    path = _candidates(search_path).get(version)
    probed = probe_interpreter(path) if path is not None else None
    if probed is None or probed[0] != version:
        return None
    return probed[1]


def available_versions(search_path: str | None = None) -> list[str]:
    """Every Python version ``find_interpreter`` finds (each candidate is run once, all at the same time:
    not for hot paths)."""
    from concurrent.futures import ThreadPoolExecutor

    candidates = {v: p for v, p in _candidates(search_path).items() if v != python_version()}
    found = {python_version()}
    if candidates:
        with ThreadPoolExecutor(max_workers=len(candidates)) as pool:
            probes = dict(zip(candidates, pool.map(probe_interpreter, candidates.values()), strict=True))
        found.update(v for v, probed in probes.items() if probed is not None and probed[0] == v)
    return sorted(found, key=lambda v: int(v.split(".")[1]))


def base_site_dirs() -> tuple[str, ...]:
    """The base environment's site-packages directories (purelib first)."""
    paths = sysconfig.get_paths()
    dirs = [paths["purelib"], paths["platlib"]]
    return tuple(dict.fromkeys(os.path.abspath(d) for d in dirs if d))


def normalise_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_distributions(site_dirs: tuple[str, ...] | None = None) -> dict[str, str]:
    """Distributions installed in the base environment: normalised name -> version.

    Read from the names of the ``*.dist-info`` / ``*.egg-info`` entries (no file is opened), so it is cheap
    enough to run on every request that needs it.
    """
    out: dict[str, str] = {}
    for d in site_dirs if site_dirs is not None else base_site_dirs():
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for entry in entries:
            m = _DIST_RE.match(entry)
            if m:
                out.setdefault(normalise_name(m["name"]), m["version"])
    return dict(sorted(out.items()))


def base_digest(dists: dict[str, str]) -> str:
    """One hash for the base environment's packages: a changed base gives inherit specs a new hash."""
    return hashlib.sha256("\n".join(f"{k}=={v}" for k, v in dists.items()).encode()).hexdigest()


def base_spec_fields() -> dict[str, Any]:
    """The ``base_*`` fields of an inheriting spec, describing the server's environment as it is now."""
    site_dirs = base_site_dirs()
    return {
        "base_prefix": os.path.abspath(sys.prefix),
        "base_site": site_dirs,
        "base_packages": base_digest(base_distributions(site_dirs)),
    }


# -- paths and locks -------------------------------------------------------------------------------------


def venv_dir(envs_dir: Path, spec_hash: str) -> Path:
    return envs_dir / spec_hash


def log_path(envs_dir: Path, spec_hash: str) -> Path:
    return envs_dir / ".logs" / f"{spec_hash}.log"


def is_ready(envs_dir: Path, spec_hash: str) -> bool:
    return (venv_dir(envs_dir, spec_hash) / READY_MARKER).exists()


@contextlib.contextmanager
def build_lock(envs_dir: Path, spec_hash: str, *, blocking: bool = True) -> Iterator[bool]:
    """Hold the hash's lock; yields False (holding nothing) when ``blocking`` is off and someone else has it."""
    locks = envs_dir / ".locks"
    locks.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(locks / f"{spec_hash}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def remove_tree(path: Path) -> None:
    """Delete a venv directory, read-only files and directories included."""
    if not os.path.lexists(path):
        return
    for root, dirs, _files in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path)


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


def build_env_vars(
    environ: dict[str, str] | None = None, *, index_url: str | None = None, extra_index_urls: Sequence[str] = ()
) -> dict[str, str]:
    """The environment of a build's subprocesses, from an allow-list: a minimal base and the proxies of the
    server's environment, and the pip index given here (the admin's settings for builds).

    Never the server's ``PIP_*`` variables: sdists' setup code runs in the build and can print what it finds
    in its environment into the build log, which the environment's author reads."""
    src = os.environ if environ is None else environ
    out = {k: v for k, v in src.items() if k in PASSED_VARS or k in PROXY_VARS}
    out.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    out["PYTHONUNBUFFERED"] = "1"
    out["PIP_NO_INPUT"] = "1"
    if index_url:
        out["PIP_INDEX_URL"] = index_url
    if extra_index_urls:
        out["PIP_EXTRA_INDEX_URL"] = " ".join(extra_index_urls)
    return out


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


class BuildLog:
    """The build log: one ``<UTC time>Z <stream> <text>`` line per write."""

    def __init__(self, f: TextIO):
        self._f = f

    def line(self, stream: str, text: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for part in text.splitlines() or [""]:
            self._f.write(f"{now} {stream} {part}\n")
        self._f.flush()

    def system(self, text: str) -> None:
        self.line("system", text)


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


def materialise(spec: BuildSpec, spec_hash: str, envs_dir: Path, runner: Runner) -> BuildResult:
    """Make ``<envs_dir>/<spec_hash>`` a finished venv for ``spec``, building it unless it is there.

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
                size = _build(spec, target, log, runner)
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


def _build(spec: BuildSpec, target: Path, log: BuildLog, runner: Runner) -> int:
    started = time.monotonic()
    deadline = started + runner.timeout
    if os.path.lexists(target):
        log.system(f"removing the unfinished venv {target.name} of an interrupted build")
        remove_tree(target)
    what = "inherits the server's packages" if spec.inherit else "a clean environment"
    log.system(
        f"build started: Python {spec.python} ({spec.interpreter}), {what}, {len(spec.requirements)} "
        f"requirement(s), {len(spec.wheels)} wheel(s)"
    )
    argv = [spec.interpreter, "-m", "venv"]
    if spec.inherit:
        argv.append("--without-pip")  # pip comes from the base environment
    target.mkdir(mode=0o755)  # made here, so that a sandboxed step can be given it
    runner.run([*argv, str(target)], log, deadline, "creating the virtual environment", target)
    python = target / "bin" / "python"
    if spec.inherit:
        _inherit(spec, target, python, log)
    if spec.requirements or spec.wheels:
        _pip_install(spec, target, python, log, runner, deadline)
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


def _inherit(spec: BuildSpec, target: Path, python: Path, log: BuildLog) -> None:
    site = target / "lib" / f"python{spec.python}" / "site-packages"
    if not site.is_dir():
        raise BuildError(f"the new venv has no {site.relative_to(target)}; cannot add the base environment")
    lines = [f"import site; site.addsitedir({d!r})" for d in spec.base_site]
    (site / BASE_PTH).write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name in ("pip", "pip3", f"pip{spec.python}"):
        script = target / "bin" / name
        script.write_text(PIP_SCRIPT.format(python=python), encoding="utf-8")
        script.chmod(0o755)
    log.system(f"inheriting the packages of {spec.base_prefix} ({', '.join(spec.base_site)})")


def _pip_install(spec: BuildSpec, target: Path, python: Path, log: BuildLog, runner: Runner, deadline: float) -> None:
    argv = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if spec.no_index:
        argv.append("--no-index")
    if spec.index_url:
        argv += ["--index-url", spec.index_url]
    for url in spec.extra_index_urls:
        argv += ["--extra-index-url", url]
    # as arguments, never in a requirements file: pip expands ${NAME} in a file from its environment
    argv += spec.requirements
    for sha, path in spec.wheels:
        if not os.path.isfile(path):
            raise BuildError(
                f"the uploaded wheel {os.path.basename(path)} (sha256 {sha[:12]}) is missing on the server"
            )
        argv.append(path)
    log.system("pip install " + _CREDENTIALS_RE.sub(r"\1***@", " ".join(argv[4:])))
    runner.run(argv, log, deadline, "pip install", target, [path for _sha, path in spec.wheels])


def read_tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a log file (empty when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    if size > 64 * 1024 and text:
        text = text[1:]  # the first line may be cut
    return text[-lines:] if lines else []
