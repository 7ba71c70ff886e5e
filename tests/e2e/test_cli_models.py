"""The model registry with the real server and CLI: register a file, list, label, describe, download, delete."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import DLCLOUD, Server

pytestmark = pytest.mark.e2e

SIGNATURE = """\
inputs:
  - {name: pixels, datatype: FP32, shape: [-1, 784]}
outputs:
  - {name: logits, datatype: FP32, shape: [-1, 10]}
"""


def test_register_list_label_download_delete(server: Server, tmp_path: Path):
    model = tmp_path / "mnist.onnx"
    model.write_bytes(b"\x08\x07 not really onnx " * 500)
    signature = tmp_path / "signature.yaml"
    signature.write_text(SIGNATURE)

    res = server.cli(
        "models", "register", "mnist", "--file", str(model), "--signature", str(signature), "--metric", "acc=0.97"
    )
    assert "model mnist version 1 registered (onnx" in res.stderr
    # the format comes from the file name; the bytes are no real ONNX model, so no signature is inferred
    v2 = server.cli_json("models", "register", "mnist", "--file", str(model), "--description", "retrained")
    assert (v2["version"], v2["format"], v2["signature"], v2["executes_code"]) == (2, "onnx", None, False)

    listed = server.cli_json("models", "list")
    assert [(m["name"], m["latest_version"], m["version_count"]) for m in listed] == [("mnist", 2, 2)]
    assert "mnist" in server.cli("models", "list").stdout

    assert "production -> version 1" in server.cli("models", "label", "mnist", "production", "1").stderr
    described = server.cli_json("models", "describe", "mnist")
    assert described["labels"] == {"production": 1}
    assert described["versions"][0]["metrics"] == {"acc": 0.97}
    text = server.cli("models", "describe", "mnist").stdout
    assert "production -> 1" in text and "signature: not declared for version(s) 2" in text
    assert "pixels FP32 [-1, 784]" in server.cli("models", "describe", "mnist", "--version", "production").stdout
    assert "not declared" in server.cli("models", "describe", "mnist", "--version", "2").stdout
    table = server.cli("models", "versions", "mnist").stdout
    assert "CODE" in table.splitlines()[0] or "CODE" in table
    predictor = tmp_path / "export"
    predictor.mkdir()
    (predictor / "predictor.py").write_text("class P:\n    def load(self): ...\n    def predict(self, b): return b\n")
    code = server.cli("models", "register", "scorer", "--file", str(predictor))
    assert "format python runs its author's code when loaded" in code.stderr and "--trust-code" in code.stderr
    assert "Executes code" in server.cli("models", "describe", "scorer", "--version", "1").stdout
    assert server.cli_json("models", "versions", "scorer")[0]["executes_code"] is True
    server.cli("models", "delete", "scorer", "--yes")
    versions = server.cli_json("models", "versions", "mnist")
    assert [(v["version"], v["labels"]) for v in versions] == [(1, ["production"]), (2, [])]

    dest = tmp_path / "downloaded"
    res = server.cli("models", "download", "mnist", "production", "--dest", str(dest))
    assert res.stdout.strip() == str(dest / "mnist.onnx")
    assert "checksum verified" in res.stderr
    assert (dest / "mnist.onnx").read_bytes() == model.read_bytes()

    # errors: a clear message on stderr, exit code 1, no traceback
    unknown = tmp_path / "weights.bin"
    unknown.write_bytes(b"x")
    for args, message in (
        (["models", "register", "mnist", "--file", str(unknown)], "error (unknown_format): cannot recognise"),
        (["models", "register", "mnist", "--file", str(model), "--format", "pickle"], "format must be one of"),
        (["models", "describe", "ghost"], "error (model_not_found): model 'ghost' not found"),
        (["models", "label", "mnist", "production", "9"], "error (model_version_not_found)"),
    ):
        bad = server.cli(*args, check=False)
        assert bad.returncode == 1, bad
        assert message in bad.stderr and "Traceback" not in bad.stderr

    # delete asks first; without a yes nothing happens
    refused = subprocess.run(
        [DLCLOUD, "models", "delete", "mnist"], env=server.env, input="n\n", capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "Delete model mnist and all its versions?" in refused.stderr
    assert server.cli_json("models", "list")[0]["version_count"] == 2
    server.cli("models", "delete", "mnist", "--version", "2", "--yes")
    assert [v["version"] for v in server.cli_json("models", "versions", "mnist")] == [1]
    server.cli("models", "delete", "mnist", "--yes")
    assert server.cli_json("models", "list") == []
    assert not [p for p in (server.data_dir / "models").rglob("*") if p.is_file()]
    audit = server.cli_json("audit")
    assert {"models.register", "models.set_label", "models.delete_version", "models.delete"} <= {
        e["action"] for e in audit
    }
