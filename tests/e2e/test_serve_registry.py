"""``dlcloud serve --registry NAME@LABEL`` follows the registry: moving the label swaps the served version,
served versions cannot be deleted, and a stopped server releases them."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import DLCLOUD, Server, free_port
from tests.serving_models import make_sklearn_classifier

pytestmark = pytest.mark.e2e


def _infer(url: str, x: np.ndarray) -> tuple[str, np.ndarray]:
    body = {"inputs": [{"name": "input", "datatype": "FP64", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    answer = httpx.post(f"{url}/v2/models/clf/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    probabilities = next(o for o in doc["outputs"] if o["name"] == "probabilities")
    return doc["model_version"], np.asarray(probabilities["data"]).reshape(probabilities["shape"])


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"dlcloud serve exited with {proc.returncode}:\n{log.read_text(errors='replace')[-5000:]}")
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_serve_follows_a_registry_label(server: Server, tmp_path: Path) -> None:
    v1 = make_sklearn_classifier(tmp_path / "v1", seed=1)
    v2 = make_sklearn_classifier(tmp_path / "v2", seed=2)
    server.cli("models", "register", "clf", "--file", str(v1.path))
    server.cli("models", "register", "clf", "--file", str(v2.path))
    server.cli("models", "label", "clf", "production", "1")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    command = [
        DLCLOUD,
        "serve",
        "--registry",
        "clf@production",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--registry-interval",
        "0.3",
        "--watch-interval",
        "0.2",
        "--port",
        str(port),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=server.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _ready(url, proc, log), timeout=120, interval=0.1, what="dlcloud serve to be ready")
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

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the stopped server released its leases: both versions can be deleted now
    server.cli("models", "delete", "clf", "--version", "2", "--yes")
    server.cli("models", "delete", "clf", "--version", "1", "--yes")
