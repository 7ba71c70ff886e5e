"""TensorFlow Serving REST v1: ``:predict`` (row and columnar), ``:classify`` / ``:regress``, status, metadata.

Requests are JSON only: ``{"signature_name"?, "instances": [...]}`` (row format: every input shares
dimension 0; a single-input model gets a list of values, several inputs a list of objects keyed by input
name), ``{"inputs": value | list | {name: tensor}}`` (columnar), or for ``:classify`` / ``:regress``
``{"examples": [{feature: value}], "context"?: {feature: value}}``. Exactly one of those keys.
``{"b64": "..."}`` carries binary values of BYTES inputs and outputs; ``NaN`` / ``Infinity`` literals are
accepted and emitted (TF Serving does both). Values are cast to the signature's datatypes and shapes are
checked against it (-1 fits any size).

The only signature is ``serving_default``; ``:classify`` and ``:regress`` answer under the key ``results``
(what TF Serving sends, though its own API page writes ``result``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from dlcloud.serving.errors import BadRequest, ServingError
from dlcloud.serving.protocol import _json
from dlcloud.serving.protocol._tensors import (
    Array,
    bytes_array,
    is_b64,
    nested_leaves,
    numeric_from_json,
    shape_str,
    to_bytes_element,
)
from dlcloud.serving.types import V2_TO_NUMPY, Signature, TensorSpec

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
STATES = ("UNKNOWN", "START", "LOADING", "AVAILABLE", "UNLOADING", "END")
Format = Literal["row", "columnar"]

TF_TYPES = {
    "BOOL": "DT_BOOL",
    "UINT8": "DT_UINT8",
    "UINT16": "DT_UINT16",
    "UINT32": "DT_UINT32",
    "UINT64": "DT_UINT64",
    "INT8": "DT_INT8",
    "INT16": "DT_INT16",
    "INT32": "DT_INT32",
    "INT64": "DT_INT64",
    "FP16": "DT_HALF",
    "FP32": "DT_FLOAT",
    "FP64": "DT_DOUBLE",
    "BYTES": "DT_STRING",
    "BF16": "DT_BFLOAT16",
}

_PATH = re.compile(
    r"/v1/models/(?P<model>[^/:]+)"
    r"(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<method>predict|classify|regress))?"
)


def parse_model_path(path: str) -> tuple[str, int | None, str | None, str] | None:
    """``/v1/models/{m}[/versions/{v}|/labels/{l}][/metadata|:predict|:classify|:regress]`` split up.

    Returns (model, version, label, action) with action one of ``status``, ``metadata``, ``predict``,
    ``classify``, ``regress``; None when the path is not a TF Serving model path. Names may hold any
    character but ``/`` and ``:``.
    """
    match = _PATH.fullmatch(path)
    if match is None:
        return None
    version = match["version"]
    action = "metadata" if match["metadata"] else match["method"] or "status"
    return match["model"], int(version) if version is not None else None, match["label"], action


# -- requests --------------------------------------------------------------------------------------------


def decode_predict(body: bytes, signature: Signature) -> tuple[dict[str, Array], Format]:
    """The input arrays of a ``:predict`` (or ``:classify`` / ``:regress``) body and its format.

    ``examples`` requests (classify / regress) are decoded like row format and reported as ``"row"``.

    Raises:
        BadRequest: invalid JSON, not exactly one of instances / inputs / examples, an unknown signature name,
            values that do not fit the signature's datatypes or shapes.
    """
    try:
        doc = _json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object with 'instances' or 'inputs'")
    name = doc.get("signature_name")
    if name not in (None, "", DEFAULT_SIGNATURE):
        raise BadRequest(f"signature {name!r} not found; this model has one signature, '{DEFAULT_SIGNATURE}'")
    if not signature.inputs:
        raise BadRequest("this model declares no inputs, so a TF Serving request cannot be mapped onto it")
    keys = [k for k in ("instances", "inputs", "examples") if k in doc]
    if len(keys) > 1:
        raise BadRequest(
            "use either 'instances' (row format) or 'inputs' (columnar format), not both"
            if keys[:2] == ["instances", "inputs"]
            else f"request has {' and '.join(repr(k) for k in keys)}; send only one of them"
        )
    if not keys:
        raise BadRequest("request must have 'instances' (row format) or 'inputs' (columnar format)")
    if keys[0] == "inputs":
        return _columnar(doc["inputs"], signature.inputs), "columnar"
    if keys[0] == "instances":
        return _rows(doc["instances"], signature.inputs, "instances"), "row"
    return _examples(doc["examples"], doc.get("context"), signature.inputs), "row"


def _rows(instances: Any, specs: Sequence[TensorSpec], key: str, *, squeeze: bool = False) -> dict[str, Array]:
    if not isinstance(instances, list) or not instances:
        raise BadRequest(f"'{key}' must be a non-empty list with one item per row")
    names = [s.name for s in specs]
    if len(specs) == 1 and not all(isinstance(i, dict) and not is_b64(i) for i in instances):
        spec = specs[0]
        return {spec.name: _to_array(instances, spec, squeeze=squeeze)}
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict) or is_b64(instance):
            raise BadRequest(f"{key}[{index}] must be an object keyed by input name; inputs are: {', '.join(names)}")
        _check_keys(instance, names, f"{key}[{index}]")
    return {s.name: _to_array([i[s.name] for i in instances], s, squeeze=squeeze) for s in specs}


def _columnar(inputs: Any, specs: Sequence[TensorSpec]) -> dict[str, Array]:
    names = [s.name for s in specs]
    if isinstance(inputs, dict) and not is_b64(inputs):
        _check_keys(inputs, names, "'inputs'")
        return {s.name: _to_array(inputs[s.name], s) for s in specs}
    if len(specs) != 1:
        raise BadRequest(
            f"this model has {len(specs)} inputs ({', '.join(names)}); 'inputs' must be an object keyed by input name"
        )
    return {specs[0].name: _to_array(inputs, specs[0])}


def _examples(examples: Any, context: Any, specs: Sequence[TensorSpec]) -> dict[str, Array]:
    if context is None:
        context = {}
    if not isinstance(context, dict):
        raise BadRequest("'context' must be an object of features shared by all examples")
    if not isinstance(examples, list) or not examples:
        raise BadRequest("'examples' must be a non-empty list of objects")
    merged = []
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise BadRequest(f"examples[{index}] must be an object of features")
        shared = sorted(set(example) & set(context))
        if shared:
            raise BadRequest(f"examples[{index}] repeats context feature(s) {', '.join(shared)}")
        # a tf.Example feature is a list of values; a bare value is a list of one
        merged.append({k: v if isinstance(v, list) else [v] for k, v in {**context, **example}.items()})
    return _rows(merged, specs, "examples", squeeze=True)


def _check_keys(obj: Mapping[str, Any], names: list[str], where: str) -> None:
    listed = ", ".join(names)
    unknown = [k for k in obj if k not in names]
    if unknown:
        raise BadRequest(f"{where} has unknown input '{unknown[0]}'; inputs are: {listed}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise BadRequest(f"{where} lacks input '{missing[0]}'; inputs are: {listed}")


def _to_array(value: Any, spec: TensorSpec, *, squeeze: bool = False) -> Array:
    what = f"input '{spec.name}'"
    if spec.datatype == "BYTES":
        shape, leaves = nested_leaves(value, what)
        array = bytes_array([to_bytes_element(v, what, allow_b64=True) for v in leaves], shape)
    else:
        dtype = V2_TO_NUMPY["FP32" if spec.datatype == "BF16" else spec.datatype]
        array = numeric_from_json(value, dtype, spec.datatype, what)
    if squeeze and array.ndim == len(spec.shape) + 1 and array.shape[-1] == 1:
        array = array[..., 0]  # a tf.Example feature is a list, even of one value
    if len(array.shape) != len(spec.shape) or any(
        d != -1 and d != got for d, got in zip(spec.shape, array.shape, strict=True)
    ):
        raise BadRequest(f"{what} must have shape {shape_str(spec.shape)}, got {shape_str(array.shape)}")
    return array


# -- responses -------------------------------------------------------------------------------------------


def encode_predict(outputs: Mapping[str, Any], fmt: str) -> bytes:
    """``{"predictions": ...}`` for row format, ``{"outputs": ...}`` for columnar.

    One output is sent bare (a list over rows / the tensor); several become a list of objects per row, or an
    object keyed by output name. Bytes that are not UTF-8 are sent as ``{"b64": ...}``.

    Raises:
        ServingError (500): row format with outputs whose first dimensions differ.
    """
    arrays = {name: np.asarray(value) for name, value in outputs.items()}
    if fmt == "columnar":
        if len(arrays) == 1:
            doc: dict[str, Any] = {"outputs": _jsonable(next(iter(arrays.values())))}
        else:
            doc = {"outputs": {name: _jsonable(a) for name, a in arrays.items()}}
    elif fmt == "row":
        if len(arrays) == 1:
            doc = {"predictions": _jsonable(next(iter(arrays.values())))}
        else:
            sizes = {name: a.shape[0] if a.ndim else None for name, a in arrays.items()}
            if len(set(sizes.values())) > 1 or None in sizes.values():
                listed = ", ".join(f"{n}: {s if s is not None else 'scalar'}" for n, s in sizes.items())
                raise ServingError(
                    f"the outputs do not share their first dimension ({listed}), so they cannot be sent in row "
                    "format; send the request with 'inputs' (columnar format)"
                )
            columns = {name: _jsonable(a) for name, a in arrays.items()}
            rows = next(iter(sizes.values()), 0) or 0
            doc = {"predictions": [{name: col[i] for name, col in columns.items()} for i in range(rows)]}
    else:
        raise ValueError(f"format must be 'row' or 'columnar', got {fmt!r}")
    return json.dumps(doc, separators=(",", ":")).encode()


def encode_results(outputs: Mapping[str, Any], method: str | None = None, labels: Sequence[str] | None = None) -> bytes:
    """``{"results": ...}`` for ``:regress`` (one value per example) or ``:classify`` ([label, score] pairs).

    The model must have one output. ``method`` None picks regress for an output of shape [n] or [n,1] and
    classify otherwise; classify labels are ``labels`` or the class indices as strings.
    """
    if len(outputs) != 1:
        raise BadRequest(
            f":classify and :regress need a model with one output; this one has {len(outputs)} "
            f"({', '.join(outputs)}); use :predict"
        )
    array = np.asarray(next(iter(outputs.values())))
    if array.dtype.kind not in "biuf":
        raise BadRequest(f":classify and :regress need a numeric output, got {array.dtype}")
    if method is None:
        method = "regress" if array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1) else "classify"
    if method == "regress":
        if array.ndim == 2 and array.shape[1] == 1:
            array = array[:, 0]
        if array.ndim != 1:
            raise BadRequest(f":regress needs one value per example; the output has shape {shape_str(array.shape)}")
        results: list[Any] = array.astype(np.float64).tolist()
    elif method == "classify":
        if array.ndim == 1:
            array = array[:, None]
        if array.ndim != 2:
            raise BadRequest(
                f":classify needs one score per class and example; the output has shape {shape_str(array.shape)}"
            )
        names = list(labels) if labels is not None else [str(i) for i in range(array.shape[1])]
        if len(names) != array.shape[1]:
            raise ValueError(f"{len(names)} labels for {array.shape[1]} classes")
        results = [[[names[j], score] for j, score in enumerate(row)] for row in array.astype(np.float64).tolist()]
    else:
        raise ValueError(f"method must be 'classify' or 'regress', got {method!r}")
    return json.dumps({"results": results}, separators=(",", ":")).encode()


def _jsonable(array: Array) -> Any:
    if array.dtype.kind in "OS":
        return _strings(array.tolist())
    return array.tolist()


def _strings(value: Any) -> Any:
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.generic):
        return value.item()
    return value


# -- status and metadata ---------------------------------------------------------------------------------


def model_status(versions: Sequence[tuple[int, str]], errors: Mapping[int, str] | None = None) -> dict[str, Any]:
    """``GET /v1/models/{m}``: one entry per (version, state); ``errors`` gives a failed version's message."""
    entries = []
    for version, state in versions:
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        message = (errors or {}).get(version, "")
        entries.append(
            {
                "version": str(version),
                "state": state,
                "status": {"error_code": "UNKNOWN" if message else "OK", "error_message": message},
            }
        )
    return {"model_version_status": entries}


def model_metadata(name: str, version: int | str | None, signature: Signature) -> dict[str, Any]:
    """``GET /v1/models/{m}/metadata`` in TF Serving's shape (sizes as strings, -1 for variable dimensions)."""

    def tensor(spec: TensorSpec) -> dict[str, Any]:
        return {
            "dtype": TF_TYPES[spec.datatype],
            "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in spec.shape], "unknown_rank": False},
            "name": spec.name,
        }

    return {
        "model_spec": {"name": name, "signature_name": "", "version": "" if version is None else str(version)},
        "metadata": {
            "signature_def": {
                "signature_def": {
                    DEFAULT_SIGNATURE: {
                        "inputs": {t.name: tensor(t) for t in signature.inputs},
                        "outputs": {t.name: tensor(t) for t in signature.outputs},
                        "method_name": PREDICT_METHOD,
                    }
                }
            }
        },
    }
