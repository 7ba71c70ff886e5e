"""No code from data to an online model: ``dlcloud jobs submit --template mlp --data train.csv --register-model``
on a real ``dlcloud up`` (sandboxed job, dataset pushed by the CLI), then ``dlcloud serve --registry`` serves the
registered TorchScript export, and ``tritonclient`` asks it for the validation rows the trainer held out: the
served model's accuracy is the one the job reported (docs/templates.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlcloud.templates.data import load
from dlcloud.templates.train import prepare
from tests.conftest import wait_for
from tests.e2e.conftest import Server, dlcloud_serve
from tests.unit.templates.test_template_trainer import dense_csv, sparse_libsvm

pytestmark = pytest.mark.e2e

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


def _train(server: Server, name: str, data: Path, *args: str) -> float:
    """Train template mlp on ``data`` through the CLI, registered as model ``name``; the best val_accuracy."""
    server.cli(
        "jobs", "submit", "--name", name, "--template", "mlp", "--data", str(data), *args,
        "--hparam", "epochs=12", "--hparam", "units=16", "--hparam", "lr=0.02", "--register-model", name,
    )  # fmt: skip
    job = wait_for(
        lambda: (j := server.cli_json("jobs", "describe", name))["state"] in TERMINAL and j,
        timeout=180,
        what=f"job {name} to end",
    )
    assert isinstance(job, dict) and job["state"] == "SUCCEEDED", (job.get("reason"), server.cli("jobs", "logs", name))
    # the control loop registers the model after the job's end
    wait_for(
        lambda: any(
            f"model {name} version 1 registered" in e["reason"]
            for e in server.cli_json("jobs", "describe", name)["events"]
        ),  # type: ignore[index]
        timeout=60,
        what=f"model {name} to be registered",
    )
    got = server.cli_json("jobs", "metrics", name, "-o", "json")
    assert isinstance(got, dict)
    series = {s["metric"]: s for s in got["series"]}
    return float(series["best_val_accuracy"]["points"][-1]["value"])


@pytest.mark.parametrize("fmt", ["csv", "libsvm"])
def test_a_template_model_is_served_and_answers_like_its_training_run(server: Server, tmp_path: Path, fmt: str) -> None:
    import tritonclient.http as triton

    if fmt == "csv":
        data, extra, table = dense_csv(tmp_path / "train.csv", n=200), ["--label", "y"], {"label": "y"}
    else:
        data, extra, table = sparse_libsvm(tmp_path / "train.libsvm", n=200), [], {}
    name = f"tpl-{fmt}"
    reported = _train(server, name, data, *extra)
    assert reported >= 0.85  # separable data: the stated accuracy of docs/templates.md

    held_out = prepare(load(data, fmt, **table), "classification", 0.2, seed=0)  # the trainer's split and seed
    args = ["--registry", name, "--cache-dir", str(tmp_path / "cache")]
    with dlcloud_serve(args, server.env, tmp_path / "serve.log") as serve:
        client = triton.InferenceServerClient(serve.hostport)
        try:
            features = held_out.x_val.astype(np.float32)
            inp = triton.InferInput("features", list(features.shape), "FP32")
            inp.set_data_from_numpy(features, binary_data=True)
            result = client.infer(name, [inp])
            assert result.get_response()["model_version"] == "1"
            classes = result.as_numpy("class")
            probabilities = result.as_numpy("probabilities")
            metadata = client.get_model_metadata(name)
        finally:
            client.close()
    assert probabilities.shape == (len(features), 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert [i["name"] for i in metadata["inputs"]] == ["features"]
    accuracy = float(np.mean(classes == held_out.y_val))
    assert accuracy == pytest.approx(reported)
