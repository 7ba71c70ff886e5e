"""Model loaders: one ``Predictor`` per format, looked up by format name, and format detection.

Formats (name -> V2 platform, artifact):

- ``torchscript`` -> ``pytorch_torchscript``: a ``.pt``/``.pth``/``.torchscript`` file (``torch.jit.save``)
- ``onnx``        -> ``onnxruntime_onnx``: a ``.onnx`` file
- ``sklearn``     -> ``sklearn``: a ``.joblib``/``.pkl``/``.pickle`` file (a pickle: trusted artifacts only)
- ``xgboost``     -> ``xgboost``: a ``.json``/``.ubj`` booster (``save_model``)
- ``savedmodel``  -> ``tensorflow_savedmodel``: a directory with ``saved_model.pb``
- ``python``      -> ``python``: a directory with ``predictor.py`` (or a ``model.yaml`` naming the module)

Importing this package imports none of torch, onnxruntime, scikit-learn, xgboost or tensorflow; each
loader imports its library in ``load()`` and, when it is missing, names the pip extra that installs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlcloud.serving.loaders import onnx, sklearn, torchscript, xgboost
from dlcloud.serving.loaders.base import (
    AUXILIARY_FILES,
    Arrays,
    MissingDependency,
    Predictor,
    check_inputs,
    find_artifact,
)
from dlcloud.serving.loaders.onnx import OnnxPredictor
from dlcloud.serving.loaders.python import CONFIG as PYTHON_CONFIG
from dlcloud.serving.loaders.python import DEFAULT_MODULE as PYTHON_MODULE
from dlcloud.serving.loaders.python import PythonPredictor, read_config
from dlcloud.serving.loaders.savedmodel import SavedModelPredictor
from dlcloud.serving.loaders.sklearn import SklearnPredictor
from dlcloud.serving.loaders.torchscript import TorchScriptPredictor
from dlcloud.serving.loaders.xgboost import XGBoostPredictor
from dlcloud.serving.types import Signature

__all__ = [
    "FORMATS",
    "FORMAT_SUFFIXES",
    "LOADERS",
    "Arrays",
    "MissingDependency",
    "Predictor",
    "artifact_for",
    "check_inputs",
    "detect_format",
    "get_loader",
    "load_predictor",
]

LOADERS: dict[str, type[Predictor]] = {
    cls.format: cls
    for cls in (
        TorchScriptPredictor,
        OnnxPredictor,
        SklearnPredictor,
        XGBoostPredictor,
        SavedModelPredictor,
        PythonPredictor,
    )
}
FORMATS: tuple[str, ...] = tuple(LOADERS)

#: single-file formats and the file suffixes that identify them (lower case)
FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "torchscript": torchscript.SUFFIXES,
    "onnx": onnx.SUFFIXES,
    "sklearn": sklearn.SUFFIXES,
    "xgboost": xgboost.SUFFIXES,
}
_SUFFIX_TO_FORMAT = {suffix: fmt for fmt, suffixes in FORMAT_SUFFIXES.items() for suffix in suffixes}
SAVEDMODEL_MARKER = "saved_model.pb"


def get_loader(fmt: str) -> type[Predictor]:
    """The Predictor class of a format name.

    Raises:
        ValueError: for an unknown name; the message lists the valid ones.
    """
    try:
        return LOADERS[fmt]
    except KeyError:
        raise ValueError(f"unknown model format {fmt!r}; valid formats: {', '.join(FORMATS)}") from None


def _recognised() -> str:
    files = "; ".join(f"{', '.join('*' + s for s in suffixes)} ({fmt})" for fmt, suffixes in FORMAT_SUFFIXES.items())
    return (
        f"{files}; a directory with {SAVEDMODEL_MARKER} (savedmodel); a directory with {PYTHON_MODULE} or a "
        f"{PYTHON_CONFIG} naming the module (python); a directory holding exactly one recognised file"
    )


def detect_format(path: Path) -> str:
    """The format of a model artifact, from its name or, for a directory, from what it holds.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: nothing recognisable (the message lists what is recognised), or a directory holds
            several model files.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"the model path {path} does not exist")
    if path.is_file():
        fmt = _SUFFIX_TO_FORMAT.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"cannot tell the model format of {path}; recognised are {_recognised()}")
        return fmt
    if (path / SAVEDMODEL_MARKER).is_file():
        return "savedmodel"
    if (path / PYTHON_MODULE).is_file() or "module" in read_config(path):
        return "python"
    files = sorted(
        p
        for p in path.iterdir()
        if p.is_file() and p.name not in AUXILIARY_FILES and p.suffix.lower() in _SUFFIX_TO_FORMAT
    )
    if len(files) == 1:
        return _SUFFIX_TO_FORMAT[files[0].suffix.lower()]
    if files:
        names = ", ".join(p.name for p in files)
        raise ValueError(f"{path} holds several model files ({names}); keep one or name the format")
    raise ValueError(f"cannot tell the model format of the directory {path}; recognised are {_recognised()}")


def artifact_for(path: Path, fmt: str) -> Path:
    """What a loader of ``fmt`` reads from ``path``: the one model file of a directory, else ``path`` itself.

    Sidecars (``signature.json``, ``warmup.json``, ``model.yaml``) never count as model files.
    """
    path = Path(path)
    suffixes = FORMAT_SUFFIXES.get(get_loader(fmt).format)
    if suffixes is None or not path.is_dir():
        return path
    return find_artifact(path, suffixes, fmt)


def load_predictor(path: Path, fmt: str | None = None, signature: Signature | None = None, **options: Any) -> Predictor:
    """A Predictor for ``path`` (format detected when not given), created but not loaded yet.

    Args:
        path: the artifact file or directory.
        fmt: a name from ``FORMATS``; detected from ``path`` when None.
        signature: a declared signature; it wins over what the loader infers.
        options: loader options (``device``, ``threads``, ``signature_name``... see each loader).

    Raises:
        ValueError: unknown format, unrecognisable path or unknown option.
    """
    path = Path(path)
    cls = get_loader(fmt or detect_format(path))
    return cls(path, signature, options=options)
