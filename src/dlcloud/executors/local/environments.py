"""LocalVenvBackend: the local executor's environments, venvs on this host (the build is ``venvs.py``; how they
are described and laid out, ``executors/host_venvs.py``).

A built environment is the venv ``<envs_dir>/<spec hash>``, which a workload runs in (``Workload.venv``).
Builds run under the build sandbox the executor gives (``LocalExecutor.build_sandbox``), with the pip index
of the settings and nothing else of the server's environment, within the settings' build time limit. What a
build takes of this host (the interpreter of the spec's Python, the server's environment, the uploaded wheels'
files, fetched by storage key into the object cache) is found when it runs: the spec names none of it.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from dlcloud.errors import DlcloudError
from dlcloud.executors.environments import BuildError, BuildResult, BuildSpec, Cancellation
from dlcloud.executors.host_venvs import HostBuild, HostVenvBackend, build_env_vars
from dlcloud.executors.local import venvs
from dlcloud.settings import Settings
from dlcloud.storage.cache import ObjectCache
from dlcloud.storage.objects import ObjectStore

log = logging.getLogger(__name__)


class LocalVenvBackend(HostVenvBackend):
    """Venvs under ``envs_dir``, one per spec hash, built by ``venvs.materialise``.

    Args:
        envs_dir: where the venvs, their locks and their build logs are (``settings.envs_dir``).
        wheels: where a build finds an uploaded wheel's file, by its storage key.
        timeout: the time limit of one build, pip included, in seconds.
        sandbox: how builds are sandboxed; None: not at all.
        index_url, extra_index_urls: the pip index of builds (the only pip settings builds get).
    """

    name = "local"

    def __init__(
        self,
        envs_dir: Path,
        *,
        wheels: ObjectCache,
        timeout: float = 3600.0,
        sandbox: venvs.BuildSandbox | None = None,
        index_url: str | None = None,
        extra_index_urls: Sequence[str] = (),
    ) -> None:
        super().__init__(envs_dir)
        self.wheels = wheels
        self.timeout = timeout
        self.sandbox = sandbox
        self.build_env = build_env_vars(index_url=index_url, extra_index_urls=extra_index_urls)

    @classmethod
    def from_settings(
        cls, settings: Settings, objects: ObjectStore, sandbox: venvs.BuildSandbox | None = None
    ) -> LocalVenvBackend:
        return cls(
            settings.envs_dir,
            wheels=ObjectCache(settings.data_dir / "cache" / "objects", objects),
            timeout=settings.env_build_timeout_seconds,
            sandbox=sandbox,
            index_url=settings.env_build_index_url,
            extra_index_urls=settings.env_build_extra_index_urls,
        )

    def _build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult:
        runner = venvs.Runner(timeout=self.timeout, sandbox=self.sandbox, env=self.build_env)
        with cancel.watch(runner.cancel):  # kills the build's running pip; its next step does not start
            return venvs.materialise(spec, spec_hash, self.envs_dir, runner, self._host(spec))

    def _host(self, spec: BuildSpec) -> HostBuild:
        """This host's interpreter of the spec's Python and a local file for each of its wheels (a remote
        store's wheel is fetched into the object cache now, checked against its checksum)."""
        interpreter = self._interpreter(spec.python)
        if interpreter is None:
            raise BuildError(f"Python {spec.python} is no longer installed on the server")
        files = []
        for sha, key in spec.wheels:
            try:
                files.append((sha, str(self._wheel_file(sha, key))))
            except (DlcloudError, ValueError) as exc:  # its text may name the store: the log has it
                log.error("environment build: wheel %s (key %s) unreadable: %s", sha[:12], key, exc)
                raise BuildError(f"the uploaded wheel (sha256 {sha[:12]}) is missing or damaged in storage") from exc
        return HostBuild.here(interpreter, tuple(files))

    def _wheel_file(self, sha: str, key: str) -> Path:
        """A local file of the wheel under its own name (pip reads a wheel's name and version from it): the
        store's file where the store is local, else the object cache's copy (named by checksum), linked
        under ``<envs_dir>/.wheels/<sha256>/<name>``."""
        cached = self.wheels.path(key, sha)
        name = PurePosixPath(key).name
        if cached.name == name:
            return cached
        named = self.envs_dir / ".wheels" / sha / name
        if not named.is_file():
            named.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # a part of its own: two builds of different specs may link the same wheel at once
            part = named.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}.part")
            part.unlink(missing_ok=True)
            try:
                os.link(cached, part)
            except OSError:  # another file system: a copy
                shutil.copyfile(cached, part)
            os.replace(part, named)
        return named
