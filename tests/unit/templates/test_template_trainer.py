"""The template trainer on separable synthetic data: dense CSV and sparse LibSVM reach the stated accuracy,
the export answers like the trained network, bad input exits 2 naming the problem. Seconds, on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dlcloud.templates.data import load
from dlcloud.templates.train import main, prepare, train

torch = pytest.importorskip("torch")


def dense_csv(path: Path, n: int = 300, seed: int = 0) -> Path:
    """Two classes split by the plane a + b = 0, with two noise columns."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = np.where(x[:, 0] + x[:, 1] > 0, "pos", "neg")
    rows = [f"{r[0]:.5f},{r[1]:.5f},{r[2]:.5f},{c},{r[3]:.5f}" for r, c in zip(x, y, strict=True)]
    lines = ["a,b,noise1,y,noise2", *rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def sparse_libsvm(path: Path, n: int = 300, seed: int = 0) -> Path:
    """Class +1 uses features 1-20, class -1 features 21-40; 4 non-zeros per row."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        positive = i % 2 == 0
        base = 1 if positive else 21
        idx = sorted(rng.choice(20, size=4, replace=False) + base)
        lines.append(("+1" if positive else "-1") + " " + " ".join(f"{j}:{rng.uniform(0.5, 1.5):.3f}" for j in idx))
    path.write_text("\n".join(lines) + "\n")
    return path


def _accuracy(model_dir: Path, features: np.ndarray, labels: list[str]) -> float:
    model = torch.jit.load(str(model_dir / "model.pt"))
    classes = json.loads((model_dir / "classes.json").read_text())
    _, predicted = model(torch.from_numpy(features))
    return float(np.mean([classes[int(p)] == y for p, y in zip(predicted, labels, strict=True)]))


def test_dense_csv_mlp_reaches_95_percent(tmp_path: Path) -> None:
    table = load(dense_csv(tmp_path / "train.csv"), "csv", label="y")
    data = prepare(table, "classification", 0.2, seed=0)
    hparams = {
        "layers": 2,
        "units": 32,
        "activation": "relu",
        "dropout": 0.0,
        "lr": 0.01,
        "epochs": 30,
        "batch_size": 32,
        "patience": 5,
        "optimizer": "adam",
        "weight_decay": 0.0,
    }
    metrics = train("mlp", hparams, data, "classification", 0, tmp_path / "out", log=lambda _m: None)
    assert metrics["val_accuracy"] >= 0.95, metrics
    # the export answers like the network did: same accuracy on the held-out rows, probabilities summing to 1
    exported = tmp_path / "out" / "model"
    held_out = [data.classes[i] for i in data.y_val]
    assert _accuracy(exported, data.x_val, held_out) == pytest.approx(metrics["val_accuracy"])
    probabilities, _ = torch.jit.load(str(exported / "model.pt"))(torch.from_numpy(data.x_val))
    np.testing.assert_allclose(probabilities.sum(dim=1).numpy(), 1.0, rtol=1e-5)
    signature = json.loads((exported / "signature.json").read_text())
    assert signature["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in signature["outputs"]] == ["probabilities", "class"]
    assert json.loads((exported / "classes.json").read_text()) == ["neg", "pos"]


def test_sparse_libsvm_logreg_reaches_95_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = sparse_libsvm(tmp_path / "train.libsvm")
    code = main(
        [
            "--template",
            "logreg",
            "--data",
            str(path),
            "--output",
            str(tmp_path / "out"),
            "--hparams",
            json.dumps({"lr": 0.1, "epochs": 15}),
        ]
    )
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "240 training and 60 validation examples, 40 features, libsvm train.libsvm, 2 classes" in out
    table = load(path, "libsvm")
    assert _accuracy(tmp_path / "out" / "model", table.features, table.labels) >= 0.95
    assert json.loads((tmp_path / "out" / "model" / "classes.json").read_text()) == ["-1", "+1"]


@pytest.mark.parametrize(
    ("template", "hparams"),
    [
        ("wide-deep", {}),
        ("cnn1d", {"channels": 1, "layers": 1, "filters": 4}),
        ("cnn2d", {"height": 2, "width": 2, "layers": 1, "filters": 4}),
        ("rnn", {"units": 8}),
        ("lstm", {"units": 8, "bidirectional": True, "layers": 2}),
    ],
)
def test_every_template_trains_and_exports(tmp_path: Path, template: str, hparams: dict) -> None:
    path = dense_csv(tmp_path / "train.csv", n=64)
    code = main(
        [
            "--template",
            template,
            "--data",
            str(path),
            "--label",
            "y",
            "--output",
            str(tmp_path / "out"),
            "--hparams",
            json.dumps({**hparams, "epochs": 2}),
        ]
    )
    assert code == 0
    model = torch.jit.load(str(tmp_path / "out" / "model" / "model.pt"))
    probabilities, predicted = model(torch.zeros(3, 4))
    assert probabilities.shape == (3, 2) and predicted.shape == (3,)


def test_regression_exports_a_prediction(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2))
    lines = ["a,b,y"] + [f"{a:.4f},{b:.4f},{3 * a - b + 10:.4f}" for a, b in x]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    code = main(
        [
            "--template",
            "logreg",
            "--task",
            "regression",
            "--data",
            str(tmp_path / "r.csv"),
            "--output",
            str(tmp_path / "out"),
            "--hparams",
            '{"lr": 0.1, "epochs": 40}',
        ]
    )
    assert code == 0
    model = torch.jit.load(str(tmp_path / "out" / "model" / "model.pt"))
    prediction = model(torch.tensor([[1.0, 1.0]], dtype=torch.float32))
    assert prediction.shape == (1,) and abs(float(prediction[0]) - 12.0) < 0.5


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("a,y\n1,0\n2\n", ["--label", "y"], "error: train.csv line 3: 1 columns, the header has 2"),
        ("a,y\n1,0\n1,0\n", ["--label", "y"], "every example has label '0'; classification needs at least 2"),
        ("a,y\n1,0\n2,1\n", ["--hparams", '{"layers": 99}'], "hparam layers must be int 1..16, got 99"),
        ("a,y\n1,0\n2,1\n", ["--hparams", '{"units": 8, "bogus": 1}'], "template mlp has no hparam bogus"),
        ("a,y\n1,0\n2,x\n", ["--task", "regression"], "line 3: label 'x' is not a number (task regression)"),
    ],
)
def test_bad_input_exits_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, args: list[str], message: str
) -> None:
    (tmp_path / "train.csv").write_text(text)
    code = main(["--template", "mlp", "--data", str(tmp_path), "--output", str(tmp_path / "out"), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
