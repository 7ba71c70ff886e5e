"""Secrets through the front door, on a real ``dlcloud up`` whose environment holds a pip index password
(``PIP_INDEX_URL=https://user:<PIP_SECRET>@...``): a member asks pip to expand the server's variables in an
environment spec, builds an environment that fails and reads its log; another tenant's member looks for a
job's ``secret_env``. Nothing with the secrets may come back.
"""

from __future__ import annotations

import json
import secrets
import subprocess

import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import DLCLOUD
from tests.security.conftest import PIP_SECRET, Platform

pytestmark = pytest.mark.e2e
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


def test_pip_variable_expansion_is_refused_and_no_build_sees_the_server_index(platform: Platform):
    attacks = {
        "requirement": ["--requirement", "x @ https://127.0.0.1:9/${PIP_INDEX_URL}/x.whl"],
        "index_url": ["--index-url", "https://127.0.0.1:9/${PIP_INDEX_URL}/simple"],
        "extra_index_urls": ["--extra-index-url", "https://127.0.0.1:9/${PIP_INDEX_URL}"],
    }
    for what, flags in attacks.items():
        res = platform.as_("mallory", "envs", "create", "evil", "--inherit", *flags, "--wait", check=False)
        assert res.returncode != 0, res
        assert "invalid_argument" in res.stderr and f"{what} " in res.stderr, res.stderr
        assert "pip would replace ${NAME} with an environment variable of the server" in res.stderr
        assert PIP_SECRET not in res.stdout + res.stderr
    assert "evil" not in platform.as_("mallory", "envs", "list").stdout

    # a build that fails on a requirement of its own: its log and error show pip's output, and the server's
    # index (the one that holds the password) never reached pip
    res = platform.as_(
        "mallory",
        "envs",
        "create",
        "broken",
        "--inherit",
        "--requirement",
        "x @ https://127.0.0.1:9/x.whl",
        "--wait",
        check=False,
    )
    assert res.returncode != 0 and "environment broken: FAILED" in res.stderr, res
    shown = [
        res.stdout + res.stderr,
        platform.as_("mallory", "envs", "describe", "broken").stdout,
        platform.as_("mallory", "envs", "describe", "broken", "-o", "json").stdout,
        platform.as_("mallory", "envs", "logs", "broken").stdout,
    ]
    assert "Invalid wheel filename" in shown[3]  # the log is pip's own output
    for text in shown:
        assert "secret" not in text.lower() and "127.0.0.1:9/simple" not in text, text
    assert PIP_SECRET not in platform.server.log()


def test_secret_env_reaches_its_job_and_no_other_reader(platform: Platform):
    token = "victim-token-" + secrets.token_hex(8)
    server = platform.server
    res = subprocess.run(
        [DLCLOUD, "--profile", "vera", "jobs", "submit", "--name", "holder", "--secret-env", "HF_TOKEN"]
        + ["--command", 'test "$HF_TOKEN" = "$EXPECTED" && echo token-ok', "--secret-env", f"EXPECTED={token}"],
        env={**server.env, "HF_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    job = wait_for(
        lambda: (
            (j := json.loads(platform.as_("vera", "jobs", "describe", "holder", "-o", "json").stdout))["state"]
            in TERMINAL
            and j
        ),
        timeout=120,
        interval=0.3,
        what="the victim's job to end",
    )
    assert job["state"] == "SUCCEEDED", job
    assert "token-ok" in platform.as_("vera", "jobs", "logs", "holder").stdout
    assert job["spec"]["secret_env"] == {"HF_TOKEN": "***", "EXPECTED": "***"}

    # another tenant: not even the job's name
    other = platform.as_("mallory", "jobs", "describe", "holder", check=False)
    assert other.returncode != 0 and "not found" in other.stderr
    assert "holder" not in platform.as_("mallory", "jobs", "list").stdout
    shown = [
        json.dumps(job),
        res.stdout + res.stderr,
        platform.as_("vera", "jobs", "describe", "holder").stdout,
        platform.as_("vera", "jobs", "list", "-o", "json").stdout,
        audit := platform.as_("local", "audit", "--all", "--limit", "1000", "-o", "json").stdout,
        server.log(),
    ]
    assert any(e["action"] == "jobs.submit" and e["resource"] == "holder" for e in json.loads(audit))
    for text in shown:
        assert token not in text
    if platform.backend == "sqlite":  # the database file holds the value encrypted only
        stored = b"".join(p.read_bytes() for p in server.data_dir.glob("dlcloud.db*"))
        assert b"EXPECTED" in stored and token.encode() not in stored
