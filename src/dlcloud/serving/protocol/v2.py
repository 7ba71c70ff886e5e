"""KServe V2 / Open Inference Protocol REST, with Triton's binary tensor data extension.

Request body: a JSON header, then (when ``Inference-Header-Content-Length`` says where the header ends) the raw
bytes of each binary input, in the order the inputs appear in the JSON; ``Inference-Header-Content-Length: 0``
means the whole body is the raw bytes of the model's single input. ``tritonclient`` sends no Content-Type, so
nothing here looks at it. ``Content-Encoding: gzip | deflate`` is undone first, never past ``max_body_bytes``.

Decisions a client can see:

- Binary inputs become read-only NumPy views into the body (little-endian, no copy unless the tensor starts at
  an offset its datatype cannot be read from in place: then it is copied once); BOOL is normalised to
  0/1; BF16 (binary only) is widened to FP32 and keeps the datatype name ``BF16``.
- Unknown request and tensor ``parameters`` are ignored. Shared memory and the ``classification`` output
  parameter are refused with a 400: this server has neither.
- Outputs: ``binary_data`` on a requested output, else the request's ``binary_data_output``, decides binary.
  An output JSON cannot carry faithfully (BYTES that are not UTF-8, BF16) is sent binary even when JSON was
  asked: the binary extension is advertised, ``tritonclient`` reads either form, and the data stays intact.
- JSON BYTES outputs are UTF-8 strings (``tritonclient`` returns them as ``str``); binary ones are bytes.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlcloud.serving.errors import BadRequest, PayloadTooLarge, ServingError
from dlcloud.serving.protocol import _json
from dlcloud.serving.protocol._tensors import (
    Array,
    bytes_array,
    element_as_bytes,
    nested_leaves,
    numeric_from_json,
    shape_str,
    to_bytes_element,
)
from dlcloud.serving.types import DATATYPES, V2_TO_NUMPY, Signature, TensorSpec, numpy_to_v2

HEADER_LENGTH = "inference-header-content-length"

# Little-endian dtypes for the wire; on little-endian hosts these equal the native ones.
_WIRE: dict[str, np.dtype[Any]] = {
    name: dtype.newbyteorder("<") for name, dtype in V2_TO_NUMPY.items() if name not in ("BYTES", "BOOL")
}
_WIRE["BOOL"] = np.dtype(np.uint8)
_WIRE["BF16"] = np.dtype("<u2")
_ITEMSIZE = {name: dtype.itemsize for name, dtype in _WIRE.items()}
_UNSUPPORTED = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")

# Triton model-config type names (model_config.proto).
TRITON_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
    "BF16": "TYPE_BF16",
}


@dataclass(frozen=True, slots=True)
class InferInput:
    """One decoded input. ``array`` has ``shape``; for ``datatype == "BF16"`` it is FP32."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: Array
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An entry of the request's ``outputs``; ``binary`` is already resolved against the request default."""

    name: str
    binary: bool
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None
    binary_output_default: bool


# -- request ---------------------------------------------------------------------------------------------


def decode_infer_request(
    body: bytes,
    headers: Mapping[str, str],
    *,
    max_body_bytes: int,
    single_input: TensorSpec | None = None,
) -> InferRequest:
    """Parse an infer request body (JSON, JSON + binary tensors, or a raw binary single input).

    Args:
        body: the request body as received (possibly compressed).
        headers: the request headers; only ``Content-Encoding`` and ``Inference-Header-Content-Length`` are read,
            case-insensitively.
        max_body_bytes: the most bytes the body may hold, before and after decompression.
        single_input: the model's only input, when it has exactly one; needed for raw binary requests
            (``Inference-Header-Content-Length: 0``), whose name, datatype and shape come from it.

    Raises:
        BadRequest: the body is malformed; the message says where. PayloadTooLarge: over ``max_body_bytes``.
        ServingError (415): an unsupported ``Content-Encoding``.
    """
    if len(body) > max_body_bytes:
        raise PayloadTooLarge(f"request body is {len(body)} bytes; the limit is {max_body_bytes} bytes")
    encoding = _header(headers, "content-encoding")
    if encoding:
        body = decompress(body, encoding, max_body_bytes)
    raw_length = _header(headers, HEADER_LENGTH)
    if raw_length is None:
        header_length = len(body)
    else:
        try:
            header_length = int(raw_length)
        except ValueError:
            raise BadRequest(f"Inference-Header-Content-Length must be an integer, got {raw_length!r}") from None
        if header_length < 0 or header_length > len(body):
            raise BadRequest(f"Inference-Header-Content-Length is {header_length} but the body has {len(body)} bytes")
        if header_length == 0:
            return _decode_raw(body, single_input)

    try:
        doc = _json.loads(body if header_length == len(body) else body[:header_length])
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request JSON is invalid: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("request JSON must be an object with an 'inputs' list")
    binary = memoryview(body)[header_length:]

    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f"request 'id' must be a string, got {type(request_id).__name__}")
    parameters = _parameters(doc, "request")
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise BadRequest("request parameter 'binary_data_output' must be true or false")

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("request must have a non-empty 'inputs' list")
    inputs: list[InferInput] = []
    seen: set[str] = set()
    offset = 0
    for index, raw in enumerate(raw_inputs):
        tensor, offset = _decode_input(raw, index, binary, offset, raw_length is not None)
        if tensor.name in seen:
            raise BadRequest(f"input '{tensor.name}' appears more than once")
        seen.add(tensor.name)
        inputs.append(tensor)
    if offset != len(binary):
        raise BadRequest(
            f"binary_data_size of the inputs add up to {offset} bytes but the body carries {len(binary)} bytes "
            "after the JSON header"
        )
    return InferRequest(
        id=request_id,
        parameters=parameters,
        inputs=inputs,
        outputs=_decode_outputs(doc.get("outputs"), binary_default),
        binary_output_default=binary_default,
    )


def _decode_input(raw: Any, index: int, binary: memoryview, offset: int, split: bool) -> tuple[InferInput, int]:
    if not isinstance(raw, dict):
        raise BadRequest(f"inputs[{index}] must be an object with name, shape, datatype and data")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{index}] needs a 'name' string")
    what = f"input '{name}'"
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequest(f"{what}: datatype must be one of {', '.join(DATATYPES)}, got {datatype!r}")
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(f"{what}: shape must be a list of non-negative integers, got {shape!r}")
    shape_t = tuple(shape)
    count = math.prod(shape_t)
    parameters = _parameters(raw, what)
    if any(key in parameters for key in _UNSUPPORTED):
        raise BadRequest(f"{what}: shared memory is not supported by this server; send the data in the body")
    size = parameters.get("binary_data_size")

    if size is not None:
        if type(size) is not int or size < 0:
            raise BadRequest(f"{what}: binary_data_size must be a non-negative integer, got {size!r}")
        if "data" in raw:
            raise BadRequest(f"{what} has both 'data' and binary_data_size; send one of them")
        if offset + size > len(binary):
            if not split:
                raise BadRequest(
                    f"{what} declares binary_data_size but the request has no Inference-Header-Content-Length "
                    "header to say where the JSON ends"
                )
            raise BadRequest(
                f"{what}: binary_data_size {size} reaches past the end of the body "
                f"({len(binary) - offset} bytes of binary data left)"
            )
        array = binary_to_array(binary[offset : offset + size], datatype, shape_t, what)
        return InferInput(name, datatype, shape_t, array, parameters), offset + size

    if "data" not in raw:
        raise BadRequest(f"{what} has neither 'data' nor parameters.binary_data_size")
    data = raw["data"]
    if datatype == "BF16":
        raise BadRequest(f"{what}: BF16 data must be sent in binary form (binary_data_size)")
    if datatype == "BYTES":
        _, leaves = nested_leaves(data, what)
        if len(leaves) != count:
            raise BadRequest(f"{what}: shape {shape_str(shape_t)} needs {count} values, got {len(leaves)}")
        elements = [to_bytes_element(v, what, allow_b64=False) for v in leaves]
        return InferInput(name, datatype, shape_t, bytes_array(elements, shape_t), parameters), offset
    array = numeric_from_json(data, V2_TO_NUMPY[datatype], datatype, what)
    if array.size != count:
        raise BadRequest(f"{what}: shape {shape_str(shape_t)} needs {count} values, got {array.size}")
    if array.shape != shape_t:
        array = array.reshape(shape_t)
    return InferInput(name, datatype, shape_t, array, parameters), offset


def binary_to_array(buf: memoryview | bytes, datatype: str, shape: tuple[int, ...], what: str) -> Array:
    """The array for one tensor's binary data (exactly its bytes)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_from_binary(buf, count, what).reshape(shape)
    itemsize = _ITEMSIZE[datatype]
    if len(buf) != count * itemsize:
        raise BadRequest(
            f"{what}: shape {shape_str(shape)} of {datatype} needs {count * itemsize} bytes, "
            f"binary_data_size is {len(buf)}"
        )
    flat = np.frombuffer(buf, dtype=_WIRE[datatype], count=count)
    if flat.ctypes.data % flat.dtype.alignment:
        # the tensor starts at an unaligned offset of the body (the JSON header has any length): copy it once,
        # since libraries copy unaligned data anyway or refuse it (XGBoost does, even for zero rows)
        flat = flat.copy()
        flat.flags.writeable = False
    if datatype == "BOOL":
        flat = flat != 0
    elif datatype == "BF16":
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    return flat.reshape(shape)


def _bytes_from_binary(buf: memoryview | bytes, count: int, what: str) -> Array:
    # elements are collected as they are read: memory follows the data sent, not the shape claimed
    elements: list[bytes] = []
    view = memoryview(buf)
    end = len(view)
    pos = 0
    unpack = struct.Struct("<I").unpack_from
    for i in range(count):
        if pos + 4 > end:
            raise BadRequest(f"{what}: binary BYTES data ends before element {i} of {count}")
        (length,) = unpack(view, pos)
        pos += 4
        if pos + length > end:
            raise BadRequest(
                f"{what}: BYTES element {i} claims {length} bytes but only {end - pos} are left in its binary data"
            )
        elements.append(bytes(view[pos : pos + length]))
        pos += length
    if pos != end:
        raise BadRequest(f"{what}: binary BYTES data has {end - pos} bytes left over after {count} elements")
    return bytes_array(elements, (count,))


def _decode_raw(body: bytes, spec: TensorSpec | None) -> InferRequest:
    """``Inference-Header-Content-Length: 0``: the body is the single input's raw bytes (Triton semantics)."""
    if spec is None:
        raise BadRequest(
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one declared "
            "input; send a JSON header instead"
        )
    what = f"input '{spec.name}'"
    datatype = spec.datatype
    if datatype == "BYTES":
        # The whole body is one element; dimensions are 1 (Triton requires shape [1]).
        shape = tuple(1 if d == -1 else d for d in spec.shape)
        if math.prod(shape) != 1:
            raise BadRequest(
                f"a raw binary request needs BYTES input '{spec.name}' to hold one element; "
                f"its shape is {shape_str(spec.shape)}"
            )
        array = bytes_array([bytes(body)], shape)
    else:
        shape = _raw_shape(spec, len(body), _ITEMSIZE[datatype])
        array = binary_to_array(memoryview(body), datatype, shape, what)
    return InferRequest(
        id=None,
        parameters={},
        inputs=[InferInput(spec.name, datatype, shape, array)],
        outputs=None,
        binary_output_default=True,
    )


def _raw_shape(spec: TensorSpec, nbytes: int, itemsize: int) -> tuple[int, ...]:
    dims = list(spec.shape)
    if dims.count(-1) > 1 and dims[0] == -1:
        dims[0] = 1  # a batching model gets a batch of one, as in Triton
    variable = [i for i, d in enumerate(dims) if d == -1]
    if len(variable) > 1:
        raise BadRequest(
            f"a raw binary request cannot tell the shape of input '{spec.name}' {shape_str(spec.shape)}: "
            "it has more than one variable dimension besides the batch; send a JSON header"
        )
    fixed = math.prod(d for d in dims if d != -1)
    if nbytes % itemsize:
        raise BadRequest(
            f"raw binary body of {nbytes} bytes is not a whole number of {spec.datatype} elements "
            f"({itemsize} bytes each)"
        )
    count = nbytes // itemsize
    if variable:
        if fixed == 0 or count % fixed:
            raise BadRequest(
                f"raw binary body holds {count} {spec.datatype} values, which do not fill input "
                f"'{spec.name}' of shape {shape_str(spec.shape)}"
            )
        dims[variable[0]] = count // fixed
    elif count != fixed:
        raise BadRequest(
            f"input '{spec.name}': shape {shape_str(spec.shape)} needs {fixed} values, "
            f"the raw binary body holds {count}"
        )
    return tuple(dims)


def _decode_outputs(raw: Any, binary_default: bool) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("request 'outputs' must be a list of objects with a 'name'")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest(f"outputs[{index}] must be an object with a 'name' string")
        name = item["name"]
        what = f"output '{name}'"
        if name in seen:
            raise BadRequest(f"{what} is requested more than once")
        seen.add(name)
        parameters = _parameters(item, what)
        if parameters.get("classification"):
            raise BadRequest(
                f"{what}: the classification extension is not supported; request the output itself and take "
                "the top classes on the client"
            )
        if any(key in parameters for key in _UNSUPPORTED):
            raise BadRequest(f"{what}: shared memory is not supported by this server")
        binary = parameters.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise BadRequest(f"{what}: parameter 'binary_data' must be true or false")
        outputs.append(RequestedOutput(name, binary, parameters))
    return outputs


def _parameters(obj: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = obj.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise BadRequest(f"{what} 'parameters' must be an object")
    return parameters


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip, deflate, identity; a list is undone last-applied first).

    Inflates incrementally and stops one byte past ``limit``, so a compression bomb costs at most ``limit``
    bytes of memory before it is refused with PayloadTooLarge.
    """
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding in ("gzip", "x-gzip"):
            body = _inflate(body, 16 + zlib.MAX_WBITS, limit, "gzip")
        elif coding == "deflate":
            # RFC 9110 "deflate" is zlib-wrapped; some clients send a bare deflate stream.
            zlib_wrapped = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
            try:
                body = _inflate(body, zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS, limit, "deflate")
            except PayloadTooLarge:
                raise
            except BadRequest:
                if not zlib_wrapped:
                    raise
                # a bare stream whose first two bytes happen to read as a zlib header
                body = _inflate(body, -zlib.MAX_WBITS, limit, "deflate")
        else:
            raise ServingError(
                f"Content-Encoding {coding!r} is not supported; use gzip, deflate or identity",
                status=415,
                headers={"Accept-Encoding": "gzip, deflate"},
            )
    return body


def _inflate(data: bytes, wbits: int, limit: int, name: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        inflater = zlib.decompressobj(wbits)
        pending = data
        try:
            while not inflater.eof:
                chunk = inflater.decompress(pending, limit + 1 - size)
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the {name}-decoded request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
                pending = inflater.unconsumed_tail
                if not chunk and not pending:
                    break
        except zlib.error as exc:
            raise BadRequest(f"request body is not valid {name} data: {exc}") from None
        if not inflater.eof:
            raise BadRequest(f"request body is truncated {name} data")
        data = inflater.unused_data
        if not data:
            return b"".join(chunks)
        if name != "gzip":
            raise BadRequest(f"request body has {len(data)} bytes after the end of its {name} data")
        # gzip allows several members back to back; go on with the next one


# -- response --------------------------------------------------------------------------------------------


def check_requested_outputs(
    model_name: str, requested: Sequence[RequestedOutput] | None, output_names: Iterable[str]
) -> None:
    """Refuse requested outputs the model does not have, before running it."""
    if requested is None:
        return
    names = list(output_names)
    known = set(names)
    for output in requested:
        if output.name not in known:
            raise BadRequest(
                f"model {model_name} has no output '{output.name}'; outputs are: {', '.join(names) or '(none)'}"
            )


def encode_infer_response(
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Mapping[str, Any],
    requested: Sequence[RequestedOutput] | None,
    binary_default: bool,
    datatypes: Mapping[str, str] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers (Content-Type, and Inference-Header-Content-Length when binary).

    Args:
        outputs: the model's outputs in order (NumPy arrays, or anything ``np.asarray`` takes).
        requested: the request's ``outputs`` (only those are sent, in that order), or None for all.
        binary_default: whether unrequested-for outputs go binary (the request's ``binary_data_output``).
        datatypes: the V2 datatype to declare per output (from the signature); the array is cast to it.
            ``BF16`` sends an FP32 array as bfloat16 (round to nearest even), always in binary form.

    Raises:
        BadRequest: a requested output the model does not have.
        ServingError (500): an output NumPy type with no V2 datatype.
    """
    if requested is None:
        selected = [(name, binary_default) for name in outputs]
    else:
        check_requested_outputs(model_name, requested, outputs)
        selected = [(r.name, r.binary) for r in requested]

    tensors: list[dict[str, Any]] = []
    blobs: list[Any] = []
    for name, binary in selected:
        array = np.asarray(outputs[name])
        declared = datatypes.get(name) if datatypes else None
        datatype = declared or _datatype_of(name, array)
        if datatype == "BF16":
            binary = True
            array = _to_bf16(array)
        elif declared is not None and datatype != "BYTES" and array.dtype != V2_TO_NUMPY[datatype]:
            array = array.astype(V2_TO_NUMPY[datatype])
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if datatype == "BYTES":
            elements = [element_as_bytes(v) for v in array.ravel().tolist()]
            texts = None if binary else _utf8_or_none(elements)
            if texts is None:
                blob: Any = _serialize_bytes(elements)
                tensor["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                tensor["data"] = texts
        elif binary:
            blob = np.ascontiguousarray(array)
            if blob.dtype.byteorder == ">" or (blob.dtype.byteorder == "=" and not _LITTLE):
                blob = blob.astype(blob.dtype.newbyteorder("<"))
            tensor["parameters"] = {"binary_data_size": blob.nbytes}
            blobs.append(blob)
        else:
            tensor["data"] = array.ravel().tolist()
        tensors.append(tensor)

    doc: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        doc["model_version"] = model_version
    if request_id is not None:
        doc["id"] = request_id
    doc["outputs"] = tensors
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return header, {"Content-Type": "application/json"}
    return b"".join([header, *blobs]), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


_LITTLE = np.little_endian


def _datatype_of(name: str, array: Array) -> str:
    try:
        return numpy_to_v2(array.dtype)
    except ValueError:
        raise ServingError(f"output '{name}' has NumPy type {array.dtype}, which has no V2 datatype") from None


def _to_bf16(array: Array) -> Array:
    with np.errstate(over="ignore"):
        f32 = np.ascontiguousarray(array, dtype="<f4")
    bits = f32.view("<u4")
    # round to nearest even; NaN keeps its quiet bit so it stays NaN after the truncation
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    rounded = np.where(np.isnan(f32), (bits >> 16) | 0x40, rounded)
    return rounded.astype("<u2").reshape(array.shape)


def _serialize_bytes(elements: list[bytes]) -> bytes:
    pack = struct.Struct("<I").pack
    parts: list[bytes] = []
    for element in elements:
        parts.append(pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def _utf8_or_none(elements: list[bytes]) -> list[str] | None:
    try:
        return [e.decode("utf-8") for e in elements]
    except UnicodeDecodeError:
        return None


def encode_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


# -- metadata --------------------------------------------------------------------------------------------


def server_metadata(name: str, version: str, extensions: Sequence[str]) -> dict[str, Any]:
    return {"name": name, "version": version, "extensions": list(extensions)}


def model_metadata(name: str, versions: Sequence[str], platform: str, signature: Signature) -> dict[str, Any]:
    """``GET /v2/models/{m}``: shapes include the batch dimension; variable dimensions are -1."""
    return {
        "name": name,
        "versions": [str(v) for v in versions],
        "platform": platform,
        "inputs": [t.to_dict() for t in signature.inputs],
        "outputs": [t.to_dict() for t in signature.outputs],
    }


def model_config(
    name: str,
    platform: str,
    max_batch_size: int,
    signature: Signature,
    *,
    dynamic_batching: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A minimal Triton model config, as ``tritonclient``'s ``get_model_config`` and perf_analyzer read it.

    With ``max_batch_size > 0`` the first dimension of each tensor is the batch and is left out of ``dims``
    (perf_analyzer drops it from the metadata shapes the same way). ``dynamic_batching`` (possibly empty)
    marks a model whose requests are batched on the server.
    """

    def tensor(spec: TensorSpec) -> dict[str, Any]:
        dims = list(spec.shape[1:] if max_batch_size > 0 and spec.shape else spec.shape)
        return {
            "name": spec.name,
            "data_type": TRITON_TYPES[spec.datatype],
            "dims": dims,
            "is_shape_tensor": False,
            "optional": False,
        }

    config: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "backend": "",
        "max_batch_size": max_batch_size,
        "input": [tensor(t) for t in signature.inputs],
        "output": [{k: v for k, v in tensor(t).items() if k != "optional"} for t in signature.outputs],
    }
    if dynamic_batching is not None:
        config["dynamic_batching"] = dict(dynamic_batching)
    return config


def validate_inputs(model_name: str, inputs: Sequence[InferInput], signature: Signature) -> None:
    """Refuse inputs a model does not declare, missing inputs, and datatypes or shapes that do not fit.

    A declared -1 dimension fits any size; a BF16 input fits an FP32 or BF16 declaration (it arrives as FP32).
    A signature without inputs (not known) accepts anything.
    """
    if not signature.inputs:
        return
    declared = {t.name: t for t in signature.inputs}
    names = ", ".join(declared)
    for tensor in inputs:
        spec = declared.get(tensor.name)
        if spec is None:
            raise BadRequest(f"model {model_name} has no input '{tensor.name}'; inputs are: {names}")
        fits = tensor.datatype == spec.datatype or (tensor.datatype == "BF16" and spec.datatype == "FP32")
        if not fits:
            raise BadRequest(f"input '{tensor.name}' must be {spec.datatype}, got {tensor.datatype}")
        if len(tensor.shape) != len(spec.shape) or any(
            d != -1 and d != got for d, got in zip(spec.shape, tensor.shape, strict=True)
        ):
            raise BadRequest(
                f"input '{tensor.name}' must have shape {shape_str(spec.shape)}, got {shape_str(tensor.shape)}"
            )
    missing = [name for name in declared if name not in {t.name for t in inputs}]
    if missing:
        raise BadRequest(f"model {model_name} needs input(s) {', '.join(missing)}; inputs are: {names}")
