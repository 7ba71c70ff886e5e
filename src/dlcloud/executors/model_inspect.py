"""Model inspection's process: ``python -m dlcloud.serving.inspect`` run on an artifact, bounded and isolated.

The registry asks the executor for it (``Executor.inspect_model``): the one process the registry has run, it is
an executor operation, so no argv prefix or sandbox detail crosses the executor interface, and an executor
elsewhere (Kubernetes) answers the same question its own way. ``run_inspect(path, fmt, timeout, sandbox)``
returns the finished process (return code, the tails of its stdout and stderr) or None at the timeout.

Invariants: the process gets an environment built here (``INSPECT_ENV_PASSED`` and fixed values, never the
server's own: no database URL, no credentials), an empty working directory that is also its HOME and TMPDIR,
removed afterwards, its own session, whose whole process group is killed when it ends or times out; at most
``INSPECT_OUTPUT_LIMIT`` bytes of each output are read back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)
INSPECT_MODULE = "dlcloud.serving.inspect"
# what the inspect process takes from the server's environment: where programs and libraries are, the locale
INSPECT_ENV_PASSED = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
INSPECT_OUTPUT_LIMIT = 1024 * 1024
# (writable paths, readable paths) -> argv prefix of a sandboxed one-off process (``Executor.sandbox_prefix``)
SandboxPrefix = Callable[[Sequence[Path], Sequence[Path]], list[str] | None]


def run_inspect(
    path: Path, fmt: str, timeout: float, sandbox: SandboxPrefix | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run ``python -m dlcloud.serving.inspect`` on an artifact; None when it did not finish in ``timeout`` s.

    Loading an artifact may run its author's code (a pickle, a predictor), so this is the one place where the
    registry starts a process, and its argv, environment and working directory are all built here, where a
    sandbox can wrap them. The environment is built from ``INSPECT_ENV_PASSED`` and fixed values, never copied
    from the server's (no database URL, no ``PIP_*``, no credentials); the working directory is a new empty
    directory, also HOME and TMPDIR, removed afterwards. The process runs in its own session and its whole
    group is killed at the timeout. Output is read from files, at most ``INSPECT_OUTPUT_LIMIT`` bytes of each.
    With ``sandbox`` (the executor's ``sandbox_prefix``) it runs in a sandbox that can write only its work
    directory and read only the artifact (docs/isolation.md).
    """
    with tempfile.TemporaryDirectory(prefix="dlcloud-inspect-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir(mode=0o700)
        argv = [sys.executable, "-P", "-m", INSPECT_MODULE, "--format", fmt, str(path)]
        env = {key: os.environ[key] for key in INSPECT_ENV_PASSED if key in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update(
            HOME=str(work),
            TMPDIR=str(work),
            PYTHONNOUSERSITE="1",
            PYTHONDONTWRITEBYTECODE="1",
            CUDA_VISIBLE_DEVICES="",  # inspecting needs no GPU and must not take one from a job
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        cwd = work
        if sandbox is not None:
            prefix = sandbox([work], [path])
            argv = [*(prefix or []), *argv]
        stdout_path, stderr_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            try:
                proc = subprocess.Popen(
                    argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
                )
            except OSError as exc:
                log.warning("signature inference for %s could not start: %s", path, exc)
                return subprocess.CompletedProcess(argv, -1, "", str(exc))
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("signature inference for %s timed out after %.0f s", path, timeout)
                return None
            finally:
                _kill_group(proc)  # also what it left running after it exited (pid numbers wrap, never this soon)
        return subprocess.CompletedProcess(argv, returncode, _tail(stdout_path), _tail(stderr_path))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the inspect process and everything still in its process group, then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - INSPECT_OUTPUT_LIMIT))
        return f.read().decode("utf-8", errors="replace")
