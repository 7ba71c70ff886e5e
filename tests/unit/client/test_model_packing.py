"""Client-side helpers of the model registry: format recognition, packing, OWNER/NAME names."""

from __future__ import annotations

import os
import tarfile

import pytest

from dlcloud import tarsafe
from dlcloud.checksums import artifact_digest
from dlcloud.client.models import infer_format, pack_artifact, split_name
from dlcloud.errors import InvalidArgument


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("model.pt", "torchscript"),
        ("model.PTH", "torchscript"),
        ("m.torchscript", "torchscript"),
        ("m.onnx", "onnx"),
        ("clf.joblib", "sklearn"),
        ("clf.pkl", "sklearn"),
        ("booster.json", "xgboost"),
        ("booster.ubj", "xgboost"),
        ("weights.bin", None),
        ("noext", None),
    ],
)
def test_format_from_the_file_name(tmp_path, name, fmt):
    (tmp_path / name).write_bytes(b"x")
    assert infer_format(tmp_path / name) == fmt
    assert infer_format(f"out/{name}", local=False) == fmt


def test_format_of_a_directory_from_what_it_holds(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    python = tmp_path / "custom"
    python.mkdir()
    (python / "predictor.py").write_text("")
    assert infer_format(saved) == "savedmodel"
    assert infer_format(python) == "python"
    assert infer_format(tmp_path / "nothing-here.onnx") == "onnx"  # a name alone still counts
    (tmp_path / "plain").mkdir()
    assert infer_format(tmp_path / "plain") is None


def test_pack_keeps_everything_under_the_artifact_name(tmp_path):
    root = tmp_path / "export"
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").write_text("kept")
    (root / ".gitignore").write_text("*\n")  # ignore files do not apply to models
    (root / "sub" / "w.bin").write_bytes(b"w")
    archive = pack_artifact(root)
    try:
        with tarfile.open(archive) as tf:
            assert sorted(tf.getnames()) == [
                "export",
                "export/.gitignore",
                "export/.hidden",
                "export/sub",
                "export/sub/w.bin",
            ]
            tarsafe.extractall(tf, tmp_path / "out")
    finally:
        archive.unlink()
    assert artifact_digest(tmp_path / "out" / "export").sha256 == artifact_digest(root).sha256
    single = tmp_path / "model.onnx"
    single.write_bytes(b"m")
    archive = pack_artifact(single)
    with tarfile.open(archive) as tf:
        assert tf.getnames() == ["model.onnx"]
    archive.unlink()


def test_pack_refuses_links_instead_of_skipping_them(tmp_path):
    root = tmp_path / "export"
    root.mkdir()
    (root / "real.bin").write_bytes(b"r")
    os.symlink(root / "real.bin", root / "alias.bin")
    with pytest.raises(InvalidArgument, match="export/alias.bin is a link"):
        pack_artifact(root)
    with pytest.raises(InvalidArgument, match="does not exist"):
        pack_artifact(tmp_path / "missing")


def test_owner_names():
    assert split_name("mnist") == ("mnist", {})
    assert split_name("acme/mnist") == ("mnist", {"owner": "acme"})
    for bad in ("/mnist", "acme/", "a/b/c"):
        with pytest.raises(InvalidArgument, match="NAME or OWNER_TENANT/NAME"):
            split_name(bad)
