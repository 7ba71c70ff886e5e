"""``dlcloud serve`` as a user runs it: a subprocess on a free port, driven by ``tritonclient``, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from tests.e2e.conftest import dlcloud_serve
from tests.serving_models import BuiltModel, make_python_predictor, make_sklearn_classifier

pytestmark = pytest.mark.e2e


def _infer(client: httpclient.InferenceServerClient, model: str, built: BuiltModel) -> None:
    inputs = []
    for name, array in built.example.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs, request_id=f"e2e-{model}")
    assert result.get_response()["id"] == f"e2e-{model}"
    for name, want in built.reference(built.example).items():
        np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-6, atol=1e-6)


def test_dlcloud_serve_answers_tritonclient_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    doubler = make_python_predictor(tmp_path / "models" / "doubler")
    classifier = make_sklearn_classifier(tmp_path / "models" / "clf")
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")} | {"COLUMNS": "200"}
    args = ["-m", f"doubler={doubler.path}", "-m", f"clf={classifier.path}:sklearn"]
    args += ["--watch-interval", "0", "--max-queue-delay", "0"]
    with dlcloud_serve(args, env, log) as serve:
        client = httpclient.InferenceServerClient(serve.hostport, connection_timeout=60, network_timeout=60)
        try:
            assert client.is_server_live() is True
            assert client.is_model_ready("doubler") is True
            assert client.get_model_metadata("clf")["platform"] == "sklearn"
            _infer(client, "doubler", doubler)
            _infer(client, "clf", classifier)
        finally:
            client.close()

        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0

    output = serve.output()
    assert f"serving doubler, clf at {serve.url}" in output
    access = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [(a["path"], a["status"]) for a in access] == [
        ("/v2/models/doubler/infer", 200),
        ("/v2/models/clf/infer", 200),
    ]
    assert "Traceback" not in output
