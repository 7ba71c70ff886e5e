"""Small real models for the model-server tests, built in a test's own directory (nothing is downloaded).

Each ``make_*`` function writes one artifact under ``directory`` and returns a ``BuiltModel``: the path
to serve, its format, an example batch the model takes, and ``reference(inputs)``, which computes the
expected outputs in-process with the training library. Server tests (unit and end-to-end) reuse these.

Naming: TorchScript and ONNX MLPs take ``input`` (FP32 ``[-1, in_features]``); ONNX answers ``output``,
TorchScript ``OUTPUT__0`` (or ``output`` with ``signature=True``, which writes a sidecar). scikit-learn
and XGBoost take ``input``; scikit-learn answers ``label`` and ``probabilities``, XGBoost ``predictions``.
The SavedModel takes ``x`` and answers ``scores`` and ``label``; the Python predictor takes ``x`` and
answers ``y`` and ``total``.
"""

from __future__ import annotations

import json
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class BuiltModel:
    path: Path
    format: str
    example: Arrays
    reference: Callable[[Arrays], Arrays]
    extra: Any = None  # the in-process model (torch module, estimator, booster, tf.Module)


def _rows(n: int, width: int, seed: int, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(dtype)


def _classification(n_features: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """200 rows of ``make_classification`` data (4 informative features): the sklearn and xgboost models' data."""
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=200, n_features=n_features, n_informative=4, n_classes=n_classes, random_state=seed
    )
    return x, y


def _torch_mlp(in_features: int, hidden: int, out: int, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(in_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out)
    ).eval()


def _torch_reference(module: Any, output: str) -> Callable[[Arrays], Arrays]:
    import torch

    def reference(inputs: Arrays) -> Arrays:
        with torch.inference_mode():
            return {output: module(torch.from_numpy(np.array(inputs["input"], dtype=np.float32))).numpy()}

    return reference


def mlp_signature(in_features: int, out: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, in_features]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, out]}],
    }


def make_torchscript_mlp(
    directory: Path,
    in_features: int = 16,
    hidden: int = 32,
    out: int = 4,
    *,
    trace: bool = False,
    signature: bool = False,
    seed: int = 0,
) -> BuiltModel:
    """``directory/model.pt``: a scripted (or traced) Linear-ReLU-Linear; ``signature`` adds a sidecar."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    module = _torch_mlp(in_features, hidden, out, seed)
    example = {"input": _rows(5, in_features, seed + 1)}
    compiled = torch.jit.trace(module, torch.from_numpy(example["input"])) if trace else torch.jit.script(module)
    path = directory / "model.pt"
    torch.jit.save(compiled, str(path))
    if signature:
        (directory / "signature.json").write_text(json.dumps(mlp_signature(in_features, out)))
    return BuiltModel(
        path, "torchscript", example, _torch_reference(module, "output" if signature else "OUTPUT__0"), module
    )


def make_onnx_mlp(
    directory: Path, in_features: int = 16, hidden: int = 32, out: int = 4, *, seed: int = 0
) -> BuiltModel:
    """``directory/model.onnx``: the same MLP exported with a dynamic batch dimension.

    Uses the TorchScript-based exporter (``dynamo=False``): in torch 2.13 it still works offline, takes
    ~0.1 s instead of the dynamo exporter's ~4 s, and prints nothing; its deprecation warning is expected.
    """
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    module = _torch_mlp(in_features, hidden, out, seed)
    example = {"input": _rows(5, in_features, seed + 1)}
    path = directory / "model.onnx"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "You are using the legacy TorchScript-based ONNX export", DeprecationWarning)
        torch.onnx.export(
            module,
            (torch.from_numpy(example["input"]),),
            str(path),
            dynamo=False,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        )
    return BuiltModel(path, "onnx", example, _torch_reference(module, "output"), module)


def make_sklearn_classifier(
    directory: Path,
    kind: str = "logistic",
    n_features: int = 8,
    n_classes: int = 3,
    *,
    suffix: str = ".joblib",
    seed: int = 0,
) -> BuiltModel:
    """``directory/model<suffix>``: a LogisticRegression or RandomForest on ``make_classification`` data."""
    import joblib
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    directory.mkdir(parents=True, exist_ok=True)
    x, y = _classification(n_features, n_classes, seed)
    estimator: Any
    if kind == "logistic":
        estimator = LogisticRegression(max_iter=1000)
    elif kind == "forest":
        estimator = RandomForestClassifier(n_estimators=10, max_depth=4, random_state=seed)
    else:
        raise ValueError(f"kind must be logistic or forest, got {kind!r}")
    estimator.fit(x, y)
    path = directory / f"model{suffix}"
    joblib.dump(estimator, path)

    def reference(inputs: Arrays) -> Arrays:
        return {"label": estimator.predict(inputs["input"]), "probabilities": estimator.predict_proba(inputs["input"])}

    return BuiltModel(path, "sklearn", {"input": x[:7]}, reference, estimator)


def make_xgboost_model(
    directory: Path,
    objective: str = "multi:softprob",
    n_features: int = 6,
    n_classes: int = 3,
    *,
    suffix: str = ".json",
    seed: int = 0,
) -> BuiltModel:
    """``directory/model<suffix>``: a small booster trained with ``objective`` (JSON or UBJSON)."""
    import xgboost as xgb

    directory.mkdir(parents=True, exist_ok=True)
    x, y = _classification(n_features, n_classes, seed)
    params: dict[str, Any] = {"objective": objective, "max_depth": 3, "seed": seed}
    if objective.startswith("multi:"):
        params["num_class"] = n_classes
    elif objective.startswith("binary:"):
        y = (y > 0).astype(int)
    booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=5)
    path = directory / f"model{suffix}"
    booster.save_model(str(path))
    example = {"input": x[:9].astype(np.float32)}

    def reference(inputs: Arrays) -> Arrays:
        return {"predictions": booster.predict(xgb.DMatrix(inputs["input"]))}

    return BuiltModel(path, "xgboost", example, reference, booster)


def make_savedmodel(directory: Path, in_features: int = 8, classes: int = 3, *, seed: int = 0) -> BuiltModel:
    """``directory`` as a SavedModel: a tf.Module whose ``serving_default`` maps ``x`` to ``scores``/``label``."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((in_features, classes)).astype(np.float32)
    bias = rng.standard_normal(classes).astype(np.float32)

    class Linear(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)
            self.b = tf.Variable(bias)

        @tf.function(input_signature=[tf.TensorSpec([None, in_features], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            scores = tf.matmul(x, self.w) + self.b
            return {"scores": scores, "label": tf.argmax(scores, axis=1)}

    module = Linear()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})

    def reference(inputs: Arrays) -> Arrays:
        result = module.serve(tf.constant(inputs["x"]))
        return {name: tensor.numpy() for name, tensor in result.items()}

    return BuiltModel(directory, "savedmodel", {"x": _rows(6, in_features, seed + 1)}, reference, module)


PYTHON_PREDICTOR = '''
import numpy as np

from . import helpers


class Doubler:
    """Scales ``x`` by the weights in weights.npy (via a sibling module) and sums each row."""

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self.scale = None
        self.unloaded = False

    def load(self):
        self.scale = np.load(self.model_dir / "weights.npy")
        self.signature = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, len(self.scale)]}],
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [-1, len(self.scale)]},
                {"name": "total", "datatype": "FP32", "shape": [-1]},
            ],
        }

    def predict(self, batch):
        y = helpers.scale(batch["x"], self.scale)
        return {"y": y, "total": y.sum(axis=1)}

    def unload(self):
        self.unloaded = True
'''

PYTHON_HELPERS = """
def scale(x, factors):
    return x * factors
"""


def make_python_predictor(directory: Path, width: int = 4, *, factor: float = 2.0) -> BuiltModel:
    """``directory`` with ``predictor.py`` (class ``Doubler``), a sibling ``helpers.py`` and ``weights.npy``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "predictor.py").write_text(textwrap.dedent(PYTHON_PREDICTOR))
    (directory / "helpers.py").write_text(textwrap.dedent(PYTHON_HELPERS))
    scale = np.full(width, factor, dtype=np.float32)
    np.save(directory / "weights.npy", scale)

    def reference(inputs: Arrays) -> Arrays:
        y = inputs["x"] * scale
        return {"y": y, "total": y.sum(axis=1)}

    return BuiltModel(directory, "python", {"x": _rows(3, width, 7)}, reference)
