"""``dlcloud serve --registry NAME@LABEL`` follows the registry: moving the label swaps the served version,
served versions cannot be deleted, and a stopped server releases them. Another tenant's shared model is
followed the same way once trusted (``--trust-code``); the refusals without trust are in
tests/security/test_model_code.py."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import Server, dlcloud_serve
from tests.serving_models import make_sklearn_classifier

pytestmark = pytest.mark.e2e


def _infer(url: str, x: np.ndarray) -> tuple[str, np.ndarray]:
    body = {"inputs": [{"name": "input", "datatype": "FP64", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    answer = httpx.post(f"{url}/v2/models/clf/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    probabilities = next(o for o in doc["outputs"] if o["name"] == "probabilities")
    return doc["model_version"], np.asarray(probabilities["data"]).reshape(probabilities["shape"])


def test_serve_follows_a_registry_label(server: Server, tmp_path: Path) -> None:
    v1 = make_sklearn_classifier(tmp_path / "v1", seed=1)
    v2 = make_sklearn_classifier(tmp_path / "v2", seed=2)
    server.cli("models", "register", "clf", "--file", str(v1.path))
    server.cli("models", "register", "clf", "--file", str(v2.path))
    server.cli("models", "label", "clf", "production", "1")

    args = ["--registry", "clf@production", "--cache-dir", str(tmp_path / "cache")]
    args += ["--registry-interval", "0.3", "--watch-interval", "0.2"]
    with dlcloud_serve(args, server.env, tmp_path / "serve.log") as serve:
        url = serve.url
        x = v1.example["input"]
        version, got = _infer(url, x)
        assert version == "1"
        np.testing.assert_allclose(got, v1.reference(v1.example)["probabilities"], rtol=1e-6)

        # version 1 is deployed: the registry refuses to delete it
        refused = server.cli("models", "delete", "clf", "--version", "1", "--yes", check=False)
        assert refused.returncode != 0 and "deployed" in refused.stderr

        # moving the label swaps the served version without a restart
        server.cli("models", "label", "clf", "production", "2")
        wait_for(lambda: _infer(url, x)[0] == "2", timeout=120, interval=0.1, what="version 2 to be served")
        _, got = _infer(url, x)
        np.testing.assert_allclose(got, v2.reference({"input": x})["probabilities"], rtol=1e-6)
        wait_for(
            lambda: httpx.get(f"{url}/v2/models/clf/versions/1/ready", timeout=5).status_code == 404,
            timeout=60,
            interval=0.1,
            what="version 1 to be unloaded",
        )

        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0, serve.output()[-3000:]
    # the stopped server released its leases: both versions can be deleted now
    server.cli("models", "delete", "clf", "--version", "2", "--yes")
    server.cli("models", "delete", "clf", "--version", "1", "--yes")


def _member(server: Server, tenant: str, user: str) -> None:
    """A tenant with a member and a CLI profile named after the user (``configure`` makes it the current
    profile: the admin's commands name theirs)."""
    server.cli("--profile", "local", "tenants", "create", tenant)
    server.cli("--profile", "local", "users", "create", user, "--tenant", tenant, "--role", "member")
    key = server.cli_json("--profile", "local", "keys", "create", "--user", user, "--tenant", tenant)
    assert isinstance(key, dict)
    creds = ["--endpoint", server.endpoint, "--access-key", key["access_key"], "--secret-key", key["secret_key"]]
    server.cli("configure", "--profile", user, *creds, "--no-check")


def test_serve_follows_a_trusted_shared_code_model_and_its_lease_blocks_the_owner(
    server: Server, tmp_path: Path
) -> None:
    _member(server, "acme", "alice")
    _member(server, "beta", "bob")
    v1 = make_sklearn_classifier(tmp_path / "v1", seed=1)
    v2 = make_sklearn_classifier(tmp_path / "v2", seed=2)
    for built in (v1, v2):
        server.cli("--profile", "alice", "models", "register", "clf", "--file", str(built.path))
    server.cli("--profile", "alice", "models", "label", "clf", "production", "1")
    server.cli("--profile", "alice", "models", "share", "clf", "--tenant", "beta")

    args = ["--registry", "acme/clf@production", "--trust-code", "acme/clf", "--cache-dir", str(tmp_path / "cache")]
    args += ["--registry-interval", "0.3", "--watch-interval", "0.2"]
    with dlcloud_serve(args, server.env | {"DLCLOUD_PROFILE": "bob"}, tmp_path / "serve.log") as serve:
        x = v1.example["input"]
        assert _infer(serve.url, x)[0] == "1"
        # bob's server holds the lease on acme's version: the owner cannot delete it, bob sees it as his
        refused = server.cli("--profile", "alice", "models", "delete", "clf", "--version", "1", "--yes", check=False)
        assert refused.returncode != 0 and "deployed" in refused.stderr and "beta" in refused.stderr
        [lease] = server.cli_json("--profile", "bob", "models", "describe", "acme/clf", "--version", "1")["deployments"]
        assert (lease["tenant"], lease["holder"]) == ("beta", "bob")

        # trusted: the owner's label move is followed
        server.cli("--profile", "alice", "models", "label", "clf", "production", "2")
        wait_for(lambda: _infer(serve.url, x)[0] == "2", timeout=120, interval=0.1, what="version 2 to be served")
        np.testing.assert_allclose(_infer(serve.url, x)[1], v2.reference({"input": x})["probabilities"], rtol=1e-6)

        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0
    assert "not trusted" not in serve.output()
    server.cli("--profile", "alice", "models", "delete", "clf", "--yes")  # every lease was released
