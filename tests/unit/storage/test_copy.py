"""Copying a data dir's store to another (storage/copy.py), here local to local: objects keep their keys and
checksums, trees their manifests, a tree registered in place only its manifest, a model version of an older data
dir (no manifest) gets one; a second run copies nothing; a damaged object stops the copy, naming its key; uploads
and what is not the store's (runs/, the database) stay behind. The real S3 target: tests/e2e/test_store_copy.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlcloud.errors import DlcloudError
from dlcloud.storage.copy import copy_store, main
from dlcloud.storage.local import MANIFEST_NAME, LocalObjectStore
from dlcloud.storage.objects import Manifest, TreeEntry, scan_tree


def _files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def source(tmp_path: Path) -> LocalObjectStore:
    src = LocalObjectStore(tmp_path / "data")
    (tmp_path / "data").mkdir()
    src.put_file("code/t1/c-1/code.tar.gz", _files(tmp_path, {"code.tar.gz": b"archive"}) / "code.tar.gz")
    src.put_file("jobs/t1/j-1/logs/attempt-1/main/output.log", _files(tmp_path, {"log": b"hello\n"}) / "log")
    src.put_file("uploads/t1/u-1.tar.gz", _files(tmp_path, {"up": b"pending"}) / "up")
    outputs = _files(tmp_path / "out", {"model.pt": b"weights", "notes/a.txt": b"a"})
    src.put_tree("jobs/t1/j-1/outputs/attempt-1", outputs)
    src.put_tree("datasets/t1/pushes/u-2", _files(tmp_path / "ds", {"train.csv": b"x,y\n1,0\n"}))
    in_place = Manifest.of([TreeEntry("part-0", 3, "a" * 64)], source="s3://ml-data/clicks")
    src.put_tree_manifest("datasets/t1/d-1/1", in_place)
    src.put_tree("models/t1/m-1/1", _files(tmp_path / "model", {"export/model.onnx": b"onnx"}))
    legacy = src.root / "models/t1/m-1/1"  # as an older data dir kept it: no manifest
    legacy.chmod(0o700)
    (legacy / MANIFEST_NAME).unlink()
    _files(src.root, {"runs/t1/j-1/attempt-1/launcher.json": b"{}", "dlcloud.db": b"db"})
    return src


def test_everything_of_the_store_is_copied_with_its_checksums(source: LocalObjectStore, tmp_path: Path) -> None:
    target = LocalObjectStore(tmp_path / "target")
    report = copy_store(source, target)
    assert (report.objects, report.trees, report.unchanged) == (2, 4, 0)
    for key in ("code/t1/c-1/code.tar.gz", "jobs/t1/j-1/logs/attempt-1/main/output.log"):
        copied, original = target.head(key), source.head(key)
        assert copied is not None and original is not None and original.sha256 is not None
        assert (copied.size, copied.sha256) == (original.size, original.sha256)
    for prefix in ("jobs/t1/j-1/outputs/attempt-1", "datasets/t1/pushes/u-2", "models/t1/m-1/1"):
        got = target.get_tree(prefix, tmp_path / "got" / prefix)
        assert got == source.tree_manifest(prefix) == scan_tree(tmp_path / "got" / prefix)
    assert target.tree_manifest("datasets/t1/d-1/1").source == "s3://ml-data/clicks"
    tops = sorted(n for n in os.listdir(target.root) if not n.startswith(".dlcloud-"))  # not the store's own
    assert tops == ["code", "datasets", "jobs", "models"]  # no uploads, no runs/, no database
    again = copy_store(source, target)
    assert (again.objects, again.trees, again.unchanged) == (0, 0, 6)


def test_a_damaged_object_stops_the_copy_naming_its_key(source: LocalObjectStore, tmp_path: Path) -> None:
    log = source.root / "jobs/t1/j-1/logs/attempt-1/main/output.log"
    log.chmod(0o600)
    log.write_bytes(b"changed on disk\n")
    with pytest.raises(DlcloudError, match="jobs/t1/j-1/logs/attempt-1/main/output.log"):
        copy_store(source, LocalObjectStore(tmp_path / "target"))


def test_the_command_copies_and_refuses_the_data_dir_itself(
    source: LocalObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data-dir", str(source.root), "--to", (tmp_path / "target").as_uri()]) == 0
    assert "copied 2 objects and 4 trees" in capsys.readouterr().out
    assert main(["--data-dir", str(source.root), "--to", source.root.as_uri()]) == 1
    assert "is the data dir itself" in capsys.readouterr().err
