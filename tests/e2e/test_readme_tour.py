"""The README's 5-minute tour runs as written: its ``bash`` blocks are read from README.md itself (so the two
cannot drift apart) and run in order, in one shell as a reader's terminal would, against a fresh ``dlcloud up``
with the embedded defaults (an empty home directory; only the port is a free one, given as ``DLCLOUD_PORT``).

Conventions the README keeps for this test:
- the first block is the platform's start (``dlcloud up``): the test runs it in the background and waits until
  the server is ready;
- every other block runs under ``set -e``: each command must exit 0 (``jobs submit --follow`` exits 1 when its
  job does not succeed); a pipeline's status is its last command's, as in a terminal (no ``pipefail``: ``grep -q``
  may end a pipe before the command writing into it is done);
- a command ending in ``&`` runs in the background, as in a terminal; whatever still runs at the end is
  stopped with the shell's process group;
- the model server's port 8000 is replaced by a free port (a machine running the tests may serve on 8000).

At the end every job the tour ran has succeeded except those it cancelled, and every study completed with
every trial completed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import WORKER_ENV, wait_for
from tests.e2e.conftest import DLCLOUD, free_port

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## A 5-minute tour"
BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.S | re.M)
MARK = "::tour block "
SCRIPT_TIMEOUT = 420  # seconds for the whole tour; it takes about two minutes on 2 cores


def tour_blocks() -> list[str]:
    """The ``bash`` blocks of the tour section of README.md, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return BLOCK.findall(text[start : end if end != -1 else len(text)])


def _script(blocks: list[str], serve_port: int) -> str:
    """One shell script of the blocks, each announced on stderr; the model server's port rewritten."""
    lines = ["set -e", "PS4='+ '", "set -x"]
    for number, block in enumerate(blocks, 1):
        block = re.sub(r"\b8000\b", str(serve_port), block)
        lines += ["{ set +x; } 2>/dev/null", f"echo '{MARK}{number}' >&2", "set -x", block]
    return "\n".join(lines) + "\n"


def _failed_block(log: str, blocks: list[str]) -> str:
    marks = re.findall(rf"^{re.escape(MARK)}(\d+)$", log, re.M)
    return blocks[int(marks[-1]) - 1] if marks else "(before the first block)"


def test_the_tour_blocks_are_found() -> None:
    blocks = tour_blocks()
    assert len(blocks) >= 10
    assert blocks[0].split("#")[0].strip() == "dlcloud up"
    commands = " ".join(blocks)
    for used in ("jobs submit", "--follow", "--template", "jobs metrics", "tune submit", "queue", "simulate",
                 "datasets create", "models register", "serve", "--port 8000"):  # fmt: skip
        assert used in commands, used


def test_the_readme_tour_runs_as_written_on_a_fresh_platform(tmp_path: Path) -> None:
    blocks = tour_blocks()
    up, rest = blocks[0], blocks[1:]
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
    env.update(WORKER_ENV)
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(tmp_path / "config"), COLUMNS="120")
    env["PATH"] = f"{Path(DLCLOUD).parent}{os.pathsep}{env.get('PATH', '')}"  # dlcloud and python, as in .venv/bin
    log = tmp_path / "tour.log"
    started = time.monotonic()
    with (tmp_path / "server.log").open("wb") as server_log:
        server = subprocess.Popen(
            ["bash", "-c", up],
            cwd=work,
            env={**env, "DLCLOUD_PORT": str(port)},
            stdout=server_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    shell: subprocess.Popen[bytes] | None = None
    try:

        def ready() -> bool:
            if server.poll() is not None:
                pytest.fail(f"dlcloud up exited {server.returncode}:\n{(tmp_path / 'server.log').read_text()[-5000:]}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=60, interval=0.1, what="dlcloud up to be ready")
        script = _script(rest, free_port())
        with log.open("wb") as out:
            shell = subprocess.Popen(
                ["bash", "-c", script], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            code = shell.wait(timeout=SCRIPT_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        output = log.read_text(errors="replace")
        if code != 0:
            ended = "timed out" if code is None else f"exited {code}"
            pytest.fail(
                f"the tour {ended} in this block:\n{_failed_block(output, rest)}\n--- output (tail) ---\n"
                f"{output[-6000:]}\n--- server log (tail) ---\n{(tmp_path / 'server.log').read_text()[-3000:]}"
            )
        _check_what_ran(env, work, rest)
        print(f"the tour ran in {time.monotonic() - started:.1f} s", file=sys.stderr)
    finally:
        for proc in (shell, server):
            if proc is not None:
                _stop(proc)


def _cli_json(env: dict[str, str], cwd: Path, *args: str) -> object:
    res = subprocess.run([DLCLOUD, *args, "-o", "json"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, (args, res.stdout, res.stderr)
    return json.loads(res.stdout)


def _check_what_ran(env: dict[str, str], work: Path, blocks: list[str]) -> None:
    """Every job of the tour succeeded but those it cancelled; every study completed, each of its trials too."""
    cancelled = set(re.findall(r"dlcloud jobs cancel (\S+)", "\n".join(blocks)))
    jobs = _cli_json(env, work, "jobs", "list")
    assert isinstance(jobs, list) and jobs
    states = {j["name"]: j["state"] for j in jobs}
    assert {n: s for n, s in states.items() if n in cancelled} == dict.fromkeys(cancelled, "CANCELLED"), states
    assert {n: s for n, s in states.items() if n not in cancelled and s != "SUCCEEDED"} == {}, states
    studies = _cli_json(env, work, "tune", "list")
    assert isinstance(studies, list) and studies
    for study in studies:
        assert study["state"] == "COMPLETED", study
        trials = _cli_json(env, work, "tune", "trials", study["name"])
        assert isinstance(trials, list) and trials
        assert {t["state"] for t in trials} == {"COMPLETED"}, trials


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's group (the shell's background commands with it), SIGKILL after 20 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the shell left in the background
