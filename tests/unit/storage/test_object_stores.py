"""The ObjectStore contract, on both backends: the local directory and a real S3 server (SeaweedFS).

Objects and trees round-trip byte for byte with their checksums; a caller's wrong checksum stores nothing;
damaged objects are detected on read; a tree is invisible until complete; deletes are complete. Local-only
behaviour (the layout of older data dirs, modes) is at the end.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.checksums import artifact_digest
from dlcloud.errors import DlcloudError
from dlcloud.storage.local import LocalObjectStore
from dlcloud.storage.objects import (
    Manifest,
    ObjectDamaged,
    ObjectMissing,
    ObjectStore,
    TreeEntry,
    check_key,
    check_rel_path,
    file_sha256,
    scan_tree,
)
from tests.conftest import python_for_nobody


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "store")
        return
    from tests.s3server import s3_server_or_skip

    server = s3_server_or_skip(request)
    yield server.new_store()


def _damage(store: ObjectStore, key: str, data: bytes) -> None:
    """Overwrite a stored object behind the store's back, keeping its recorded checksum."""
    if isinstance(store, LocalObjectStore):
        path = store.root / key
        path.chmod(0o644)
        path.write_bytes(data)
        return
    store._client.put_object(  # type: ignore[attr-defined]
        Bucket=store.bucket,  # type: ignore[attr-defined]
        Key=store._full(key),  # type: ignore[attr-defined]
        Body=data,
        Metadata={"sha256": file_sha256_bytes(b"the original")},
    )


def file_sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _tree(root: Path) -> Path:
    (root / "model" / "sub").mkdir(parents=True)
    (root / "model" / "weights.bin").write_bytes(os.urandom(300_000))
    (root / "model" / "sub" / "config.json").write_text('{"a": 1}\n')
    (root / "model" / "sub" / ".hidden").write_text("h")
    (root / "model" / "empty.txt").write_bytes(b"")
    return root


def test_keys_and_tree_paths_are_checked() -> None:
    for good in ("code/t-1/c-2/code.tar.gz", "models/t/m/1", "a"):
        assert check_key(good) == good
    for bad in ("", "/abs", "a//b", "a/../b", "./a", "a/.hidden", "a/b/", "a\\b", "a b"):
        with pytest.raises(ValueError):
            check_key(bad)
    for good in ("a", "sub/.hidden", "dir/file name (1).txt", "ü/ß"):
        assert check_rel_path(good) == good
    for bad in ("", "/abs", "a/../b", "a//b", "a\\b", "a\0b", ".dlcloud-manifest.json", "x/.dlcloud-tmp-1"):
        with pytest.raises(ValueError):
            check_rel_path(bad)


def test_objects_round_trip_with_their_checksum(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(100_000))
    sha = file_sha256(src)
    info = store.put_file("code/t-1/c-1/code.tar.gz", src, sha256=sha)
    assert (info.size, info.sha256) == (100_000, sha)
    head = store.head("code/t-1/c-1/code.tar.gz")
    assert head is not None and (head.size, head.sha256) == (100_000, sha)
    dest = tmp_path / "out" / "back.bin"
    dest.parent.mkdir()
    assert store.get_file("code/t-1/c-1/code.tar.gz", dest).sha256 == sha
    assert dest.read_bytes() == src.read_bytes()
    assert b"".join(store.iter_bytes("code/t-1/c-1/code.tar.gz", chunk=7_000)) == src.read_bytes()
    assert store.head("code/t-1/c-1/other") is None
    with pytest.raises(ObjectMissing):
        store.get_file("code/t-1/c-1/other", tmp_path / "x")
    with pytest.raises(ObjectMissing):
        list(store.iter_bytes("code/t-1/missing"))


def test_a_wrong_declared_checksum_stores_nothing(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    with pytest.raises(DlcloudError) as err:
        store.put_file("code/t/c/f", src, sha256="0" * 64)
    assert err.value.code == "checksum_mismatch" and err.value.http_status == 400
    assert store.head("code/t/c/f") is None
    assert list(store.list("code")) == []


def test_a_damaged_object_is_detected_and_not_left_behind(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"the original")
    store.put_file("code/t/c/f", src)
    _damage(store, "code/t/c/f", b"the altered!")
    dest = tmp_path / "dest.bin"
    with pytest.raises(ObjectDamaged) as err:
        store.get_file("code/t/c/f", dest)
    assert err.value.http_status == 500 and "damaged or altered" in err.value.message
    assert not dest.exists()
    # a caller's own expectation is checked as well
    store.put_file("code/t/c/g", src)
    with pytest.raises(ObjectDamaged):
        store.get_file("code/t/c/g", dest, sha256=file_sha256_bytes(b"something else"))


def test_list_delete_and_delete_prefix(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    keys = ["code/t-1/a/f", "code/t-1/b/f", "code/t-2/a/f", "models/t-1/m/1/x"]
    for key in keys:
        store.put_file(key, src)
    assert [i.key for i in store.list("code")] == keys[:3]
    assert [i.key for i in store.list("code/t-1")] == keys[:2]
    assert list(store.list("code/t-")) == []  # a prefix is whole segments
    store.delete("code/t-1/a/f")
    store.delete("code/t-1/a/f")  # idempotent
    assert [i.key for i in store.list("code/t-1")] == ["code/t-1/b/f"]
    assert store.delete_prefix("code") == 2
    assert list(store.list("code")) == []
    assert [i.key for i in store.list("models")] == ["models/t-1/m/1/x"]


def test_trees_round_trip_with_the_artifact_checksum(store: ObjectStore, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    manifest = store.put_tree("models/t/m/1", src)
    assert [e.path for e in manifest.entries] == [
        "model/empty.txt",
        "model/sub/.hidden",
        "model/sub/config.json",
        "model/weights.bin",
    ]
    # the manifest's checksum is the registry's artifact checksum of the same files
    assert manifest.artifact_sha256() == artifact_digest(src / "model").sha256
    assert store.tree_manifest("models/t/m/1") == manifest
    dest = tmp_path / "dest"
    assert store.get_tree("models/t/m/1", dest) == manifest
    assert artifact_digest(dest / "model").sha256 == manifest.artifact_sha256()
    weights = next(e for e in manifest.entries if e.path == "model/weights.bin")
    data = b"".join(store.iter_tree_file("models/t/m/1", weights, chunk=50_000))
    assert data == (src / "model" / "weights.bin").read_bytes()
    # the manifest is the store's own: not an object of the tree
    assert ".dlcloud" not in " ".join(i.key for i in store.list("models/t/m/1"))
    store.delete_tree("models/t/m/1")
    with pytest.raises(ObjectMissing):
        store.tree_manifest("models/t/m/1")
    assert list(store.list("models")) == []
    store.delete_tree("models/t/m/1")  # idempotent


def test_a_tree_is_invisible_until_it_is_complete(store: ObjectStore, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    manifest = scan_tree(src)
    # the files change between the manifest and the upload: the put fails and leaves nothing visible
    (src / "model" / "weights.bin").write_bytes(b"changed")
    with pytest.raises(ObjectDamaged):
        store.put_tree("models/t/m/2", src, manifest)
    with pytest.raises(ObjectMissing):
        store.tree_manifest("models/t/m/2")
    assert list(store.list("models")) == []


def test_a_damaged_tree_file_is_detected_on_read(store: ObjectStore, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    manifest = store.put_tree("datasets/t/d/1", src)
    _damage(store, "datasets/t/d/1/model/sub/config.json", b'{"a": 2}\n')
    entry = next(e for e in manifest.entries if e.path == "model/sub/config.json")
    with pytest.raises(ObjectDamaged):
        b"".join(store.iter_tree_file("datasets/t/d/1", entry))
    with pytest.raises(ObjectDamaged):
        store.get_tree("datasets/t/d/1", tmp_path / "dest")
    # a longer file is cut off at the first chunk past its size
    _damage(store, "datasets/t/d/1/model/sub/config.json", b"x" * 100)
    with pytest.raises(ObjectDamaged, match="longer"):
        for _ in store.iter_tree_file("datasets/t/d/1", entry, chunk=16):
            pass


def test_manifests_refuse_reserved_and_unsafe_paths() -> None:
    good = Manifest.of([TreeEntry("b", 1, "0" * 64), TreeEntry("a/c", 2, "1" * 64)])
    assert [e.path for e in Manifest.from_json(good.to_json()).entries] == ["a/c", "b"]
    for bad in (
        '{"format": "other", "files": []}',
        '{"format": "dlcloud-tree-manifest-v1", "files": [["../x", 1, "0"]]}',
    ):
        with pytest.raises(ValueError):
            Manifest.from_json(bad.encode())


# -- the local backend only ------------------------------------------------------------------------------


def test_local_layout_is_the_data_dir_layout_read_only_and_private(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "data")
    src = tmp_path / "f"
    src.write_bytes(b"x")
    store.put_file("code/t-1/c-1/code.tar.gz", src)
    path = tmp_path / "data" / "code" / "t-1" / "c-1" / "code.tar.gz"
    assert path.read_bytes() == b"x" and store.local_path("code/t-1/c-1/code.tar.gz") == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert stat.S_IMODE((tmp_path / "data" / "code" / "t-1").stat().st_mode) == 0o700
    store.put_tree("models/t-1/m-1/1", _tree(tmp_path / "src"))
    tree = tmp_path / "data" / "models" / "t-1" / "m-1" / "1"
    assert (tree / "model" / "weights.bin").is_file() and store.tree_local_path("models/t-1/m-1/1") == tree
    assert stat.S_IMODE((tree / "model").stat().st_mode) == 0o555
    assert stat.S_IMODE((tree / "model" / "weights.bin").stat().st_mode) == 0o444
    assert not any((tmp_path / "data" / ".dlcloud-staging").iterdir())


def test_local_tree_of_an_older_data_dir_gets_its_manifest_from_its_files(tmp_path: Path) -> None:
    """Model versions stored before manifests existed: a read-only directory holding the artifact only."""
    store = LocalObjectStore(tmp_path / "data")
    old = tmp_path / "data" / "models" / "t" / "m" / "3"
    _tree(old)
    os.chmod(old, 0o555)
    manifest = store.tree_manifest("models/t/m/3")
    assert manifest.artifact_sha256() == artifact_digest(old / "model").sha256
    assert (old / ".dlcloud-manifest.json").is_file() and stat.S_IMODE(old.stat().st_mode) == 0o555
    assert store.tree_manifest("models/t/m/3") == manifest  # read back, not recomputed
    with pytest.raises(ObjectMissing):
        store.tree_manifest("models/t/m/4")


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to an unprivileged uid (CI runs as root)")
def test_local_trees_are_stored_by_an_unprivileged_server(tmp_path: Path) -> None:
    """Moving a read-only directory to another parent is refused to anyone but root: a server run as an
    ordinary user must still store trees (and the cache install them)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="dlcloud-unprivileged-"))  # pytest's tmp_path is root's alone
    root.chmod(0o755)
    os.chown(root, 65534, 65534)
    request_cleanup = root
    script = (
        "import sys; from pathlib import Path\n"
        "from dlcloud.storage.local import LocalObjectStore\n"
        "root = Path(sys.argv[1]); src = root / 'src' / 'model'; src.mkdir(parents=True)\n"
        "(src / 'w.bin').write_bytes(b'x')\n"
        "store = LocalObjectStore(root / 'data')\n"
        "store.put_tree('models/t/m/1', root / 'src')\n"
        "print(sorted(p.name for p in (root / 'data' / 'models' / 't' / 'm' / '1').iterdir()))\n"
    )

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    try:
        res = subprocess.run(
            [*drop, python_for_nobody(), "-c", script, str(root)], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(request_cleanup)], check=False)
        shutil.rmtree(request_cleanup, ignore_errors=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['.dlcloud-manifest.json', 'model']"
