"""The S3 backend against a real S3 server (SeaweedFS, tests/s3server.py), looked at from the bucket's side:
where objects and their checksums land, multipart uploads, what a failed tree upload leaves (nothing), damage
done in the bucket, and the failures of the server, the network and the credentials (StorageError, quickly,
never showing the secret). The contract shared with the local backend is in test_object_stores.py.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from dlcloud.errors import DlcloudError
from dlcloud.storage.objects import (
    Manifest,
    ObjectDamaged,
    ObjectMissing,
    StorageError,
    TreeEntry,
    scan_tree,
)
from dlcloud.storage.s3 import S3ObjectStore
from tests.s3server import S3Server, s3_server  # noqa: F401  (the fixture)

MiB = 1024 * 1024


@pytest.fixture
def store(s3_server: S3Server) -> S3ObjectStore:  # noqa: F811
    return s3_server.new_store()


def _raw_keys(server: S3Server, store: S3ObjectStore) -> list[str]:
    """Every S3 object under the store's prefix, the store's own names included."""
    r = server.client().list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + "/")
    return sorted(o["Key"][len(store.prefix) + 1 :] for o in r.get("Contents") or ())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path) -> Path:
    (root / "model" / "sub").mkdir(parents=True)
    (root / "model" / "weights.bin").write_bytes(os.urandom(200_000))
    (root / "model" / "sub" / "config.json").write_text('{"a": 1}\n')
    (root / "model" / "empty-dir").mkdir()
    (root / "README").write_text("hi")
    return root


def _calls(store: S3ObjectStore, operation: str) -> list[dict[str, Any]]:
    """The parameters of the store's requests of one kind from now on (a botocore event hook that only
    looks: the requests still go out)."""
    seen: list[dict[str, Any]] = []

    def hook(params: dict[str, Any], **kwargs: Any) -> None:
        seen.append(params)

    store._client.meta.events.register(f"before-parameter-build.s3.{operation}", hook)
    return seen


# -- objects ---------------------------------------------------------------------------------------------


def test_objects_live_under_the_prefix_with_their_sha256_as_metadata(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    data = os.urandom(70_000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    info = store.put_file("code/t-1/c-1/code.tar.gz", src)
    assert (info.key, info.size, info.sha256) == ("code/t-1/c-1/code.tar.gz", 70_000, _sha(data))
    assert info.modified is not None and abs(info.modified - time.time()) < 300
    raw = s3_server.client().head_object(Bucket=store.bucket, Key=f"{store.prefix}/code/t-1/c-1/code.tar.gz")
    assert raw["ContentLength"] == 70_000 and raw["Metadata"] == {"sha256": _sha(data)}
    assert store.url == f"s3://{s3_server.bucket}/{store.prefix}"
    assert s3_server.secret_key not in store.url + repr(store)

    head = store.head("code/t-1/c-1/code.tar.gz")
    assert head is not None and (head.size, head.sha256) == (70_000, _sha(data))
    assert store.head("code/t-1/c-1/nothing") is None
    dest = tmp_path / "out" / "back.bin"
    dest.parent.mkdir()
    assert store.get_file("code/t-1/c-1/code.tar.gz", dest, sha256=_sha(data)).sha256 == _sha(data)
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["back.bin"]  # no temporary file left beside it
    chunks = list(store.iter_bytes("code/t-1/c-1/code.tar.gz", chunk=30_000))
    assert [len(c) for c in chunks] == [30_000, 30_000, 10_000] and b"".join(chunks) == data
    with pytest.raises(ObjectMissing, match="code/t-1/c-1/nothing"):
        store.get_file("code/t-1/c-1/nothing", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ObjectMissing):
        list(store.iter_bytes("code/t-1/c-1/nothing"))

    # a second put replaces the object whole
    src.write_bytes(b"v2")
    store.put_file("code/t-1/c-1/code.tar.gz", src)
    assert b"".join(store.iter_bytes("code/t-1/c-1/code.tar.gz")) == b"v2"
    assert store.head("code/t-1/c-1/code.tar.gz").sha256 == _sha(b"v2")  # type: ignore[union-attr]


def test_list_is_in_key_order_and_deletes_are_complete(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    # SeaweedFS lists "d/a/b" before "d/a-b" (it walks directories); key order puts '-' and '.' before '/'
    keys = ["d/a/b", "d/a.b", "d/a-b", "d/z", "other/k"]
    for key in keys:
        store.put_file(key, src)
    listed = list(store.list("d"))
    assert [i.key for i in listed] == ["d/a-b", "d/a.b", "d/a/b", "d/z"]
    assert all(i.size == 1 and i.modified is not None for i in listed)
    assert list(store.list("d/a")) == [i for i in listed if i.key == "d/a/b"]
    assert list(store.list("d/a-")) == []  # a prefix is whole segments
    store.delete("d/z")
    store.delete("d/z")  # a missing key is fine
    assert store.head("d/z") is None
    assert store.delete_prefix("d") == 3
    assert list(store.list("d")) == [] and _raw_keys(s3_server, store) == ["other/k"]


def test_delete_prefix_takes_more_than_one_batch(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    client = s3_server.client()
    with ThreadPoolExecutor(8) as pool:  # DeleteObjects takes 1000 keys at most: 1005 need two
        list(
            pool.map(lambda i: client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/many/k{i:04d}"), range(1005))
        )
    deletes = _calls(store, "DeleteObjects")
    assert store.delete_prefix("many") == 1005
    assert [len(p["Delete"]["Objects"]) for p in deletes if p["Delete"]["Objects"]] == [1000, 5]
    assert _raw_keys(s3_server, store) == []


def test_a_wrong_declared_sha256_stores_nothing(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    puts = _calls(store, "PutObject")
    with pytest.raises(DlcloudError) as err:
        store.put_file("code/t/c/f", src, sha256=_sha(b"other payload"))
    assert err.value.code == "checksum_mismatch" and err.value.http_status == 400
    assert list(puts) == [] and _raw_keys(s3_server, store) == []


def test_an_object_damaged_in_the_bucket_is_detected_by_get_file(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"the original")
    store.put_file("code/t/c/f", src)
    # altered behind the store's back, keeping the recorded checksum
    s3_server.client().put_object(
        Bucket=store.bucket,
        Key=f"{store.prefix}/code/t/c/f",
        Body=b"the altered!",
        Metadata={"sha256": _sha(b"the original")},
    )
    dest = tmp_path / "out" / "f"
    dest.parent.mkdir()
    with pytest.raises(ObjectDamaged, match="damaged or altered") as err:
        store.get_file("code/t/c/f", dest)
    assert err.value.http_status == 500
    assert os.listdir(dest.parent) == []  # neither the file nor a temporary one


def test_multipart_uploads_round_trip(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = s3_server.new_store(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    data = os.urandom(12 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    parts = _calls(store, "UploadPart")
    info = store.put_file("models/t/m/1/big.bin", src)
    assert (info.size, info.sha256) == (12 * MiB, _sha(data))
    assert sorted(p["PartNumber"] for p in parts) == [1, 2, 3]
    raw = s3_server.client().head_object(Bucket=store.bucket, Key=f"{store.prefix}/models/t/m/1/big.bin")
    assert raw["ETag"].strip('"').endswith("-3") and raw["Metadata"] == {"sha256": _sha(data)}
    assert s3_server.client().list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads") in (
        None,
        [],
    )
    # read back in ranged parts, each pinned to the ETag read first
    gets = _calls(store, "GetObject")
    dest = tmp_path / "back.bin"
    assert store.get_file("models/t/m/1/big.bin", dest).sha256 == _sha(data)
    assert dest.read_bytes() == data
    ranged = list(gets)
    assert len(ranged) == 3 and all(g["IfMatch"] == raw["ETag"] and g["Range"].startswith("bytes=") for g in ranged)
    assert hashlib.sha256(b"".join(store.iter_bytes("models/t/m/1/big.bin"))).hexdigest() == _sha(data)


def test_sweep_aborts_stale_multipart_uploads_under_the_prefix_only(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
) -> None:
    client = s3_server.client()
    mine = client.create_multipart_upload(Bucket=store.bucket, Key=f"{store.prefix}/models/x")["UploadId"]
    other_prefix = "t-" + secrets.token_hex(6)
    other = client.create_multipart_upload(Bucket=store.bucket, Key=f"{other_prefix}/models/x")["UploadId"]

    def open_uploads() -> set[str]:
        r = client.list_multipart_uploads(Bucket=store.bucket)
        return {u["UploadId"] for u in r.get("Uploads") or ()}

    store.sweep(max_age_seconds=3600)
    assert {mine, other} <= open_uploads()
    store.sweep(max_age_seconds=-60)  # everything counts as stale
    assert mine not in open_uploads() and other in open_uploads()
    client.abort_multipart_upload(Bucket=store.bucket, Key=f"{other_prefix}/models/x", UploadId=other)


# -- trees -----------------------------------------------------------------------------------------------


def test_a_tree_is_written_with_its_manifest_last_and_read_back_verified(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src")
    reader = s3_server.new_store(store.prefix)
    seen_before_manifest: list[tuple[list[str], str]] = []

    def before_put(params: dict[str, Any], **kwargs: Any) -> None:
        if params["Key"].endswith("/.dlcloud-manifest.json"):
            try:
                reader.tree_manifest("models/t/m/1")
                visible = "visible"
            except ObjectMissing:
                visible = "missing"
            seen_before_manifest.append((_raw_keys(s3_server, store), visible))

    store._client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    manifest = store.put_tree("models/t/m/1", src)
    # when the manifest was sent, every file was there and the tree was not yet visible
    files = ["models/t/m/1/README", "models/t/m/1/model/sub/config.json", "models/t/m/1/model/weights.bin"]
    assert seen_before_manifest == [(files, "missing")]
    assert _raw_keys(s3_server, store) == sorted([*files, "models/t/m/1/.dlcloud-manifest.json"])
    assert reader.tree_manifest("models/t/m/1") == manifest
    assert manifest.empty_dirs == ("model/empty-dir",)
    assert [i.key for i in store.list("models/t/m/1")] == files  # the manifest is not an object of the tree

    dest = tmp_path / "dest"
    assert store.get_tree("models/t/m/1", dest) == manifest
    assert scan_tree(dest) == manifest  # the files, byte for byte, and the empty directory
    assert not [p for p in dest.rglob(".part-*")]
    weights = next(e for e in manifest.entries if e.path == "model/weights.bin")
    assert b"".join(store.iter_tree_file("models/t/m/1", weights)) == (src / "model" / "weights.bin").read_bytes()

    # a re-put replaces the tree whole: none of the old files stay
    other = tmp_path / "other"
    (other / "only").mkdir(parents=True)
    (other / "only" / "file").write_text("new")
    store.put_tree("models/t/m/1", other)
    assert _raw_keys(s3_server, store) == ["models/t/m/1/.dlcloud-manifest.json", "models/t/m/1/only/file"]

    deletes = _calls(store, "DeleteObject")
    store.delete_tree("models/t/m/1")
    assert deletes[0]["Key"].endswith("models/t/m/1/.dlcloud-manifest.json")  # invisible first
    assert _raw_keys(s3_server, store) == []
    with pytest.raises(ObjectMissing):
        store.tree_manifest("models/t/m/1")
    store.delete_tree("models/t/m/1")  # a missing tree is fine


def test_a_tree_whose_file_differs_from_its_manifest_leaves_nothing(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src")
    manifest = scan_tree(src)
    # same size, other bytes: found only by the SHA-256, after the files were uploaded
    (src / "model" / "sub" / "config.json").write_text('{"a": 2}\n')
    uploads = _calls(store, "PutObject")
    with pytest.raises(ObjectDamaged, match="config.json"):
        store.put_tree("models/t/m/2", src, manifest)
    assert len(list(uploads)) == 3  # they were uploaded, then deleted again
    with pytest.raises(ObjectMissing):
        store.tree_manifest("models/t/m/2")
    assert _raw_keys(s3_server, store) == []
    # another size: refused before anything is sent
    (src / "README").write_text("longer than before")
    uploads = _calls(store, "PutObject")
    with pytest.raises(ObjectDamaged, match="README"):
        store.put_tree("models/t/m/2", src, manifest)
    assert list(uploads) == [] and _raw_keys(s3_server, store) == []


def test_a_tree_whose_manifest_upload_fails_leaves_nothing(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    from botocore.exceptions import EndpointConnectionError

    src = _tree(tmp_path / "src")

    def fail_manifest(params: dict[str, Any], **kwargs: Any) -> None:
        if params["Key"].endswith("/.dlcloud-manifest.json"):  # the server goes away at the last step
            raise EndpointConnectionError(endpoint_url=s3_server.endpoint_url)

    store._client.meta.events.register("before-parameter-build.s3.PutObject", fail_manifest)
    with pytest.raises(StorageError, match="manifest"):
        store.put_tree("models/t/m/3", src)
    with pytest.raises(ObjectMissing):
        store.tree_manifest("models/t/m/3")
    assert _raw_keys(s3_server, store) == []


def test_a_tree_file_damaged_in_the_bucket_is_detected(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src")
    manifest = store.put_tree("datasets/t/d/1", src)
    entry = next(e for e in manifest.entries if e.path == "model/sub/config.json")
    key = f"{store.prefix}/datasets/t/d/1/model/sub/config.json"
    s3_server.client().put_object(Bucket=store.bucket, Key=key, Body=b'{"a": 2}\n')  # same size
    with pytest.raises(ObjectDamaged, match="SHA-256"):
        b"".join(store.iter_tree_file("datasets/t/d/1", entry))
    dest = tmp_path / "dest"
    with pytest.raises(ObjectDamaged, match="config.json"):
        store.get_tree("datasets/t/d/1", dest)
    assert [p for p in dest.rglob("*") if p.is_file()] == []  # nothing written, not even the good files
    s3_server.client().put_object(Bucket=store.bucket, Key=key, Body=b"x" * 1000)
    with pytest.raises(ObjectDamaged, match="longer"):
        for _ in store.iter_tree_file("datasets/t/d/1", entry, chunk=16):
            pass
    s3_server.client().delete_object(Bucket=store.bucket, Key=key)
    with pytest.raises(ObjectMissing, match="config.json"):
        store.get_tree("datasets/t/d/1", tmp_path / "dest2")


def test_a_damaged_first_file_stops_the_tree_download_and_leaves_nothing(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    """Files are verified as they arrive, while the next ones download: the first bad one cancels the rest,
    and neither a good file nor a partial one is left in the destination."""
    src = tmp_path / "src"
    (src / "parts").mkdir(parents=True)
    (src / "a-first").write_bytes(b"the original")
    for i in range(24):
        (src / "parts" / f"p-{i:02d}").write_bytes(os.urandom(MiB))
    store.put_tree("datasets/t/d/1", src)
    key = f"{store.prefix}/datasets/t/d/1/a-first"
    s3_server.client().put_object(Bucket=store.bucket, Key=key, Body=b"the altered!")  # same size
    dest = tmp_path / "dest"
    with pytest.raises(ObjectDamaged, match="a-first"):
        store.get_tree("datasets/t/d/1", dest)
    assert [p for p in dest.rglob("*") if p.is_file()] == []


def test_a_manifest_naming_unsafe_paths_is_refused(store: S3ObjectStore, tmp_path: Path) -> None:
    bad = Manifest((TreeEntry("../escape", 1, "0" * 64),))
    with pytest.raises(ValueError):
        store.put_tree("models/t/m/4", tmp_path, bad)


# -- failures of the server, the network, the credentials ------------------------------------------------


def test_wrong_credentials_are_a_storage_error_that_never_shows_the_secret(
    s3_server: S3Server,  # noqa: F811
    store: S3ObjectStore,
    tmp_path: Path,
) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    store.put_file("code/t/c/f", src)
    wrong_secret = "wrong-" + secrets.token_urlsafe(24)
    for kwargs in (
        {"secret_access_key": wrong_secret},  # a known key, the wrong secret
        {"access_key_id": "nobody-" + secrets.token_hex(4), "secret_access_key": wrong_secret},
    ):
        bad = s3_server.new_store(store.prefix, max_attempts=1, **kwargs)
        calls = [
            lambda b=bad: b.put_file("code/t/c/g", src),
            lambda b=bad: b.head("code/t/c/f"),  # a 403 is not "missing"
            lambda b=bad: b.head("code/t/c/nothing"),
            lambda b=bad: b.get_file("code/t/c/f", tmp_path / "out"),
            lambda b=bad: list(b.list("code")),
            lambda b=bad: b.tree_manifest("models/t/m/1"),
            lambda b=bad: b.check(),
        ]
        for call in calls:
            with pytest.raises(StorageError) as err:
                call()
            assert err.value.code == "storage_unavailable" and err.value.http_status == 503
            assert wrong_secret not in err.value.message and wrong_secret not in str(err.value.details)
            assert s3_server.endpoint_url in err.value.message and s3_server.bucket in err.value.message
            assert "access key" in err.value.message
    assert store.head("code/t/c/g") is None and not (tmp_path / "out").exists()

    # a key that may only read: reads work, writes are refused
    reader = s3_server.new_store(
        store.prefix, access_key_id=s3_server.reader_access_key, secret_access_key=s3_server.reader_secret_key
    )
    assert reader.head("code/t/c/f") is not None and reader.head("code/t/c/nothing") is None
    with pytest.raises(StorageError, match="AccessDenied"):
        reader.put_file("code/t/c/h", src)
    with pytest.raises(StorageError, match="AccessDenied"):
        reader.delete_prefix("code")
    assert store.head("code/t/c/f") is not None


def test_a_missing_bucket_is_a_storage_error_until_ensure_bucket_creates_it(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = s3_server.new_store(bucket="dlcloud-new-" + secrets.token_hex(6), max_attempts=1)
    src = tmp_path / "f"
    src.write_bytes(b"x")
    for call in (
        lambda: store.head("code/t/c/f"),  # HEAD says only 404: the bucket is checked before "missing"
        lambda: store.get_file("code/t/c/f", tmp_path / "out"),
        lambda: list(store.list("code")),
        lambda: store.put_file("code/t/c/f", src),
    ):
        with pytest.raises(StorageError, match="does not exist"):
            call()
    store.check()  # at start: creates the bucket
    store.ensure_bucket()  # there already: fine
    assert store.head("code/t/c/f") is None
    store.put_file("code/t/c/f", src)
    assert store.head("code/t/c/f") is not None


def test_an_unreachable_endpoint_is_a_storage_error_quickly(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    src = tmp_path / "f"
    src.write_bytes(b"x")
    secret = "s3cr3t-" + secrets.token_urlsafe(16)
    store = S3ObjectStore(
        "dlcloud-nowhere",
        "p",
        endpoint_url=f"http://127.0.0.1:{closed_port}",
        region="us-east-1",
        access_key_id="k",
        secret_access_key=secret,
        connect_timeout=1,
        max_attempts=2,
    )
    for call in (
        lambda: store.put_file("code/t/c/f", src),
        lambda: store.head("code/t/c/f"),
        lambda: list(store.iter_bytes("code/t/c/f")),
        lambda: store.delete_prefix("code"),
        lambda: store.check(),
    ):
        start = time.monotonic()
        with pytest.raises(StorageError) as err:
            call()
        assert time.monotonic() - start < 20  # not botocore's 60 s connect timeout, with room for a loaded machine
        assert f"127.0.0.1:{closed_port}" in err.value.message and secret not in err.value.message


def test_a_server_that_never_answers_is_a_storage_error_after_the_read_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        store = S3ObjectStore(
            "dlcloud-silent",
            endpoint_url=f"http://127.0.0.1:{port}",
            region="us-east-1",
            access_key_id="k",
            secret_access_key="s",
            read_timeout=0.5,
            max_attempts=1,
        )
        start = time.monotonic()
        with pytest.raises(StorageError, match="timeout|timed out"):
            store.head("code/t/c/f")
        assert 0.4 < time.monotonic() - start < 20  # the read timeout, not botocore's 60 s default


def test_the_constructor_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="addressing_style"):
        S3ObjectStore("dlcloud-x", addressing_style="sideways")
    with pytest.raises(ValueError, match="5 MiB"):
        S3ObjectStore("dlcloud-x", multipart_chunksize=1024)
    with pytest.raises(ValueError, match="both"):
        S3ObjectStore("dlcloud-x", access_key_id="only-the-id")
    with pytest.raises(ValueError):
        S3ObjectStore("dlcloud-x", "../up")
    assert S3ObjectStore("dlcloud-x", "/a/b/", region="us-east-1").url == "s3://dlcloud-x/a/b"
    assert S3ObjectStore("dlcloud-x", region="us-east-1").url == "s3://dlcloud-x"


def test_boto3_is_imported_only_when_a_store_is_built() -> None:
    import subprocess
    import sys

    code = "import sys, dlcloud.storage.s3, dlcloud.storage.stores; print('boto3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
