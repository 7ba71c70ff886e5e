"""KServe V2 codec against the real tritonclient: its request bodies decode, our responses parse back."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.http import InferenceServerClient

from dlcloud.serving.errors import BadRequest, PayloadTooLarge, ServingError
from dlcloud.serving.protocol import v2
from dlcloud.serving.types import V2_TO_NUMPY, Signature, TensorSpec

NUMERIC = ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
ALL_TYPES = ["BOOL", *NUMERIC, "BYTES"]
LIMIT = 1 << 20


def sample(datatype: str, shape: tuple[int, ...] = (2, 3), seed: int = 0) -> np.ndarray:
    """A test tensor that includes the datatype's extremes (and NaN / inf for floats)."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if datatype == "BOOL":
        return (rng.integers(0, 2, count) == 1).reshape(shape)
    if datatype == "BYTES":
        pool = [b"", b"a", "h\u00e9llo \u4e16\u754c".encode(), b"x" * 300, b"with space", b"\x00nul"]
        flat = np.empty(count, dtype=object)
        flat[:] = [pool[i % len(pool)] for i in range(count)]
        return flat.reshape(shape)
    dtype = V2_TO_NUMPY[datatype]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, size=count, dtype=dtype, endpoint=True)
        flat[: min(2, count)] = [info.min, info.max][: min(2, count)]
    else:
        flat = rng.standard_normal(count).astype(dtype)
        flat[: min(3, count)] = [np.nan, np.inf, -np.inf][: min(3, count)]
    return flat.reshape(shape)


def client_request(
    inputs: list[triton.InferInput],
    outputs: list[triton.InferRequestedOutput] | None = None,
    request_id: str = "",
    compression: str | None = None,
    **kwargs: Any,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers tritonclient's ``infer`` would send (same compression code path)."""
    body, json_size = InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id=request_id, **kwargs
    )
    headers: dict[str, str] = {}
    if compression == "gzip":
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body)
    elif compression == "deflate":
        headers["Content-Encoding"] = "deflate"
        body = zlib.compress(body)
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


def client_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def decode(body: bytes, headers: dict[str, str] | None = None, **kwargs: Any) -> v2.InferRequest:
    return v2.decode_infer_request(body, headers or {}, max_body_bytes=kwargs.pop("limit", LIMIT), **kwargs)


def parse(body: bytes, headers: dict[str, str]) -> Any:
    length = headers.get("Inference-Header-Content-Length")
    return InferenceServerClient.parse_response_body(
        body, verbose=False, header_length=int(length) if length is not None else None, content_encoding=None
    )


def raw_json(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


# -- decoding what tritonclient sends ----------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_every_datatype_from_tritonclient_decodes_exactly(datatype: str, binary: bool):
    array = sample(datatype)
    body, headers = client_request([client_input("x", array, datatype, binary)])
    assert ("Inference-Header-Content-Length" in headers) is binary

    request = decode(body, headers)

    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 3))
    assert tensor.array.shape == (2, 3)
    assert tensor.array.dtype == V2_TO_NUMPY[datatype]
    np.testing.assert_array_equal(tensor.array, array)
    if datatype == "BYTES":
        assert all(type(v) is bytes for v in tensor.array.ravel())


def test_binary_inputs_are_zero_copy_read_only_views():
    array = sample("FP32", (4, 8))
    body, headers = client_request([client_input("x", array, "FP32", True)])
    tensor = decode(body, headers).inputs[0]
    assert not tensor.array.flags.writeable
    assert tensor.array.base is not None


def test_binary_bytes_that_are_not_utf8_decode():
    array = np.array([b"\xff\xfe\x00", b"\x80"], dtype=object)
    body, headers = client_request([client_input("img", array, "BYTES", True)])
    np.testing.assert_array_equal(decode(body, headers).inputs[0].array, array)


def test_bf16_binary_input_is_widened_to_fp32():
    array = np.array([[1.5, -2.25, 3.0e38], [0.0, -0.0, np.inf]], dtype=ml_dtypes.bfloat16)
    body, headers = client_request([client_input("x", array, "BF16", True)])
    tensor = decode(body, headers).inputs[0]
    assert tensor.datatype == "BF16"
    assert tensor.array.dtype == np.float32
    np.testing.assert_array_equal(tensor.array, array.astype(np.float32))


@pytest.mark.parametrize("request_id", ["", "req-42"])
def test_several_inputs_mixed_json_and_binary_keep_order_and_id(request_id: str):
    a, b, c = sample("INT64", (3,)), sample("BYTES", (2, 2)), sample("FP16", (1, 4))
    body, headers = client_request(
        [client_input("a", a, "INT64", True), client_input("b", b, "BYTES", False), client_input("c", c, "FP16", True)],
        request_id=request_id,
    )
    request = decode(body, headers)
    assert request.id == (request_id or None)
    assert [t.name for t in request.inputs] == ["a", "b", "c"]
    for tensor, expected in zip(request.inputs, (a, b, c), strict=True):
        np.testing.assert_array_equal(tensor.array, expected)


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_compressed_requests_decode(compression: str, binary: bool):
    array = sample("FP32", (16, 16))
    body, headers = client_request([client_input("x", array, "FP32", binary)], compression=compression)
    assert headers["Content-Encoding"] == compression
    np.testing.assert_array_equal(decode(body, headers).inputs[0].array, array)


def test_raw_deflate_multi_member_gzip_and_identity_are_accepted():
    doc = raw_json([{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]}])
    bare = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw_deflate = bare.compress(doc) + bare.flush()
    assert decode(raw_deflate, {"content-encoding": "deflate"}).inputs[0].array.tolist() == [1, 2]
    two_members = gzip.compress(doc[:10]) + gzip.compress(doc[10:])
    assert decode(two_members, {"Content-Encoding": "gzip"}).inputs[0].array.tolist() == [1, 2]
    assert decode(doc, {"Content-Encoding": "identity"}).inputs[0].array.tolist() == [1, 2]


def test_headers_are_read_case_insensitively():
    array = sample("FP64", (3,))
    body, headers = client_request([client_input("x", array, "FP64", True)])
    lower = {k.lower(): v for k, v in headers.items()}
    np.testing.assert_array_equal(decode(body, lower).inputs[0].array, array)


def test_requested_outputs_resolve_binary_against_the_request_default():
    x = client_input("x", sample("FP32"), "FP32", True)
    outputs = [triton.InferRequestedOutput("a", binary_data=False), triton.InferRequestedOutput("b")]
    request = decode(*client_request([x], outputs=outputs))
    assert request.outputs is not None
    assert [(o.name, o.binary) for o in request.outputs] == [("a", False), ("b", True)]
    assert request.binary_output_default is False

    request = decode(*client_request([x]))  # no outputs: tritonclient asks for all of them in binary
    assert request.outputs is None and request.binary_output_default is True

    doc = raw_json(
        [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
        parameters={"binary_data_output": True},
        outputs=[{"name": "a"}, {"name": "b", "parameters": {"binary_data": False}}],
    )
    request = decode(doc)
    assert [(o.name, o.binary) for o in request.outputs or []] == [("a", True), ("b", False)]


def test_unknown_and_scheduling_parameters_are_ignored():
    x = client_input("x", sample("INT32"), "INT32", True)
    x._parameters["custom_tensor_param"] = "kept"
    body, headers = client_request(
        [x], sequence_id=7, sequence_start=True, priority=2, timeout=1000, parameters={"anything": {"nested": 1}}
    )
    request = decode(body, headers)
    assert request.parameters["priority"] == 2 and request.parameters["anything"] == {"nested": 1}
    assert request.inputs[0].parameters["custom_tensor_param"] == "kept"


def test_classification_is_refused_with_a_clear_message():
    x = client_input("x", sample("FP32"), "FP32", True)
    body, headers = client_request([x], outputs=[triton.InferRequestedOutput("probs", class_count=3)])
    with pytest.raises(BadRequest, match="output 'probs': the classification extension is not supported"):
        decode(body, headers)


def test_shared_memory_is_refused():
    x = triton.InferInput("x", [4], "FP32")
    x.set_shared_memory("region", 16)
    body, headers = client_request([x])
    with pytest.raises(BadRequest, match="input 'x': shared memory is not supported"):
        decode(body, headers)


def test_json_data_may_be_nested_and_hold_nan_and_infinity():
    doc = b'{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[NaN,Infinity],[-Infinity,1.5]]}]}'
    array = decode(doc).inputs[0].array
    assert array.shape == (2, 2) and array.dtype == np.float32
    np.testing.assert_array_equal(array, [[np.nan, np.inf], [-np.inf, 1.5]])


def test_json_numbers_convert_across_kinds_only_when_exact():
    def one(datatype: str, data: Any) -> np.ndarray:
        return (
            decode(raw_json([{"name": "x", "shape": [len(data)], "datatype": datatype, "data": data}])).inputs[0].array
        )

    assert one("INT8", [1.0, -2.0]).tolist() == [1, -2]
    assert one("FP32", [1, 2]).tolist() == [1.0, 2.0]
    assert one("BOOL", [True, False]).tolist() == [True, False]
    assert one("BOOL", [1, 0]).tolist() == [True, False]
    assert one("UINT64", [2**64 - 1, 0]).tolist() == [2**64 - 1, 0]
    assert one("INT64", [-(2**63), 2**63 - 1]).tolist() == [-(2**63), 2**63 - 1]
    assert one("FP16", [70000.0]).tolist() == [np.inf]  # out of range: like a C cast
    with pytest.raises(BadRequest, match=r"input 'x' is INT32; data must be whole numbers"):
        one("INT32", [1.5])
    with pytest.raises(BadRequest, match=r"input 'x' is UINT8; values must be in 0\.\.255, got 300"):
        one("UINT8", [1, 300])
    with pytest.raises(BadRequest, match=r"input 'x' is FP32; data must be numbers, got strings"):
        one("FP32", ["1.5"])
    with pytest.raises(BadRequest, match=r"input 'x' is FP32; data must be numbers, got null"):
        one("FP32", [None, 1.0])
    with pytest.raises(BadRequest, match=r"input 'x' is BOOL; data must be true/false"):
        one("BOOL", [2])
    with pytest.raises(BadRequest, match=r"input 'x' is FP64; data must be numbers, got true/false"):
        one("FP64", [True])
    with pytest.raises(BadRequest, match=r"input 'x' is BYTES; data must be strings, got int"):
        one("BYTES", [1])


# -- raw binary requests (Inference-Header-Content-Length: 0) ---------------------------------------------


def test_raw_binary_request_takes_name_datatype_and_shape_from_the_single_input():
    array = sample("FP32", (3, 4))
    spec = TensorSpec("pixels", "FP32", (-1, 4))
    request = decode(array.tobytes(), {"Inference-Header-Content-Length": "0"}, single_input=spec)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("pixels", "FP32", (3, 4))
    np.testing.assert_array_equal(tensor.array, array)
    assert request.id is None and request.outputs is None and request.binary_output_default is True


def test_raw_binary_request_batches_one_row_when_another_dimension_varies():
    array = sample("INT16", (1, 5, 3))
    spec = TensorSpec("seq", "INT16", (-1, -1, 3))
    tensor = decode(array.tobytes(), {"Inference-Header-Content-Length": "0"}, single_input=spec).inputs[0]
    assert tensor.shape == (1, 5, 3)
    np.testing.assert_array_equal(tensor.array, array)


def test_raw_binary_bytes_request_is_one_element():
    spec = TensorSpec("jpeg", "BYTES", (-1,))
    tensor = decode(b"\xff\xd8raw", {"Inference-Header-Content-Length": "0"}, single_input=spec).inputs[0]
    assert tensor.shape == (1,) and tensor.array.tolist() == [b"\xff\xd8raw"]


@pytest.mark.parametrize(
    ("spec", "body", "message"),
    [
        (None, b"\x00" * 8, "needs a model with exactly one declared input"),
        (TensorSpec("x", "FP32", (2, 2)), b"\x00" * 12, r"input 'x': shape \[2,2\] needs 4 values, the raw"),
        (TensorSpec("x", "FP32", (-1, 3)), b"\x00" * 6, "not a whole number of FP32 elements"),
        (TensorSpec("x", "FP32", (-1, 3)), b"\x00" * 8, r"do not fill input 'x' of shape \[-1,3\]"),
        (TensorSpec("x", "FP32", (-1, -1, -1)), b"\x00" * 8, "more than one variable dimension"),
        (TensorSpec("x", "BYTES", (-1, 2)), b"ab", "needs BYTES input 'x' to hold one element"),
    ],
)
def test_raw_binary_request_errors(spec: TensorSpec | None, body: bytes, message: str):
    with pytest.raises(BadRequest, match=message):
        decode(body, {"Inference-Header-Content-Length": "0"}, single_input=spec)


# -- malformed requests -----------------------------------------------------------------------------------


def _binary_body(inputs: list[dict[str, Any]], blob: bytes) -> tuple[bytes, dict[str, str]]:
    header = raw_json(inputs)
    return header + blob, {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize(
    ("inputs", "blob", "message"),
    [
        (
            [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
            b"\x00" * 12,
            "add up to 8 bytes but the body carries 12 bytes after the JSON header",
        ),
        (
            [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 16}}],
            b"\x00" * 8,
            "binary_data_size 16 reaches past the end of the body",
        ),
        (
            [{"name": "x", "shape": [2], "datatype": "FP32"}],
            b"\x00" * 8,
            "input 'x' has neither 'data' nor parameters.binary_data_size",
        ),
        (
            [{"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 20}}],
            b"\x00" * 20,
            r"input 'x': shape \[2,3\] of FP32 needs 24 bytes, binary_data_size is 20",
        ),
        (
            [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": -8}}],
            b"",
            "binary_data_size must be a non-negative integer",
        ),
        (
            [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2], "parameters": {"binary_data_size": 8}}],
            b"\x00" * 8,
            "has both 'data' and binary_data_size",
        ),
        (
            [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}],
            b"\x09\x00\x00\x00ab",
            "BYTES element 0 claims 9 bytes but only 2 are left",
        ),
        (
            [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}],
            b"\x01\x00\x00\x00abcd",
            "3 bytes left over after 1 elements",
        ),
        (
            [{"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 5}}],
            b"\x01\x00\x00\x00a",
            "ends before element 1 of 2",
        ),
    ],
)
def test_malformed_binary_requests_are_400s(inputs: list[dict[str, Any]], blob: bytes, message: str):
    body, headers = _binary_body(inputs, blob)
    with pytest.raises(BadRequest, match=message):
        decode(body, headers)


def test_binary_input_without_header_length_says_so():
    doc = raw_json([{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}])
    with pytest.raises(BadRequest, match="no Inference-Header-Content-Length header"):
        decode(doc)


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (
            raw_json([{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]),
            {},
            r"input 'x': shape \[2,3\] needs 6 values, got 5",
        ),
        (
            raw_json([{"name": "x", "shape": [3], "datatype": "BYTES", "data": ["a", "b"]}]),
            {},
            r"input 'x': shape \[3\] needs 3 values, got 2",
        ),
        (
            raw_json([{"name": "x", "shape": [2], "datatype": "FP8", "data": [1, 2]}]),
            {},
            "input 'x': datatype must be one of BOOL, .*BF16, got 'FP8'",
        ),
        (
            raw_json([{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]),
            {},
            "shape must be a list of non-negative integers",
        ),
        (
            raw_json([{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3]]}]),
            {},
            "rectangular nested lists",
        ),
        (
            raw_json([{"name": "x", "shape": [1], "datatype": "BF16", "data": [1.0]}]),
            {},
            "BF16 data must be sent in binary form",
        ),
        (
            raw_json(
                [
                    {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
                    {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
                ]
            ),
            {},
            "input 'x' appears more than once",
        ),
        (b'{"inputs": [', {}, "request JSON is invalid"),
        (b"\xff\xfe{", {}, "request JSON is invalid"),
        (b"[" * 100_000, {}, "request JSON is invalid"),
        (b'{"inputs": []}', {}, "non-empty 'inputs' list"),
        (b"[1, 2]", {}, "must be an object"),
        (raw_json([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], id=5), {}, "'id' must be a string"),
        (b"{}", {"Inference-Header-Content-Length": "10"}, "is 10 but the body has 2 bytes"),
        (b"{}", {"Inference-Header-Content-Length": "two"}, "must be an integer"),
        (
            raw_json([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], outputs=[{"name": 3}]),
            {},
            r"outputs\[0\] must be an object with a 'name' string",
        ),
    ],
)
def test_malformed_requests_are_400s(body: bytes, headers: dict[str, str], message: str):
    with pytest.raises(BadRequest, match=message) as info:
        decode(body, headers)
    assert info.value.status == 400


def test_gzip_bomb_is_refused_without_inflating_it():
    bomb = gzip.compress(b"\x00" * (64 << 20))  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 100_000
    with pytest.raises(PayloadTooLarge, match="exceeds the limit of 1048576 bytes") as info:
        decode(bomb, {"Content-Encoding": "gzip"})
    assert info.value.status == 413


def test_deflate_bomb_and_oversized_body_are_413():
    with pytest.raises(PayloadTooLarge):
        decode(zlib.compress(b"{" * (8 << 20)), {"Content-Encoding": "deflate"})
    with pytest.raises(PayloadTooLarge, match="request body is 2048 bytes; the limit is 1024"):
        decode(b" " * 2048, limit=1024)


def test_corrupt_truncated_and_unknown_encodings():
    good = gzip.compress(raw_json([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]))
    with pytest.raises(BadRequest, match="truncated gzip data"):
        decode(good[:-12], {"Content-Encoding": "gzip"})
    with pytest.raises(BadRequest, match="not valid gzip data"):
        decode(b"not gzip at all", {"Content-Encoding": "gzip"})
    with pytest.raises(ServingError, match="Content-Encoding 'br' is not supported") as info:
        decode(b"{}", {"Content-Encoding": "br"})
    assert info.value.status == 415 and info.value.headers == {"Accept-Encoding": "gzip, deflate"}


# -- encoding responses that tritonclient parses ----------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_every_datatype_round_trips_through_tritonclient(datatype: str, binary: bool):
    array = sample(datatype, (2, 3), seed=1)
    body, headers = v2.encode_infer_response("m", "1", "rid", {"y": array}, None, binary)

    assert headers["Content-Type"] == ("application/octet-stream" if binary else "application/json")
    result = parse(body, headers)
    got = result.as_numpy("y")
    assert got.shape == (2, 3)
    if datatype == "BYTES" and not binary:
        # tritonclient hands JSON BYTES back as str
        np.testing.assert_array_equal(got, np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(array))
    else:
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("m", "1", "rid")
    assert response["outputs"][0]["datatype"] == datatype


def test_requested_outputs_pick_subset_order_and_form():
    outputs = {"a": sample("FP32", (2,)), "b": sample("INT64", (3,)), "c": sample("BYTES", (1,))}
    requested = [v2.RequestedOutput("c", False), v2.RequestedOutput("a", True)]
    body, headers = v2.encode_infer_response("m", None, None, outputs, requested, False)
    result = parse(body, headers)
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["c", "a"]
    assert "id" not in response and "model_version" not in response
    assert "data" in response["outputs"][0] and response["outputs"][1]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(result.as_numpy("a"), outputs["a"])
    assert result.as_numpy("b") is None


def test_unknown_requested_output_names_the_outputs():
    outputs = {"a": np.zeros(1), "b": np.zeros(1)}
    with pytest.raises(BadRequest, match="model m has no output 'y'; outputs are: a, b"):
        v2.encode_infer_response("m", "1", None, outputs, [v2.RequestedOutput("y", True)], True)
    with pytest.raises(BadRequest, match="model m has no output 'y'; outputs are: a, b"):
        v2.check_requested_outputs("m", [v2.RequestedOutput("y", True)], outputs)
    v2.check_requested_outputs("m", None, outputs)


def test_bytes_that_are_not_utf8_go_binary_even_when_json_was_asked():
    array = np.array([b"\xff\x00", b"ok"], dtype=object)
    body, headers = v2.encode_infer_response("m", "1", None, {"y": array, "z": np.ones(2)}, None, False)
    assert headers["Inference-Header-Content-Length"]
    result = parse(body, headers)
    np.testing.assert_array_equal(result.as_numpy("y"), array)
    assert "data" in result.get_output("z")  # the other output stays JSON


def test_string_and_unicode_outputs_are_bytes():
    array = np.array(["h\u00e9", "b"])
    result = parse(*v2.encode_infer_response("m", "1", None, {"y": array}, None, True))
    assert result.as_numpy("y").tolist() == ["h\u00e9".encode(), b"b"]
    assert result.get_output("y")["datatype"] == "BYTES"


def test_declared_datatypes_cast_and_bf16_is_sent_binary():
    values = np.array([[1.0, -2.5, 3.140625], [np.nan, np.inf, 1e-3]], dtype=np.float64)
    body, headers = v2.encode_infer_response(
        "m", "1", None, {"half": values, "wide": values}, None, False, datatypes={"half": "BF16", "wide": "FP32"}
    )
    result = parse(body, headers)
    half = result.get_output("half")
    assert half["datatype"] == "BF16" and half["parameters"]["binary_data_size"] == 12
    np.testing.assert_array_equal(  # compared as FP32: NumPy's NaN-equality only knows its own floats
        result.as_numpy("half").astype(np.float32), values.astype(ml_dtypes.bfloat16).astype(np.float32)
    )
    assert result.as_numpy("wide").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("wide"), values.astype(np.float32))


def test_scalars_empty_tensors_and_non_contiguous_arrays_encode():
    outputs: dict[str, Any] = {
        "scalar": np.float32(2.5),
        "empty": np.zeros((0, 3), dtype=np.int32),
        "strided": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
        "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
    }
    for binary in (False, True):
        result = parse(*v2.encode_infer_response("m", "1", None, outputs, None, binary))
        for name, array in outputs.items():
            got = result.as_numpy(name)
            assert got.shape == np.shape(array)
            np.testing.assert_array_equal(got, array)


def test_output_without_a_v2_datatype_is_a_server_error():
    with pytest.raises(ServingError, match="output 'c' has NumPy type complex64") as info:
        v2.encode_infer_response("m", "1", None, {"c": np.zeros(2, dtype=np.complex64)}, None, True)
    assert info.value.status == 500


def test_round_trip_through_both_codecs_for_random_tensors():
    rng = np.random.default_rng(7)
    for i in range(60):
        datatype = ALL_TYPES[i % len(ALL_TYPES)]
        shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 4))))
        array = sample(datatype, shape, seed=i)
        in_binary, out_binary = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        compression = [None, "gzip", "deflate"][i % 3]
        body, headers = client_request(
            [client_input("x", array, datatype, in_binary)], request_id=f"r{i}", compression=compression
        )
        request = decode(body, headers)
        tensor = request.inputs[0]
        np.testing.assert_array_equal(tensor.array, array)
        if datatype == "BYTES" and not out_binary:
            continue  # JSON BYTES come back as str; covered above
        body, headers = v2.encode_infer_response("m", "1", request.id, {"y": tensor.array}, None, out_binary)
        result = parse(body, headers)
        assert result.get_response()["id"] == f"r{i}"
        got = result.as_numpy("y")
        assert got.shape == array.shape, (datatype, shape)
        np.testing.assert_array_equal(got, array)


def test_encode_error():
    assert json.loads(v2.encode_error("model 'm' is not ready")) == {"error": "model 'm' is not ready"}


# -- metadata ---------------------------------------------------------------------------------------------

SIGNATURE = Signature(
    inputs=(TensorSpec("x", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, -1))),
    outputs=(TensorSpec("y", "FP32", (-1, 2)), TensorSpec("label", "BYTES", (-1,))),
)


def test_server_and_model_metadata():
    assert v2.server_metadata("dlcloud", "0.1.0", ["binary_tensor_data"]) == {
        "name": "dlcloud",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data"],
    }
    meta = v2.model_metadata("m", ["1", "2"], "onnxruntime_onnx", SIGNATURE)
    assert meta == {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "mask", "datatype": "BOOL", "shape": [-1, -1]},
        ],
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [-1, 2]},
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
        ],
    }


def test_model_config_drops_the_batch_dimension_when_batching():
    config = v2.model_config("m", "pytorch_libtorch", 8, SIGNATURE, dynamic_batching={})
    assert config["name"] == "m" and config["max_batch_size"] == 8 and config["dynamic_batching"] == {}
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [4]),
        ("mask", "TYPE_BOOL", [-1]),
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("y", "TYPE_FP32", [2]),
        ("label", "TYPE_STRING", []),
    ]
    unbatched = v2.model_config("m", "onnxruntime_onnx", 0, SIGNATURE)
    assert unbatched["input"][0]["dims"] == [-1, 4] and "dynamic_batching" not in unbatched
    json.dumps(config)  # serialisable as is


def test_validate_inputs_against_a_signature():
    good = decode(
        raw_json(
            [
                {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0] * 8},
                {"name": "mask", "shape": [2, 5], "datatype": "BOOL", "data": [True] * 10},
            ]
        )
    )
    v2.validate_inputs("m", good.inputs, SIGNATURE)
    cases = [
        ({"name": "z", "shape": [1], "datatype": "FP32", "data": [0]}, "model m has no input 'z'; inputs are: x, mask"),
        ({"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [0] * 4}, "input 'x' must be FP32, got FP64"),
        ({"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0] * 3}, r"must have shape \[-1,4\], got \[1,3\]"),
        ({"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}, r"needs input\(s\) mask"),
    ]
    for tensor, message in cases:
        with pytest.raises(BadRequest, match=message):
            v2.validate_inputs("m", decode(raw_json([tensor])).inputs, SIGNATURE)
    v2.validate_inputs("m", good.inputs, Signature())  # unknown signature: anything goes
