"""No-code template jobs on a real platform (docs/templates.md): submit checks the template and its hparams
(400 naming what is allowed); a template job runs the platform's trainer on a dataset version, reports its
metrics each epoch, exports TorchScript, and the platform registers it when the job succeeds; the registered
version answers like the training process did. ``hparams`` of a plain job reach it as DLCLOUD_HPARAMS and
``--name=value`` arguments. On SQLite and PostgreSQL.

The jobs run ``python -m dlcloud.templates.train``: the executor's jobs get PYTHONPATH pointing at the dlcloud
these tests import, so the trainer the job runs is the one under test (a worktree's, not an installed one)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import dlcloud
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.local.runner import BASE_ENV_VARS
from dlcloud.templates.data import load
from dlcloud.templates.train import prepare
from tests.conftest import Env, assert_api_error, build_env, control_running, make_settings, wait_for
from tests.integration.test_metrics import api_server
from tests.unit.templates.test_template_trainer import dense_csv

API = "/api/v1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
SOURCE = str(Path(dlcloud.__file__).resolve().parents[1])  # where this dlcloud is imported from


@pytest.fixture
def template_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """``running_env`` whose jobs import the dlcloud under test, with the API reachable for their metrics."""
    base = {k: os.environ[k] for k in BASE_ENV_VARS if k in os.environ}
    e = build_env(make_settings(tmp_path, db_url), LocalExecutor(base_env={**base, "PYTHONPATH": SOURCE}))
    with control_running(e), api_server(e):
        yield e


def _ended(client, name: str) -> dict:
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=180, what=f"job {name} to end"
    )


def _event(client, name: str, fragment: str) -> str:
    def find() -> str | None:
        return next((e.reason for e in client.jobs.get(name).events if fragment in e.reason), None)

    return wait_for(find, timeout=120, what=f"an event of job {name} saying {fragment!r}")


def test_template_job_trains_reports_exports_and_is_registered(template_env: Env, tmp_path: Path) -> None:
    c = template_env.admin
    data = dense_csv(tmp_path / "train.csv", n=200)
    assert c.datasets.push("blobs", path=data).version == 1
    spec = {
        "name": "tpl",
        "template": {"name": "mlp", "data": "blobs@1", "label": "y"},
        "hparams": {"epochs": 12, "units": 16, "lr": 0.02},
        "register_model": {"name": "blobs-mlp"},
    }
    job = c.jobs.submit(spec)
    assert job.command.startswith("python -m dlcloud.templates.train --template mlp --data=")
    ended = _ended(c, "tpl")
    logs = "".join(line.text + "\n" for line in c.jobs.logs("tpl"))
    assert ended.state == "SUCCEEDED", logs
    assert '"units": 16' in logs  # DLCLOUD_HPARAMS: the given ones over the template's defaults
    assert "160 training and 40 validation examples, 4 features, csv train.csv, 2 classes" in logs

    reason = _event(c, "tpl", "model blobs-mlp")
    assert reason == "model blobs-mlp version 1 registered from model", reason

    # metrics, each epoch and the best epoch's
    series = {s.metric: s for s in c.jobs.metrics("tpl").series}
    assert {"loss", "val_loss", "accuracy", "val_accuracy", "best_val_accuracy", "best_epoch"} <= set(series)
    assert [p.step for p in series["val_loss"].points][:3] == [1, 2, 3]
    best_val_accuracy = series["best_val_accuracy"].points[-1].value
    assert best_val_accuracy >= 0.85

    version = c.models.version("blobs-mlp", 1)
    assert version.format == "torchscript"
    assert (version.source_job, version.source_path) == ("tpl", "model")
    assert version.metrics["best_val_accuracy"] == pytest.approx(best_val_accuracy)
    assert version.signature["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]

    # the registered model answers like the training process: its accuracy on the very validation rows the
    # trainer held out (same seed, same split) is the one the job reported
    artifact = c.models.download("blobs-mlp", 1, dest=tmp_path / "dl")
    from dlcloud.serving.loaders import load_predictor

    predictor = load_predictor(artifact, "torchscript")
    predictor.load()
    try:
        held_out = prepare(load(data, "csv", label="y"), "classification", 0.2, seed=0)
        outputs = predictor.predict({"features": held_out.x_val})
    finally:
        predictor.unload()
    assert set(outputs) == {"probabilities", "class"}
    accuracy = float(np.mean(outputs["class"] == held_out.y_val))
    assert accuracy == pytest.approx(best_val_accuracy)
    assert json.loads((artifact / "classes.json").read_text()) == ["neg", "pos"]


def test_a_failing_template_job_names_the_line_and_registers_nothing(template_env: Env, tmp_path: Path) -> None:
    c = template_env.admin
    (tmp_path / "bad.csv").write_text("a,b,y\n1,2,0\n3,4\n")
    c.datasets.push("bad", path=tmp_path / "bad.csv")
    c.jobs.submit({"name": "bad", "template": {"name": "logreg", "data": "bad"}, "register_model": {"name": "m"}})
    assert _ended(c, "bad").state == "FAILED"
    logs = "".join(line.text + "\n" for line in c.jobs.logs("bad"))
    assert "error: bad.csv line 3: 2 columns, the header has 3" in logs
    assert not any("model m" in e.reason for e in c.jobs.get("bad").events)
    assert c.models.list() == []


def test_plain_job_gets_hparams_as_env_and_arguments(template_env: Env) -> None:
    c = template_env.admin
    script = "import json, os, sys; print('HP', os.environ['DLCLOUD_HPARAMS'], sys.argv[1:])"
    c.jobs.submit(
        {
            "name": "hp",
            "command": f'python -c "{script}"',
            "hparams": {"lr": 0.1, "units": 8, "wide": True, "act": "relu"},
            "hparams_as_args": True,
        }
    )
    assert _ended(c, "hp").state == "SUCCEEDED"
    line = next(line.text for line in c.jobs.logs("hp") if line.text.startswith("HP "))
    assert json.loads(line.split(" ", 1)[1].rsplit(" [", 1)[0]) == {"act": "relu", "lr": 0.1, "units": 8, "wide": True}
    assert line.endswith("['--lr=0.1', '--units=8', '--wide=true', '--act=relu']")


def test_plain_job_registers_its_output_when_it_succeeds(template_env: Env) -> None:
    c = template_env.admin
    c.jobs.submit(
        {
            "name": "onnxish",
            "command": 'printf x > "$DLCLOUD_OUTPUT_DIR/weights.onnx"',
            "register_model": {"name": "plain", "path": "weights.onnx"},
        }
    )
    assert _ended(c, "onnxish").state == "SUCCEEDED"
    assert _event(c, "onnxish", "model plain") == "model plain version 1 registered from weights.onnx"
    assert c.models.version("plain", 1).format == "onnx"
    c.jobs.submit(
        {
            "name": "nothing",
            "command": 'printf x > "$DLCLOUD_OUTPUT_DIR/other"',
            "register_model": {"name": "plain", "path": "missing.onnx"},
        }
    )
    reason = _event(c, "nothing", "model plain")
    assert reason == "model plain not registered: no file or directory 'missing.onnx' in the outputs of job 'nothing'"


@pytest.mark.parametrize(
    ("spec", "status", "code", "fragment"),
    [
        ({"template": {"name": "resnet", "data": "d"}}, 400, "invalid_spec", "templates: mlp, logreg, wide-deep"),
        (
            {"template": {"name": "mlp", "data": "d"}, "hparams": {"layers": 17}},
            400,
            "invalid_spec",
            "hparam layers must be int 1..16, got 17",
        ),
        (
            {"template": {"name": "logreg", "data": "d"}, "hparams": {"units": 3}},
            400,
            "invalid_spec",
            "template logreg has no hparam units; its hparams are: lr, epochs",
        ),
        ({"template": {"name": "cnn2d", "data": "d"}}, 400, "invalid_spec", "template cnn2d needs hparam height"),
        (
            {"template": {"name": "mlp", "data": "d"}, "hparams": {"lr": -1}},
            400,
            "invalid_spec",
            "hparam lr must be number > 0, ≤ 10, got -1",
        ),
        ({"template": {"name": "mlp", "data": "nosuch"}}, 404, "dataset_not_found", "nosuch"),
        (
            {"template": {"name": "mlp", "data": "d"}, "command": "x"},
            422,
            "validation_error",
            "leave 'command' and 'module' out",
        ),
        (
            {"template": {"name": "mlp", "data": "d", "validation_split": 0.95}},
            422,
            "validation_error",
            "validation_split",
        ),
        (
            {"command": "true", "register_model": {"name": "m"}},
            422,
            "validation_error",
            "register_model.path is required",
        ),
        (
            {"command": "true", "register_model": {"name": "m", "path": "out/model"}},
            400,
            "invalid_spec",
            "register_model.format is needed",
        ),
        (
            {"command": "true", "register_model": {"name": "m", "path": "a.pt", "signature": {"inputs": 3}}},
            400,
            "invalid_signature",
            "signature.inputs must be a list",
        ),
        ({"command": "true", "hparams": {"bad name": 1}}, 422, "validation_error", "hparams"),
    ],
)
def test_submit_refuses_bad_template_specs(env: Env, spec: dict, status: int, code: str, fragment: str) -> None:
    env.admin.datasets.push("d", path=Path(__file__))
    resp = env.signed(env.admin_creds, "POST", f"{API}/jobs", {"name": "t", **spec})
    assert_api_error(resp, status, code, fragment)


def test_cli_pushes_a_local_data_file_as_a_dataset_named_after_the_job(env: Env, tmp_path: Path) -> None:
    from dlcloud.cli.jobs import _parse_hparams, upload_template_data

    c = env.admin
    data = dense_csv(tmp_path / "train.csv", n=20)
    section = upload_template_data(c, {"name": "mlp", "data": "train.csv", "label": "y"}, "churn", tmp_path)
    assert section == {"name": "mlp", "data": "churn@1", "path": "train.csv", "label": "y"}
    assert [f.path for f in c.datasets.files("churn", 1)] == ["train.csv"]
    assert upload_template_data(c, {"name": "mlp", "data": str(data)}, "churn", Path("/"))["data"] == "churn@2"
    # a dataset reference is kept, REF:PATH names one file of it
    assert upload_template_data(c, {"data": "clicks@3:part/0.svm"}, "x", tmp_path) == {
        "data": "clicks@3",
        "path": "part/0.svm",
    }
    assert _parse_hparams(["layers=3", "lr=1e-3", "wide=true", "act=relu", "tag=007"]) == {
        "layers": 3,
        "lr": 0.001,
        "wide": True,
        "act": "relu",
        "tag": "007",
    }
    job = c.jobs.submit(
        {"name": "churn", "template": section, "hparams": {"layers": 3}, "register_model": {"name": "churn"}}
    )
    detail = c.jobs.get("churn")
    assert detail.spec["register_model"] == {  # the user's, as given
        "name": "churn",
        "path": None,
        "format": None,
        "signature": None,
        "description": "",
    }
    assert detail.resolved.register_model is not None
    assert detail.resolved.register_model.model_dump() == {  # completed at submit
        "name": "churn",
        "path": "model",
        "format": "torchscript",
        "signature": None,
        "description": "",
    }
    assert [d.name for d in detail.resolved.datasets] == ["churn"]
    assert '--data="${DLCLOUD_DATASET_CHURN}" --path train.csv --label y' in job.command
