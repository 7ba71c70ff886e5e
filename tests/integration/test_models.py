"""The model registry through the in-process API and the SDK, on SQLite and PostgreSQL: registering files,
directories and job outputs, versions, checksums and immutability, labels, read-only sharing between
tenants, deletion rules with deployment leases, and bad input that leaves nothing behind."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud import signing
from dlcloud.checksums import artifact_digest
from dlcloud.client import Client
from dlcloud.errors import DlcloudError
from dlcloud.schemas.models import ModelVersion
from dlcloud.storage.artifacts import verify
from dlcloud.store.rows import ModelDeploymentRow, ModelLabelRow, ModelRow, ModelShareRow, ModelVersionRow
from tests.conftest import Env, assert_api_error, wait_for

API = "/api/v1"
SIG = {
    "inputs": [{"name": "pixels", "datatype": "fp32", "shape": [-1, 28, 28]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
}
REGISTRY_TABLES = (ModelRow, ModelVersionRow, ModelLabelRow, ModelShareRow, ModelDeploymentRow)


@dataclass
class World:
    env: Env
    alice: Client  # acme, member
    amy: Client  # acme, member
    anna: Client  # acme, tenant-admin
    bob: Client  # beta, member
    bella: Client  # beta, tenant-admin


@pytest.fixture
def world(env: Env) -> World:
    return World(
        env,
        env.new_tenant_user("acme", "alice"),
        env.new_tenant_user("acme", "amy"),
        env.new_tenant_user("acme", "anna", role="tenant-admin"),
        env.new_tenant_user("beta", "bob"),
        env.new_tenant_user("beta", "bella", role="tenant-admin"),
    )


# --- helpers -------------------------------------------------------------------------------------------------


def _file(tmp_path: Path, name: str, data: bytes = b"weights " * 64) -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _tree(tmp_path: Path, name: str = "export") -> Path:
    root = tmp_path / "src" / name
    (root / "variables").mkdir(parents=True)
    (root / "predictor.py").write_text("class Predictor: ...\n")
    (root / ".config").write_text("hidden files travel too\n")
    (root / "variables" / "data.bin").write_bytes(bytes(range(256)) * 8)
    return root


def _register(client: Client, name: str, artifact: Path, fmt: str = "onnx", **kwargs) -> ModelVersion:
    kwargs.setdefault("signature", SIG)
    return client.models.register(name, fmt, artifact=artifact, **kwargs)


def _rows(env: Env) -> dict[str, int]:
    with env.platform.db.read() as s:
        return {t.__tablename__: int(s.scalar(select(func.count()).select_from(t)) or 0) for t in REGISTRY_TABLES}


def _stored_files(env: Env) -> list[Path]:
    """Every file of stored artifacts and waiting uploads, and whatever is left in the staging area."""
    found = []
    for root in (env.settings.models_dir, env.settings.data_dir / "uploads", env.settings.data_dir / "tmp"):
        found += [p for p in root.rglob("*") if not p.is_dir()] if root.exists() else []
    # the local store's own bookkeeping (checksums, manifests) is no stored file
    return sorted(p for p in found if not p.name.startswith(".dlcloud-"))


def _assert_nothing_stored(env: Env) -> None:
    assert _stored_files(env) == []
    assert set(_rows(env).values()) == {0}


def _artifact_path(env: Env, model: str, version: int) -> Path:
    with env.platform.db.read() as s:
        row = s.scalars(
            select(ModelVersionRow)
            .join(ModelRow, ModelRow.id == ModelVersionRow.model_id)
            .where(ModelRow.name == model, ModelVersionRow.version == version)
        ).one()
        tree = env.platform.objects.tree_local_path(row.artifact_key)
        assert tree is not None
        return tree / row.artifact_name


def _raw(env: Env, client: Client, method: str, path: str, body: object = None, query: str = ""):
    return env.signed(client.transport.creds, method, path, body, query)


def _raw_upload(env: Env, client: Client, data: bytes):
    creds = client.transport.creds
    digest = hashlib.sha256(data).hexdigest()
    headers = signing.sign_request(creds.access_key, creds.secret_key, "POST", f"{API}/model-uploads", "", digest)
    return env.http.post(
        f"{API}/model-uploads",
        content=data,
        headers={**headers.headers, "Content-Type": "application/octet-stream"},
    )


def _tar_gz(members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """(name, data or None for a special entry, tar type) -> a .tar.gz."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            info.size = len(data) if data is not None else 0
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _errors(fn) -> DlcloudError:
    with pytest.raises(DlcloudError) as exc:
        fn()
    return exc.value


# --- registering ---------------------------------------------------------------------------------------------


def test_register_file_and_directory_versions_increment(world, tmp_path):
    env = world.env
    model_file = _file(tmp_path, "model.onnx")
    v1 = _register(world.alice, "mnist", model_file, metrics={"accuracy": 0.98, "loss": 0.05}, description="first")
    assert (v1.model, v1.owner, v1.version, v1.format) == ("mnist", "acme", 1, "onnx")
    assert v1.artifact == "model.onnx"
    assert v1.sha256 == artifact_digest(model_file).sha256
    assert v1.size_bytes == model_file.stat().st_size
    assert v1.metrics == {"accuracy": 0.98, "loss": 0.05}
    assert v1.created_by == "alice" and v1.description == "first"
    assert v1.signature["inputs"][0] == {"name": "pixels", "datatype": "FP32", "shape": [-1, 28, 28]}
    assert v1.source_job is None and v1.labels == [] and v1.deployed is False

    tree = _tree(tmp_path)
    v2 = _register(world.amy, "mnist", tree, fmt="python")
    assert (v2.version, v2.format, v2.artifact, v2.created_by) == (2, "python", "export", "amy")
    assert v2.sha256 == artifact_digest(tree).sha256
    assert v2.size_bytes == sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    v3 = _register(world.alice, "mnist", model_file)
    assert v3.version == 3
    assert v3.sha256 == v1.sha256  # same bytes, same name: same checksum wherever they came from

    described = world.alice.models.get("mnist")
    assert [v.version for v in described.versions] == [1, 2, 3]
    assert (described.latest_version, described.version_count) == (3, 3)
    assert described.created_by == "alice" and described.description == "first"
    assert described.shared is False and described.shared_with == []
    assert world.anna.models.version("mnist", "latest").version == 3
    assert world.anna.models.version("mnist", 2).artifact == "export"
    [listed] = world.alice.models.list()
    assert (listed.name, listed.latest_version, listed.version_count) == ("mnist", 3, 3)

    stored_tree = _artifact_path(env, "mnist", 2)
    assert sorted(p.relative_to(stored_tree).as_posix() for p in stored_tree.rglob("*")) == [
        ".config",
        "predictor.py",
        "variables",
        "variables/data.bin",
    ]
    tenant = world.env.admin.tenants.get("acme").id
    assert stored_tree.is_relative_to(env.settings.models_dir / tenant)
    assert verify(stored_tree, v2.sha256)
    # no upload, staging dir or temporary file is left over
    assert not [p for p in (env.settings.data_dir / "tmp").rglob("*") if not p.is_dir()]
    assert not list(env.platform.objects.list("uploads"))


def test_stored_artifacts_are_read_only(world, tmp_path):
    env = world.env
    _register(world.alice, "ro-file", _file(tmp_path, "model.onnx"))
    _register(world.alice, "ro-tree", _tree(tmp_path), fmt="python")
    file_path = _artifact_path(env, "ro-file", 1)
    tree_path = _artifact_path(env, "ro-tree", 1)
    assert stat.S_IMODE(file_path.stat().st_mode) == 0o444
    assert stat.S_IMODE(file_path.parent.stat().st_mode) == 0o555  # the version directory
    for p in [tree_path, *tree_path.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o555 if p.is_dir() else 0o444), p
    if os.geteuid() != 0:  # root ignores permission bits
        with pytest.raises(PermissionError):
            file_path.write_bytes(b"tampered")
        with pytest.raises(PermissionError):
            (tree_path / "new-file").write_bytes(b"x")


def test_download_verifies_the_checksum_and_detects_tampering(world, tmp_path):
    env = world.env
    model_file = _file(tmp_path, "model.onnx", b"\x00\x01 original bytes " * 1000)
    tree = _tree(tmp_path)
    _register(world.alice, "dl", model_file)
    v2 = _register(world.alice, "dl", tree, fmt="python")
    world.alice.models.set_label("dl", "production", 1)

    got_file = world.alice.models.download("dl", "production", dest=tmp_path / "out")
    assert got_file == tmp_path / "out" / "model.onnx"
    assert got_file.read_bytes() == model_file.read_bytes()
    got_tree = world.alice.models.download("dl", 2, dest=tmp_path / "out")
    assert artifact_digest(got_tree).sha256 == v2.sha256
    assert (got_tree / "variables" / "data.bin").read_bytes() == (tree / "variables" / "data.bin").read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["export", "model.onnx"]
    err = _errors(lambda: world.alice.models.download("dl", 1, dest=tmp_path / "out"))
    assert err.code == "already_exists" and "model.onnx already exists" in err.message

    # the raw response carries the checksum in a header
    resp = _raw(env, world.alice, "GET", f"{API}/models/dl/versions/1/artifact")
    assert resp.status_code == 200
    assert resp.headers["x-dlcloud-artifact-sha256"] == artifact_digest(model_file).sha256
    assert resp.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tf:
        assert tf.getnames() == ["model.onnx"]

    # a stored file changed behind the registry's back: verify() and the SDK's download both notice
    stored = _artifact_path(env, "dl", 1)
    assert verify(stored, artifact_digest(model_file).sha256)
    stored.chmod(0o644)
    stored.write_bytes(b"\x00\x01 tampered bytes! " * 1000)
    assert not verify(stored, artifact_digest(model_file).sha256)
    err = _errors(lambda: world.alice.models.download("dl", 1, dest=tmp_path / "again"))
    assert err.code == "checksum_mismatch" and "does not match its checksum" in err.message
    assert list((tmp_path / "again").iterdir()) == []  # nothing half-downloaded is left
    extra = _artifact_path(env, "dl", 2) / "variables" / "extra.bin"
    extra.parent.chmod(0o755)
    extra.write_bytes(b"planted")
    assert not verify(_artifact_path(env, "dl", 2), v2.sha256)


def test_version_numbers_are_never_reused(world, tmp_path):
    f = _file(tmp_path, "model.onnx")
    for _ in range(3):
        _register(world.alice, "nums", f)
    world.alice.models.delete_version("nums", 3)
    world.alice.models.delete_version("nums", 1)
    assert [v.version for v in world.alice.models.versions("nums")] == [2]
    assert _register(world.alice, "nums", f).version == 4
    err = _errors(lambda: world.alice.models.version("nums", 3))
    assert (err.code, err.http_status) == ("model_version_not_found", 404)
    assert "has no version 3" in err.message
    assert not _artifact_path(world.env, "nums", 2).parent.with_name("3").exists()


def test_concurrent_registrations_get_distinct_versions(world, tmp_path):
    """The first versions of a new model, registered at once: one model, versions 1..N, no file lost."""
    f = _file(tmp_path, "model.onnx")
    clients = [world.alice, world.amy, world.anna] * 2
    with ThreadPoolExecutor(len(clients)) as pool:
        versions = list(pool.map(lambda c: _register(c, "race", f).version, clients))
    assert sorted(versions) == list(range(1, len(clients) + 1))
    assert [m.name for m in world.alice.models.list()] == ["race"]
    listed = world.alice.models.versions("race")
    assert [v.version for v in listed] == sorted(versions)
    for v in listed:
        assert verify(_artifact_path(world.env, "race", v.version), v.sha256)


def test_inferred_signature_of_a_scikit_learn_model(world, tmp_path):
    joblib = pytest.importorskip("joblib")
    np = pytest.importorskip("numpy")
    linear_model = pytest.importorskip("sklearn.linear_model")
    x = np.random.default_rng(0).random((40, 4))
    clf = linear_model.LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int))
    path = tmp_path / "src" / "clf.joblib"
    path.parent.mkdir()
    joblib.dump(clf, path)
    v = world.alice.models.register("churn", artifact=path)  # the format is recognised from .joblib
    assert v.format == "sklearn"
    assert v.signature == {
        "inputs": [{"name": "input", "datatype": "FP64", "shape": [-1, 4]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP64", "shape": [-1, 2]},
        ],
    }
    # inspected where it is stored (read in place on local storage): the stored copy stays read-only and whole
    stored = _artifact_path(world.env, "churn", 1)
    assert stored.stat().st_mode & 0o777 == 0o444 and verify(stored, v.sha256)


def test_failed_inference_leaves_the_signature_undeclared(world, tmp_path):
    v = world.alice.models.register("opaque", "onnx", artifact=_file(tmp_path, "model.onnx", b"not an onnx model"))
    assert v.version == 1 and v.signature is None
    assert world.alice.models.version("opaque", 1).signature is None


# --- labels --------------------------------------------------------------------------------------------------


def test_labels_move_between_versions(world, tmp_path):
    f = _file(tmp_path, "model.onnx")
    for _ in range(3):
        _register(world.alice, "lab", f)
    moved = world.amy.models.set_label("lab", "production", 1)
    assert (moved.label, moved.version) == ("production", 1)
    world.amy.models.set_label("lab", "staging", 2)
    world.amy.models.set_label("lab", "production", 3)  # moves: v1 loses it
    model = world.alice.models.get("lab")
    assert model.labels == {"production": 3, "staging": 2}
    assert {v.version: v.labels for v in model.versions} == {1: [], 2: ["staging"], 3: ["production"]}
    assert world.alice.models.version("lab", "production").version == 3
    world.alice.models.set_label("lab", "staging", 3)
    assert world.alice.models.version("lab", 3).labels == ["production", "staging"]
    world.alice.models.remove_label("lab", "staging")
    assert world.alice.models.get("lab").labels == {"production": 3}
    err = _errors(lambda: world.alice.models.version("lab", "staging"))
    assert err.code == "model_version_not_found" and "has no label 'staging'" in err.message
    err = _errors(lambda: world.alice.models.remove_label("lab", "staging"))
    assert (err.code, err.http_status) == ("not_found", 404)
    err = _errors(lambda: world.alice.models.set_label("lab", "canary", 9))
    assert (err.code, err.http_status) == ("model_version_not_found", 404)
    # deleting a labelled version takes its labels with it
    world.alice.models.delete_version("lab", 3)
    assert world.alice.models.get("lab").labels == {}


def test_bad_labels_and_refs_are_refused(world, tmp_path):
    env = world.env
    _register(world.alice, "lab", _file(tmp_path, "model.onnx"))
    for label, fragment in (
        ("Prod", "is not a valid label"),
        ("1st", "is not a valid label"),
        ("latest", "is reserved"),
        ("a" * 64, "is not a valid label"),
        ("-x", "is not a valid label"),
    ):
        resp = _raw(env, world.alice, "PUT", f"{API}/models/lab/labels/{label}", {"version": 1})
        assert_api_error(resp, 400, "invalid_argument", fragment)
    assert_api_error(
        _raw(env, world.alice, "PUT", f"{API}/models/lab/labels/ok", {"version": 0}), 422, "validation_error"
    )
    assert_api_error(
        _raw(env, world.alice, "GET", f"{API}/models/lab/versions/Bad_Ref"),
        404,
        "model_version_not_found",
        "give a version number, a label or 'latest'",
    )
    assert world.alice.models.get("lab").labels == {}


# --- sharing -------------------------------------------------------------------------------------------------


def test_sharing_is_read_only_and_unshared_models_are_not_found(world, tmp_path):
    env = world.env
    f = _file(tmp_path, "model.onnx")
    v1 = _register(world.alice, "mnist", f, metrics={"accuracy": 0.9})
    _register(world.alice, "secret", f)
    world.alice.models.set_label("mnist", "production", 1)
    assert world.alice.models.share("mnist", "beta").tenant == "beta"
    world.alice.models.share("mnist", "beta")  # idempotent
    assert world.alice.models.get("mnist").shared_with == ["beta"]

    # beta sees it, named OWNER/NAME, and can read and download it
    listed = {m.name: m for m in world.bob.models.list()}
    assert set(listed) == {"acme/mnist"}
    assert listed["acme/mnist"].shared is True and listed["acme/mnist"].owner == "acme"
    assert listed["acme/mnist"].shared_with == []  # the owner's other shares stay private
    described = world.bob.models.get("acme/mnist")
    assert described.name == "acme/mnist" and described.labels == {"production": 1}
    assert described.versions[0].model == "acme/mnist"
    assert world.bob.models.versions("acme/mnist")[0].sha256 == v1.sha256
    got = world.bob.models.download("acme/mnist", "production", dest=tmp_path / "bob")
    assert got.read_bytes() == f.read_bytes()

    # ... but cannot change it (403, the model exists for beta), whatever the role
    for caller in (world.bob, world.bella):
        for change in (
            lambda c=caller: _register(c, "acme/mnist", f),
            lambda c=caller: c.models.set_label("acme/mnist", "staging", 1),
            lambda c=caller: c.models.remove_label("acme/mnist", "production"),
            lambda c=caller: c.models.share("acme/mnist", "beta"),
            lambda c=caller: c.models.unshare("acme/mnist", "beta"),
            lambda c=caller: c.models.delete_version("acme/mnist", 1),
            lambda c=caller: c.models.delete("acme/mnist"),
        ):
            err = _errors(change)
            assert (err.code, err.http_status) == ("permission_denied", 403), err.message
            assert "shared with tenant 'beta' read-only" in err.message
    resp = _raw(env, world.bob, "DELETE", f"{API}/models/mnist", query="owner=acme")
    assert_api_error(resp, 403, "permission_denied", "read-only")
    resp = _raw(env, world.bob, "PUT", f"{API}/models/mnist/labels/staging", {"version": 1}, query="owner=acme")
    assert_api_error(resp, 403, "permission_denied", "setting labels is for tenant 'acme'")
    resp = _raw(env, world.bob, "DELETE", f"{API}/models/mnist/labels/production", query="owner=acme")
    assert_api_error(resp, 403, "permission_denied", "removing labels is for tenant 'acme'")
    assert world.alice.models.get("mnist").labels == {"production": 1}
    assert [v.version for v in world.alice.models.versions("mnist")] == [1]

    # a model that is not shared, or a tenant that does not exist, is simply not found
    for name in ("acme/secret", "acme/nothing", "nobody/mnist"):
        for read in (world.bob.models.get, world.bob.models.versions, lambda n: world.bob.models.version(n, 1)):
            err = _errors(lambda r=read, n=name: r(n))
            assert (err.code, err.http_status) == ("model_not_found", 404)
            assert "beta" not in err.message
        err = _errors(lambda n=name: world.bob.models.delete(n))
        assert (err.code, err.http_status) == ("model_not_found", 404)
    resp = _raw(env, world.bob, "GET", f"{API}/models/secret/versions/1/artifact", query="owner=acme")
    assert_api_error(resp, 404, "model_not_found")
    # without an owner a name is beta's own: beta's own mnist is a different model
    err = _errors(lambda: world.bob.models.get("mnist"))
    assert err.code == "model_not_found"
    assert _register(world.bob, "mnist", f).version == 1
    assert {m.name for m in world.bob.models.list()} == {"mnist", "acme/mnist"}

    world.alice.models.unshare("mnist", "beta")
    err = _errors(lambda: world.bob.models.get("acme/mnist"))
    assert (err.code, err.http_status) == ("model_not_found", 404)
    assert {m.name for m in world.bob.models.list()} == {"mnist"}
    err = _errors(lambda: world.alice.models.unshare("mnist", "beta"))
    assert (err.code, err.http_status) == ("not_found", 404)


def test_share_targets_are_checked(world, tmp_path):
    _register(world.alice, "mnist", _file(tmp_path, "model.onnx"))
    err = _errors(lambda: world.alice.models.share("mnist", "acme"))
    assert (err.code, err.http_status) == ("invalid_argument", 400)
    # the answer for a tenant that does not exist is that for one that does (names must not leak); nothing is stored
    assert world.alice.models.share("mnist", "no-such-tenant").tenant == "no-such-tenant"
    assert world.alice.models.get("mnist").shared_with == []


# --- permissions and deletion --------------------------------------------------------------------------------


def test_delete_and_share_need_the_author_or_a_tenant_admin(world, tmp_path):
    f = _file(tmp_path, "model.onnx")
    _register(world.alice, "owned", f)
    _register(world.alice, "owned", f)
    for change, fragment in (
        (lambda: world.amy.models.delete("owned"), "delete model 'owned'"),
        (lambda: world.amy.models.delete_version("owned", 1), "delete version 1 of model 'owned'"),
        (lambda: world.amy.models.share("owned", "beta"), "share model 'owned'"),
    ):
        err = _errors(change)
        assert (err.code, err.http_status) == ("permission_denied", 403)
        assert f"only the author or a tenant admin can {fragment}" in err.message
    # any member registers versions and moves labels
    assert _register(world.amy, "owned", f).version == 3
    world.amy.models.set_label("owned", "production", 3)
    world.amy.models.delete_version("owned", 3)  # her own version
    world.anna.models.share("owned", "beta")  # a tenant admin
    world.alice.models.delete_version("owned", 1)  # the author
    world.anna.models.delete("owned")
    err = _errors(lambda: world.alice.models.get("owned"))
    assert err.code == "model_not_found"
    _assert_nothing_stored(world.env)


def test_delete_is_refused_while_a_version_is_deployed(world, tmp_path, registry_clock):
    env = world.env
    f = _file(tmp_path, "model.onnx")
    _register(world.alice, "served", f)
    _register(world.alice, "served", f)
    lease = world.alice.models.heartbeat_deployment("served", 1, "mnist-svc", "http://10.0.0.5:8500", 30)
    assert (lease.name, lease.endpoint, lease.tenant) == ("mnist-svc", "http://10.0.0.5:8500", "acme")
    assert lease.holder == "alice"
    version = world.alice.models.version("served", 1)
    assert version.deployed is True and version.deployments[0].name == "mnist-svc"
    assert world.alice.models.version("served", 2).deployed is False

    for delete in (
        lambda: world.alice.models.delete_version("served", 1),
        lambda: world.anna.models.delete("served"),
    ):
        err = _errors(delete)
        assert (err.code, err.http_status) == ("model_deployed", 409)
        assert "mnist-svc" in err.message
        assert err.details["deployments"][0]["version"] == 1
    resp = _raw(env, world.alice, "DELETE", f"{API}/models/served/versions/1")
    assert_api_error(resp, 409, "model_deployed", "undeploy it first")
    world.alice.models.delete_version("served", 2)  # the other version is not deployed
    assert verify(_artifact_path(env, "served", 1), version.sha256)

    # renewals keep it deployed; release ends the lease (idempotently)
    world.alice.models.heartbeat_deployment("served", 1, "mnist-svc", "http://10.0.0.6:8500", 30)
    assert world.alice.models.version("served", 1).deployments[0].endpoint == "http://10.0.0.6:8500"
    world.alice.models.release_deployment("served", 1, "mnist-svc")
    world.alice.models.release_deployment("served", 1, "mnist-svc")
    assert world.alice.models.version("served", 1).deployed is False

    # an expired lease no longer counts (the registry's clock moved past it: no race with a slow machine)
    world.alice.models.heartbeat_deployment("served", 1, "canary", "http://10.0.0.7:8500", 30)
    assert _errors(lambda: world.alice.models.delete("served")).code == "model_deployed"
    registry_clock.advance(31)
    assert world.alice.models.version("served", 1).deployed is False
    world.alice.models.delete("served")
    _assert_nothing_stored(env)


def test_a_tenant_a_model_is_shared_with_holds_its_own_leases(world, tmp_path, registry_clock):
    env = world.env
    carl = env.new_tenant_user("gamma", "carl")
    f = _file(tmp_path, "model.onnx")
    _register(world.alice, "served", f)
    world.alice.models.share("served", "beta")

    # beta serves acme/served: its lease keeps the owner from deleting the version
    lease = world.bob.models.heartbeat_deployment("acme/served", 1, "edge", "http://10.1.0.5:8000", 30)
    assert (lease.name, lease.tenant, lease.holder) == ("edge", "beta", "bob")
    for delete in (lambda: world.alice.models.delete_version("served", 1), lambda: world.anna.models.delete("served")):
        err = _errors(delete)
        assert (err.code, err.http_status) == ("model_deployed", 409)
        assert err.details["deployments"] == [
            {"version": 1, "name": "edge", "tenant": "beta", "expires_at": err.details["deployments"][0]["expires_at"]}
        ]

    # lease names are per tenant: acme's own "edge" is another lease
    world.alice.models.heartbeat_deployment("served", 1, "edge", "http://10.0.0.5:8000", 30)
    seen_by_owner = world.alice.models.version("served", 1).deployments
    assert [(d.tenant, d.holder) for d in seen_by_owner] == [("acme", "alice"), ("beta", None)]
    seen_by_beta = world.bob.models.version("acme/served", 1)
    assert [(d.tenant, d.endpoint) for d in seen_by_beta.deployments] == [("beta", "http://10.1.0.5:8000")]
    assert seen_by_beta.deployed is True

    # a lease belongs to its holder: another user of the tenant cannot renew or release it
    for other in (
        lambda: world.bella.models.heartbeat_deployment("acme/served", 1, "edge", "http://evil:1", 30),
        lambda: world.bella.models.release_deployment("acme/served", 1, "edge"),
        lambda: world.amy.models.release_deployment("served", 1, "edge"),
    ):
        err = _errors(other)
        assert (err.code, err.http_status) == ("permission_denied", 403)
        assert "is held by user" in err.message and "only its holder" in err.message
    # ... and another tenant's release never reaches it (its own "edge" does not exist: nothing to do)
    world.alice.models.release_deployment("served", 1, "edge")
    world.alice.models.release_deployment("served", 1, "edge")
    [left] = world.alice.models.version("served", 1).deployments
    assert (left.tenant, left.endpoint) == ("beta", "http://10.1.0.5:8000")
    # a tenant the model is not shared with cannot lease it
    err = _errors(lambda: carl.models.heartbeat_deployment("acme/served", 1, "edge", "http://x", 30))
    assert (err.code, err.http_status) == ("model_not_found", 404)

    # unsharing ends beta's leases, and beta can no longer lease the model
    world.alice.models.unshare("served", "beta")
    assert world.alice.models.version("served", 1).deployed is False
    err = _errors(lambda: world.bob.models.heartbeat_deployment("acme/served", 1, "edge", "http://x", 30))
    assert err.code == "model_not_found"

    # an expired lease of beta no longer blocks anything, and its name is free again
    world.alice.models.share("served", "beta")
    world.bob.models.heartbeat_deployment("acme/served", 1, "edge", "http://10.1.0.5:8000", 30)
    assert _errors(lambda: world.alice.models.delete("served")).code == "model_deployed"
    registry_clock.advance(31)
    assert world.alice.models.version("served", 1).deployed is False
    assert world.bella.models.heartbeat_deployment("acme/served", 1, "edge", "http://10.1.0.6:8000", 30).holder == (
        "bella"
    )
    assert _errors(lambda: world.alice.models.delete("served")).code == "model_deployed"
    registry_clock.advance(31)
    world.alice.models.delete("served")
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(ModelDeploymentRow)) == 0


def test_registry_changes_are_audited(world, tmp_path):
    f = _file(tmp_path, "model.onnx")
    _register(world.anna, "audited", f)
    world.anna.models.set_label("audited", "production", 1)
    world.anna.models.share("audited", "beta")
    for _ in range(3):
        world.anna.models.heartbeat_deployment("audited", 1, "svc", "http://x", 0.2)
    world.anna.models.release_deployment("audited", 1, "svc")
    _errors(lambda: world.bob.models.delete("acme/audited"))
    world.anna.models.delete("audited")
    events = world.anna.accounting.audit(limit=1000)
    actions = [(e.action, e.resource, e.status_code) for e in reversed(events)]
    assert [a for a in actions if a[0].startswith("models.")] == [
        ("models.upload", actions[0][1], 201),
        ("models.register", "audited:1", 201),
        ("models.set_label", "audited@production", 200),
        ("models.share", "audited->beta", 200),
        ("models.deployment_renew", "audited:1", 200),  # the first heartbeat; renewals are routine
        ("models.deployment_release", "audited:1", 204),
        ("models.delete", "audited", 204),
    ]
    assert actions[0][1].startswith("mu-")
    beta = world.bella.accounting.audit(limit=1000)
    assert [(e.action, e.status_code) for e in beta if e.action.startswith("models.")] == [("models.delete", 403)]


# --- registering from a job's outputs --------------------------------------------------------------------------

JOB_OUTPUTS = (
    'cd "$DLCLOUD_OUTPUT_DIR" && mkdir -p export/sub dirty && printf weights > model.onnx'
    " && printf tree > export/sub/w.bin && printf x > export/predictor.py"
    " && ln -s /etc/passwd passwd.onnx && ln -s /etc etc && ln -s /etc/passwd dirty/leak"
    " && mkfifo pipe.onnx"
)


def test_register_from_a_job_output(running_env, tmp_path):
    env = running_env
    alice = env.new_tenant_user("acme", "alice")
    bob = env.new_tenant_user("beta", "bob")
    alice.jobs.submit({"name": "train", "command": JOB_OUTPUTS})
    job = wait_for(lambda: (j := alice.jobs.get("train")).state in ("SUCCEEDED", "FAILED") and j, what="the job to end")
    assert job.state == "SUCCEEDED", job
    outputs = env.settings.runs_dir / env.admin.tenants.get("acme").id / job.id / "outputs"

    v = alice.models.register("from-job", "onnx", from_job="train", path="model.onnx", signature=SIG)
    assert (v.version, v.artifact, v.source_job, v.source_path) == (1, "model.onnx", "train", "model.onnx")
    assert v.source_job_id == job.id and v.sha256 == artifact_digest(outputs / "model.onnx").sha256
    v2 = alice.models.register("from-job", from_job=job.id, path="./export/", signature=SIG, format="python")
    assert (v2.version, v2.artifact, v2.source_job) == (2, "export", "train")
    assert v2.sha256 == artifact_digest(outputs / "export").sha256
    got = alice.models.download("from-job", 2, dest=tmp_path / "dl")
    assert (got / "sub" / "w.bin").read_text() == "tree"
    before = (_rows(env), _stored_files(env))

    bad = {
        "../train/outputs/model.onnx": "'..' is not allowed",
        "export/../../model.onnx": "'..' is not allowed",
        "/etc/passwd": "must be relative",
        ".": "must name a file or directory",
        "passwd.onnx": "is a symbolic link",
        "etc/passwd": "'etc' in the outputs of job 'train' is a symbolic link",
        "dirty": "dirty/leak is a symbolic link",
        "pipe.onnx": "device, FIFO or socket",
        "missing.onnx": "no file or directory 'missing.onnx' in the outputs of job 'train'",
        "back\\slash": "backslash",
    }
    for path, fragment in bad.items():
        err = _errors(lambda p=path: alice.models.register("from-job", "onnx", from_job="train", path=p, signature=SIG))
        assert (err.code, err.http_status) == ("invalid_argument", 400), (path, err.message)
        assert fragment in err.message, (path, err.message)
    # another tenant's job is not found, and so is a job that does not exist
    for caller, job_ref in ((bob, "train"), (bob, job.id), (alice, "nope")):
        err = _errors(lambda c=caller, j=job_ref: c.models.register("x", "onnx", from_job=j, path="model.onnx"))
        assert (err.code, err.http_status) == ("not_found", 404)
    assert (_rows(env), _stored_files(env)) == before
    assert not list((env.settings.data_dir / "tmp" / "models" / ".staging").iterdir())


# --- bad input -----------------------------------------------------------------------------------------------


def test_bad_register_requests_persist_nothing(world, tmp_path, subtests):
    env = world.env
    f = _file(tmp_path, "model.onnx")
    cases = {
        "unknown-format": (dict(format="pickle"), 400, "unknown_format", "format must be one of torchscript, onnx"),
        "bad-datatype": (
            dict(signature={"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1]}]}),
            400,
            "invalid_signature",
            "signature.inputs[0] (x): datatype must be one of BOOL",
        ),
        "bad-shape": (
            dict(signature={"inputs": [{"name": "x", "datatype": "FP32", "shape": [-2]}]}),
            400,
            "invalid_signature",
            "shape dimensions must be >= -1",
        ),
        "shape-not-ints": (
            dict(signature={"inputs": [{"name": "x", "datatype": "FP32", "shape": ["a"]}]}),
            400,
            "invalid_signature",
            "shape must be a list of integers",
        ),
        "signature-unknown-field": (
            dict(signature={"inputs": [], "extra": 1}),
            400,
            "invalid_signature",
            "unknown field(s) extra",
        ),
        "signature-empty": (dict(signature={"inputs": []}), 400, "invalid_signature", "declares no inputs"),
        "duplicate-tensor": (
            dict(signature={"inputs": [{"name": "x", "datatype": "FP32"}, {"name": "x", "datatype": "FP32"}]}),
            400,
            "invalid_signature",
            "appears twice",
        ),
        "bad-name": (dict(name="Bad_Name"), 422, "validation_error", "is not a valid name"),
        "long-name": (dict(name="m" * 64), 422, "validation_error", "name"),
        "unknown-field": (dict(bogus=1), 422, "validation_error", "bogus: unknown field"),
        "bad-metric": (dict(metrics={"acc": "high"}), 422, "validation_error", "metrics.acc"),
        "two-sources": (
            dict(from_job={"job": "x", "path": "m.onnx"}),
            422,
            "validation_error",
            "exactly one artifact source",
        ),
        "unknown-upload": (dict(upload="mu-0000000000000000"), 400, "invalid_argument", "upload the artifact again"),
        "upload-path-trick": (dict(upload="../../etc/passwd"), 400, "invalid_argument", "not found"),
    }
    up = world.alice.models.upload(_pack(f, tmp_path))
    assert up.artifact == "model.onnx" and up.id.startswith("mu-")
    for case, (overrides, status, code, fragment) in cases.items():
        with subtests.test(case=case):
            body = {"name": "m", "format": "onnx", "upload": up.id, "signature": SIG, **overrides}
            resp = _raw(env, world.alice, "POST", f"{API}/models", body)
            assert_api_error(resp, status, code, fragment)
            assert set(_rows(env).values()) == {0}
            assert [p.name for p in _stored_files(env)] == [f"{up.id}.tar.gz"]  # only the upload
    # a failed register leaves the upload usable; a successful one uses it up
    ok = _raw(env, world.alice, "POST", f"{API}/models", {"name": "m", "format": "onnx", "upload": up.id})
    assert ok.status_code == 201, ok.text
    assert ok.json()["signature"] is None
    assert_api_error(
        _raw(env, world.alice, "POST", f"{API}/models", {"name": "m", "format": "onnx", "upload": up.id}),
        400,
        "invalid_argument",
        "used by a register already",
    )
    assert [p.name for p in _stored_files(env)] == ["model.onnx"]
    # another tenant cannot use the upload either
    other = _raw(env, world.bob, "POST", f"{API}/models", {"name": "m", "format": "onnx", "upload": up.id})
    assert_api_error(other, 400, "invalid_argument", "not found")


def _pack(path: Path, tmp_path: Path) -> Path:
    from dlcloud.client.models import pack_artifact

    archive = pack_artifact(path)
    target = tmp_path / "packed.tar.gz"
    archive.replace(target)
    return target


def test_bad_input_through_the_sdk_persists_nothing(world, tmp_path, subtests):
    env = world.env
    f = _file(tmp_path, "model.onnx")
    tree = _tree(tmp_path)
    os.symlink(tree / "predictor.py", tree / "link.py")
    cases = [
        ("unknown-format", lambda: world.alice.models.register("m", "pickle", artifact=f), "unknown_format"),
        (
            "unrecognised-format",
            lambda: world.alice.models.register("m", artifact=_file(tmp_path, "weights.bin")),
            "unknown_format",
        ),
        (
            "invalid-signature",
            lambda: world.alice.models.register(
                "m", "onnx", artifact=f, signature={"inputs": [{"name": "x", "datatype": "FP99", "shape": []}]}
            ),
            "invalid_signature",
        ),
        ("bad-name", lambda: _register(world.alice, "Bad Name", f), "validation_error"),
        ("link-in-directory", lambda: _register(world.alice, "m", tree, fmt="python"), "invalid_argument"),
        ("bad-artifact-name", lambda: _register(world.alice, "m", _file(tmp_path, "-x.onnx")), "invalid_archive"),
    ]
    for case, call, code in cases:
        with subtests.test(case=case):
            err = _errors(call)
            assert err.code == code, err.message
            assert 400 <= err.http_status < 500
            _assert_nothing_stored(env)  # the SDK deleted its upload after the failed register


@pytest.mark.parametrize(
    ("members", "status", "code", "fragment"),
    [
        ([("a.onnx", b"x", tarfile.REGTYPE), ("b.onnx", b"y", tarfile.REGTYPE)], 400, "invalid_archive", "found 2"),
        ([("../evil.onnx", b"x", tarfile.REGTYPE)], 400, "invalid_archive", "'..'"),
        ([("/etc/evil.onnx", b"x", tarfile.REGTYPE)], 400, "invalid_archive", "absolute path"),
        ([("m/link", None, tarfile.SYMTYPE)], 400, "invalid_archive", "is a link"),
        ([("m/dev", None, tarfile.CHRTYPE)], 400, "invalid_archive", "device, FIFO"),
        ([(".hidden.onnx", b"x", tarfile.REGTYPE)], 400, "invalid_archive", "artifact name '.hidden.onnx'"),
        ([], 400, "invalid_archive", "found 0"),
    ],
    ids=["two-top-level", "dotdot", "absolute", "symlink", "device", "hidden-name", "empty"],
)
def test_bad_uploads_are_refused(world, members, status, code, fragment):
    resp = _raw_upload(world.env, world.alice, _tar_gz(members))
    assert_api_error(resp, status, code, fragment)
    _assert_nothing_stored(world.env)


def test_bomb_and_garbage_uploads_are_refused(world):
    assert_api_error(_raw_upload(world.env, world.alice, b"not a tarball" * 100), 400, "invalid_archive")
    big = tarfile.TarInfo("m.onnx")
    big.size = world.env.settings.max_unpacked_bytes + 1
    bomb = gzip.compress(big.tobuf(tarfile.PAX_FORMAT) + bytes(1024))  # a header declaring more than the limit
    resp = _raw_upload(world.env, world.alice, bomb)
    assert_api_error(resp, 413, "payload_too_large", "more than")
    _assert_nothing_stored(world.env)


def test_unknown_models_and_versions_are_404(world):
    env = world.env
    assert world.alice.models.list() == []
    assert_api_error(_raw(env, world.alice, "GET", f"{API}/models/ghost"), 404, "model_not_found", "'ghost'")
    assert_api_error(_raw(env, world.alice, "GET", f"{API}/models/ghost/versions/1"), 404, "model_not_found")
    assert_api_error(_raw(env, world.alice, "DELETE", f"{API}/models/ghost"), 404, "model_not_found")
    assert_api_error(_raw(env, world.alice, "DELETE", f"{API}/model-uploads/mu-nope"), 404, "not_found")
