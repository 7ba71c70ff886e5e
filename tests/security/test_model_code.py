"""Attacks through model code: a tenant's model whose loading runs code (a pickle, a Python predictor).

The attacker registers such a model and shares it. Its code must not see the control plane's environment
when the registry inspects it; another tenant's model server must refuse to load it unless that tenant
trusts the owner (``--trust-code``), and must not follow the owner's label moves without that trust. A model
that is not shared is unreachable. Deployment leases belong to their holder. A model server listening on a
public address keeps its repository endpoints behind a token.

The registry side runs in-process (SQLite and PostgreSQL); ``dlcloud serve`` and ``dlcloud up`` run for real.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from dlcloud.api.app import create_app
from dlcloud.client import Client
from dlcloud.client.mirror import RegistryMirror
from dlcloud.errors import DlcloudError, ModelNotFound, PermissionDenied, UntrustedCode
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.schemas.models import ModelVersion
from tests.conftest import Env, wait_for
from tests.e2e.conftest import DLCLOUD, dlcloud_serve, free_port
from tests.security.conftest import DB_PASSWORD, PIP_SECRET, Platform
from tests.serving_models import make_python_predictor, make_xgboost_model

SECRETS = {
    "DLCLOUD_DATABASE_URL": "postgresql://dlcloud:db-secret-5f1e@db.internal:5432/dlcloud",
    "PIP_INDEX_URL": "https://user:pip-secret-77aa@pypi.internal/simple",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-0c3b",
}

# a predictor whose load() turns what it can see into its signature: the one channel back to its author
SNOOP = """
import os


class Snoop:
    def load(self):
        seen = [f"pid={os.getpid()}", f"cwd={os.getcwd()}", f"home={os.environ.get('HOME', '')}"]
        seen += [f"env={key}={value}"[:256] for key, value in sorted(os.environ.items())]
        self.signature = {
            "inputs": [{"name": item, "datatype": "FP32", "shape": [-1]} for item in seen],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
        }

    def predict(self, batch):
        return {"y": batch[next(iter(batch))]}
"""


def _snoop(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "predictor.py").write_text(SNOOP)
    return directory


def _seen(version: ModelVersion) -> list[str]:
    assert version.signature is not None, "the predictor's signature was not inferred"
    return [spec["name"] for spec in version.signature["inputs"]]


def _onnx_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x08\x07 not really onnx " * 64)
    return path


def _mirror(client: Client, ref: str, root: Path, *, trusted: bool = False, name: str = "edge") -> RegistryMirror:
    model, _, label = ref.partition("@")
    return RegistryMirror(
        client, model, label or None, root, deployment=name, endpoint="http://127.0.0.1:1", trusted=trusted
    )


def _error(fn) -> DlcloudError:
    with pytest.raises(DlcloudError) as info:
        fn()
    return info.value


# --- in-process: the registry ---------------------------------------------------------------------------------


def test_inspecting_a_python_model_sees_none_of_the_servers_environment(env: Env, tmp_path, monkeypatch):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    mallory = env.new_tenant_user("attacker", "mallory")
    version = mallory.models.register("snoop", "python", artifact=_snoop(tmp_path / "snoop"))
    assert version.executes_code is True
    seen = _seen(version)
    env_keys = {item.split("=")[1] for item in seen if item.startswith("env=")}
    assert env_keys, seen
    leaked = [item for item in seen if any(key in item or value in item for key, value in SECRETS.items())]
    assert leaked == []
    assert not any(key.startswith(("DLCLOUD_", "PIP_", "AWS_")) for key in env_keys), env_keys
    assert env_keys <= {"PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TMPDIR"} | {
        "PYTHONNOUSERSITE",
        "PYTHONDONTWRITEBYTECODE",
        "CUDA_VISIBLE_DEVICES",
        "TF_CPP_MIN_LOG_LEVEL",
    }
    assert f"pid={os.getpid()}" not in seen  # never inside the API process
    cwd = next(item for item in seen if item.startswith("cwd="))[4:]
    home = next(item for item in seen if item.startswith("home="))[5:]
    assert cwd != os.getcwd() and not Path(cwd).exists()  # a private directory, removed afterwards
    assert home == cwd and home != os.environ.get("HOME")


MARKS = """
import pathlib


class Marks:
    def load(self):
        pathlib.Path("@MARK_DIR@", "ran").write_text("loaded")  # proof that it ran
        self.signature = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}], "outputs": []}

    def predict(self, batch):
        return batch
"""


def test_on_a_host_without_a_sandbox_another_tenant_must_declare_a_code_models_signature(env: Env, tmp_path):
    """Inspecting a predictor runs its author's code; where the executor cannot sandbox it, it would run as the
    server. Only the bootstrap tenant may have it inspected then: another tenant is refused (403, nothing
    stored, nothing ran) unless it declares the signature, which needs no inspection."""
    mark = tmp_path / "marks"
    mark.mkdir()
    artifact = tmp_path / "marks-model"
    artifact.mkdir()
    (artifact / "predictor.py").write_text(MARKS.replace("@MARK_DIR@", str(mark)))
    mallory = env.new_tenant_user("attacker", "mallory")
    bare = dataclasses.replace(env.platform, isolated=False, isolation="no sandbox on this host")
    assert not bare.executor.inspects_sandboxed
    with TestClient(create_app(bare), base_url="http://testserver") as http:
        as_mallory = Client(mallory.transport.creds, http_client=http)
        with pytest.raises(DlcloudError) as exc:
            as_mallory.models.register("marks", "python", artifact=artifact)
        assert exc.value.code == "isolation_unavailable"
        assert "inferring the signature of a model whose loading runs code" in str(exc.value)
        assert as_mallory.models.list() == [] and not (mark / "ran").exists()
        declared = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}], "outputs": []}
        version = as_mallory.models.register("marks", "python", artifact=artifact, signature=declared)
        assert version.signature["inputs"][0]["name"] == "x" and not (mark / "ran").exists()
        as_admin = Client(env.admin_creds, http_client=http)  # the bootstrap tenant's own code: its choice
        as_admin.models.register("marks", "python", artifact=artifact)
        assert (mark / "ran").read_text() == "loaded"


def test_an_executor_that_runs_no_user_code_here_inspects_nothing(tmp_path):
    tree = tmp_path / "store" / "models" / "t-1" / "m-1" / "1"
    (tree / "marks-model").mkdir(parents=True)
    (tree / "marks-model" / "predictor.py").write_text(MARKS.replace("@MARK_DIR@", str(tmp_path)))
    simulated = SimulatedExecutor()
    assert not simulated.inspects_sandboxed
    assert simulated.inspect_model("models/t-1/m-1/1", "marks-model", "python", 30) is None
    assert not (tmp_path / "ran").exists()


def test_a_model_that_is_not_shared_is_unreachable(env: Env, tmp_path):
    vera = env.new_tenant_user("victim", "vera")
    mallory = env.new_tenant_user("attacker", "mallory")
    vera.models.register("fraud", "python", artifact=make_python_predictor(tmp_path / "fraud").path)
    for attempt in (
        lambda: mallory.models.get("victim/fraud"),
        lambda: mallory.models.versions("victim/fraud"),
        lambda: mallory.models.version("victim/fraud", 1),
        lambda: mallory.models.download("victim/fraud", 1, tmp_path / "stolen"),
        lambda: mallory.models.heartbeat_deployment("victim/fraud", 1, "edge", "http://x", 30),
        lambda: mallory.models.release_deployment("victim/fraud", 1, "edge"),
        lambda: _mirror(mallory, "victim/fraud", tmp_path / "cache", trusted=True).sync(),
    ):
        err = _error(attempt)
        assert isinstance(err, ModelNotFound) and err.http_status == 404
        assert "attacker" not in err.message
    assert not (tmp_path / "stolen").exists() and not (tmp_path / "cache").exists()
    assert vera.models.version("fraud", 1).deployed is False


@pytest.mark.parametrize("fmt", ["python", "sklearn"])
def test_an_untrusted_shared_code_model_is_never_downloaded(env: Env, tmp_path, fmt):
    mallory = env.new_tenant_user("attacker", "mallory")
    vera = env.new_tenant_user("victim", "vera")
    if fmt == "python":
        artifact = make_python_predictor(tmp_path / "pred").path
    else:
        artifact = tmp_path / "model.pkl"
        artifact.write_bytes(b"not even a pickle")
    mallory.models.register("gift", fmt, artifact=artifact)
    mallory.models.share("gift", "victim")
    assert vera.models.version("attacker/gift", 1).executes_code is True

    mirror = _mirror(vera, "attacker/gift", tmp_path / "cache")
    err = _error(mirror.sync)
    assert isinstance(err, UntrustedCode) and err.code == "untrusted_code"
    assert f"a {fmt!r} model: loading it runs code written by tenant 'attacker'" in err.message
    assert "--trust-code attacker/gift" in err.message
    assert mirror.on_disk() == {}
    assert vera.models.version("attacker/gift", 1).deployed is False  # no lease either

    trusted = _mirror(vera, "attacker/gift", tmp_path / "trusted", trusted=True)
    assert trusted.sync() is True and set(trusted.on_disk()) == {1}


def test_moving_the_label_of_an_untrusted_shared_model_does_not_swap(env: Env, tmp_path):
    mallory = env.new_tenant_user("attacker", "mallory")
    vera = env.new_tenant_user("victim", "vera")
    for i in (1, 2):
        mallory.models.register("ranker", "onnx", artifact=_onnx_file(tmp_path, f"v{i}"))
    mallory.models.set_label("ranker", "production", 1)
    mallory.models.share("ranker", "victim")

    pinned = _mirror(vera, "attacker/ranker@production", tmp_path / "pinned")
    every = _mirror(vera, "attacker/ranker", tmp_path / "every", name="every")
    followed = _mirror(vera, "attacker/ranker@production", tmp_path / "followed", trusted=True, name="trusted")
    for mirror in (pinned, every, followed):
        assert mirror.sync() is True
    assert (set(pinned.on_disk()), set(every.on_disk()), set(followed.on_disk())) == ({1}, {1, 2}, {1})
    assert pinned.follows is False and followed.follows is True

    # the owner moves the label, then slips a python version behind it: only the trusted mirror moves
    mallory.models.set_label("ranker", "production", 2)
    assert pinned.sync() is False and set(pinned.on_disk()) == {1}
    assert followed.sync() is True and set(followed.on_disk()) == {2}
    mallory.models.register("ranker", "python", artifact=make_python_predictor(tmp_path / "evil").path)
    mallory.models.set_label("ranker", "production", 3)
    for mirror in (pinned, every):
        assert mirror.sync() is False
    assert (set(pinned.on_disk()), set(every.on_disk())) == ({1}, {1, 2})
    # a trusted mirror runs the owner's code: that is what trusting means
    assert followed.sync() is True and set(followed.on_disk()) == {3}

    # the tenant's own models need no trust: their label is followed
    for i in (1, 2):
        vera.models.register("own", "python", artifact=make_python_predictor(tmp_path / f"own{i}").path)
    vera.models.set_label("own", "production", 1)
    own = _mirror(vera, "own@production", tmp_path / "own", name="own")
    assert own.sync() is True and own.follows is True
    vera.models.set_label("own", "production", 2)
    assert own.sync() is True and set(own.on_disk()) == {2}


def test_another_tenant_cannot_release_my_lease_and_an_expired_lease_blocks_nothing(env: Env, tmp_path, registry_clock):
    mallory = env.new_tenant_user("attacker", "mallory")
    vera = env.new_tenant_user("victim", "vera")
    victor = env.new_tenant_user("victim", "victor")
    carl = env.new_tenant_user("gamma", "carl")
    vera.models.register("shared", "onnx", artifact=_onnx_file(tmp_path, "m"))
    for tenant in ("attacker", "gamma"):
        vera.models.share("shared", tenant)
    mirror = _mirror(mallory, "victim/shared", tmp_path / "cache", name="mallory-edge")
    mirror.ttl_seconds = 30
    mirror.sync()
    [lease] = vera.models.version("shared", 1).deployments
    assert (lease.name, lease.tenant) == ("mallory-edge", "attacker")

    # another tenant, the owner, or the owner's other user: none of them ends mallory's lease
    carl.models.release_deployment("victim/shared", 1, "mallory-edge")
    vera.models.release_deployment("shared", 1, "mallory-edge")
    victor.models.release_deployment("shared", 1, "mallory-edge")
    assert vera.models.version("shared", 1).deployed is True
    assert _error(lambda: vera.models.delete_version("shared", 1)).code == "model_deployed"
    # nor can they renew it to point it elsewhere (their own lease of that name is a different lease)
    carl.models.heartbeat_deployment("victim/shared", 1, "mallory-edge", "http://carl", 30)
    seen = {(d.tenant, d.endpoint) for d in vera.models.version("shared", 1).deployments}
    assert seen == {("attacker", "http://127.0.0.1:1"), ("gamma", "http://carl")}
    carl.models.release_deployment("victim/shared", 1, "mallory-edge")

    # and within the holder's tenant, only the holder
    mallory_too = env.new_tenant_user("attacker", "mo")
    err = _error(lambda: mallory_too.models.release_deployment("victim/shared", 1, "mallory-edge"))
    assert isinstance(err, PermissionDenied) and "held by user 'mallory'" in err.message

    # a lease that expired blocks nothing
    mirror.release()
    mallory.models.heartbeat_deployment("victim/shared", 1, "short", "http://x", 30)
    assert _error(lambda: vera.models.delete("shared")).code == "model_deployed"
    registry_clock.advance(31)  # the registry's clock moves past the lease (no race with a slow machine)
    vera.models.delete("shared")


# --- the model server ----------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.11.12.13"])
def test_a_public_model_server_without_an_admin_token_refuses_to_start(tmp_path: Path, host: str):
    model = make_python_predictor(tmp_path / "m")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")} | {"COLUMNS": "200"}
    res = subprocess.run(
        [DLCLOUD, "serve", "-m", f"m={model.path}", "--host", host, "--port", str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "not a loopback address" in res.stderr and "--admin-token" in res.stderr
    with pytest.raises(httpx.TransportError):
        httpx.post(f"http://127.0.0.1:{port}/v2/repository/models/m/unload", timeout=2)


@pytest.mark.e2e
def test_a_token_protects_unload_on_a_public_address(tmp_path: Path):
    model = make_python_predictor(tmp_path / "m")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")} | {"COLUMNS": "200"}
    token = "unload-token-0123456789"
    args = ["-m", f"m={model.path}", "--host", "0.0.0.0", "--watch-interval", "0"]
    with dlcloud_serve(args, env | {"DLCLOUD_SERVE_ADMIN_TOKEN": token}, tmp_path / "serve.log") as serve:
        refused = httpx.post(f"{serve.url}/v2/repository/models/m/unload", timeout=10)
        assert refused.status_code == 401
        assert httpx.get(f"{serve.url}/v2/models/m/ready", timeout=10).status_code == 200
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.post(f"{serve.url}/v2/repository/models/m/unload", headers=headers, timeout=30).status_code == 200
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0


# --- on a real dlcloud up, with the real CLI ------------------------------------------------------------------

SERVE_SNOOP = textwrap.dedent(
    """
    import numpy as np


    class Gift:
        signature = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
                     "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}]}

        def load(self):
            import os
            open(os.environ.get("GIFT_MARK", "/nonexistent/gift-ran"), "w").write("ran")

        def predict(self, batch):
            return {"y": batch["x"]}
    """
)


@pytest.mark.e2e
def test_a_shared_python_model_reaches_neither_the_registry_secrets_nor_an_untrusting_server(
    platform: Platform, tmp_path: Path
):
    snoop = _snoop(tmp_path / "snoop")
    registered = json.loads(
        platform.as_(
            "mallory", "models", "register", "snoop", "--file", str(snoop), "--format", "python", "-o", "json"
        ).stdout
    )
    seen = " ".join(_seen(ModelVersion.model_validate(registered)))
    for secret in (PIP_SECRET, DB_PASSWORD, "PIP_INDEX_URL", "DLCLOUD_DATABASE_URL", "DLCLOUD_"):
        assert secret not in seen

    gift = tmp_path / "gift"
    gift.mkdir()
    (gift / "predictor.py").write_text(SERVE_SNOOP)
    platform.as_("mallory", "models", "register", "gift", "--file", str(gift), "--format", "python")
    platform.as_("mallory", "models", "label", "gift", "production", "1")
    platform.as_("mallory", "models", "share", "gift", "--tenant", "victim")
    mark = tmp_path / "gift-ran"
    env = platform.server.env | {"GIFT_MARK": str(mark)}
    cmd = [DLCLOUD, "--profile", "vera", "serve", "--registry", "attacker/gift@production"]
    cmd += ["--cache-dir", str(tmp_path / "cache"), "--port", str(free_port())]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=platform.server.root)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error (untrusted_code)" in res.stderr and "--trust-code attacker/gift" in res.stderr
    assert not mark.exists()
    assert not list((tmp_path / "cache").rglob("predictor.py"))
    described = json.loads(platform.as_("mallory", "models", "describe", "gift", "-o", "json").stdout)
    assert described["versions"][0]["executes_code"] is True and described["versions"][0]["deployed"] is False


NET_SNOOP = """
import os
import socket


def _write_own():
    # the artifact is inspected where it is stored: writing there would change a stored version
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted"), "w") as f:
            f.write("x")
        return "ok"
    except OSError as exc:
        return type(exc).__name__


def _try(host, port):
    try:
        with socket.create_connection((host, port), timeout=3):
            return "connected"
    except OSError as exc:
        return type(exc).__name__


class NetSnoop:
    def load(self):
        seen = [f"api={_try('127.0.0.1', @PORT@)}", f"postgres={_try('127.0.0.1', 5432)}"]
        seen.append(f"interfaces={','.join(sorted(name for _, name in socket.if_nameindex()))}")
        seen.append(f"own={_write_own()}")
        self.signature = {"inputs": [{"name": i, "datatype": "FP32", "shape": [-1]} for i in seen], "outputs": []}

    def predict(self, batch):
        return batch
"""


@pytest.mark.sqlite_only  # the database plays no part: root and unprivileged on SQLite
def test_inspecting_a_tenants_model_reaches_no_network(platform: Platform, tmp_path: Path):
    """docs/isolation.md: model inspection loads a tenant's artifact with no network at all: neither the API
    on the host's loopback nor PostgreSQL answers it."""
    snoop = tmp_path / "net-snoop"
    snoop.mkdir()
    (snoop / "predictor.py").write_text(NET_SNOOP.replace("@PORT@", str(platform.server.port)))
    registered = json.loads(
        platform.as_(
            "mallory", "models", "register", "net", "--file", str(snoop), "--format", "python", "-o", "json"
        ).stdout
    )
    seen = dict(item.split("=", 1) for item in _seen(ModelVersion.model_validate(registered)))
    assert seen["api"] != "connected" and seen["postgres"] != "connected", seen
    assert set(seen["interfaces"].split(",")) <= {"lo", ""}, seen
    assert seen["own"] != "ok", seen  # the stored artifact it was read from stays as stored
    platform.as_("mallory", "models", "download", "net", "1", "--dest", str(tmp_path / "back"))
    assert sorted(p.name for p in (tmp_path / "back").rglob("*") if p.is_file()) == ["predictor.py"]


def _served_version(url: str) -> str:
    x = [[0.5] * 6]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 6], "data": x[0]}]}
    answer = httpx.post(f"{url}/v2/models/ranker/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["model_version"])


@pytest.mark.e2e
def test_an_untrusting_server_keeps_its_version_when_the_owner_moves_the_label(platform: Platform, tmp_path: Path):
    for i in (1, 2):
        built = make_xgboost_model(tmp_path / f"v{i}", objective="binary:logistic", n_classes=2, seed=i)
        platform.as_("mallory", "models", "register", "ranker", "--file", str(built.path))
    platform.as_("mallory", "models", "label", "ranker", "production", "1")
    platform.as_("mallory", "models", "share", "ranker", "--tenant", "victim")

    args = ["--registry", "attacker/ranker@production", "--cache-dir", str(tmp_path / "cache")]
    args += ["--registry-interval", "0.2", "--watch-interval", "0.1"]
    env = platform.server.env | {"DLCLOUD_PROFILE": "vera"}
    with dlcloud_serve(args, env, tmp_path / "serve.log") as serve:
        assert _served_version(serve.url) == "1"
        # vera's server holds a lease on the owner's version: the owner cannot pull it away
        refused = platform.as_("mallory", "models", "delete", "ranker", "--version", "1", "--yes", check=False)
        assert refused.returncode != 0 and "deployed" in refused.stderr

        platform.as_("mallory", "models", "label", "ranker", "production", "2")
        wait_for(lambda: "not following" in serve.output(), timeout=60, what="the server to notice the label move")
        time.sleep(1.0)  # several registry intervals
        assert _served_version(serve.url) == "1"
        assert sorted(p.name for p in (tmp_path / "cache" / "attacker__ranker").iterdir() if p.name.isdigit()) == ["1"]
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0
    assert "shared by tenant 'attacker' and not trusted" in serve.output()
    platform.as_("mallory", "models", "delete", "ranker", "--version", "1", "--yes")  # the lease was released
