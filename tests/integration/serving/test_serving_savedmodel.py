"""A TensorFlow SavedModel through the real server: ``tritonclient.http`` and TF Serving REST.

Kept apart from ``test_serving_protocols.py`` because importing TensorFlow takes several seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from dlcloud.serving.config import ServerConfig
from tests.integration.serving.conftest import RunningServer, run_serving_server
from tests.serving_models import BuiltModel, make_savedmodel


@pytest.fixture(scope="module")
def savedmodel(tmp_path_factory: pytest.TempPathFactory) -> BuiltModel:
    return make_savedmodel(tmp_path_factory.mktemp("savedmodel") / "linear" / "1", in_features=8, classes=3)


@pytest.fixture(scope="module")
def server(savedmodel: BuiltModel) -> Iterator[RunningServer]:
    config = ServerConfig.model_validate(
        {
            "models": [{"name": "linear", "path": str(savedmodel.path.parent), "labels": {"stable": 1}}],
            "watch_interval": 0,
        }
    )
    with run_serving_server(config) as running:
        yield running


def test_savedmodel_through_tritonclient(server: RunningServer, savedmodel: BuiltModel) -> None:
    x = savedmodel.example["x"]
    expected = savedmodel.reference({"x": x})
    client = httpclient.InferenceServerClient(server.hostport, connection_timeout=60, network_timeout=60)
    try:
        meta = client.get_model_metadata("linear", model_version="1")
        assert meta["platform"] == "tensorflow_savedmodel"
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
        assert {(o["name"], o["datatype"]) for o in meta["outputs"]} == {("scores", "FP32"), ("label", "INT64")}
        for binary in (True, False):
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("scores", "label")]
            result = client.infer("linear", [tensor], outputs=outputs, model_version="1")
            np.testing.assert_allclose(result.as_numpy("scores"), expected["scores"], rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])
    finally:
        client.close()


def test_savedmodel_through_tfserving_rest(server: RunningServer, savedmodel: BuiltModel) -> None:
    x = savedmodel.example["x"]
    expected = savedmodel.reference({"x": x})
    with httpx.Client(base_url=server.url, timeout=60) as http:
        status = http.get("/v1/models/linear/labels/stable")
        assert status.status_code == 200, status.text
        assert status.json()["model_version_status"][0]["state"] == "AVAILABLE"
        meta = http.get("/v1/models/linear/metadata").json()
        signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert signature["inputs"]["x"]["dtype"] == "DT_FLOAT"
        assert signature["outputs"]["label"]["dtype"] == "DT_INT64"

        row = http.post("/v1/models/linear/versions/1:predict", json={"instances": x.tolist()})
        assert row.status_code == 200, row.text
        predictions = row.json()["predictions"]
        np.testing.assert_allclose([p["scores"] for p in predictions], expected["scores"], rtol=1e-5, atol=1e-6)
        assert [p["label"] for p in predictions] == expected["label"].tolist()

        columnar = http.post("/v1/models/linear/labels/stable:predict", json={"inputs": {"x": x.tolist()}})
        assert columnar.status_code == 200, columnar.text
        outputs = columnar.json()["outputs"]
        np.testing.assert_allclose(outputs["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
        assert outputs["label"] == expected["label"].tolist()

        wrong = http.post("/v1/models/linear:predict", json={"instances": [[1.0, 2.0]]})
        assert wrong.status_code == 400
        assert "input 'x' must have shape [-1,8], got [1,2]" in wrong.json()["error"]
