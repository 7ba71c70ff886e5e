"""LocalVenvBackend: the local executor's environments, venvs on this host (the mechanics are ``venvs.py``).

A built environment is the venv ``<envs_dir>/<spec hash>``, which a workload runs in (``Workload.venv``).
Builds run under the build sandbox the executor gives (``LocalExecutor.build_sandbox``), with the pip index
of the settings and nothing else of the server's environment, within the settings' build time limit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlcloud.executors.environments import BuildResult, BuildSpec, Cancellation, EnvironmentBackend
from dlcloud.executors.local import venvs

if TYPE_CHECKING:
    from dlcloud.settings import Settings


class LocalVenvBackend(EnvironmentBackend):
    """Venvs under ``envs_dir``, one per spec hash, built by ``venvs.materialise``.

    Args:
        envs_dir: where the venvs, their locks and their build logs are (``settings.envs_dir``).
        timeout: the time limit of one build, pip included, in seconds.
        sandbox: how builds are sandboxed; None: not at all.
        index_url, extra_index_urls: the pip index of builds (the only pip settings builds get).
    """

    name = "local"

    def __init__(
        self,
        envs_dir: Path,
        *,
        timeout: float = 3600.0,
        sandbox: venvs.BuildSandbox | None = None,
        index_url: str | None = None,
        extra_index_urls: Sequence[str] = (),
    ) -> None:
        self.envs_dir = envs_dir
        self.timeout = timeout
        self.sandbox = sandbox
        self.build_env = venvs.build_env_vars(index_url=index_url, extra_index_urls=extra_index_urls)

    @classmethod
    def from_settings(cls, settings: Settings, sandbox: venvs.BuildSandbox | None = None) -> LocalVenvBackend:
        return cls(
            settings.envs_dir,
            timeout=settings.env_build_timeout_seconds,
            sandbox=sandbox,
            index_url=settings.env_build_index_url,
            extra_index_urls=settings.env_build_extra_index_urls,
        )

    def _server_python(self) -> str:
        return venvs.python_version()

    def _interpreter(self, version: str) -> str | None:
        return venvs.find_interpreter(version)

    def _available_versions(self) -> list[str]:
        return venvs.available_versions()

    def _inherited_fields(self) -> dict[str, Any]:
        return venvs.base_spec_fields()

    def _server_packages(self) -> dict[str, str]:
        return venvs.base_distributions()

    def _build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult:
        runner = venvs.Runner(timeout=self.timeout, sandbox=self.sandbox, env=self.build_env)
        with cancel.watch(runner.cancel):  # kills the build's running pip; its next step does not start
            return venvs.materialise(spec, spec_hash, self.envs_dir, runner)

    def _discard(self, spec_hash: str, wanted: Callable[[], bool]) -> bool:
        with venvs.build_lock(self.envs_dir, spec_hash, blocking=False) as held:
            if not held or wanted():  # a builder holds it, or it was asked for again before we got the lock
                return False
            venvs.remove_tree(venvs.venv_dir(self.envs_dir, spec_hash))
            venvs.log_path(self.envs_dir, spec_hash).unlink(missing_ok=True)
            return True

    def _log_tail(self, spec_hash: str, lines: int) -> list[str]:
        return venvs.read_tail(venvs.log_path(self.envs_dir, spec_hash), lines)

    def _log_path(self, spec_hash: str) -> Path:
        return venvs.log_path(self.envs_dir, spec_hash)

    def _location(self, spec_hash: str) -> Path:
        return venvs.venv_dir(self.envs_dir, spec_hash)
