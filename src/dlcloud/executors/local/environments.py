"""LocalVenvBackend: the local executor's environments, venvs on this host (the build is ``venvs.py``; how they
are described and laid out, ``executors/host_venvs.py``).

A built environment is the venv ``<envs_dir>/<spec hash>``, which a workload runs in (``Workload.venv``).
Builds run under the build sandbox the executor gives (``LocalExecutor.build_sandbox``), with the pip index
of the settings and nothing else of the server's environment, within the settings' build time limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlcloud.executors.environments import BuildResult, BuildSpec, Cancellation
from dlcloud.executors.host_venvs import HostVenvBackend, build_env_vars
from dlcloud.executors.local import venvs
from dlcloud.settings import Settings


class LocalVenvBackend(HostVenvBackend):
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
        super().__init__(envs_dir)
        self.timeout = timeout
        self.sandbox = sandbox
        self.build_env = build_env_vars(index_url=index_url, extra_index_urls=extra_index_urls)

    @classmethod
    def from_settings(cls, settings: Settings, sandbox: venvs.BuildSandbox | None = None) -> LocalVenvBackend:
        return cls(
            settings.envs_dir,
            timeout=settings.env_build_timeout_seconds,
            sandbox=sandbox,
            index_url=settings.env_build_index_url,
            extra_index_urls=settings.env_build_extra_index_urls,
        )

    def _build(self, spec: BuildSpec, spec_hash: str, cancel: Cancellation) -> BuildResult:
        runner = venvs.Runner(timeout=self.timeout, sandbox=self.sandbox, env=self.build_env)
        with cancel.watch(runner.cancel):  # kills the build's running pip; its next step does not start
            return venvs.materialise(spec, spec_hash, self.envs_dir, runner)
