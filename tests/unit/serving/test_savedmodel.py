"""TensorFlow SavedModels (kept in one module: importing TensorFlow costs seconds)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dlcloud.serving.errors import BadRequest
from dlcloud.serving.loaders import detect_format, load_predictor
from tests.serving_models import make_savedmodel


@pytest.fixture(scope="module")
def savedmodel(tmp_path_factory):
    return make_savedmodel(tmp_path_factory.mktemp("savedmodel") / "model", in_features=8, classes=3)


def test_savedmodel_matches_tensorflow(savedmodel):
    assert detect_format(savedmodel.path) == "savedmodel"
    predictor = load_predictor(savedmodel.path)
    predictor.load()
    assert predictor.signature.to_dict() == {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "scores", "datatype": "FP32", "shape": [-1, 3]},
        ],
    }
    got = predictor.predict(savedmodel.example)
    expected = savedmodel.reference(savedmodel.example)
    np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5)
    np.testing.assert_array_equal(got["label"], expected["label"])
    as_fp64 = predictor.predict({"x": savedmodel.example["x"].astype(np.float64)})
    np.testing.assert_allclose(as_fp64["scores"], expected["scores"], rtol=1e-5)
    with pytest.raises(BadRequest, match=r"input 'x' must have shape \[-1, 8\], got \[2, 5\]"):
        predictor.predict({"x": np.zeros((2, 5), np.float32)})
    predictor.unload()


def test_savedmodel_unknown_signature_name_lists_the_available_ones(savedmodel):
    predictor = load_predictor(savedmodel.path, signature_name="classify")
    with pytest.raises(ValueError, match=r"has no signature 'classify'; it has serving_default"):
        predictor.load()


def test_inspect_cli_keeps_stdout_pure_json_with_tensorflow(savedmodel):
    result = subprocess.run(
        [sys.executable, "-m", "dlcloud.serving.inspect", str(savedmodel.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["format"] == "savedmodel"
    assert answer["signature"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
