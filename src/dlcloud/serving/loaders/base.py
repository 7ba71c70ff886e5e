"""The Predictor plugin base and the helpers every loader shares.

A Predictor wraps one model artifact (a file or a directory). ``load()`` imports the heavy library and
reads the artifact; ``predict()`` is synchronous, runs in a worker thread, takes and returns dicts of
NumPy arrays whose first dimension is the batch; ``unload()`` drops references so memory can be freed.

Invariants:
- Heavy libraries are imported inside ``_load`` only (through ``import_optional``), so importing this
  package is cheap and works without them.
- ``predict()`` checks its inputs against the signature where one is known (``check_inputs``), so
  ``_predict`` sees exactly the declared names, ranks and dtypes; it never copies an array whose dtype
  already matches.
- Every error a client can cause is a ``BadRequest``; anything the model raises while computing a batch
  becomes ``InferenceFailed``.
- A declared signature wins over an inferred one, but must use the names the model has (where the
  loader can infer them).
"""

from __future__ import annotations

import abc
import importlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from dlcloud.serving.errors import BadRequest, InferenceFailed, ServingError, Unavailable
from dlcloud.serving.types import V2_TO_NUMPY, Signature, numpy_to_v2

Arrays = dict[str, np.ndarray]

#: sidecar files that describe a model's signature next to (or inside) its artifact
SIGNATURE_SIDECARS = ("signature.json", "signature.yaml", "signature.yml")
#: files that may sit beside an artifact and are never the model itself (warm-up requests, python config)
AUXILIARY_FILES = frozenset((*SIGNATURE_SIDECARS, "warmup.json", "model.yaml"))


class MissingDependency(ImportError):
    """The library a format needs is not installed; the message names the pip extra."""


class Predictor(abc.ABC):
    """One loaded model version. Subclasses fill ``_load``, ``_predict`` and optionally ``_unload``."""

    format: ClassVar[str]
    #: the ``platform`` string of V2 model metadata (e.g. ``pytorch_torchscript``, ``onnxruntime_onnx``)
    platform: ClassVar[str]
    #: the loader options this format understands (``ModelSpec.options``); anything else is refused
    option_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, path: Path, signature: Signature | None = None, *, options: Mapping[str, Any] | None = None
    ) -> None:
        self.path = Path(path)
        self._declared = signature
        self._signature: Signature | None = None
        self.options: dict[str, Any] = dict(options or {})
        unknown = sorted(set(self.options) - set(self.option_names))
        if unknown:
            allowed = ", ".join(self.option_names) or "none"
            raise ValueError(f"unknown {self.format} loader option(s) {', '.join(unknown)}; allowed: {allowed}")
        self.loaded = False

    @property
    def signature(self) -> Signature:
        """The declared signature, else the one the loader inferred from the artifact."""
        if self._declared is not None:
            return self._declared
        if self._signature is None:
            raise ValueError(
                f"the {self.format} model at {self.path} does not describe its inputs and outputs; "
                "declare a signature (inputs/outputs with name, datatype, shape)"
            )
        return self._signature

    @property
    def inferred_signature(self) -> Signature | None:
        """What the artifact itself says (None before ``load`` or when the format cannot tell)."""
        return self._signature

    def load(self) -> None:
        if not self.path.exists():
            raise FileNotFoundError(f"the {self.format} model artifact {self.path} does not exist")
        inferred = self._load()
        if self._declared is not None and inferred is not None:
            check_declared_names(self._declared, inferred)
        self._signature = inferred
        self.loaded = True

    def predict(self, inputs: Mapping[str, Any]) -> Arrays:
        """Run one batch: check the inputs against the signature, then call the model."""
        if not self.loaded:
            raise Unavailable(f"the {self.format} model at {self.path} is not loaded")
        signature = self._declared if self._declared is not None else self._signature
        arrays = check_inputs(signature, inputs) if signature is not None else _as_arrays(inputs)
        try:
            return self._predict(arrays)
        except ServingError:
            raise
        except Exception as exc:  # the model's own failure: fail this batch only
            raise InferenceFailed(f"the {self.format} model failed on this batch: {type(exc).__name__}: {exc}") from exc

    def unload(self) -> None:
        self._unload()
        self.loaded = False

    @abc.abstractmethod
    def _load(self) -> Signature | None:
        """Import the library, read the artifact, return the inferred signature (None if it cannot be)."""

    @abc.abstractmethod
    def _predict(self, inputs: Arrays) -> Arrays:
        """Run one batch."""

    def _unload(self) -> None:  # noqa: B027 - optional hook
        """Drop the model."""


# --- input checks -------------------------------------------------------------------------------------------


def _as_arrays(inputs: Mapping[str, Any]) -> Arrays:
    return {name: value if isinstance(value, np.ndarray) else np.asarray(value) for name, value in inputs.items()}


def _datatype(dtype: np.dtype[Any]) -> str:
    try:
        return numpy_to_v2(dtype)
    except ValueError:
        return str(dtype)


def _cast(name: str, array: np.ndarray, datatype: str) -> np.ndarray:
    """``array`` as ``datatype``: unchanged when it already is, cast when no meaning is lost, else BadRequest."""
    if datatype not in V2_TO_NUMPY:  # BF16: no NumPy dtype; the loader sees what the protocol decoded
        return array
    target = V2_TO_NUMPY[datatype]
    if array.dtype == target:
        return array
    got = _datatype(array.dtype)
    if datatype == "BYTES":
        if array.dtype.kind in ("O", "S", "U"):
            return array
        raise BadRequest(f"input {name!r} must be BYTES, got {got}")
    if array.dtype.kind in ("O", "S", "U", "V") or not np.can_cast(array.dtype, target, "same_kind"):
        raise BadRequest(f"input {name!r} must be {datatype}, got {got} (which cannot be cast without loss)")
    if target.kind in ("i", "u") and array.dtype.kind in ("i", "u") and array.size:
        # integer narrowing (INT64 JSON numbers to INT32): only when every value fits
        info = np.iinfo(target)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise BadRequest(f"input {name!r} must be {datatype}; values {low}..{high} do not fit")
    return array.astype(target)


def check_inputs(signature: Signature, inputs: Mapping[str, Any]) -> Arrays:
    """Check named inputs against ``signature`` and cast them to the declared datatypes where that is safe.

    Names must match exactly (no missing, no unexpected input); ranks and the known (non -1) dimensions
    must match; a dtype is cast within its kind (FP64 -> FP32, INT64 -> INT32 when the values fit,
    integers -> floats), never across it (floats -> integers, numbers <-> BYTES). Arrays whose dtype
    already matches are returned as they are, without a copy. A signature with no inputs checks nothing.

    Raises:
        BadRequest: with a message that says which input was wrong and what the model takes.
    """
    arrays = _as_arrays(inputs)
    if not signature.inputs:
        return arrays
    expected = [spec.name for spec in signature.inputs]
    takes = ", ".join(repr(n) for n in expected)
    missing = [n for n in expected if n not in arrays]
    if missing:
        raise BadRequest(f"missing input {missing[0]!r}; the model takes {takes}")
    unexpected = [n for n in arrays if n not in expected]
    if unexpected:
        raise BadRequest(f"unexpected input {unexpected[0]!r}; the model takes {takes}")
    checked: Arrays = {}
    for spec in signature.inputs:
        array = arrays[spec.name]
        if spec.shape and (
            array.ndim != len(spec.shape) or any(d not in (-1, a) for d, a in zip(spec.shape, array.shape, strict=True))
        ):
            raise BadRequest(f"input {spec.name!r} must have shape {list(spec.shape)}, got {list(array.shape)}")
        checked[spec.name] = _cast(spec.name, array, spec.datatype)
    batch_sizes = {name: a.shape[0] for name, a in checked.items() if a.ndim}
    if len(set(batch_sizes.values())) > 1:
        sizes = ", ".join(f"{n}: {b}" for n, b in batch_sizes.items())
        raise BadRequest(f"all inputs must have the same batch size (first dimension), got {sizes}")
    return checked


def check_declared_names(declared: Signature, inferred: Signature) -> None:
    """A declared signature may narrow shapes and dtypes, but must name the inputs and outputs the model has."""
    for kind, have, want in (
        ("input", inferred.inputs, declared.inputs),
        ("output", inferred.outputs, declared.outputs),
    ):
        names = [t.name for t in have]
        for spec in want:
            if spec.name not in names:
                raise ValueError(
                    f"the declared signature names {kind} {spec.name!r}, but the model's {kind}s are "
                    f"{', '.join(repr(n) for n in names) or 'none'}"
                )
        left_out = [n for n in names if n not in {t.name for t in want}]
        if kind == "input" and want and left_out:
            raise ValueError(f"the declared signature leaves out the model's input(s) {', '.join(left_out)}")


# --- helpers for loaders ------------------------------------------------------------------------------------


def import_optional(module: str, *, fmt: str, extra: str, package: str | None = None) -> ModuleType:
    """Import a format's library, or say which pip extra installs it.

    Raises:
        MissingDependency: "the onnx format needs onnxruntime: pip install 'dlcloud[onnx]'".
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the library is there but one of its own imports failed: show the real error
        raise MissingDependency(f"the {fmt} format needs {package or module}: pip install 'dlcloud[{extra}]'") from exc


def find_artifact(path: Path, suffixes: Iterable[str], fmt: str) -> Path:
    """The model file: ``path`` itself, or the only file with one of ``suffixes`` in the directory ``path``."""
    suffixes = tuple(suffixes)
    if path.is_file():
        return path
    files = sorted(
        p for p in path.iterdir() if p.is_file() and p.suffix.lower() in suffixes and p.name not in AUXILIARY_FILES
    )
    if len(files) != 1:
        found = ", ".join(p.name for p in files) or "none"
        raise ValueError(f"{path} must hold exactly one {fmt} file ({', '.join(suffixes)}); found {found}")
    return files[0]


def read_sidecar_signature(path: Path) -> Signature | None:
    """The ``signature.json``/``signature.yaml`` in the artifact directory (or next to the artifact file)."""
    folder = path if path.is_dir() else path.parent
    for name in SIGNATURE_SIDECARS:
        sidecar = folder / name
        if not sidecar.is_file():
            continue
        text = sidecar.read_text()
        if name.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml  # yaml: loaded only for a YAML config

            data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError(f"{sidecar} must hold a mapping with 'inputs' and 'outputs'")
        try:
            return Signature.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{sidecar} is not a valid signature: {exc}") from exc
    return None


def dims(shape: Iterable[Any] | None) -> tuple[int, ...]:
    """A library's shape as TensorSpec dims: symbolic, unknown or None dimensions become -1."""
    if shape is None:
        return ()
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)
