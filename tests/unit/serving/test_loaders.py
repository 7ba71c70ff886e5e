"""Each loader serves a real model built in the test and agrees with the training library's own output."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dlcloud.serving.errors import BadRequest, InferenceFailed, Unavailable
from dlcloud.serving.loaders import (
    FORMATS,
    LOADERS,
    MissingDependency,
    artifact_for,
    detect_format,
    get_loader,
    load_predictor,
)
from dlcloud.serving.loaders.base import import_optional
from dlcloud.serving.types import Signature, TensorSpec
from tests.serving_models import (
    make_onnx_mlp,
    make_python_predictor,
    make_sklearn_classifier,
    make_torchscript_mlp,
    make_xgboost_model,
    mlp_signature,
)

RTOL = 1e-5


def assert_outputs(got, expected, rtol=RTOL, atol=1e-6):
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)


def loaded(path, fmt=None, signature=None, **options):
    predictor = load_predictor(path, fmt, signature, **options)
    predictor.load()
    return predictor


# --- registry and detection ---------------------------------------------------------------------------------


def test_registry_names_every_format_and_platform():
    assert FORMATS == ("torchscript", "onnx", "sklearn", "xgboost", "savedmodel", "python")
    platforms = {fmt: cls.platform for fmt, cls in LOADERS.items()}
    assert platforms == {
        "torchscript": "pytorch_torchscript",
        "onnx": "onnxruntime_onnx",
        "sklearn": "sklearn",
        "xgboost": "xgboost",
        "savedmodel": "tensorflow_savedmodel",
        "python": "python",
    }
    assert get_loader("onnx") is LOADERS["onnx"]


def test_get_loader_unknown_format_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown model format 'keras'; valid formats: torchscript, onnx, .*python"):
        get_loader("keras")


def test_importing_loaders_imports_no_heavy_library():
    import subprocess

    code = (
        "import sys, dlcloud.serving.loaders, dlcloud.serving.inspect; "
        "print(sorted(m for m in ('torch', 'onnxruntime', 'sklearn', 'xgboost', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_library_names_the_pip_extra():
    with pytest.raises(MissingDependency, match=r"the demo format needs demo-lib: pip install 'dlcloud\[demo\]'"):
        import_optional("dlcloud_no_such_library", fmt="demo", extra="demo", package="demo-lib")
    assert issubclass(MissingDependency, ImportError)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("m.pt", "torchscript"),
        ("m.PTH", "torchscript"),
        ("m.torchscript", "torchscript"),
        ("m.onnx", "onnx"),
        ("m.joblib", "sklearn"),
        ("m.pkl", "sklearn"),
        ("m.pickle", "sklearn"),
        ("m.json", "xgboost"),
        ("m.ubj", "xgboost"),
    ],
)
def test_detect_format_of_files(tmp_path, name, fmt):
    (tmp_path / name).write_bytes(b"x")
    assert detect_format(tmp_path / name) == fmt


def test_detect_format_of_directories(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"x")
    (saved / "variables").mkdir()
    assert detect_format(saved) == "savedmodel"

    python = tmp_path / "py"
    python.mkdir()
    (python / "predictor.py").write_text("")
    (python / "weights.json").write_text("{}")  # a data file beside the code does not make it xgboost
    assert detect_format(python) == "python"

    configured = tmp_path / "configured"
    configured.mkdir()
    (configured / "model.yaml").write_text("module: serve.py\n")
    (configured / "serve.py").write_text("")
    assert detect_format(configured) == "python"

    single = tmp_path / "single"
    single.mkdir()
    (single / "model.onnx").write_bytes(b"x")
    (single / "signature.json").write_text("{}")  # sidecars are not model files
    (single / "warmup.json").write_text("[]")
    (single / "README.md").write_text("")
    assert detect_format(single) == "onnx"
    assert artifact_for(single, "onnx") == single / "model.onnx"


def test_detect_format_errors_say_what_is_recognised(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        detect_format(tmp_path / "nope.onnx")
    (tmp_path / "model.h5").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"cannot tell the model format of .*model\.h5; recognised are \*\.pt"):
        detect_format(tmp_path / "model.h5")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"recognised are .*saved_model\.pb \(savedmodel\)"):
        detect_format(empty)
    several = tmp_path / "several"
    several.mkdir()
    (several / "a.onnx").write_bytes(b"x")
    (several / "b.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"several model files \(a\.onnx, b\.pt\)"):
        detect_format(several)


def test_unknown_loader_option_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown onnx loader option\(s\) gpu; allowed: device, threads"):
        load_predictor(tmp_path / "m.onnx", "onnx", gpu=True)
    with pytest.raises(ValueError, match=r"unknown sklearn loader option\(s\) threads; allowed: none"):
        load_predictor(tmp_path / "m.pkl", "sklearn", threads=2)


def test_load_of_a_missing_artifact_fails_clearly(tmp_path):
    predictor = load_predictor(tmp_path / "gone.onnx", "onnx")
    with pytest.raises(FileNotFoundError, match=r"the onnx model artifact .*gone\.onnx does not exist"):
        predictor.load()
    with pytest.raises(Unavailable, match="not loaded"):
        predictor.predict({"input": np.zeros((1, 2), np.float32)})


# --- TorchScript --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trace", [False, True], ids=["script", "trace"])
def test_torchscript_matches_torch(tmp_path, trace):
    model = make_torchscript_mlp(tmp_path, trace=trace)
    assert detect_format(model.path) == "torchscript"
    predictor = loaded(model.path)
    assert predictor.inferred_signature is None  # TorchScript records no shapes
    with pytest.raises(ValueError, match="declare a signature"):
        _ = predictor.signature
    got = predictor.predict(model.example)  # matched by forward's argument name, "input"
    assert list(got) == ["OUTPUT__0"]
    assert_outputs(got, model.reference(model.example))
    by_index = predictor.predict({"INPUT__0": model.example["input"]})
    assert_outputs(by_index, model.reference(model.example))
    predictor.unload()
    assert not predictor.loaded


def test_torchscript_uses_the_sidecar_signature(tmp_path):
    model = make_torchscript_mlp(tmp_path, in_features=6, out=3, signature=True)
    predictor = loaded(tmp_path)  # the directory: one .pt file plus signature.json
    assert predictor.signature == Signature.from_dict(mlp_signature(6, 3))
    # FP64 rows (JSON numbers) are cast to the declared FP32
    x64 = model.example["input"].astype(np.float64)
    got = predictor.predict({"input": x64})
    assert list(got) == ["output"]
    assert got["output"].dtype == np.float32
    assert_outputs(got, model.reference(model.example))
    with pytest.raises(BadRequest, match=r"input 'input' must have shape \[-1, 6\], got \[4, 3\]"):
        predictor.predict({"input": np.zeros((4, 3), np.float32)})


def test_torchscript_declared_signature_and_read_only_input(tmp_path):
    model = make_torchscript_mlp(tmp_path, in_features=5, out=2)
    declared = Signature(
        inputs=(TensorSpec("features", "FP32", (-1, 5)),), outputs=(TensorSpec("logits", "FP32", (-1, 2)),)
    )
    predictor = loaded(model.path, signature=declared)
    x = np.frombuffer(model.example["input"].tobytes(), dtype=np.float32).reshape(-1, 5)  # read-only, as decoded
    assert not x.flags.writeable
    got = predictor.predict({"features": x})
    np.testing.assert_allclose(got["logits"], model.reference(model.example)["OUTPUT__0"], rtol=RTOL)


def test_torchscript_ambiguous_inputs_are_a_bad_request(tmp_path):
    model = make_torchscript_mlp(tmp_path)
    predictor = loaded(model.path)
    with pytest.raises(BadRequest, match=r"the torchscript model takes 'input' \(or INPUT__0"):
        predictor.predict({"a": model.example["input"], "b": model.example["input"]})
    with pytest.raises(BadRequest, match="not BYTES"):
        predictor.predict({"input": np.array([[b"x"]], dtype=object)})


def test_torchscript_model_errors_fail_the_batch(tmp_path):
    model = make_torchscript_mlp(tmp_path, in_features=4)
    predictor = loaded(model.path)
    with pytest.raises(InferenceFailed, match="the torchscript model failed on this batch: RuntimeError"):
        predictor.predict({"input": np.zeros((2, 7), np.float32)})  # no signature: the model itself refuses


def test_torchscript_cuda_without_cuda_is_refused(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model = make_torchscript_mlp(tmp_path)
    with pytest.raises(ValueError, match="asks for device 'cuda', but torch sees no CUDA device"):
        loaded(model.path, device="cuda")


# --- ONNX ---------------------------------------------------------------------------------------------------


def test_onnx_matches_torch_and_infers_the_signature(tmp_path):
    model = make_onnx_mlp(tmp_path, in_features=16, out=4)
    assert detect_format(model.path) == "onnx"
    predictor = loaded(model.path, threads=1)
    assert predictor.signature.to_dict() == mlp_signature(16, 4)  # symbolic batch dimension -> -1
    for batch in (1, 5, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        assert_outputs(predictor.predict({"input": x}), model.reference({"input": x}))
    with pytest.raises(BadRequest, match=r"missing input 'input'; the model takes 'input'"):
        predictor.predict({"x": model.example["input"]})
    with pytest.raises(BadRequest, match=r"input 'input' must be FP32, got BYTES"):
        predictor.predict({"input": np.array([[b"a"] * 16], dtype=object)})


def test_onnx_declared_signature_must_use_the_models_names(tmp_path):
    model = make_onnx_mlp(tmp_path)
    declared = Signature(inputs=(TensorSpec("x", "FP32", (-1, 16)),), outputs=(TensorSpec("output", "FP32", (-1, 4)),))
    predictor = load_predictor(model.path, signature=declared)
    with pytest.raises(ValueError, match=r"declared signature names input 'x', but the model's inputs are 'input'"):
        predictor.load()
    assert not predictor.loaded


def test_onnx_cuda_without_the_cuda_provider_is_refused(tmp_path):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    model = make_onnx_mlp(tmp_path)
    with pytest.raises(ValueError, match="no CUDA execution provider"):
        loaded(model.path, device="cuda")


# --- scikit-learn -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "suffix"), [("logistic", ".joblib"), ("forest", ".pkl")])
def test_sklearn_matches_the_estimator(tmp_path, kind, suffix):
    model = make_sklearn_classifier(tmp_path, kind, n_features=8, n_classes=3, suffix=suffix)
    assert detect_format(model.path) == "sklearn"
    predictor = loaded(model.path)
    assert predictor.signature.to_dict() == {
        "inputs": [{"name": "input", "datatype": "FP64", "shape": [-1, 8]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP64", "shape": [-1, 3]},
        ],
    }
    got = predictor.predict(model.example)
    assert_outputs(got, model.reference(model.example))
    # FP32 rows are widened to FP64, without changing the answer
    x32 = model.example["input"].astype(np.float32)
    np.testing.assert_array_equal(predictor.predict({"input": x32})["label"], model.extra.predict(x32))
    with pytest.raises(BadRequest, match=r"input 'input' must have shape \[-1, 8\], got \[7\]"):
        predictor.predict({"input": model.example["input"][:, 0]})


def test_sklearn_regressor_and_string_labels(tmp_path):
    import joblib
    from sklearn.linear_model import LinearRegression, LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 3))
    regressor = LinearRegression().fit(x, x @ np.array([1.0, -2.0, 0.5]))
    joblib.dump(regressor, tmp_path / "reg.pkl")
    predictor = loaded(tmp_path / "reg.pkl")
    assert [o.to_dict() for o in predictor.signature.outputs] == [
        {"name": "predictions", "datatype": "FP64", "shape": [-1]}
    ]
    np.testing.assert_allclose(predictor.predict({"input": x[:4]})["predictions"], regressor.predict(x[:4]), rtol=RTOL)

    classifier = LogisticRegression().fit(x, np.where(x[:, 0] > 0, "yes", "no"))
    joblib.dump(classifier, tmp_path / "words.joblib")
    words = loaded(tmp_path / "words.joblib")
    assert words.signature.output("label") == TensorSpec("label", "BYTES", (-1,))
    np.testing.assert_array_equal(words.predict({"input": x[:4]})["label"], classifier.predict(x[:4]))


def test_sklearn_refuses_an_object_without_predict(tmp_path):
    import joblib

    joblib.dump({"not": "a model"}, tmp_path / "dict.joblib")
    with pytest.raises(ValueError, match="holds a dict, which has no predict method"):
        loaded(tmp_path / "dict.joblib")


# --- XGBoost ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("objective", "suffix", "shape"),
    [
        ("multi:softprob", ".json", [-1, 3]),
        ("multi:softprob", ".ubj", [-1, 3]),
        ("multi:softmax", ".json", [-1]),
        ("binary:logistic", ".ubj", [-1]),
        ("reg:squarederror", ".json", [-1]),
    ],
)
def test_xgboost_matches_the_booster(tmp_path, objective, suffix, shape):
    model = make_xgboost_model(tmp_path, objective, n_features=6, suffix=suffix)
    assert detect_format(model.path) == "xgboost"
    predictor = loaded(model.path, threads=1)
    assert predictor.signature.to_dict() == {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 6]}],
        "outputs": [{"name": "predictions", "datatype": "FP32", "shape": shape}],
    }
    got = predictor.predict(model.example)
    assert_outputs(got, model.reference(model.example))
    # FP64 rows (JSON numbers) are narrowed to the declared FP32
    got64 = predictor.predict({"input": model.example["input"].astype(np.float64)})
    assert_outputs(got64, model.reference(model.example))


def test_xgboost_classifier_saved_from_the_sklearn_api(tmp_path):
    import xgboost as xgb
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=150, n_features=5, n_informative=3, n_classes=3, random_state=1)
    classifier = xgb.XGBClassifier(n_estimators=4, max_depth=2).fit(x, y)
    classifier.save_model(tmp_path / "clf.ubj")
    predictor = loaded(tmp_path)  # the directory holding one .ubj file
    got = predictor.predict({"input": x[:10].astype(np.float32)})["predictions"]
    np.testing.assert_allclose(got, classifier.predict_proba(x[:10].astype(np.float32)), rtol=RTOL)


# --- custom Python ------------------------------------------------------------------------------------------


def test_python_predictor_loads_in_isolation(tmp_path):
    first = make_python_predictor(tmp_path / "v1", width=4, factor=2.0)
    second = make_python_predictor(tmp_path / "v2", width=4, factor=3.0)
    assert detect_format(first.path) == "python"
    before = set(sys.modules)
    one, two = loaded(first.path), loaded(second.path)
    assert one.signature.input("x") == TensorSpec("x", "FP32", (-1, 4))
    # both versions ship predictor.py and helpers.py, yet each uses its own
    assert_outputs(one.predict(first.example), first.reference(first.example))
    assert_outputs(two.predict(second.example), second.reference(second.example))
    ours = {name for name in set(sys.modules) - before if name.startswith("_dlcloud_model_")}
    assert len(ours) == 4  # two packages, each with its own helpers submodule
    assert "predictor" not in sys.modules and "helpers" not in sys.modules
    instance = one._instance
    one.unload()
    two.unload()
    assert instance.unloaded is True
    assert not ours & set(sys.modules)  # this test's modules are gone (others' may still be loaded)


def test_python_predictor_named_in_model_yaml(tmp_path):
    (tmp_path / "model.yaml").write_text("module: serve.py\nclass: Echo\n")
    (tmp_path / "serve.py").write_text(
        "class Echo:\n"
        "    def load(self):\n"
        "        pass\n"
        "    def predict(self, batch):\n"
        "        return {'out': batch['a'] + 1}\n"
        "class Other:\n"
        "    def load(self):\n"
        "        pass\n"
        "    def predict(self, batch):\n"
        "        return {}\n"
    )
    predictor = loaded(tmp_path)
    assert predictor.inferred_signature is None
    np.testing.assert_array_equal(predictor.predict({"a": np.arange(3)})["out"], np.arange(1, 4))


def test_python_predictor_errors(tmp_path):
    (tmp_path / "predictor.py").write_text(
        "class A:\n    def load(self): pass\n    def predict(self, b): return [1]\n"
        "class B:\n    def load(self): pass\n    def predict(self, b): return b\n"
    )
    before = set(sys.modules)
    with pytest.raises(ValueError, match=r"exactly one class with load\(\) and predict\(\) \(found A, B\)"):
        loaded(tmp_path)
    assert set(sys.modules) == before  # a failed load leaves nothing behind
    (tmp_path / "model.yaml").write_text("class: A\n")
    predictor = loaded(tmp_path)
    with pytest.raises(InferenceFailed, match="returned list, not a dict of arrays"):
        predictor.predict({"x": np.zeros(2)})
    predictor.unload()


# --- check_inputs through predict ---------------------------------------------------------------------------


def test_predict_rejects_wrong_trailing_dimensions(tmp_path):
    model = make_onnx_mlp(tmp_path, in_features=256, out=10)
    predictor = loaded(model.path)
    assert predictor.predict({"input": np.zeros((2, 256), np.float32)})["output"].shape == (2, 10)
    with pytest.raises(BadRequest, match=r"input 'input' must have shape \[-1, 256\], got \[4, 3\]"):
        predictor.predict({"input": np.zeros((4, 3), np.float32)})
