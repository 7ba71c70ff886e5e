"""inspect_signature and ``python -m dlcloud.serving.inspect``: one JSON object on stdout, exit 0 or 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlcloud.serving.inspect import inspect_signature
from tests.serving_models import make_onnx_mlp, make_torchscript_mlp, make_xgboost_model, mlp_signature


def run_inspect(*args):
    result = subprocess.run(
        [sys.executable, "-m", "dlcloud.serving.inspect", *map(str, args)], capture_output=True, text=True, timeout=120
    )
    return result.returncode, json.loads(result.stdout), result.stderr


def test_inspect_signature_in_process(tmp_path):
    onnx = make_onnx_mlp(tmp_path / "onnx", in_features=10, out=2)
    assert inspect_signature(onnx.path, "onnx").to_dict() == mlp_signature(10, 2)
    torchscript = make_torchscript_mlp(tmp_path / "ts")
    assert inspect_signature(torchscript.path) is None  # detected, loaded, cannot describe itself


def test_inspect_cli_prints_the_signature(tmp_path):
    onnx = make_onnx_mlp(tmp_path / "onnx", in_features=10, out=2)
    code, answer, _ = run_inspect("--format", "onnx", onnx.path)
    assert code == 0
    assert answer == {"format": "onnx", "signature": mlp_signature(10, 2)}

    xgb = make_xgboost_model(tmp_path / "xgb", "multi:softprob", n_features=6)
    code, answer, _ = run_inspect(xgb.path)  # format detected
    assert code == 0
    assert answer["format"] == "xgboost"
    assert answer["signature"]["outputs"] == [{"name": "predictions", "datatype": "FP32", "shape": [-1, 3]}]

    torchscript = make_torchscript_mlp(tmp_path / "ts")
    assert run_inspect("--format", "torchscript", torchscript.path)[:2] == (
        0,
        {"format": "torchscript", "signature": None},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "onnx", "missing.onnx"), "does not exist"),
        (("--format", "keras", "m.h5"), "invalid choice: 'keras'"),
        (("notes.txt",), "cannot tell the model format"),
        (("--format", "onnx", "notes.txt"), ""),  # onnxruntime's own complaint about a non-model file
    ],
    ids=["missing", "unknown-format", "undetectable", "corrupt"],
)
def test_inspect_cli_failures_answer_json_with_exit_2(tmp_path, args, message):
    (tmp_path / "notes.txt").write_text("not a model")
    args = tuple(str(tmp_path / a) if a.endswith((".onnx", ".h5", ".txt")) else a for a in args)
    code, answer, _ = run_inspect(*args)
    assert code == 2
    assert set(answer) == {"error"} and answer["error"]
    assert message in answer["error"]
