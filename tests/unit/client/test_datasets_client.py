"""Client-side helpers of datasets: packing a directory's contents or a file, the tree checksum the download
verifies, refused sources, OWNER/NAME names."""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

import pytest

from dlcloud.checksums import artifact_digest
from dlcloud.client.datasets import check_local_source, pack_data, split_name, tree_checksum
from dlcloud.errors import AlreadyExists, DlcloudError, InvalidArgument, PermissionDenied
from dlcloud.storage.objects import scan_tree


def _names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tf:
        return sorted(tf.getnames())


def test_a_directory_is_packed_by_its_contents_with_hidden_files_and_empty_dirs(tmp_path):
    root = tmp_path / "clicks"
    (root / "train" / "deep").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / ".hidden").write_text("kept")
    (root / ".gitignore").write_text("*\n")  # ignore files do not apply to data
    (root / "train" / "deep" / "x.bin").write_bytes(b"12345")
    (root / "zero").write_bytes(b"")
    packed = pack_data(root)
    try:
        assert _names(packed.archive) == [
            ".gitignore",
            ".hidden",
            "empty-dir",
            "train",
            "train/deep",
            "train/deep/x.bin",
            "zero",
        ]
        assert (packed.files, packed.bytes) == (4, 4 + 2 + 5 + 0)
    finally:
        packed.archive.unlink()


def test_a_file_is_packed_under_its_own_name(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_text("a\nb\n")
    packed = pack_data(str(f))
    try:
        assert _names(packed.archive) == ["vocab.txt"]
        assert (packed.files, packed.bytes) == (1, 4)
    finally:
        packed.archive.unlink()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "holds no file"),
        (lambda d: (d / "l").symlink_to("/etc/hostname"), "l is a link"),
        (lambda d: os.mkfifo(d / "fifo"), "fifo is a device, FIFO or socket"),
        (lambda d: (d / ".dlcloud-x").write_text(""), "are reserved"),
    ],
)
def test_refused_directories_leave_no_archive(tmp_path, monkeypatch, make, message):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where pack_data's archive goes
    root = tmp_path / "data"
    root.mkdir()
    make(root)
    with pytest.raises(InvalidArgument, match=message):
        pack_data(root)
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("s3://bucket/clicks", "is registered in place, not packed"),
        ("https://example.com/x.tar", "is not a local path"),
    ],
)
def test_urls_are_refused(source, message):
    with pytest.raises(InvalidArgument, match=message):
        check_local_source(source)
    with pytest.raises(InvalidArgument, match=message):
        pack_data(source)


def test_a_missing_source_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="does not exist"):
        pack_data(tmp_path / "nope")


def test_tree_checksum_is_the_servers_and_a_single_files_artifact_checksum(tmp_path):
    root = tmp_path / "t"
    (root / "b" / "c").mkdir(parents=True)
    (root / "b" / "c" / "x").write_bytes(b"x" * 1000)
    (root / "a-b").write_bytes(b"")
    (root / "a").write_text("a")
    assert tree_checksum(root) == scan_tree(root).artifact_sha256()
    single = tmp_path / "one"
    single.mkdir()
    (single / "vocab.txt").write_text("v")
    assert tree_checksum(single) == artifact_digest(single / "vocab.txt").sha256
    (root / "a").write_text("b")
    assert tree_checksum(root) != tree_checksum(single)
    assert tree_checksum(root) == scan_tree(root).artifact_sha256()


def test_owner_slash_name():
    assert split_name("clicks") == ("clicks", {})
    assert split_name("acme/clicks") == ("clicks", {"owner": "acme"})
    for bad in ("/clicks", "acme/", "a/b/c"):
        with pytest.raises(InvalidArgument, match="NAME or OWNER_TENANT/NAME"):
            split_name(bad)


# -- the SDK against the in-process API ------------------------------------------------------------------


def _data(root: Path) -> Path:
    (root / "train" / "deep").mkdir(parents=True)
    (root / "train" / "deep" / "x.bin").write_bytes(os.urandom(50_000))
    (root / ".hidden").write_text("h")
    (root / "empty").write_bytes(b"")
    return root


def _uploads(env) -> list[str]:
    return [o.key for o in env.platform.objects.list("uploads")]


def test_push_a_directory_and_download_it_back(env, tmp_path):
    src = _data(tmp_path / "src")
    sent: list[int] = []
    v = env.admin.datasets.push("clicks", path=src, description="d", progress=sent.append)
    assert (v.dataset, v.version, v.file_count, v.description) == ("clicks", 1, 3, "d")
    assert v.sha256 == tree_checksum(src) and sum(sent) > 0 and _uploads(env) == []
    dest = tmp_path / "a" / "b" / "out"
    assert env.admin.datasets.download("clicks", "latest", dest) == dest
    assert tree_checksum(dest) == v.sha256 and (dest / ".hidden").read_text() == "h"
    assert [p.name for p in dest.parent.iterdir()] == ["out"]  # no work directory left beside it


def test_a_failed_push_deletes_its_upload(env, tmp_path):
    src = _data(tmp_path / "src")
    with pytest.raises(InvalidArgument, match="shape of an id"):
        env.admin.datasets.push("ds-0123456789abcdef", path=src)
    assert _uploads(env) == []
    packed = pack_data(src)
    try:
        up = env.admin.datasets.upload(packed.archive)
    finally:
        packed.archive.unlink()
    assert len(_uploads(env)) == 1
    with pytest.raises(InvalidArgument):
        env.admin.datasets.push("ds-0123456789abcdef", upload=up.id)
    assert _uploads(env) == []
    with pytest.raises(InvalidArgument, match="exactly one of path, upload or source"):
        env.admin.datasets.push("clicks")


def test_download_refuses_a_used_destination_and_leaves_nothing_on_a_bad_checksum(env, tmp_path):
    v = env.admin.datasets.push("clicks", path=_data(tmp_path / "src"))
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep").write_text("k")
    with pytest.raises(AlreadyExists, match="not empty"):
        env.admin.datasets.download("clicks", 1, used)
    assert [p.name for p in used.iterdir()] == ["keep"]
    (tmp_path / "file").write_text("f")
    with pytest.raises(AlreadyExists, match="not a directory"):
        env.admin.datasets.download("clicks", 1, tmp_path / "file")

    [stored] = (env.settings.data_dir / "datasets").rglob("x.bin")
    stored.chmod(0o644)
    stored.write_bytes(b"y" * stored.stat().st_size)  # damaged in the store, same size
    fresh = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(DlcloudError, match="does not match its checksum") as info:
        env.admin.datasets.download("clicks", v.version, fresh)
    assert info.value.code == "checksum_mismatch"
    assert not (tmp_path / "new").exists()  # the directories made for it are gone again
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DlcloudError, match="does not match its checksum"):
        env.admin.datasets.download("clicks", 1, empty)
    assert list(empty.iterdir()) == []


def test_shared_datasets_are_read_as_owner_slash_name(env, tmp_path):
    alice = env.new_tenant_user("acme", "alice")
    bob = env.new_tenant_user("beta", "bob")
    alice.datasets.push("clicks", path=_data(tmp_path / "src"))
    with pytest.raises(DlcloudError) as info:
        bob.datasets.get("acme/clicks")
    assert info.value.code == "dataset_not_found"
    alice.datasets.share("clicks", "beta")
    assert [d.name for d in bob.datasets.list()] == ["acme/clicks"]
    assert bob.datasets.version("acme/clicks").dataset == "acme/clicks"
    assert len(bob.datasets.files("acme/clicks", 1)) == 3
    bob.datasets.download("acme/clicks", "latest", tmp_path / "b")
    with pytest.raises(PermissionDenied):
        bob.datasets.delete("acme/clicks")
