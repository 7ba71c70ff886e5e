"""What the executors that describe environments as venvs on this host share: the local executor builds them
(``local/venvs.py``, ``local/environments.py``); the simulated executor describes them the same way and builds
nothing (``simulated.py``). Neither imports the other.

This module finds interpreters, describes the base environment (the Python environment the server runs in),
and knows the layout of the environments directory (``local/venvs.py`` says what each entry holds)::

    <hash>/                the venv of a spec hash
    .locks/<hash>.lock     flock: one builder per hash at a time, across threads and processes
    .logs/<hash>.log       the latest build's log: "<UTC time>Z <stream> <text>" lines (system | stdout)

``HostVenvBackend`` is the ``EnvironmentBackend`` of such environments less the build, which each executor
supplies (``_build``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from dlcloud.executors.environments import EnvironmentBackend

# all a build's subprocesses see of the server's environment (never DLCLOUD_* or PIP_* variables)
PASSED_VARS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
_DIST_RE = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+)\.(?:dist-info|egg-info)$")


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
    """The ``base_packages`` field of an inheriting spec: the digest of the server's environment as it is now
    (its directories are this host's, found when a build runs: ``HostBuild``)."""
    return {"base_packages": base_digest(base_distributions())}


@dataclass(frozen=True)
class HostBuild:
    """What building a spec takes on this host, found when the build runs and never stored (``BuildSpec``
    names no host path): the interpreter of its Python, the server's environment an inheriting venv adds to
    its path, and a local file for each of its wheels."""

    interpreter: str
    base_prefix: str
    base_site: tuple[str, ...]
    wheel_files: tuple[tuple[str, str], ...] = ()  # (sha256, local file)

    @classmethod
    def here(cls, interpreter: str, wheel_files: tuple[tuple[str, str], ...] = ()) -> HostBuild:
        return cls(interpreter, os.path.abspath(sys.prefix), base_site_dirs(), wheel_files)


# -- paths, locks, logs ----------------------------------------------------------------------------------


def venv_dir(envs_dir: Path, spec_hash: str) -> Path:
    return envs_dir / spec_hash


def log_path(envs_dir: Path, spec_hash: str) -> Path:
    return envs_dir / ".logs" / f"{spec_hash}.log"


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


# -- what a build's subprocesses see --------------------------------------------------------------------


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


# -- the backend ----------------------------------------------------------------------------------------


class HostVenvBackend(EnvironmentBackend):
    """Environments as venvs under ``envs_dir`` on this host, one per spec hash: described from this host's
    interpreters and base environment; subclasses build them (``_build``)."""

    def __init__(self, envs_dir: Path) -> None:
        self.envs_dir = envs_dir

    def _server_python(self) -> str:
        return python_version()

    def _interpreter(self, version: str) -> str | None:
        return find_interpreter(version)

    def _available_versions(self) -> list[str]:
        return available_versions()

    def _inherited_fields(self) -> dict[str, Any]:
        return base_spec_fields()

    def _server_packages(self) -> dict[str, str]:
        return base_distributions()

    def _discard(self, spec_hash: str, wanted: Callable[[], bool]) -> bool:
        with build_lock(self.envs_dir, spec_hash, blocking=False) as held:
            if not held or wanted():  # a builder holds it, or it was asked for again before we got the lock
                return False
            remove_tree(venv_dir(self.envs_dir, spec_hash))
            log_path(self.envs_dir, spec_hash).unlink(missing_ok=True)
            return True

    def _log_tail(self, spec_hash: str, lines: int) -> list[str]:
        return read_tail(log_path(self.envs_dir, spec_hash), lines)

    def _log_path(self, spec_hash: str) -> Path:
        return log_path(self.envs_dir, spec_hash)

    def _location(self, spec_hash: str) -> Path:
        return venv_dir(self.envs_dir, spec_hash)
