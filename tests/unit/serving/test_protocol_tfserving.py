"""TF Serving REST codec: row and columnar predict, b64, NaN literals, results, status, metadata, URLs."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from dlcloud.serving.errors import BadRequest, ServingError
from dlcloud.serving.protocol import tfserving
from dlcloud.serving.types import Signature, TensorSpec

ONE = Signature(inputs=(TensorSpec("x", "FP32", (-1, 3)),), outputs=(TensorSpec("y", "FP32", (-1,)),))
SEVERAL = Signature(
    inputs=(
        TensorSpec("tag", "BYTES", (-1,)),
        TensorSpec("signal", "INT32", (-1, 5)),
        TensorSpec("sensor", "FP64", (-1, 2, 2)),
    )
)
TEXT = Signature(inputs=(TensorSpec("text", "BYTES", (-1,)),))


def predict(doc: Any, signature: Signature = ONE) -> tuple[dict[str, np.ndarray], str]:
    return tfserving.decode_predict(json.dumps(doc).encode(), signature)


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


# -- requests ---------------------------------------------------------------------------------------------


def test_row_format_single_input_is_a_list_of_values():
    arrays, fmt = predict({"instances": [[1, 2, 3], [4.5, 5, 6]]})
    assert fmt == "row"
    assert arrays["x"].dtype == np.float32 and arrays["x"].shape == (2, 3)
    np.testing.assert_array_equal(arrays["x"], [[1, 2, 3], [4.5, 5, 6]])


def test_row_format_single_input_may_also_be_named():
    arrays, _ = predict({"signature_name": "serving_default", "instances": [{"x": [1, 2, 3]}]})
    np.testing.assert_array_equal(arrays["x"], [[1, 2, 3]])


def test_row_format_several_inputs_is_a_list_of_objects():
    doc = {
        "instances": [
            {"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
            {"tag": "bar", "signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]},
        ]
    }
    arrays, fmt = predict(doc, SEVERAL)
    assert fmt == "row" and list(arrays) == ["tag", "signal", "sensor"]
    assert arrays["tag"].tolist() == [b"foo", b"bar"]
    assert arrays["signal"].dtype == np.int32 and arrays["signal"].shape == (2, 5)
    assert arrays["sensor"].dtype == np.float64 and arrays["sensor"].shape == (2, 2, 2)


def test_columnar_format_single_input_and_named_map():
    arrays, fmt = predict({"inputs": [[1, 2, 3]]})
    assert fmt == "columnar" and arrays["x"].shape == (1, 3)
    doc = {
        "inputs": {
            "tag": ["foo", "bar"],
            "signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],
            "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]],
        }
    }
    arrays, fmt = predict(doc, SEVERAL)
    assert fmt == "columnar" and arrays["signal"].tolist() == [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]]
    arrays, _ = predict({"inputs": {"x": [[1, 2, 3]]}})
    assert arrays["x"].shape == (1, 3)


def test_columnar_inputs_need_not_share_the_first_dimension():
    doc = {"inputs": {"tag": ["a"], "signal": [[1, 2, 3, 4, 5]] * 3, "sensor": [[[1, 2], [3, 4]]] * 2}}
    arrays, _ = predict(doc, SEVERAL)
    assert [a.shape[0] for a in arrays.values()] == [1, 3, 2]


def test_b64_values_decode_to_bytes_and_plain_strings_to_utf8():
    payload = b"\xff\xd8\x00jpeg"
    arrays, _ = predict({"instances": [b64(payload), "h\u00e9llo"]}, TEXT)
    assert arrays["text"].tolist() == [payload, "h\u00e9llo".encode()]
    arrays, _ = predict({"inputs": {"text": [b64(b"a"), b64(b"")]}}, TEXT)
    assert arrays["text"].tolist() == [b"a", b""]
    arrays, _ = predict({"instances": [{"text": b64(b"z")}]}, TEXT)
    assert arrays["text"].tolist() == [b"z"]


def test_nan_and_infinity_literals_are_accepted():
    body = b'{"instances": [[NaN, Infinity, -Infinity]]}'
    arrays, _ = tfserving.decode_predict(body, ONE)
    np.testing.assert_array_equal(arrays["x"], [[np.nan, np.inf, -np.inf]])


def test_examples_with_context_decode_like_rows():
    signature = Signature(inputs=(TensorSpec("x", "FP32", (-1,)), TensorSpec("k", "INT64", (-1,))))
    body = b'{"context": {"k": 3}, "examples": [{"x": 1.0}, {"x": [2.0]}]}'
    arrays, fmt = tfserving.decode_predict(body, signature)
    assert fmt == "row"
    assert arrays["x"].tolist() == [1.0, 2.0] and arrays["k"].tolist() == [3, 3]


@pytest.mark.parametrize(
    ("doc", "signature", "message"),
    [
        ({"instances": [[1, 2, 3]], "inputs": [[1, 2, 3]]}, ONE, "either 'instances' .* or 'inputs' .*, not both"),
        ({"signature_name": "serving_default"}, ONE, "must have 'instances' .* or 'inputs'"),
        ({"instances": []}, ONE, "'instances' must be a non-empty list"),
        ({"instances": {"x": [1, 2, 3]}}, ONE, "'instances' must be a non-empty list"),
        ({"instances": [[1, 2, 3], [4, 5]]}, ONE, "input 'x': data must be a flat list or rectangular"),
        ({"instances": [[1, 2, 3, 4]]}, ONE, r"input 'x' must have shape \[-1,3\], got \[1,4\]"),
        ({"instances": [1, 2, 3]}, ONE, r"input 'x' must have shape \[-1,3\], got \[3\]"),
        ({"instances": [["a", "b", "c"]]}, ONE, "input 'x' is FP32; data must be numbers, got strings"),
        ({"instances": [[b64(b"1"), 2, 3]]}, ONE, "input 'x' is FP32; data must be numbers, got objects"),
        ({"instances": [{"x": [1, 2, 3], "z": 1}]}, ONE, r"instances\[0\] has unknown input 'z'; inputs are: x"),
        ({"signature_name": "predict_images", "instances": [[1, 2, 3]]}, ONE, "signature 'predict_images' not found"),
        (
            {"instances": [{"tag": "a", "signal": [1, 2, 3, 4, 5]}]},
            SEVERAL,
            r"instances\[0\] lacks input 'sensor'; inputs are: tag, signal, sensor",
        ),
        ({"instances": [[1, 2, 3, 4, 5]]}, SEVERAL, r"instances\[0\] must be an object keyed by input name"),
        ({"inputs": [1, 2]}, SEVERAL, "this model has 3 inputs .*'inputs' must be an object keyed by input name"),
        ({"inputs": {"tag": ["a"]}}, SEVERAL, "'inputs' lacks input 'signal'"),
        ({"instances": [{"b64": "***"}]}, TEXT, '"b64" value is not valid base64'),
        ({"instances": [3]}, TEXT, r'input \'text\' is BYTES; data must be strings or \{"b64": "..."\} objects'),
        ({"examples": [{"text": "a"}], "context": {"text": "b"}}, TEXT, "repeats context feature"),
        ({"instances": [[1, 2, 3]], "examples": [{"x": [1, 2, 3]}]}, ONE, "'instances' and 'examples'"),
    ],
)
def test_bad_predict_requests_are_400s(doc: Any, signature: Signature, message: str):
    with pytest.raises(BadRequest, match=message) as info:
        predict(doc, signature)
    assert info.value.status == 400


@pytest.mark.parametrize("body", [b"{", b"[1]", b"\xff"])
def test_invalid_json_is_a_400(body: bytes):
    with pytest.raises(BadRequest):
        tfserving.decode_predict(body, ONE)


def test_integer_inputs_are_range_checked():
    signature = Signature(inputs=(TensorSpec("ids", "UINT8", (-1,)),))
    with pytest.raises(BadRequest, match=r"input 'ids' is UINT8; values must be in 0\.\.255, got 256"):
        predict({"instances": [1, 256]}, signature)


# -- responses --------------------------------------------------------------------------------------------


def test_row_predictions_single_output_is_a_list_per_row():
    body = tfserving.encode_predict({"y": np.array([[0.5, 1.5], [2.0, 3.0]], dtype=np.float32)}, "row")
    assert json.loads(body) == {"predictions": [[0.5, 1.5], [2.0, 3.0]]}


def test_row_predictions_several_outputs_are_objects_per_row():
    outputs = {"score": np.array([0.25, 0.75]), "label": np.array([b"cat", b"dog"], dtype=object)}
    assert json.loads(tfserving.encode_predict(outputs, "row")) == {
        "predictions": [{"score": 0.25, "label": "cat"}, {"score": 0.75, "label": "dog"}]
    }


def test_row_predictions_with_different_batch_sizes_is_a_server_error():
    with pytest.raises(ServingError, match=r"do not share their first dimension \(a: 2, b: 3\)"):
        tfserving.encode_predict({"a": np.zeros(2), "b": np.zeros(3)}, "row")


def test_columnar_outputs_single_and_several():
    assert json.loads(tfserving.encode_predict({"y": np.array([1, 2], dtype=np.int64)}, "columnar")) == {
        "outputs": [1, 2]
    }
    outputs = {"a": np.array([True, False]), "b": np.float32(2.5)}
    assert json.loads(tfserving.encode_predict(outputs, "columnar")) == {"outputs": {"a": [True, False], "b": 2.5}}


def test_binary_outputs_use_b64_and_nan_is_a_literal():
    outputs = {"raw": np.array([b"\xff\x00", b"text", "str"], dtype=object)}
    assert json.loads(tfserving.encode_predict(outputs, "columnar")) == {
        "outputs": [{"b64": base64.b64encode(b"\xff\x00").decode()}, "text", "str"]
    }
    body = tfserving.encode_predict({"y": np.array([np.nan, np.inf], dtype=np.float32)}, "row")
    assert body == b'{"predictions":[NaN,Infinity]}'


def test_request_and_response_round_trip_for_random_tensors():
    rng = np.random.default_rng(3)
    for i in range(40):
        rows, width = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        signature = Signature(
            inputs=(
                TensorSpec("a", "FP64", (-1, width)),
                TensorSpec("b", "INT64", (-1,)),
                TensorSpec("c", "BYTES", (-1,)),
            )
        )
        a = rng.standard_normal((rows, width))
        b = rng.integers(-(2**62), 2**62, rows)
        c = np.array(
            [bytes(rng.integers(0, 256, int(rng.integers(0, 6)), dtype=np.uint8)) for _ in range(rows)], dtype=object
        )
        fmt = "row" if i % 2 else "columnar"
        if fmt == "row":
            instances = [{"a": a[r].tolist(), "b": int(b[r]), "c": b64(c[r])} for r in range(rows)]
            doc: dict[str, Any] = {"instances": instances}
        else:
            doc = {"inputs": {"a": a.tolist(), "b": b.tolist(), "c": [b64(v) for v in c]}}
        arrays, got_fmt = predict(doc, signature)
        assert got_fmt == fmt
        np.testing.assert_array_equal(arrays["a"], a)
        np.testing.assert_array_equal(arrays["b"], b)
        assert arrays["c"].tolist() == c.tolist()
        # what the server answers decodes back to the same values
        answer = json.loads(tfserving.encode_predict(arrays, fmt))
        if fmt == "row":
            np.testing.assert_array_equal([p["a"] for p in answer["predictions"]], a)
        else:
            np.testing.assert_array_equal(answer["outputs"]["b"], b)


def test_results_for_regress_and_classify():
    assert json.loads(tfserving.encode_results({"y": np.array([[3.5], [4.0]], dtype=np.float32)})) == {
        "results": [3.5, 4.0]
    }
    scores = np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32)
    assert json.loads(tfserving.encode_results({"p": scores})) == {
        "results": [[["0", 0.25], ["1", 0.75]], [["0", 1.0], ["1", 0.0]]]
    }
    assert json.loads(tfserving.encode_results({"p": scores}, "classify", labels=["cat", "dog"]))["results"][0] == [
        ["cat", 0.25],
        ["dog", 0.75],
    ]
    assert json.loads(tfserving.encode_results({"p": np.array([0.5])}, "classify")) == {"results": [[["0", 0.5]]]}
    with pytest.raises(BadRequest, match="need a model with one output; this one has 2"):
        tfserving.encode_results({"a": np.zeros(1), "b": np.zeros(1)})
    with pytest.raises(BadRequest, match=r":regress needs one value per example; the output has shape \[2,3\]"):
        tfserving.encode_results({"a": np.zeros((2, 3))}, "regress")


# -- status, metadata, paths ------------------------------------------------------------------------------


def test_model_status():
    assert tfserving.model_status([(3, "AVAILABLE")]) == {
        "model_version_status": [
            {"version": "3", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    failed = tfserving.model_status([(1, "END"), (2, "LOADING")], errors={1: "file not found"})
    assert failed["model_version_status"][0]["status"] == {"error_code": "UNKNOWN", "error_message": "file not found"}
    assert failed["model_version_status"][1]["state"] == "LOADING"
    with pytest.raises(ValueError, match="state must be one of"):
        tfserving.model_status([(1, "READY")])


def test_model_metadata_has_tf_servings_shape():
    meta = tfserving.model_metadata("half_plus_two", 123, SEVERAL)
    assert meta["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "123"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["sensor"] == {
        "dtype": "DT_DOUBLE",
        "tensor_shape": {
            "dim": [{"size": "-1", "name": ""}, {"size": "2", "name": ""}, {"size": "2", "name": ""}],
            "unknown_rank": False,
        },
        "name": "sensor",
    }
    assert sig["inputs"]["tag"]["dtype"] == "DT_STRING" and sig["outputs"] == {}
    assert tfserving.model_metadata("m", None, ONE)["model_spec"]["version"] == ""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/models/resnet", ("resnet", None, None, "status")),
        ("/v1/models/my-model_v2.1/versions/7", ("my-model_v2.1", 7, None, "status")),
        ("/v1/models/m/labels/stable", ("m", None, "stable", "status")),
        ("/v1/models/m/metadata", ("m", None, None, "metadata")),
        ("/v1/models/m/versions/3/metadata", ("m", 3, None, "metadata")),
        ("/v1/models/m:predict", ("m", None, None, "predict")),
        ("/v1/models/m/versions/12:classify", ("m", 12, None, "classify")),
        ("/v1/models/m/labels/canary-1:regress", ("m", None, "canary-1", "regress")),
        ("/v1/models/metadata", ("metadata", None, None, "status")),
        ("/v1/models/m:explain", None),
        ("/v1/models/m/versions/latest", None),
        ("/v1/models/m/versions/1/labels/x", None),
        ("/v1/models/", None),
        ("/v2/models/m", None),
        ("/v1/models/m/extra", None),
    ],
)
def test_parse_model_path(path: str, expected: tuple[str, int | None, str | None, str] | None):
    assert tfserving.parse_model_path(path) == expected
