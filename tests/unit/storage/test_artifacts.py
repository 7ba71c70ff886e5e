"""The artifact checksum and store: the checksum ignores times and modes but not names or bytes; staging,
committing and streaming keep an artifact exact, read-only, and refuse links and oversized trees."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from dlcloud import tarsafe
from dlcloud.checksums import artifact_digest, verify
from dlcloud.errors import InvalidArchive, InvalidArgument, PayloadTooLarge
from dlcloud.storage.archives import ArchiveLimits
from dlcloud.storage.artifacts import ArtifactStore, iter_tar_gz
from dlcloud.storage.local import LocalObjectStore


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 1000)
    (root / "sub" / "b.txt").write_text("b\n")
    (root / ".hidden").write_text("h")
    (root / "empty-dir").mkdir()
    return root


def _store(tmp_path: Path, max_bytes: int = 1 << 20, max_members: int = 100) -> ArtifactStore:
    return ArtifactStore(tmp_path / "models", ArchiveLimits(max_bytes, max_members))


def test_checksum_ignores_times_and_modes_but_not_bytes_or_names(tmp_path):
    tree = _tree(tmp_path / "one" / "model")
    digest = artifact_digest(tree)
    assert (digest.size, digest.files) == (1000 + 2 + 1, 3)
    os.utime(tree / "a.bin", (0, 0))
    (tree / "sub" / "b.txt").chmod(0o400)
    assert artifact_digest(tree).sha256 == digest.sha256
    copy = _tree(tmp_path / "two" / "model")  # the same tree elsewhere
    assert artifact_digest(copy).sha256 == digest.sha256
    renamed = _tree(tmp_path / "three" / "other-name")
    assert artifact_digest(renamed).sha256 != digest.sha256
    (copy / "a.bin").write_bytes(b"a" * 999 + b"b")
    assert not verify(copy, digest.sha256)
    assert verify(tree, digest.sha256)
    assert not verify(tmp_path / "missing", digest.sha256)
    single = tmp_path / "model.onnx"
    single.write_bytes(b"x")
    assert artifact_digest(single).files == 1


def test_a_link_inside_an_artifact_fails_the_checksum(tmp_path):
    tree = _tree(tmp_path / "model")
    os.symlink("/etc/passwd", tree / "sub" / "link")
    with pytest.raises(ValueError, match="model/sub/link is a link or special file"):
        artifact_digest(tree)
    assert not verify(tree, "0" * 64)


def test_streamed_tar_gz_round_trips_exactly(tmp_path):
    tree = _tree(tmp_path / "src" / "model")
    (tree / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    data = b"".join(iter_tar_gz(tree, chunk=64 * 1024))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        names = tf.getnames()
        tarsafe.extractall(tf, tmp_path / "out")
    assert names[0] == "model" and "model/empty-dir" in names
    assert artifact_digest(tmp_path / "out" / "model").sha256 == artifact_digest(tree).sha256
    assert (tmp_path / "out" / "model" / "empty-dir").is_dir()


def test_stage_store_as_a_tree_and_discard(tmp_path):
    store = _store(tmp_path)
    tree = _tree(tmp_path / "src" / "model")
    staged = store.stage_copy(tree, "model", "model")
    assert staged.digest.sha256 == artifact_digest(tree).sha256
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    objects = LocalObjectStore(tmp_path / "data")
    manifest = objects.put_tree("models/t-1/m-1/1", staged.dir)
    assert manifest.artifact_sha256() == staged.digest.sha256 and manifest.empty_dirs == ("model/empty-dir",)
    store.discard(staged)
    assert not staged.dir.exists() and list((store.root / ".staging").iterdir()) == []
    stored = objects.tree_local_path("models/t-1/m-1/1")
    assert stored is not None and verify(stored / "model", staged.digest.sha256)
    assert (stored / "model" / "empty-dir").is_dir()


def test_stage_copy_refuses_links_specials_and_limits(tmp_path):
    tree = _tree(tmp_path / "src" / "model")
    os.symlink(tree / "a.bin", tree / "sub" / "alias")
    store = _store(tmp_path)
    with pytest.raises(InvalidArgument, match="model/sub/alias is a symbolic link"):
        store.stage_copy(tree, "model", "model")
    os.unlink(tree / "sub" / "alias")
    with pytest.raises(PayloadTooLarge, match="more than 500 bytes"):
        _store(tmp_path, max_bytes=500).stage_copy(tree, "model", "model")
    with pytest.raises(InvalidArgument, match="more than 3 entries"):
        _store(tmp_path, max_members=3).stage_copy(tree, "model", "model")
    with pytest.raises(InvalidArgument, match="artifact name '.model' is not allowed"):
        store.stage_copy(tree, ".model", "model")
    assert list((store.root / ".staging").iterdir()) == []  # every failure cleaned up after itself


def test_stage_archive_needs_one_top_level_entry(tmp_path):
    store = _store(tmp_path)
    archive = tmp_path / "two.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name in ("a.onnx", "b.onnx"):
            info = tarfile.TarInfo(name)
            tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(InvalidArchive, match="exactly one top-level file or directory.*found 2: a.onnx, b.onnx"):
        store.stage_archive(archive)
    assert not (store.root / ".staging").exists() or list((store.root / ".staging").iterdir()) == []
