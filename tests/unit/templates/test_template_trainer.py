"""The template trainer on separable synthetic data: dense CSV and sparse LibSVM reach the stated accuracy,
the export answers like the trained network, bad input exits 2 naming the problem; with a checkpoint directory a
run cut by step budgets and resumed reports what an uninterrupted run does, and a checkpoint of another run or an
unreadable one exits 2. Seconds, on CPU."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcloud import reporter as client_metrics
from dlcloud.templates.data import load
from dlcloud.templates.train import CHECKPOINT_FILE, main, prepare, train
from tests.metrics_stub import MetricsStub

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _outside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer reads these from its environment: a test run inside a dlcloud job must not inherit them."""
    for name in ("DLCLOUD_CHECKPOINT_DIR", "DLCLOUD_STOP_AT_STEP", "DLCLOUD_HPARAMS", "DLCLOUD_OUTPUT_DIR"):
        monkeypatch.delenv(name, raising=False)


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


# --- checkpoints, resuming, step budgets ---------------------------------------------------------------------

# dropout and several batches an epoch: resuming reproduces the metrics only with the same random streams
RESUMABLE = {"units": 16, "dropout": 0.3, "epochs": 6, "batch_size": 16, "patience": 0, "lr": 0.01}


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetricsStub]:
    """A metrics API recording what the trainer reports (each run's final flush waits until it is sent)."""
    stub = MetricsStub()
    stub.start()
    monkeypatch.setenv("DLCLOUD_METRICS_URL", stub.push_url)
    monkeypatch.setenv("DLCLOUD_METRICS_TOKEN", "tok-trainer")
    client_metrics._reset()
    yield stub
    client_metrics._reset()
    stub.stop()


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _argv(data: Path, output: Path, hparams: dict[str, Any], *extra: str) -> list[str]:
    """An mlp on ``data`` (label column y); ``extra`` flags come last, so they override (``--template logreg``)."""
    hp = json.dumps(hparams)
    return ["--template", "mlp", "--data", str(data), "--label", "y", "--output", str(output), "--hparams", hp, *extra]


def _epochs(out: str) -> list[int]:
    return [int(n) for n in re.findall(r"^epoch (\d+):", out, flags=re.MULTILINE)]


def _per_epoch(points: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> the epoch's metrics (loss, val_loss, ...), from the points the API received."""
    out: dict[int, dict[str, float]] = {}
    for p in points:
        if "val_loss" in p["metrics"]:
            assert p["step"] not in out, f"epoch {p['step']} reported twice"
            out[p["step"]] = p["metrics"]
    return out


def _best(points: list[dict[str, Any]]) -> dict[str, float]:
    return {k: v for p in points for k, v in p["metrics"].items() if k.startswith("best_")}


def _outputs(model_dir: Path, rows: np.ndarray) -> np.ndarray:
    probabilities, _ = torch.jit.load(str(model_dir / "model.pt"))(torch.from_numpy(rows))
    return probabilities.numpy()


def test_step_budgets_and_resumes_reproduce_an_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], reported: MetricsStub
) -> None:
    path = dense_csv(tmp_path / "train.csv", n=120)
    rows = load(path, "csv", label="y").features[:10]

    code, out, err = _run(capsys, _argv(path, tmp_path / "a", RESUMABLE))  # A: six epochs straight, no checkpoint
    assert code == 0, err
    assert _epochs(out) == [1, 2, 3, 4, 5, 6]
    straight = reported.points()

    checkpoints = tmp_path / "checkpoints"
    monkeypatch.setenv("DLCLOUD_CHECKPOINT_DIR", str(checkpoints))
    resumed: list[dict[str, Any]] = []
    # B: stopped at step 2, again at 2 (nothing to do), at 4, then to the end
    for budget, epochs, line in [
        ("2", [1, 2], "step budget reached: stopped after epoch 2 of 6"),
        ("2", [], "nothing to train: the checkpoint in"),
        ("4", [3, 4], f"resuming from epoch 2 (checkpoint in {checkpoints})"),
        (None, [5, 6], f"resuming from epoch 4 (checkpoint in {checkpoints})"),
    ]:
        if budget is None:
            monkeypatch.delenv("DLCLOUD_STOP_AT_STEP")
        else:
            monkeypatch.setenv("DLCLOUD_STOP_AT_STEP", budget)
        seen = len(reported.points())
        code, out, err = _run(capsys, _argv(path, tmp_path / "b", RESUMABLE))
        assert code == 0, err
        assert _epochs(out) == epochs, out
        assert line in out
        points = reported.points()[seen:]
        # best_* only when training is over: a budget stop may still be followed by a better epoch
        assert bool(_best(points)) == (budget is None), points
        assert (tmp_path / "b" / "model" / "model.pt").exists()  # every stop exports the best model so far
        resumed += points
        if budget == "2":
            saved = torch.load(checkpoints / CHECKPOINT_FILE, weights_only=True)
            assert (saved["epoch"], saved["finished"]) == (2, False)
            assert saved["identity"]["hparams"]["lr"] == 0.01 and "epochs" not in saved["identity"]["hparams"]
    assert sorted(p.name for p in checkpoints.iterdir()) == [CHECKPOINT_FILE]  # no temporary file left behind

    a, b = _per_epoch(straight), _per_epoch(resumed)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for epoch in a:
        assert b[epoch].keys() == a[epoch].keys()
        for name, value in a[epoch].items():
            assert b[epoch][name] == pytest.approx(value, abs=1e-5), (epoch, name)
    assert _best(resumed) == pytest.approx(_best(straight), abs=1e-5)
    np.testing.assert_allclose(
        _outputs(tmp_path / "b" / "model", rows), _outputs(tmp_path / "a" / "model", rows), atol=1e-5
    )


def noise_csv(path: Path, n: int = 80, seed: int = 1) -> Path:
    """Labels drawn at random: the validation loss soon stops improving, so early stopping ends training."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    rows = [",".join(f"{v:.4f}" for v in r) + f",{c}" for r, c in zip(x, rng.integers(0, 2, size=n), strict=True)]
    path.write_text("\n".join(["a,b,c,d,y", *rows]) + "\n")
    return path


def test_a_checkpoint_of_early_stopping_is_exported_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = noise_csv(tmp_path / "noise.csv")
    rows = load(path, "csv", label="y").features[:10]
    hparams = {"units": 32, "lr": 0.05, "epochs": 30, "patience": 2}
    monkeypatch.setenv("DLCLOUD_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    code, out, err = _run(capsys, _argv(path, tmp_path / "first", hparams))
    assert code == 0, err
    assert "early stopping" in out
    trained = _epochs(out)
    assert 3 <= len(trained) < 30

    code, out, err = _run(capsys, _argv(path, tmp_path / "again", hparams))  # the next attempt of the same job
    assert code == 0, err
    assert _epochs(out) == []
    assert f"training finished at epoch {trained[-1]} (early stopping;" in out
    saved = torch.load(tmp_path / "checkpoints" / CHECKPOINT_FILE, weights_only=True)
    assert (saved["epoch"], saved["finished"], saved["stopped_early"]) == (trained[-1], True, True)
    np.testing.assert_allclose(
        _outputs(tmp_path / "again" / "model", rows), _outputs(tmp_path / "first" / "model", rows)
    )


def test_more_epochs_continue_a_run_that_finished_its_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dense_csv(tmp_path / "train.csv", n=60)
    monkeypatch.setenv("DLCLOUD_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    assert _epochs(_run(capsys, _argv(path, tmp_path / "out", {"epochs": 2, "patience": 0}))[1]) == [1, 2]
    code, out, err = _run(capsys, _argv(path, tmp_path / "out", {"epochs": 2, "patience": 0}))
    assert (code, _epochs(out)) == (0, []), err
    code, out, err = _run(capsys, _argv(path, tmp_path / "out", {"epochs": 3, "patience": 0}))
    assert (code, _epochs(out)) == (0, [3]), err


@pytest.mark.parametrize(
    ("hparams", "extra", "message"),
    [
        ({"lr": 0.05}, [], "hparam lr: 0.01 in the checkpoint, 0.05 now"),
        ({"units": 8}, [], "hparam units: 64 in the checkpoint, 8 now"),
        ({}, ["--template", "logreg"], "template: 'mlp' in the checkpoint, 'logreg' now"),
        ({}, ["--seed", "1"], "seed: 0 in the checkpoint, 1 now"),
        ({}, ["--validation-split", "0.5"], "n_train: 48 in the checkpoint, 30 now"),
        ({}, ["--task", "regression"], "task: 'classification' in the checkpoint, 'regression' now"),
        ({}, ["--data", "other.csv"], "the data: same shape, other values"),
    ],
)
def test_a_checkpoint_of_another_run_exits_2_naming_what_differs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    hparams: dict[str, Any],
    extra: list[str],
    message: str,
) -> None:
    path = noise_csv(tmp_path / "train.csv", n=60)  # labels 0 and 1: classes, or numbers for a regression
    noise_csv(tmp_path / "other.csv", n=60, seed=2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLCLOUD_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    code, _, err = _run(capsys, _argv(path, tmp_path / "first", {"epochs": 2}))
    assert code == 0, err
    checkpoint = (tmp_path / "checkpoints" / CHECKPOINT_FILE).read_bytes()

    code, out, err = _run(capsys, _argv(path, tmp_path / "second", {"epochs": 2, **hparams}, *extra))
    assert code == 2
    assert "was written for another run" in err and message in err, err
    assert _epochs(out) == []
    assert not (tmp_path / "second").exists()
    assert (tmp_path / "checkpoints" / CHECKPOINT_FILE).read_bytes() == checkpoint


class _Opens:
    """Unpickled without weights_only, it would create a file: a checkpoint must never run code."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p, _good: p.write_bytes(b"not a checkpoint\n"), "cannot be read (not a torch file"),
        (lambda p, _good: p.write_bytes(b""), "cannot be read (empty or cut short)"),
        (lambda p, good: p.write_bytes(good[: len(good) // 2]), "cannot be read"),
        (lambda p, _good: torch.save({"epoch": 1}, p), "has format None; this trainer reads format 1"),
        (lambda p, _good: torch.save([1, 2], p), "is not a template checkpoint (a list)"),
        (
            lambda p, good: torch.save({**torch.load(p, weights_only=True), "stale": "x", "net": None}, p),
            "is not a template checkpoint: bad or missing net, stale",
        ),
        (lambda p, _good: torch.save({"x": _Opens(p.parent.parent / "ran")}, p), "cannot be read (not a torch file"),
    ],
)
def test_an_unreadable_checkpoint_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], write: Any, message: str
) -> None:
    path = dense_csv(tmp_path / "train.csv", n=60)
    checkpoints = tmp_path / "checkpoints"
    monkeypatch.setenv("DLCLOUD_CHECKPOINT_DIR", str(checkpoints))
    assert _run(capsys, _argv(path, tmp_path / "first", {"epochs": 1}))[0] == 0
    write(checkpoints / CHECKPOINT_FILE, (checkpoints / CHECKPOINT_FILE).read_bytes())

    code, out, err = _run(capsys, _argv(path, tmp_path / "second", {"epochs": 2}))
    assert code == 2
    assert f"error: checkpoint {checkpoints / CHECKPOINT_FILE} " in err and message in err, err
    assert _epochs(out) == []
    assert not (tmp_path / "second").exists()
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("budget", ["0", "-1", "abc", "1.5", "2 epochs", "\uff12"])
def test_a_malformed_step_budget_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], budget: str
) -> None:
    path = dense_csv(tmp_path / "train.csv", n=60)
    monkeypatch.setenv("DLCLOUD_STOP_AT_STEP", budget)
    code, out, err = _run(capsys, _argv(path, tmp_path / "out", {"epochs": 2}))
    assert code == 2
    assert f"error: DLCLOUD_STOP_AT_STEP must be a positive integer (the last epoch to train), got {budget!r}" in err
    assert _epochs(out) == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("directory", [None, ""])
def test_without_a_checkpoint_directory_each_run_trains_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], directory: str | None
) -> None:
    path = dense_csv(tmp_path / "train.csv", n=60)
    monkeypatch.chdir(tmp_path)
    if directory is not None:
        monkeypatch.setenv("DLCLOUD_CHECKPOINT_DIR", directory)
    for _ in range(2):
        code, out, err = _run(capsys, _argv(path, tmp_path / "out", {"epochs": 3, "patience": 0}))
        assert (code, _epochs(out)) == (0, [1, 2, 3]), err
        assert "resuming" not in out
    assert (tmp_path / "out" / "model" / "model.pt").exists()
    assert not list(tmp_path.rglob(CHECKPOINT_FILE + "*"))
