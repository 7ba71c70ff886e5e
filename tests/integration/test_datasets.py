"""Datasets through the API, on SQLite and PostgreSQL: pushes make numbered immutable versions with a
manifest, labels move, sharing is read-only and 404 for everyone else, bad input stores nothing, and a
version a job that has not ended reads cannot be deleted."""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud import signing
from dlcloud.client import Client
from dlcloud.services import datasets as datasets_service
from dlcloud.storage.objects import scan_tree
from dlcloud.store.rows import DatasetRow, DatasetVersionRow, JobDatasetRow
from tests.conftest import Env, assert_api_error, wait_for

API = "/api/v1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


@dataclass
class World:
    env: Env
    alice: Client  # acme, member
    amy: Client  # acme, member
    bob: Client  # beta, member


@pytest.fixture
def world(env: Env) -> World:
    return World(
        env,
        env.new_tenant_user("acme", "alice"),
        env.new_tenant_user("acme", "amy"),
        env.new_tenant_user("beta", "bob"),
    )


def _tar_gz(files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _raw(env: Env, client: Client, method: str, path: str, body: object = None, query: str = ""):
    return env.signed(client.transport.creds, method, path, body, query)


def _upload(env: Env, client: Client, data: bytes) -> str:
    creds = client.transport.creds
    digest = hashlib.sha256(data).hexdigest()
    headers = signing.sign_request(creds.access_key, creds.secret_key, "POST", f"{API}/dataset-uploads", "", digest)
    resp = env.http.post(
        f"{API}/dataset-uploads", content=data, headers={**headers.headers, "Content-Type": "application/octet-stream"}
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _push(env: Env, client: Client, name: str, files: dict[str, bytes], **kw) -> dict:
    upload = _upload(env, client, _tar_gz(files, kw.pop("dirs", ())))
    resp = _raw(env, client, "POST", f"{API}/datasets/{name}/versions", {"upload": upload, **kw})
    assert resp.status_code == 201, resp.text
    return resp.json()


def _counts(env: Env) -> tuple[int, int]:
    with env.platform.db.read() as s:
        return (
            int(s.scalar(select(func.count()).select_from(DatasetRow)) or 0),
            int(s.scalar(select(func.count()).select_from(DatasetVersionRow)) or 0),
        )


FILES = {"train/part-0.csv": b"a,b\n1,2\n", "train/part-1.csv": b"a,b\n3,4\n" * 100, ".meta": b"m", "empty": b""}


def test_pushes_make_numbered_versions_with_a_manifest(world: World, tmp_path) -> None:
    env = world.env
    v1 = _push(env, world.alice, "clicks", FILES, description="first", dirs=("unused-dir",))
    assert (v1["dataset"], v1["owner"], v1["version"], v1["file_count"]) == ("clicks", "acme", 1, 4)
    assert v1["size_bytes"] == sum(map(len, FILES.values())) and v1["created_by"] == "alice"
    src = tmp_path / "src"
    for name, data in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / "unused-dir").mkdir()
    # the version's checksum is the canonical checksum of its files (paths from the dataset's root)
    assert v1["sha256"] == scan_tree(src).artifact_sha256()
    files = _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/1/files").json()
    assert [(f["path"], f["size"]) for f in files] == [
        (".meta", 1),
        ("empty", 0),
        *[(k, len(v)) for k, v in sorted(FILES.items()) if k.startswith("train")],
    ]
    assert all(f["sha256"] == hashlib.sha256(FILES[f["path"]]).hexdigest() for f in files)

    v2 = _push(env, world.amy, "clicks", {"x.bin": b"\x00" * 10})
    assert v2["version"] == 2
    listed = _raw(env, world.alice, "GET", f"{API}/datasets").json()
    assert [(d["name"], d["latest_version"], d["version_count"], d["shared"]) for d in listed] == [
        ("clicks", 2, 2, False)
    ]
    assert listed[0]["size_bytes"] == v1["size_bytes"] + 10

    # the download is the files, with the checksum in a header
    resp = _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/1/data")
    assert resp.status_code == 200 and resp.headers["x-dlcloud-artifact-sha256"] == v1["sha256"]
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tf:
        got = {m.name: tf.extractfile(m).read() for m in tf if m.isfile()}  # type: ignore[union-attr]
        assert "unused-dir" in tf.getnames()  # an empty directory comes back
    assert got == FILES


def test_labels_move_and_resolve(world: World) -> None:
    env = world.env
    for i in range(3):
        _push(env, world.alice, "clicks", {f"f{i}": b"x"})
    assert _raw(env, world.alice, "PUT", f"{API}/datasets/clicks/labels/production", {"version": 2}).status_code == 200
    assert _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/production").json()["version"] == 2
    assert _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/latest").json()["version"] == 3
    assert _raw(env, world.amy, "PUT", f"{API}/datasets/clicks/labels/production", {"version": 3}).status_code == 200
    detail = _raw(env, world.alice, "GET", f"{API}/datasets/clicks").json()
    assert detail["labels"] == {"production": 3}
    assert [v["labels"] for v in detail["versions"]] == [[], [], ["production"]]
    assert_api_error(
        _raw(env, world.alice, "PUT", f"{API}/datasets/clicks/labels/latest", {"version": 1}), 400, "invalid_argument"
    )
    assert_api_error(
        _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/staging"), 404, "dataset_version_not_found"
    )
    # a reference that is no number, label or 'latest' is bad input for a dataset (a model answers 404)
    assert_api_error(
        _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/Bad_Ref"),
        400,
        "invalid_argument",
        "give a number, a label or 'latest'",
    )


def test_sharing_is_read_only_and_others_get_404(world: World) -> None:
    env = world.env
    _push(env, world.alice, "clicks", FILES)
    # not shared: exactly like a dataset that does not exist
    for path in (f"{API}/datasets/clicks", f"{API}/datasets/clicks/versions/1/data"):
        assert_api_error(_raw(env, world.bob, "GET", path, query="owner=acme"), 404, "dataset_not_found")
        assert_api_error(_raw(env, world.bob, "GET", path, query="owner=nosuch"), 404, "dataset_not_found")
    # share answers alike whether or not the tenant exists
    a = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/shares/beta")
    b = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/shares/nosuch")
    assert a.status_code == b.status_code == 200 and set(a.json()) == set(b.json())
    listed = _raw(env, world.bob, "GET", f"{API}/datasets").json()
    assert [(d["name"], d["shared"], d["shared_with"]) for d in listed] == [("acme/clicks", True, [])]
    resp = _raw(env, world.bob, "GET", f"{API}/datasets/clicks/versions/1/data", query="owner=acme")
    assert resp.status_code == 200
    for method, path, body in (
        ("PUT", f"{API}/datasets/clicks/labels/x", {"version": 1}),
        ("DELETE", f"{API}/datasets/clicks", None),
        ("DELETE", f"{API}/datasets/clicks/versions/1", None),
        ("POST", f"{API}/datasets/clicks/shares/gamma", None),
    ):
        assert_api_error(_raw(env, world.bob, method, path, body, query="owner=acme"), 403, "permission_denied")
    assert_api_error(
        _raw(env, world.bob, "DELETE", f"{API}/datasets/clicks/labels/x", query="owner=acme"),
        403,
        "permission_denied",
        "moving labels is for tenant 'acme'",
    )
    assert _raw(env, world.alice, "DELETE", f"{API}/datasets/clicks/shares/beta").status_code == 204
    assert_api_error(
        _raw(env, world.bob, "GET", f"{API}/datasets/clicks", query="owner=acme"), 404, "dataset_not_found"
    )


def test_bad_input_stores_nothing(world: World, subtests) -> None:
    env = world.env
    before = (_counts(env), sorted(i.key for i in env.platform.objects.list("datasets")))
    bombs = {
        "a path that climbs out": _tar_gz({"../evil": b"x"}),
        "no file at all": _tar_gz({}, dirs=("only-a-dir",)),
    }
    for what, data in bombs.items():
        with subtests.test(what):
            upload_resp = None
            creds = world.alice.transport.creds
            digest = hashlib.sha256(data).hexdigest()
            headers = signing.sign_request(
                creds.access_key, creds.secret_key, "POST", f"{API}/dataset-uploads", "", digest
            )
            upload_resp = env.http.post(f"{API}/dataset-uploads", content=data, headers=headers.headers)
            if upload_resp.status_code == 201:
                resp = _raw(
                    env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload_resp.json()["id"]}
                )
                assert_api_error(resp, 400, "invalid_archive")
            else:
                assert_api_error(upload_resp, 400, "invalid_archive")
    with subtests.test("an id-shaped name"):
        upload = _upload(env, world.alice, _tar_gz({"f": b"x"}))
        assert_api_error(
            _raw(env, world.alice, "POST", f"{API}/datasets/ds-0123456789abcdef/versions", {"upload": upload}),
            400,
            "invalid_argument",
        )
    with subtests.test("another tenant's upload"):
        upload = _upload(env, world.bob, _tar_gz({"f": b"x"}))
        assert_api_error(
            _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload}),
            400,
            "invalid_argument",
        )
    assert (_counts(env), sorted(i.key for i in env.platform.objects.list("datasets"))) == before


def test_a_version_a_queued_job_reads_cannot_be_deleted(world: World) -> None:
    env = world.env
    _push(env, world.alice, "clicks", FILES)
    _push(env, world.alice, "clicks", {"f": b"x"})
    _raw(env, world.alice, "PUT", f"{API}/datasets/clicks/labels/production", {"version": 1})
    world.alice.jobs.submit({"name": "reader", "command": "true", "datasets": ["clicks@production"]})
    resolved = world.alice.jobs.get("reader").resolved.datasets
    assert [(d.name, d.owner, d.version) for d in resolved] == [("clicks", "acme", 1)]
    wire = world.alice.transport.request("GET", f"{API}/jobs/reader")["resolved"]["datasets"][0]
    assert "storage_key" not in wire and "version_id" not in wire
    # the label moving later does not change what the job reads
    _raw(env, world.alice, "PUT", f"{API}/datasets/clicks/labels/production", {"version": 2})
    for path in (f"{API}/datasets/clicks/versions/1", f"{API}/datasets/clicks"):
        err = assert_api_error(_raw(env, world.alice, "DELETE", path), 409, "dataset_in_use", "reader")
        assert err["details"]["jobs"] == ["reader"]
    assert _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions/1").json()["in_use_by"] == ["reader"]
    world.alice.jobs.cancel("reader")
    assert _raw(env, world.alice, "DELETE", f"{API}/datasets/clicks/versions/1").status_code == 204
    with env.platform.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobDatasetRow)) == 0
    assert _raw(env, world.alice, "DELETE", f"{API}/datasets/clicks").status_code == 204
    assert list(env.platform.objects.list("datasets")) == []


def test_jobs_refuse_datasets_they_cannot_read(world: World) -> None:
    env = world.env
    _push(env, world.alice, "clicks", FILES)
    for refs, code, fragment in (
        (["nosuch"], "dataset_not_found", "nosuch"),
        (["acme/clicks"], "dataset_not_found", "acme/clicks"),  # bob's tenant: not shared
        (["clicks@7"], "dataset_not_found", "clicks"),
    ):
        resp = _raw(env, world.bob, "POST", f"{API}/jobs", {"name": "j", "command": "true", "datasets": refs})
        assert_api_error(resp, 404, code, fragment)
    resp = _raw(env, world.alice, "POST", f"{API}/jobs", {"name": "j", "command": "true", "datasets": ["clicks@7"]})
    assert_api_error(resp, 404, "dataset_version_not_found", "no version 7")
    resp = _raw(
        env, world.alice, "POST", f"{API}/jobs", {"name": "j", "command": "true", "datasets": ["clicks", "clicks@1"]}
    )
    assert_api_error(resp, 400, "invalid_argument", "give each dataset once")
    resp = _raw(env, world.alice, "POST", f"{API}/jobs", {"name": "j", "command": "true", "datasets": ["Bad Name"]})
    assert_api_error(resp, 422, "validation_error")
    assert world.alice.jobs.list() == []


def test_a_job_spec_gives_datasets_as_strings_or_mappings(world: World) -> None:
    """``{name: NAME, version: VERSION}`` (version a number, a label, or left out) reads as ``NAME@VERSION``, mixed
    with the string form; a mapping of another shape is refused with a message that names the forms."""
    env = world.env
    for name in ("clicks", "clicks", "views", "ads"):
        _push(env, world.alice, name, {"f": b"x"})
    _raw(env, world.alice, "PUT", f"{API}/datasets/views/labels/production", {"version": 1})
    refs = [{"name": "clicks", "version": 1}, {"name": "views", "version": "production"}, {"name": "ads"}]
    resp = _raw(env, world.alice, "POST", f"{API}/jobs", {"name": "mixed", "command": "true", "datasets": refs})
    assert resp.status_code == 201, resp.text
    job = world.alice.jobs.get("mixed")
    assert job.spec["datasets"] == ["clicks@1", "views@production", "ads"]
    resolved = job.resolved.datasets
    assert [(d.name, d.version) for d in resolved] == [("clicks", 1), ("views", 1), ("ads", 1)]
    world.alice.jobs.submit({"name": "strings", "command": "true", "datasets": ["clicks", {"name": "views"}]})
    assert world.alice.jobs.get("strings").spec["datasets"] == ["clicks", "views"]
    for bad, fragment in (
        ({"name": "clicks", "versoin": 1}, "datasets.0: unknown key versoin: a dataset is NAME, NAME@VERSION"),
        ({"version": 1}, "datasets.0: name must be a dataset's NAME or OWNER/NAME"),
        ({"name": "clicks@1", "version": 2}, "without @VERSION; got 'clicks@1'"),
        ({"name": "clicks", "version": [1]}, "version must be a version number or a label; got [1]"),
        ({"name": "Clicks"}, "'Clicks' is not a dataset: give NAME, NAME@VERSION"),
        (3, "3 is not a dataset"),
    ):
        resp = _raw(env, world.alice, "POST", f"{API}/jobs", {"name": "bad", "command": "true", "datasets": [bad]})
        assert_api_error(resp, 422, "validation_error", fragment)
    assert sorted(j.name for j in world.alice.jobs.list()) == ["mixed", "strings"]


READER = r"""
import json, os, pathlib, sys
root = pathlib.Path(os.environ["DLCLOUD_DATASET_CLICK_LOG"])
print(json.dumps({
    "datasets": json.loads(os.environ["DLCLOUD_DATASETS"]),
    "files": sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".dlcloud-")
    ),
    "part1": (root / "train" / "part-1.csv").read_text().count("3,4"),
}))
try:
    (root / "new").write_text("x")
    print("WROTE")
except OSError as exc:
    print("read-only", exc.errno)
"""


def test_a_job_reads_its_dataset_read_only(running_env: Env, tmp_path) -> None:
    env = running_env
    alice = env.new_tenant_user("acme", "alice")
    _push(env, alice, "click-log", FILES)
    code = tmp_path / "code.tar.gz"
    code.write_bytes(_tar_gz({"reader.py": READER.encode()}))
    up = alice.code.upload(code)
    alice.jobs.submit({"name": "reader", "code": up.id, "command": "python reader.py", "datasets": ["click-log@1"]})
    job = wait_for(lambda: (j := alice.jobs.get("reader")).state in TERMINAL and j, 60, what="reader to end")
    lines = [line.text for line in alice.jobs.logs("reader") if line.stream == "stdout"]
    assert job.state == "SUCCEEDED", (job.reason, lines)
    seen = json.loads(lines[0])
    path = seen["datasets"]["click-log"]
    assert seen["files"] == sorted(FILES) and seen["part1"] == 100
    assert lines[1].startswith("read-only")
    # in the sandbox at a neutral path (the local store's own tree, bound read-only); bare, the tree itself
    assert env.control is not None
    if env.control.executor.isolation()[0]:
        assert path == "/datasets/click-log"
    else:
        with env.platform.db.read() as s:
            key = s.scalars(select(DatasetVersionRow.storage_key)).one()
        assert path == str(env.platform.objects.tree_local_path(key))
    # the attempt's pin is gone once it ended
    assert env.control is not None
    assert env.control.executor.data_cache.holders() == set()


def test_the_storage_quota_counts_datasets_models_and_code(world: World, tmp_path) -> None:
    env = world.env
    _push(env, world.alice, "clicks", {"f": b"x" * 1000})
    code = tmp_path / "code.tar.gz"
    code.write_bytes(_tar_gz({"train.py": b"print(1)\n"}))
    up = world.alice.code.upload(code)
    used = 1000 + up.size
    assert world.alice.accounting.quota().usage.storage == used
    env.admin.tenants.set_quota("acme", {"storage": used + 600})
    assert world.alice.accounting.quota().limits.storage == used + 600
    uploads_before = sorted(i.key for i in env.platform.objects.list("uploads"))

    # a declared length that cannot fit is refused before the body is read
    big = _tar_gz({"g": random.Random(1).randbytes(4000)})
    assert len(big) > 600
    creds = world.alice.transport.creds
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, "POST", f"{API}/dataset-uploads", "", hashlib.sha256(big).hexdigest()
    )
    resp = env.http.post(f"{API}/dataset-uploads", content=big, headers=headers.headers)
    err = assert_api_error(resp, 429, "quota_exceeded", "storage quota")
    assert err["details"]["resource"] == "storage"
    # without a declared length the body is cut where it stops fitting
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, "POST", f"{API}/dataset-uploads", "", hashlib.sha256(big).hexdigest()
    )
    resp = env.http.post(f"{API}/dataset-uploads", content=iter([big[:300], big[300:]]), headers=headers.headers)
    assert_api_error(resp, 429, "quota_exceeded", "storage quota")
    # a small upload whose unpacked files do not fit: refused at the push, nothing stored
    small = _tar_gz({"z": b"\0" * 100_000})
    assert len(small) < 600
    upload = _upload(env, world.alice, small)
    resp = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload})
    assert_api_error(resp, 429, "quota_exceeded", "storage quota")
    assert [v["version"] for v in _raw(env, world.alice, "GET", f"{API}/datasets/clicks/versions").json()] == [1]
    # the refused upload stored nothing; the pushed one waits for another push (or its expiry)
    assert [i.key.rsplit("/", 1)[1] for i in env.platform.objects.list("uploads")] == [
        k.rsplit("/", 1)[1] for k in uploads_before
    ] + [f"{upload}.tar.gz"]
    assert world.alice.accounting.quota().usage.storage == used
    # the upload waiting for a push takes room: a length that fits the quota but not beside it is refused
    n = 1
    while len(also := _tar_gz({"h": random.Random(2).randbytes(n)})) <= 600 - len(small):
        n += 8
    assert len(also) <= 600 < len(also) + len(small)
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, "POST", f"{API}/dataset-uploads", "", hashlib.sha256(also).hexdigest()
    )
    resp = env.http.post(f"{API}/dataset-uploads", content=also, headers=headers.headers)
    assert_api_error(resp, 429, "quota_exceeded", "storage quota")
    # another tenant is not limited by it
    _push(env, world.bob, "clicks", {"z": b"\0" * 100_000})


PEEK = r"""
import json, sys
out = {}
for path in json.loads(open("targets.json").read()):
    try:
        out[path] = open(path).read()[:32]
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""


def test_another_tenants_job_cannot_read_a_dataset_by_its_path(running_env: Env, tmp_path) -> None:
    """The attacker knows where the files are on the host (worst case): the sandbox does not show them."""
    env = running_env
    if not env.platform.isolated or env.control is None or not env.control.executor.isolation()[0]:
        pytest.skip("needs the bubblewrap sandbox (installed by make test)")
    alice = env.new_tenant_user("acme", "alice")
    bob = env.new_tenant_user("beta", "bob")
    _push(env, alice, "private", {"secret.txt": b"acme-private-rows"})
    with env.platform.db.read() as s:
        key = s.scalars(select(DatasetVersionRow.storage_key)).one()
    tree = env.platform.objects.tree_local_path(key)
    assert tree is not None
    targets = [str(tree / "secret.txt"), str(env.settings.data_dir / "datasets")]
    code = tmp_path / "code.tar.gz"
    code.write_bytes(_tar_gz({"peek.py": PEEK.encode(), "targets.json": json.dumps(targets).encode()}))
    up = bob.code.upload(code)
    bob.jobs.submit({"name": "peek", "code": up.id, "command": "python peek.py"})
    job = wait_for(lambda: (j := bob.jobs.get("peek")).state in TERMINAL and j, 60, what="peek to end")
    lines = [line.text for line in bob.jobs.logs("peek") if line.stream == "stdout"]
    assert job.state == "SUCCEEDED", (job.reason, lines)
    seen = json.loads(lines[0])
    assert set(seen.values()) <= {"FileNotFoundError", "PermissionError"}, seen
    assert "acme-private-rows" not in lines[0]


def test_unsharing_ends_the_other_tenants_readers(world: World) -> None:
    env = world.env
    _push(env, world.alice, "clicks", FILES)
    _raw(env, world.alice, "POST", f"{API}/datasets/clicks/shares/beta")
    world.bob.jobs.submit({"name": "borrow", "command": "true", "datasets": ["acme/clicks@1"]})
    err = assert_api_error(_raw(env, world.alice, "DELETE", f"{API}/datasets/clicks"), 409, "dataset_in_use")
    assert err["details"] == {"jobs": [], "other_tenants_jobs": 1}  # beta's job is counted, not named
    assert "borrow" not in err["message"]
    assert _raw(env, world.alice, "DELETE", f"{API}/datasets/clicks/shares/beta").status_code == 204
    job = world.bob.jobs.get("borrow")
    assert job.state == "FAILED" and "no longer shared" in job.reason
    assert _raw(env, world.alice, "DELETE", f"{API}/datasets/clicks").status_code == 204


def test_a_push_that_would_unpack_past_the_quota_writes_nothing(world: World, monkeypatch) -> None:
    env = world.env
    env.admin.tenants.set_quota("acme", {"storage": 10_000})
    upload = _upload(env, world.alice, _tar_gz({"zeros": b"\0" * 5_000_000}))  # 5 MB of zeros packs small
    unpacked: list[Path] = []
    real = datasets_service._unpack
    monkeypatch.setattr(datasets_service, "_unpack", lambda *a: unpacked.append(a[1]) or real(*a))
    resp = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload})
    assert_api_error(resp, 429, "quota_exceeded", "storage quota")
    assert unpacked == []  # refused from the archive's declared sizes, before extraction


def test_uploads_no_push_used_are_dropped_after_their_time(world: World) -> None:
    from dlcloud.services.uploads import sweep_uploads

    env = world.env
    upload = _upload(env, world.alice, _tar_gz({"f": b"x"}))
    objects = env.platform.objects
    sweep_uploads(objects, 3600.0)  # young: kept
    assert [i.key.rsplit("/", 1)[1] for i in objects.list("uploads")] == [f"{upload}.tar.gz"]
    sweep_uploads(objects, 0.0)  # past its time: dropped, and a push then says so
    assert list(objects.list("uploads")) == []
    resp = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload})
    assert_api_error(resp, 400, "invalid_argument", "expired")


def test_an_upload_in_use_by_one_push_is_refused_to_another(world: World, tmp_path) -> None:
    """One upload never becomes two versions: while a push holds it, another push of it is a 409."""
    from dlcloud.schemas.datasets import DATASET_UPLOAD_ID_RE
    from dlcloud.services import uploads
    from dlcloud.services.auth import Caller, Role

    env = world.env
    upload = _upload(env, world.alice, _tar_gz({"f": b"x"}))
    from dlcloud.store.rows import TenantRow, UserRow

    with env.platform.db.read() as s:
        tenant = s.scalars(select(TenantRow).where(TenantRow.name == "acme")).one()
        user = s.scalars(select(UserRow).where(UserRow.tenant_id == tenant.id, UserRow.name == "alice")).one()
        caller = Caller(tenant.id, "acme", user.id, "alice", Role(user.role), world.alice.transport.creds.access_key)
    with uploads.use_upload(env.platform, caller, upload, DATASET_UPLOAD_ID_RE, tmp_path, "a push", "the data"):
        resp = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload})
        assert_api_error(resp, 409, "invalid_state", "being used by another request")
    # released: the upload is usable again, once
    assert _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload}).status_code == 201
    resp = _raw(env, world.alice, "POST", f"{API}/datasets/clicks/versions", {"upload": upload})
    assert_api_error(resp, 400, "invalid_argument", "used by a push already")


def test_a_versions_files_are_listed_a_page_at_a_time(world: World, monkeypatch) -> None:
    env = world.env
    files = {f"part-{i:03d}.csv": b"x" * i for i in range(25)}
    _push(env, world.alice, "paged", files)
    url = f"{API}/datasets/paged/versions/1/files"
    first = _raw(env, world.alice, "GET", url, query="limit=10").json()
    assert [f["path"] for f in first] == sorted(files)[:10]
    rest = _raw(env, world.alice, "GET", url, query=f"limit=10&after={first[-1]['path']}").json()
    assert [f["path"] for f in rest] == sorted(files)[10:20]
    last = _raw(env, world.alice, "GET", url, query="limit=10&after=part-019.csv").json()
    assert [f["path"] for f in last] == sorted(files)[20:]
    assert _raw(env, world.alice, "GET", url, query="after=zzz").json() == []
    for bad in ("limit=0", "limit=10001", "limit=x"):
        assert_api_error(_raw(env, world.alice, "GET", url, query=bad), 422, "validation_error")
    # the SDK (and so the CLI) pages through them all
    from dlcloud.client import datasets as client_datasets

    monkeypatch.setattr(client_datasets, "FILES_PAGE", 7)
    assert [f.path for f in world.alice.datasets.files("paged", 1)] == sorted(files)
