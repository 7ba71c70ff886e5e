"""The model server end to end: real models, the real server (uvicorn), the real clients.

KServe V2 through ``tritonclient.http`` (binary and JSON tensors, every datatype, compression, versions,
the repository extension, a URL prefix), TF Serving REST through httpx, bad input of every kind (each
followed by a request that still works), health codes, metrics and the access log. The server runs once
per module; tests that change its state (unload) restore it.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import textwrap
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dlcloud.serving.config import ServerConfig
from tests.integration.serving.conftest import RunningServer, run_serving_server
from tests.serving_models import (
    BuiltModel,
    make_onnx_mlp,
    make_python_predictor,
    make_sklearn_classifier,
    make_torchscript_mlp,
    make_xgboost_model,
)

MAX_BODY = 256 * 1024
NUMERIC = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")

# Python predictors written by the tests: an echo of every numeric datatype, a BYTES model, a two-input model.
ECHO = """
import numpy as np

TYPES = {types!r}


class Echo:
    def load(self):
        self.signature = {{
            "inputs": [{{"name": "in_" + t, "datatype": t, "shape": [-1, 3]}} for t in TYPES],
            "outputs": [{{"name": "out_" + t, "datatype": t, "shape": [-1, 3]}} for t in TYPES],
        }}

    def predict(self, batch):
        return {{"out_" + name[3:]: np.asarray(value) for name, value in batch.items()}}
"""

TEXT = """
import numpy as np


class Text:
    def load(self):
        self.signature = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [
                {"name": "upper", "datatype": "BYTES", "shape": [-1]},
                {"name": "length", "datatype": "INT32", "shape": [-1]},
            ],
        }

    def predict(self, batch):
        items = [bytes(v) for v in batch["text"].ravel()]
        upper = np.empty(len(items), dtype=object)
        upper[:] = [v.upper() for v in items]
        return {"upper": upper, "length": np.array([len(v) for v in items], dtype=np.int32)}
"""

ADDER = """
import numpy as np


class Adder:
    def load(self):
        self.signature = {
            "inputs": [
                {"name": "a", "datatype": "FP32", "shape": [-1, 2]},
                {"name": "b", "datatype": "INT64", "shape": [-1]},
            ],
            "outputs": [
                {"name": "sum", "datatype": "FP32", "shape": [-1, 2]},
                {"name": "twice", "datatype": "INT64", "shape": [-1]},
            ],
        }

    def predict(self, batch):
        return {"sum": batch["a"] + batch["b"][:, None].astype(np.float32), "twice": batch["b"] * 2}
"""


def write_predictor(directory: Path, source: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "predictor.py").write_text(textwrap.dedent(source))
    return directory


class Models:
    """The real models this module serves, by served name."""

    def __init__(self, root: Path) -> None:
        self.torch = make_torchscript_mlp(root / "torch_mlp" / "1", signature=True)
        self.onnx = make_onnx_mlp(root / "onnx_mlp")
        self.sklearn = make_sklearn_classifier(root / "sklearn_clf")
        self.xgb = make_xgboost_model(root / "xgb_clf")
        self.xgb_reg = make_xgboost_model(root / "xgb_reg", objective="reg:squarederror")
        self.doubler = make_python_predictor(root / "doubler")
        self.scratch = make_python_predictor(root / "scratch", factor=3.0)
        self.echo = write_predictor(root / "echo", ECHO.format(types=NUMERIC))
        self.text = write_predictor(root / "text", TEXT)
        self.adder = write_predictor(root / "adder", ADDER)

    def specs(self) -> list[dict[str, Any]]:
        return [
            {"name": "torch_mlp", "path": str(self.torch.path.parent.parent), "labels": {"stable": 1}},
            {"name": "onnx_mlp", "path": str(self.onnx.path)},
            {"name": "sklearn_clf", "path": str(self.sklearn.path)},
            {"name": "xgb_clf", "path": str(self.xgb.path)},
            {"name": "xgb_reg", "path": str(self.xgb_reg.path)},
            {"name": "doubler", "path": str(self.doubler.path)},
            {"name": "scratch", "path": str(self.scratch.path)},
            {"name": "echo", "path": str(self.echo)},
            {"name": "text", "path": str(self.text)},
            {"name": "adder", "path": str(self.adder)},
        ]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def server(models: Models) -> Iterator[RunningServer]:
    config = ServerConfig.model_validate(
        {
            "models": models.specs(),
            "root_path": "/serving",
            "max_body_bytes": MAX_BODY,
            "watch_interval": 0,
            "access_log": True,
        }
    )
    with run_serving_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.hostport, connection_timeout=60, network_timeout=60)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as session:
        yield session


def triton_inputs(arrays: dict[str, np.ndarray], *, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


def infer(
    client: httpclient.InferenceServerClient,
    model: str,
    arrays: dict[str, np.ndarray],
    outputs: list[str] | None = None,
    *,
    binary_in: bool = True,
    binary_out: bool = True,
    **kwargs: Any,
) -> httpclient.InferResult:
    requested = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in outputs] if outputs else None
    return client.infer(model, triton_inputs(arrays, binary=binary_in), outputs=requested, **kwargs)


def assert_matches(result: httpclient.InferResult, built: BuiltModel, inputs: dict[str, np.ndarray]) -> None:
    expected = built.reference(inputs)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got is not None, f"output {name} missing from {result.get_response()}"
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def check_still_serving(client: httpclient.InferenceServerClient, models: Models) -> None:
    """After a bad request, the server answers a good one correctly."""
    x = models.doubler.example
    assert_matches(infer(client, "doubler", x), models.doubler, x)


# --- real models, checked against the in-process result --------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize(
    ("model", "attr", "outputs"),
    [
        ("torch_mlp", "torch", ["output"]),
        ("onnx_mlp", "onnx", ["output"]),
        ("sklearn_clf", "sklearn", ["label", "probabilities"]),
        ("xgb_clf", "xgb", ["predictions"]),
        ("doubler", "doubler", ["y", "total"]),
    ],
)
def test_real_models_match_in_process_results(
    client: httpclient.InferenceServerClient, models: Models, model: str, attr: str, outputs: list[str], binary: bool
) -> None:
    built: BuiltModel = getattr(models, attr)
    result = infer(client, model, built.example, outputs, binary_in=binary, binary_out=binary)
    assert_matches(result, built, built.example)
    response = result.get_response()
    assert response["model_name"] == model
    assert response["model_version"] == "1"
    for output in response["outputs"]:
        assert ("binary_data_size" in output.get("parameters", {})) is binary
        assert ("data" in output) is not binary


def test_no_outputs_named_gives_all_of_them_and_sklearn_labels_keep_int64(
    client: httpclient.InferenceServerClient, http: httpx.Client, models: Models
) -> None:
    x = models.sklearn.example
    result = client.infer("sklearn_clf", triton_inputs(x))  # tritonclient then asks for binary_data_output
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["label", "probabilities"]
    assert all("binary_data_size" in o["parameters"] for o in response["outputs"])
    assert response["outputs"][0]["datatype"] == "INT64"
    assert_matches(result, models.sklearn, x)

    # a plain JSON request without outputs: every output, as JSON
    tensor = {"name": "input", "shape": list(x["input"].shape), "datatype": "FP64", "data": x["input"].tolist()}
    answer = http.post("/v2/models/sklearn_clf/infer", json={"inputs": [tensor]})
    assert answer.status_code == 200, answer.text
    label, probabilities = answer.json()["outputs"]
    expected = models.sklearn.reference(x)
    assert label["datatype"] == "INT64"
    assert label["data"] == expected["label"].tolist()
    np.testing.assert_allclose(np.reshape(probabilities["data"], probabilities["shape"]), expected["probabilities"])


def test_a_batch_of_one_row_and_a_larger_batch(client: httpclient.InferenceServerClient, models: Models) -> None:
    rng = np.random.default_rng(3)
    for rows in (1, 40):  # 40 > max_batch_size 32: runs alone, never split
        x = {"input": rng.standard_normal((rows, 16)).astype(np.float32)}
        assert_matches(infer(client, "onnx_mlp", x, ["output"]), models.onnx, x)


# --- tritonclient.http: server and model calls ----------------------------------------------------------


def test_server_live_ready_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    meta = client.get_server_metadata()
    assert meta["name"] == "dlcloud"
    assert isinstance(meta["version"], str) and meta["version"]
    assert {"binary_tensor_data", "model_repository"} <= set(meta["extensions"])


def test_model_metadata_ready_and_config(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("onnx_mlp")
    assert meta["name"] == "onnx_mlp"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]
    versioned = client.get_model_metadata("torch_mlp", model_version="1")
    assert versioned["name"] == "torch_mlp"
    assert versioned["platform"] == "pytorch_torchscript"
    assert versioned["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]

    assert client.is_model_ready("onnx_mlp") is True
    assert client.is_model_ready("torch_mlp", model_version="1") is True
    assert client.is_model_ready("torch_mlp", model_version="7") is False
    assert client.is_model_ready("no_such_model") is False

    config = client.get_model_config("sklearn_clf")
    assert config["name"] == "sklearn_clf"
    assert config["max_batch_size"] == 32
    assert config["input"][0]["name"] == "input"
    assert config["input"][0]["data_type"] == "TYPE_FP64"
    assert config["input"][0]["dims"] == [8]  # batch dimension left out, as Triton does
    assert [o["name"] for o in config["output"]] == ["label", "probabilities"]
    assert config["output"][1]["dims"] == [3]


def test_metadata_of_unknown_model_and_version_is_an_error(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as info:
        client.get_model_metadata("nope")
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException, match="has no version 9") as info:
        client.get_model_metadata("torch_mlp", model_version="9")
    assert info.value.status() == "404"


def test_versioned_infer_and_request_id(client: httpclient.InferenceServerClient, models: Models) -> None:
    x = models.torch.example
    result = infer(client, "torch_mlp", x, ["output"], model_version="1", request_id="req-42")
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["model_version"] == "1"
    assert_matches(result, models.torch, x)


def test_bytes_input_and_output_binary_and_json(client: httpclient.InferenceServerClient) -> None:
    words = np.array([b"hello", b"", "gr\u00fc\u00dfe".encode(), b"a b c"], dtype=object)
    for binary in (True, False):
        result = infer(client, "text", {"text": words}, ["upper", "length"], binary_in=binary, binary_out=binary)
        upper = result.as_numpy("upper")
        assert upper is not None
        # binary BYTES come back as bytes, JSON ones as str (UTF-8)
        assert [v if binary else v.encode() for v in upper] == [w.upper() for w in words]
        np.testing.assert_array_equal(result.as_numpy("length"), [5, 0, 7, 5])


def test_bytes_output_that_is_not_utf8_comes_back_binary_even_when_json_is_asked(
    client: httpclient.InferenceServerClient,
) -> None:
    raw = np.array([b"\xff\xfeab"], dtype=object)
    result = infer(client, "text", {"text": raw}, ["upper"], binary_out=False)
    upper = result.as_numpy("upper")
    assert upper is not None
    assert bytes(upper[0]) == b"\xff\xfeAB"


def _every_datatype(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    arrays: dict[str, np.ndarray] = {}
    for datatype in NUMERIC:
        if datatype == "BOOL":
            array = rng.integers(0, 2, (rows, 3)).astype(bool)
        elif datatype.startswith("FP"):
            array = rng.standard_normal((rows, 3)).astype(
                {"FP16": np.float16, "FP32": np.float32}.get(datatype, np.float64)
            )
        else:
            dtype = np.dtype(datatype.lower())
            info = np.iinfo(dtype)
            array = np.array([[info.min, info.max, 7]] * rows, dtype=dtype)  # the extremes of each type
        arrays[f"in_{datatype}"] = array
    return arrays


@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)])
def test_every_numeric_datatype_round_trips(
    client: httpclient.InferenceServerClient, binary_in: bool, binary_out: bool
) -> None:
    arrays = _every_datatype(2)
    result = infer(client, "echo", arrays, [f"out_{t}" for t in NUMERIC], binary_in=binary_in, binary_out=binary_out)
    for datatype in NUMERIC:
        sent = arrays[f"in_{datatype}"]
        got = result.as_numpy(f"out_{datatype}")
        assert got is not None
        assert got.dtype == sent.dtype, datatype
        np.testing.assert_array_equal(got, sent, err_msg=datatype)
    assert {o["datatype"] for o in result.get_response()["outputs"]} == set(NUMERIC)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client: httpclient.InferenceServerClient, models: Models, algorithm: str) -> None:
    x = models.onnx.example
    for binary in (True, False):
        result = infer(
            client,
            "onnx_mlp",
            x,
            ["output"],
            binary_in=binary,
            binary_out=binary,
            request_compression_algorithm=algorithm,
        )
        assert_matches(result, models.onnx, x)


def test_client_errors_unknown_model_and_wrong_shape(client: httpclient.InferenceServerClient, models: Models) -> None:
    with pytest.raises(InferenceServerException, match="unknown model 'missing'; models served: ") as info:
        infer(client, "missing", models.onnx.example)
    assert info.value.status() == "404"

    with pytest.raises(InferenceServerException, match="has no version 5") as info:
        infer(client, "onnx_mlp", models.onnx.example, model_version="5")
    assert info.value.status() == "404"

    wrong = {"input": np.zeros((2, 5), dtype=np.float32)}
    with pytest.raises(
        InferenceServerException, match=r"input 'input' must have shape \[-1, 16\], got \[2, 5\]"
    ) as info:
        infer(client, "onnx_mlp", wrong)
    assert info.value.status() == "400"

    with pytest.raises(InferenceServerException, match="input 'x' must be FP32, got BYTES") as info:
        infer(client, "doubler", {"x": np.array([[b"a"] * 4], dtype=object)})
    assert info.value.status() == "400"

    with pytest.raises(InferenceServerException, match="has no output 'nope'") as info:
        infer(client, "onnx_mlp", models.onnx.example, ["nope"])
    assert info.value.status() == "400"
    check_still_serving(client, models)


def test_triton_client_under_a_url_prefix(server: RunningServer, models: Models) -> None:
    prefixed = httpclient.InferenceServerClient(f"{server.hostport}/serving", connection_timeout=60, network_timeout=60)
    try:
        assert prefixed.is_server_live() is True
        assert prefixed.is_server_ready() is True
        assert prefixed.get_model_metadata("onnx_mlp")["name"] == "onnx_mlp"
        assert prefixed.is_model_ready("onnx_mlp") is True
        x = models.onnx.example
        assert_matches(infer(prefixed, "onnx_mlp", x, ["output"], request_compression_algorithm="gzip"), models.onnx, x)
        assert_matches(infer(prefixed, "onnx_mlp", x, ["output"], binary_in=False), models.onnx, x)
        assert any(row["name"] == "onnx_mlp" for row in prefixed.get_model_repository_index())
    finally:
        prefixed.close()


# --- repository extension -------------------------------------------------------------------------------


def test_repository_index_unload_and_load(client: httpclient.InferenceServerClient, models: Models) -> None:
    index = client.get_model_repository_index()
    rows = {row["name"]: row for row in index}
    assert set(rows) >= {"torch_mlp", "onnx_mlp", "sklearn_clf", "xgb_clf", "doubler", "scratch", "echo"}
    assert rows["scratch"]["state"] == "AVAILABLE"
    assert rows["scratch"]["version"] == "1"

    x = models.scratch.example
    assert_matches(infer(client, "scratch", x), models.scratch, x)
    client.unload_model("scratch")
    try:
        assert client.is_model_ready("scratch") is False
        assert client.is_server_ready() is True  # an explicitly unloaded model does not make the server unready
        with pytest.raises(InferenceServerException, match="no version ready to serve.*unloaded") as info:
            infer(client, "scratch", x)
        assert info.value.status() == "503"
        rows = {row["name"]: row for row in client.get_model_repository_index()}
        assert rows["scratch"]["state"] == "UNAVAILABLE"
    finally:
        client.load_model("scratch")
    assert client.is_model_ready("scratch") is True
    assert_matches(infer(client, "scratch", x), models.scratch, x)

    with pytest.raises(InferenceServerException, match="unknown model 'ghost'") as info:
        client.load_model("ghost")
    assert info.value.status() == "404"


def test_repository_load_with_a_body_that_is_not_an_object(http: httpx.Client) -> None:
    url = "/v2/repository/models/doubler/load"
    assert_error(http.post(url, content=b"[1]"), 400, "load request body must be a JSON object")
    assert_error(http.post(url, content=b'{"parameters": [1]}'), 400, "load request body must be a JSON object")
    assert_error(http.post(url, content=b"{bad"), 400, "load request body is not valid JSON")
    assert_error(
        http.post(url, json={"parameters": {"config": "{}"}}), 400, "override config or files is not supported"
    )
    assert http.post(url, json={"parameters": {"unknown": 1}}).status_code == 200  # same connection: still served
    assert http.get("/v2/models/doubler/ready").status_code == 200


# --- TF Serving REST ------------------------------------------------------------------------------------


def test_tfserving_row_and_columnar_with_one_input(http: httpx.Client, models: Models) -> None:
    x = models.onnx.example["input"]
    want = models.onnx.reference({"input": x})["output"]
    row = http.post("/v1/models/onnx_mlp:predict", json={"instances": x.tolist()})
    assert row.status_code == 200, row.text
    np.testing.assert_allclose(np.array(row.json()["predictions"]), want, rtol=1e-5, atol=1e-6)
    columnar = http.post("/v1/models/onnx_mlp:predict", json={"inputs": x.tolist()})
    assert columnar.status_code == 200, columnar.text
    np.testing.assert_allclose(np.array(columnar.json()["outputs"]), want, rtol=1e-5, atol=1e-6)
    named = http.post(
        "/v1/models/onnx_mlp:predict", json={"signature_name": "serving_default", "inputs": {"input": x.tolist()}}
    )
    assert named.status_code == 200, named.text
    np.testing.assert_allclose(np.array(named.json()["outputs"]), want, rtol=1e-5, atol=1e-6)


def test_tfserving_row_and_columnar_with_several_inputs(http: httpx.Client) -> None:
    a = [[1.0, 2.0], [3.0, 4.5]]
    b = [10, -1]
    row = http.post("/v1/models/adder:predict", json={"instances": [{"a": a[0], "b": b[0]}, {"a": a[1], "b": b[1]}]})
    assert row.status_code == 200, row.text
    assert row.json() == {"predictions": [{"sum": [11.0, 12.0], "twice": 20}, {"sum": [2.0, 3.5], "twice": -2}]}
    columnar = http.post("/v1/models/adder:predict", json={"inputs": {"a": a, "b": b}})
    assert columnar.status_code == 200, columnar.text
    assert columnar.json() == {"outputs": {"sum": [[11.0, 12.0], [2.0, 3.5]], "twice": [20, -2]}}


def test_tfserving_status_versions_labels_and_metadata(http: httpx.Client) -> None:
    expected = {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    for path in ("/v1/models/torch_mlp", "/v1/models/torch_mlp/versions/1", "/v1/models/torch_mlp/labels/stable"):
        answer = http.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.json() == expected, path

    meta = http.get("/v1/models/torch_mlp/metadata")
    assert meta.status_code == 200, meta.text
    doc = meta.json()
    assert doc["model_spec"] == {"name": "torch_mlp", "signature_name": "", "version": "1"}
    signature = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["input"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in signature["inputs"]["input"]["tensor_shape"]["dim"]] == ["-1", "16"]
    assert signature["outputs"]["output"]["dtype"] == "DT_FLOAT"
    assert http.get("/v1/models/torch_mlp/labels/stable/metadata").json()["model_spec"]["version"] == "1"

    for path, fragment in (
        ("/v1/models/torch_mlp/versions/4", "has no version 4"),
        ("/v1/models/torch_mlp/labels/canary", "has no label 'canary'; its labels are: stable"),
        ("/v1/models/nope", "unknown model 'nope'"),
    ):
        answer = http.get(path)
        assert answer.status_code == 404, (path, answer.text)
        assert fragment in answer.json()["error"]


def test_tfserving_predict_by_label_and_version(http: httpx.Client, models: Models) -> None:
    x = models.torch.example["input"]
    want = models.torch.reference({"input": x})["output"]
    for path in ("/v1/models/torch_mlp/labels/stable:predict", "/v1/models/torch_mlp/versions/1:predict"):
        answer = http.post(path, json={"instances": x.tolist()})
        assert answer.status_code == 200, (path, answer.text)
        np.testing.assert_allclose(np.array(answer.json()["predictions"]), want, rtol=1e-5, atol=1e-6)
    missing = http.post("/v1/models/torch_mlp/versions/3:predict", json={"instances": x.tolist()})
    assert missing.status_code == 404
    assert "has no version 3" in missing.json()["error"]


def test_tfserving_errors(http: httpx.Client, client: httpclient.InferenceServerClient, models: Models) -> None:
    unknown = http.post("/v1/models/ghost:predict", json={"instances": [[1.0]]})
    assert unknown.status_code == 404
    assert set(unknown.json()) == {"error"}
    assert "unknown model 'ghost'" in unknown.json()["error"]

    both = http.post("/v1/models/onnx_mlp:predict", json={"instances": [[0.0] * 16], "inputs": [[0.0] * 16]})
    assert both.status_code == 400
    assert both.json() == {"error": "use either 'instances' (row format) or 'inputs' (columnar format), not both"}

    for body, fragment in (
        ({"instances": [[0.0] * 3]}, "input 'input' must have shape [-1,16], got [1,3]"),
        ({"instances": [["a"] * 16]}, "input 'input' is FP32; data must be numbers, got strings"),
        ({"instances": [{"a": [1.0, 2.0]}]}, "lacks input 'b'"),
        ({"signature_name": "other", "instances": [[0.0] * 16]}, "signature 'other' not found"),
    ):
        model = "adder" if "lacks" in fragment else "onnx_mlp"
        answer = http.post(f"/v1/models/{model}:predict", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert fragment in answer.json()["error"]

    bad_json = http.post("/v1/models/onnx_mlp:predict", content=b"{not json")
    assert bad_json.status_code == 400
    assert "not valid JSON" in bad_json.json()["error"]
    unknown_method = http.post("/v1/models/onnx_mlp:explain", json={"instances": [[0.0] * 16]})
    assert unknown_method.status_code == 404
    assert "error" in unknown_method.json()
    check_still_serving(client, models)


def test_tfserving_classify_and_regress(http: httpx.Client, models: Models) -> None:
    x = models.onnx.example["input"][:3]
    scores = models.onnx.reference({"input": x})["output"]
    classify = http.post("/v1/models/onnx_mlp:classify", json={"examples": [{"input": row} for row in x.tolist()]})
    assert classify.status_code == 200, classify.text
    results = classify.json()["results"]
    assert [[label for label, _ in row] for row in results] == [["0", "1", "2", "3"]] * 3
    np.testing.assert_allclose([[s for _, s in row] for row in results], scores, rtol=1e-5, atol=1e-6)

    features = models.xgb_reg.example["input"][:4]
    want = models.xgb_reg.reference({"input": features})["predictions"]
    regress = http.post("/v1/models/xgb_reg:regress", json={"examples": [{"input": row} for row in features.tolist()]})
    assert regress.status_code == 200, regress.text
    np.testing.assert_allclose(regress.json()["results"], want, rtol=1e-5, atol=1e-6)

    two_outputs = http.post("/v1/models/adder:regress", json={"examples": [{"a": [1.0, 2.0], "b": 1}]})
    assert two_outputs.status_code == 400
    assert "need a model with one output" in two_outputs.json()["error"]


def test_tfserving_b64_bytes_input(http: httpx.Client) -> None:
    raw = b"\xff\x00ab"
    answer = http.post(
        "/v1/models/text:predict", json={"instances": [{"b64": base64.b64encode(raw).decode()}, "plain"]}
    )
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert predictions[0] == {"upper": {"b64": base64.b64encode(b"\xff\x00AB").decode()}, "length": 4}
    assert predictions[1] == {"upper": "PLAIN", "length": 5}
    columnar = http.post("/v1/models/text:predict", json={"inputs": [{"b64": base64.b64encode(b"xyz").decode()}]})
    assert columnar.status_code == 200, columnar.text
    assert columnar.json() == {"outputs": {"upper": ["XYZ"], "length": [3]}}


# --- bad input on the V2 endpoint, with raw bytes -------------------------------------------------------


def _v2_header(shape: list[int], size: int, datatype: str = "FP32") -> bytes:
    doc = {
        "inputs": [{"name": "input", "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}]
    }
    return json.dumps(doc).encode()


def assert_error(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    for fragment in fragments:
        assert fragment in body["error"], body["error"]


def test_malformed_binary_requests(
    http: httpx.Client, client: httpclient.InferenceServerClient, models: Models
) -> None:
    url = "/v2/models/onnx_mlp/infer"
    data = np.zeros((2, 16), dtype=np.float32).tobytes()

    header = _v2_header([2, 16], len(data))
    # sizes do not add up: the body carries more binary data than binary_data_size declares
    extra = http.post(
        url, content=header + data + b"\0" * 8, headers={"Inference-Header-Content-Length": str(len(header))}
    )
    assert_error(extra, 400, "add up to 128 bytes but the body carries 136 bytes")
    # ... and less
    short = http.post(url, content=header + data[:-4], headers={"Inference-Header-Content-Length": str(len(header))})
    assert_error(short, 400, "binary_data_size 128 reaches past the end of the body")
    # binary_data_size does not fit the shape
    wrong = _v2_header([2, 16], 64)
    mismatch = http.post(url, content=wrong + data[:64], headers={"Inference-Header-Content-Length": str(len(wrong))})
    assert_error(mismatch, 400, "shape [2,16] of FP32 needs 128 bytes, binary_data_size is 64")
    # the header length points past the body
    past = http.post(url, content=header + data, headers={"Inference-Header-Content-Length": "100000"})
    assert_error(past, 400, "Inference-Header-Content-Length is 100000 but the body has")
    # not a number
    nan = http.post(url, content=header + data, headers={"Inference-Header-Content-Length": "ten"})
    assert_error(nan, 400, "Inference-Header-Content-Length must be an integer")
    # binary data without the header that says where the JSON ends
    no_split = http.post(url, content=header + data)
    assert_error(no_split, 400, "request JSON is invalid")
    # the header length cuts the JSON
    cut = http.post(url, content=header + data, headers={"Inference-Header-Content-Length": str(len(header) - 5)})
    assert_error(cut, 400, "request JSON is invalid")

    good = http.post(url, content=header + data, headers={"Inference-Header-Content-Length": str(len(header))})
    assert good.status_code == 200, good.text
    assert good.headers["content-type"] == "application/json"  # no binary output was asked for
    assert good.json()["outputs"][0]["shape"] == [2, 4]
    check_still_serving(client, models)


def test_binary_bytes_with_a_huge_shape_is_refused_before_allocating(
    http: httpx.Client, client: httpclient.InferenceServerClient, models: Models
) -> None:
    header = json.dumps(
        {"inputs": [{"name": "text", "shape": [2**40], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}]}
    ).encode()
    answer = http.post(
        "/v2/models/text/infer",
        content=header + b"\x04\0\0\0abcd",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert_error(answer, 400, f"input 'text': binary BYTES data ends before element 1 of {2**40}")
    check_still_serving(client, models)


def test_a_request_without_rows_is_a_400(client: httpclient.InferenceServerClient, models: Models) -> None:
    x = {"input": models.xgb.example["input"][:0]}
    with pytest.raises(InferenceServerException, match="has no rows"):
        infer(client, "xgb_clf", x, ["predictions"])
    check_still_serving(client, models)


@pytest.mark.parametrize("rows", [1, 3])
def test_binary_inputs_at_any_offset_of_the_body(
    client: httpclient.InferenceServerClient, models: Models, rows: int
) -> None:
    """The JSON header has any length, so binary tensors start at any offset; XGBoost refuses unaligned data."""
    x = {"input": models.xgb.example["input"][:rows]}
    for request_id in ("", "a", "ab", "abc"):  # shifts the binary part by one byte each time
        result = infer(client, "xgb_clf", x, ["predictions"], request_id=request_id)
        predictions = result.as_numpy("predictions")
        assert predictions is not None
        assert predictions.shape[0] == rows
        np.testing.assert_allclose(predictions, models.xgb.reference(x)["predictions"], rtol=1e-5, atol=1e-6)


def test_raw_binary_body_for_a_single_input_model(http: httpx.Client, models: Models) -> None:
    x = models.onnx.example["input"]
    answer = http.post(
        "/v2/models/onnx_mlp/infer", content=x.tobytes(), headers={"Inference-Header-Content-Length": "0"}
    )
    assert answer.status_code == 200, answer.text
    header_length = int(answer.headers["inference-header-content-length"])
    doc = json.loads(answer.content[:header_length])
    (output,) = doc["outputs"]
    got = np.frombuffer(answer.content[header_length:], dtype="<f4").reshape(output["shape"])
    np.testing.assert_allclose(got, models.onnx.reference({"input": x})["output"], rtol=1e-5, atol=1e-6)


def test_invalid_json_and_bad_tensors(
    http: httpx.Client, client: httpclient.InferenceServerClient, models: Models
) -> None:
    url = "/v2/models/onnx_mlp/infer"
    assert_error(http.post(url, content=b'{"inputs": [}'), 400, "request JSON is invalid")
    assert_error(http.post(url, content=b"[1, 2]"), 400, "must be an object with an 'inputs' list")
    assert_error(http.post(url, content=b"{}"), 400, "non-empty 'inputs' list")
    assert_error(http.post(url, content=b""), 400, "request JSON is invalid")
    tensor = {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}
    for change, fragment in (
        ({"datatype": "FLOAT"}, "datatype must be one of"),
        ({"shape": [1, -16]}, "shape must be a list of non-negative integers"),
        ({"data": [0.0] * 15}, "shape [1,16] needs 16 values, got 15"),
        ({"data": ["x"] * 16}, "data must be numbers, got strings"),
        ({"datatype": "INT32", "data": [0.5] * 16}, "data must be whole numbers"),
        ({"datatype": "FP64"}, ""),  # FP64 is narrowed to the model's FP32: not an error
    ):
        answer = http.post(url, json={"inputs": [{**tensor, **change}]})
        if fragment:
            assert_error(answer, 400, fragment)
        else:
            assert answer.status_code == 200, answer.text
    text = {**tensor, "datatype": "BYTES", "data": ["a"] * 16}
    assert_error(http.post(url, json={"inputs": [text]}), 400, "input 'input' must be FP32, got BYTES")
    assert_error(
        http.post(url, json={"inputs": [tensor, {**tensor, "name": "extra"}]}), 400, "unexpected input 'extra'"
    )
    assert_error(http.post(url, json={"inputs": [{**tensor, "name": "wrong"}]}), 400, "missing input 'input'")
    check_still_serving(client, models)


def test_oversize_body_and_unsupported_encoding(
    http: httpx.Client, client: httpclient.InferenceServerClient, models: Models
) -> None:
    url = "/v2/models/onnx_mlp/infer"
    big = b'{"inputs": [' + b" " * (MAX_BODY + 10) + b"]}"
    assert_error(http.post(url, content=big), 413, f"the limit is {MAX_BODY} bytes")
    assert_error(http.post("/v1/models/onnx_mlp:predict", content=big), 413, f"the limit is {MAX_BODY} bytes")
    # small on the wire, too large once inflated
    bomb = gzip.compress(b" " * (MAX_BODY * 4))
    assert_error(http.post(url, content=bomb, headers={"Content-Encoding": "gzip"}), 413, "exceeds the limit")

    tensor = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]})
    brotli = http.post(url, content=tensor.encode(), headers={"Content-Encoding": "br"})
    assert_error(brotli, 415, "Content-Encoding 'br' is not supported; use gzip, deflate or identity")
    corrupt = http.post(url, content=b"\x1f\x8b not gzip", headers={"Content-Encoding": "gzip"})
    assert_error(corrupt, 400, "not valid gzip data")
    deflated = http.post(url, content=zlib.compress(tensor.encode()), headers={"Content-Encoding": "deflate"})
    assert deflated.status_code == 200, deflated.text
    check_still_serving(client, models)


def test_bad_version_and_routes(http: httpx.Client, client: httpclient.InferenceServerClient, models: Models) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
    assert_error(http.post("/v2/models/doubler/versions/abc/infer", json=body), 400, "positive integer")
    assert_error(http.post("/v2/models/doubler/versions/2/infer", json=body), 404, "has no version 2")
    assert_error(http.get("/v2/nothing/here"), 404, "no route for GET /v2/nothing/here")
    assert_error(http.get("/v2/models/doubler/infer"), 405, "GET is not allowed")
    check_still_serving(client, models)


# --- health, metrics, access log ------------------------------------------------------------------------


def test_health_codes_are_exactly_200(http: httpx.Client) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/onnx_mlp/ready", "/serving/v2/health/ready"):
        assert http.get(path).status_code == 200, path
    assert http.get("/v2/models/ghost/ready").status_code == 404


def test_metrics_after_requests(http: httpx.Client, client: httpclient.InferenceServerClient, models: Models) -> None:
    for _ in range(3):
        infer(client, "xgb_clf", models.xgb.example)
    http.post("/v1/models/xgb_clf:predict", json={"instances": models.xgb.example["input"].tolist()})
    with pytest.raises(InferenceServerException):
        infer(client, "xgb_clf", {"input": np.zeros((1, 2), dtype=np.float32)})
    text = http.get("/metrics").text
    samples = _samples(text)
    assert samples[("dlcloud_serving_requests_total", 'code="200",model="xgb_clf",protocol="v2",version="1"')] >= 3
    assert (
        samples[("dlcloud_serving_requests_total", 'code="200",model="xgb_clf",protocol="tfserving",version="1"')] >= 1
    )
    assert (
        samples[("dlcloud_serving_request_errors_total", 'code="400",model="xgb_clf",protocol="v2",version="1"')] >= 1
    )
    assert samples[("dlcloud_serving_request_duration_seconds_count", 'model="xgb_clf",version="1"')] >= 4
    assert samples[("dlcloud_serving_batch_size_count", 'model="xgb_clf",version="1"')] >= 4
    assert samples[("dlcloud_serving_batch_size_sum", 'model="xgb_clf",version="1"')] >= 4 * 9
    assert samples[("dlcloud_serving_queue_depth", 'model="xgb_clf",version="1"')] == 0
    assert ("dlcloud_serving_inflight_requests", 'model="xgb_clf",version="1"') in samples
    assert "# TYPE dlcloud_serving_request_duration_seconds histogram" in text
    assert "# TYPE dlcloud_serving_batch_size histogram" in text


def test_metrics_take_no_labels_from_unknown_models_or_versions(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
    for i in range(3):
        assert http.post(f"/v2/models/random-{i}/infer", json=body).status_code == 404
        assert http.post(f"/v2/models/doubler/versions/{900 + i}/infer", json=body).status_code == 404
        assert http.post(f"/v1/models/random-{i}:predict", json={"instances": [[1.0] * 4]}).status_code == 404
    text = http.get("/metrics").text
    assert "random-" not in text
    assert 'version="90' not in text
    samples = _samples(text)
    assert samples[("dlcloud_serving_request_errors_total", 'code="404",model="",protocol="v2",version=""')] >= 3
    assert samples[("dlcloud_serving_request_errors_total", 'code="404",model="doubler",protocol="v2",version=""')] >= 3
    assert samples[("dlcloud_serving_request_errors_total", 'code="404",model="",protocol="tfserving",version=""')] >= 3


def _samples(text: str) -> dict[tuple[str, str], float]:
    """Prometheus text -> {(metric, sorted labels): value}."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = sorted(p for p in labels.rstrip("}").split(",") if p)
        out[(name, ",".join(pairs))] = float(value)
    return out


def test_access_log_has_one_json_line_per_request(
    http: httpx.Client,
    client: httpclient.InferenceServerClient,
    models: Models,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger("dlcloud.serving.access"), "propagate", True)
    caplog.set_level(logging.INFO, logger="dlcloud.serving.access")
    infer(client, "doubler", models.doubler.example, request_id="log-1")
    http.post("/v1/models/doubler:predict", json={"instances": models.doubler.example["x"].tolist()})
    http.post("/v2/models/ghost/infer", json={"inputs": []})
    http.get("/v2/health/ready")  # health checks are not logged
    records = [r for r in caplog.records if r.name == "dlcloud.serving.access"]
    lines = [json.loads(r.getMessage()) for r in records]
    assert [(line["method"], line["path"], line["status"], line["protocol"]) for line in lines] == [
        ("POST", "/v2/models/doubler/infer", 200, "v2"),
        ("POST", "/v1/models/doubler:predict", 200, "tfserving"),
        ("POST", "/v2/models/ghost/infer", 404, "v2"),
    ]
    assert lines[0]["model"] == "doubler" and lines[0]["version"] == "1"
    assert all(isinstance(line["ms"], float) and line["ms"] >= 0 for line in lines)
    assert all(line["client"].startswith("127.0.0.1:") for line in lines)


# --- a server with a broken model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broken_server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    broken = tmp_path_factory.mktemp("broken") / "model.onnx"
    broken.write_bytes(b"this is not an onnx model")
    config = ServerConfig.model_validate(
        {
            "models": [{"name": "good", "path": str(models.doubler.path)}, {"name": "bad", "path": str(broken)}],
            "watch_interval": 0,
        }
    )
    with run_serving_server(config, wait_ready=False) as running:
        yield running


def test_broken_model_makes_server_and_model_not_ready(broken_server: RunningServer, models: Models) -> None:
    with httpx.Client(base_url=broken_server.url, timeout=60) as http:
        assert http.get("/v2/health/live").status_code == 200
        assert http.get("/v2/health/ready").status_code == 503
        assert http.get("/v2/models/bad/ready").status_code == 503
        assert http.get("/v2/models/good/ready").status_code == 200
        status = http.get("/v1/models/bad")
        assert status.status_code == 200
        (entry,) = status.json()["model_version_status"]
        assert entry["state"] == "END"
        assert entry["status"]["error_code"] == "UNKNOWN"
        assert entry["status"]["error_message"]
    triton = httpclient.InferenceServerClient(broken_server.hostport, connection_timeout=60, network_timeout=60)
    try:
        assert triton.is_server_live() is True
        assert triton.is_server_ready() is False
        assert triton.is_model_ready("bad") is False
        assert triton.is_model_ready("good") is True
        with pytest.raises(InferenceServerException, match="failed to load") as info:
            triton.infer("bad", triton_inputs({"input": np.zeros((1, 16), dtype=np.float32)}))
        assert info.value.status() == "503"
        x = models.doubler.example
        assert_matches(infer(triton, "good", x), models.doubler, x)
    finally:
        triton.close()
