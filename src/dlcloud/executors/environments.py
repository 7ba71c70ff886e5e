"""The EnvironmentBackend ABC and the value types that cross it.

A runtime environment is what a job runs in, beyond its code: a Python version and packages. Services keep
the catalogue and every environment's state (``services/environments.py``, ``services/env_builds.py``); a
backend, made by the executor that runs the jobs (``Executor.environments``), builds the content of one
``BuildSpec`` and says where a workload finds it. The local executor's backend makes venvs on this host
(``executors/local/environments.py``); a Kubernetes one would make container images.

Invariants:
- A spec is known by its ``spec_hash`` everywhere: in the database (``environment_builds``), on disk (the
  local executor names venvs by it) and in a workload's location. ``BuildSpec``'s JSON form and hash never
  change for a given spec; change ``HASH_FORMAT`` instead, so that every spec builds anew.
- ``build`` is idempotent per hash: what is built already is found, not built again, and two builds of one
  hash at the same time build it once. A failed or cancelled build leaves nothing a workload could use.
- ``discard`` never removes an environment while it is being built.
- What a backend raises is for services to map: ``BuildError`` (its message is for users),
  ``BuildCancelled``, ``InvalidArgument`` (a Python version the server lacks) and, from ``discard``, OSError.

Vocabulary: the *server's environment* is the Python environment the control plane runs in; an ``inherit``
spec takes its packages from it, and the built-ins are made of it.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlcloud.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

HASH_FORMAT = 2  # bump when the layout of a built environment changes, so every spec builds anew (2: no host paths)
_HASH_RE = re.compile(r"[0-9a-f]{64}")


class BuildError(Exception):
    """The build failed; the message is for users (it ends with the build tool's last error lines)."""


class BuildCancelled(Exception):
    """The builder is shutting down; the build is left to the next builder."""


@dataclass(frozen=True)
class BuildSpec:
    """Everything that decides an environment's content, and nothing of the host that builds it: no
    interpreter path, no site directory, no file path (decision 7; a Kubernetes backend builds images from the
    same spec). The backend finds this host's interpreter of ``python``, its base environment and the wheels'
    bytes (by storage key) when it builds. ``spec_hash`` covers all of it except where wheels are stored (a
    wheel counts by its checksum, so the same wheel uploaded by two tenants gives one hash)."""

    python: str  # "3.11"
    inherit: bool = False
    base_packages: str | None = None  # inherit only: the digest of the server's environment's packages
    requirements: tuple[str, ...] = ()
    wheels: tuple[tuple[str, str], ...] = ()  # (sha256, object-store key)
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False

    def spec_hash(self) -> str:
        identity = {
            "format": HASH_FORMAT,
            "python": self.python,
            "inherit": self.inherit,
            "base_packages": self.base_packages,
            "requirements": sorted(self.requirements),
            "wheels": sorted(sha for sha, _ in self.wheels),
            "index_url": self.index_url,
            "extra_index_urls": sorted(self.extra_index_urls),
            "no_index": self.no_index,
        }
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildSpec:
        return cls(
            python=str(data["python"]),
            inherit=bool(data.get("inherit")),
            base_packages=data.get("base_packages"),
            requirements=tuple(data.get("requirements") or ()),
            wheels=tuple((str(sha), str(key)) for sha, key in data.get("wheels") or ()),
            index_url=data.get("index_url"),
            extra_index_urls=tuple(data.get("extra_index_urls") or ()),
            no_index=bool(data.get("no_index")),
        )


@dataclass(frozen=True)
class BuildResult:
    size_bytes: int
    built: bool  # False: the environment was there already (built by another builder)


class Cancellation:
    """Cancels, once and from any thread, the builds given it: a running one is stopped (its processes
    killed) and raises BuildCancelled, and one started afterwards raises BuildCancelled at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            callbacks = list(self._callbacks.values())
        for callback in callbacks:
            callback()

    @contextlib.contextmanager
    def watch(self, on_cancel: Callable[[], None]) -> Iterator[None]:
        """Call ``on_cancel`` on ``cancel`` while in the block (at once if cancelled already)."""
        with self._lock:
            key = self._next
            self._next += 1
            self._callbacks[key] = on_cancel
            cancelled = self._cancelled
        try:
            if cancelled:
                on_cancel()
            yield
        finally:
            with self._lock:
                del self._callbacks[key]


def _check_hash(spec_hash: str) -> str:
    # a hash names directories and images: anything else is a caller's bug, never a user's input
    if not _HASH_RE.fullmatch(spec_hash):
        raise ValueError(f"not a spec hash: {spec_hash!r}")
    return spec_hash


class EnvironmentBackend(abc.ABC):
    """Builds environments from specs and says where workloads find them. Public methods check their input
    and log; implementations fill the ``_`` hooks."""

    name: str = "base"

    # -- the server's environment -------------------------------------------------------------------------

    def server_python(self) -> str:
        """The Python version (``major.minor``) of the server's environment."""
        return self._server_python()

    def check_python(self, version: str) -> None:
        """Whether environments of Python ``version`` can be built (the backend finds its interpreter when it
        builds).

        Raises:
            InvalidArgument: the server has no such Python; the message and details list those it has.
        """
        if self._interpreter(version) is None:
            available = self._available_versions()
            raise InvalidArgument(
                f"Python {version} is not installed on the server; available: {', '.join(available)}",
                details={"available": available},
            )

    def inherited_fields(self) -> dict[str, Any]:
        """The ``base_packages`` field of a spec that inherits the server's environment, as that is now."""
        return self._inherited_fields()

    def server_packages(self) -> dict[str, str]:
        """The distributions installed in the server's environment: normalised name -> version (cheap)."""
        return self._server_packages()

    # -- builds ---------------------------------------------------------------------------------------------

    def build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult:
        """Make the environment of ``spec`` (known as ``spec_hash``), unless it is made already; blocks while
        another builder builds the same hash. Bounded by the backend's build time limit.

        Raises:
            BuildError: the build failed or ran out of time (nothing of it is left to use); the message is
                for users.
            BuildCancelled: ``cancel`` was cancelled.
        """
        _check_hash(spec_hash)
        if cancel.cancelled:
            raise BuildCancelled()
        started = time.monotonic()
        try:
            result = self._build(spec, spec_hash, cancel)
        except OSError as exc:  # its text may name the server's directories: the log has it, the user the reason
            log.error("%s backend: building environment %s failed: %s", self.name, spec_hash[:12], exc)
            raise BuildError(f"could not build the environment: {exc.strerror or type(exc).__name__}") from exc
        if result.built:
            log.info("%s backend built environment %s in %.1f s", self.name, spec_hash[:12], time.monotonic() - started)
        return result

    def discard(self, spec_hash: str, wanted: Callable[[], bool] = lambda: False) -> bool:
        """Remove the environment of ``spec_hash`` (built, failed or half-built) and its build log; returns
        whether it did. Nothing is removed while a build of it runs, or when ``wanted()``, asked while no
        build can start, says the hash was asked for again. Raises OSError when removing fails."""
        _check_hash(spec_hash)
        removed = self._discard(spec_hash, wanted)
        if removed:
            log.info("%s backend removed environment %s", self.name, spec_hash[:12])
        return removed

    def log_tail(self, spec_hash: str, lines: int) -> list[str]:
        """The last ``lines`` lines of the latest build's log (empty when there is none)."""
        return self._log_tail(_check_hash(spec_hash), lines) if lines > 0 else []

    def log_path(self, spec_hash: str) -> Path:
        """The file the latest build's log is written to as the build runs, for followers. A new build of the
        hash starts it again from empty; it may not exist."""
        return self._log_path(_check_hash(spec_hash))

    def location(self, spec_hash: str) -> Path:
        """Where a workload finds the built environment (``Workload.venv``), in terms the executor that made
        this backend understands."""
        return self._location(_check_hash(spec_hash))

    # -- hooks ----------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _server_python(self) -> str: ...

    @abc.abstractmethod
    def _interpreter(self, version: str) -> str | None: ...

    @abc.abstractmethod
    def _available_versions(self) -> list[str]: ...

    @abc.abstractmethod
    def _inherited_fields(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _server_packages(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def _build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult: ...

    @abc.abstractmethod
    def _discard(self, spec_hash: str, wanted: Callable[[], bool]) -> bool: ...

    @abc.abstractmethod
    def _log_tail(self, spec_hash: str, lines: int) -> list[str]: ...

    @abc.abstractmethod
    def _log_path(self, spec_hash: str) -> Path: ...

    @abc.abstractmethod
    def _location(self, spec_hash: str) -> Path: ...


class NoEnvironments(EnvironmentBackend):
    """The backend of a platform built without one (the scheduler benchmark, which uses no environments):
    every use says so."""

    name = "none"

    def _refuse(self) -> Any:
        raise Unavailable("runtime environments are not available: this platform was built without a backend")

    def _server_python(self) -> str:
        return self._refuse()

    def _interpreter(self, version: str) -> str | None:
        return self._refuse()

    def _available_versions(self) -> list[str]:
        return self._refuse()

    def _inherited_fields(self) -> dict[str, Any]:
        return self._refuse()

    def _server_packages(self) -> dict[str, str]:
        return self._refuse()

    def _build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult:
        return self._refuse()

    def _discard(self, spec_hash: str, wanted: Callable[[], bool]) -> bool:
        return self._refuse()

    def _log_tail(self, spec_hash: str, lines: int) -> list[str]:
        return self._refuse()

    def _log_path(self, spec_hash: str) -> Path:
        return self._refuse()

    def _location(self, spec_hash: str) -> Path:
        return self._refuse()
