"""Runtime environments with the real server and CLI: create from a requirements file with --wait, list, a
job that runs in the environment, a broken requirement's readable failure, delete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Server
from tests.wheels import make_wheel

pytestmark = pytest.mark.e2e

JOB = """\
name: uses-tiny
environment: tiny
command: >-
  python -c "import sys, tinypkg; print('tiny', tinypkg.VERSION, sys.prefix)" && pip --version
"""


def test_create_wait_list_run_delete(server: Server, tmp_path: Path):
    make_wheel(tmp_path / "dist", body="def hello():\n    return 'hello from tinypkg'\n")
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("--no-index\n./dist/tinypkg-0.1-py3-none-any.whl\n")

    # a clean venv (with its own pip), built in the background; --wait streams the build log
    res = server.cli("envs", "create", "tiny", "--python", "3.11", "-r", str(reqs), "--wait", timeout=300)
    assert "environment tiny created, state BUILDING" in res.stderr
    assert "Successfully installed tinypkg-0.1" in res.stderr
    assert "environment tiny: READY" in res.stderr

    listed = {e["name"]: e for e in server.cli_json("envs", "list")}
    assert {"default", "python", "pytorch", "tensorflow", "sklearn", "tiny"} <= set(listed)
    tiny = listed["tiny"]
    assert (tiny["state"], tiny["builtin"], tiny["inherit"], tiny["python"]) == ("READY", False, False, "3.11")
    venv = server.data_dir / "envs" / tiny["spec_hash"]
    assert (venv / "bin" / "pip").exists()
    assert "tinypkg-0.1-py3-none-any.whl" in server.cli("envs", "describe", "tiny").stdout

    spec = tmp_path / "job.yaml"
    spec.write_text(JOB)
    run = server.cli("jobs", "submit", "-f", str(spec), "--follow", timeout=300)
    assert f"tiny 0.1 {venv}" in run.stdout
    assert str(venv) in run.stdout.splitlines()[-1]  # pip --version names the venv's site-packages
    job = server.cli_json("jobs", "describe", "uses-tiny")
    assert (job["environment"], job["environment_hash"]) == ("tiny", tiny["spec_hash"])
    flag = server.cli(
        "jobs",
        "submit",
        "--name",
        "flag",
        "--environment",
        "tiny",
        "--command",
        "echo $DLCLOUD_ENVIRONMENT",
        "--follow",
    )
    assert flag.stdout.strip() == "tiny"

    # a broken requirement: the build fails with pip's own words and a non-zero exit
    broken = ["--inherit", "--no-index", "--requirement", "nonexistent-pkg-dlcloud==9.9", "--wait"]
    bad = server.cli("envs", "create", "broken", *broken, check=False, timeout=300)
    assert bad.returncode == 1, bad
    assert "environment broken: FAILED" in bad.stderr
    assert "No matching distribution found for nonexistent-pkg-dlcloud==9.9" in bad.stderr
    refused = server.cli(
        "jobs", "submit", "--name", "nope", "--environment", "broken", "--command", "true", check=False
    )
    assert refused.returncode == 1 and "error (invalid_spec): environment 'broken' failed to build" in refused.stderr

    server.cli("envs", "delete", "tiny")
    server.cli("envs", "delete", "broken")
    names = {e["name"] for e in json.loads(server.cli("envs", "list", "-o", "json").stdout)}
    assert "tiny" not in names and "broken" not in names
    assert not venv.exists()
    gone = server.cli("envs", "describe", "tiny", check=False)
    assert gone.returncode == 1 and "error (not_found): environment 'tiny' not found" in gone.stderr
