"""JSON <-> NumPy conversions shared by the V2 and TF Serving codecs.

JSON numbers are checked against the target datatype instead of being cast blindly: ``np.asarray(["1.5"],
dtype=np.float32)`` would accept a string and ``np.asarray([1.7], dtype=np.int32)`` would truncate, so the
data is first read with NumPy's own type inference (one C pass) and then converted with explicit checks.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import numpy.typing as npt

from dlcloud.serving.errors import BadRequest

Array = npt.NDArray[Any]

_BOUNDS: dict[np.dtype[Any], tuple[int, int]] = {}
for _dt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
    _info = np.iinfo(_dt)
    _BOUNDS[np.dtype(_dt)] = (int(_info.min), int(_info.max))


def shape_str(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def numeric_from_json(data: Any, dtype: np.dtype[Any], datatype: str, what: str) -> Array:
    """A numeric or BOOL array from JSON data (flat or nested), with the shape the nesting gives."""
    try:
        arr = np.asarray(data)
    except ValueError:
        raise BadRequest(f"{what}: data must be a flat list or rectangular nested lists of values") from None
    kind, target = arr.dtype.kind, dtype.kind
    if arr.size == 0 and kind == "f":  # [] and [[], []] read as float64
        return arr.astype(dtype)
    if kind == "f":
        if target == "f":
            if arr.dtype != dtype:
                with np.errstate(over="ignore"):  # out-of-range values become +-inf, like a C cast
                    arr = arr.astype(dtype)
            return arr
        if target == "b":
            raise BadRequest(f"{what} is BOOL; data must be true/false (or 0/1)")
        if arr.size and not (np.isfinite(arr).all() and (arr == np.trunc(arr)).all()):
            raise BadRequest(f"{what} is {datatype}; data must be whole numbers")
        _check_bounds(arr, dtype, datatype, what)
        # Whole numbers, but possibly read through float64 (NumPy does so for ints past int64 mixed with
        # smaller ones): convert from the JSON values themselves so that large integers stay exact.
        try:
            with np.errstate(all="ignore"):
                return np.asarray(data, dtype=dtype)
        except OverflowError:
            lo, hi = _BOUNDS[dtype]
            raise BadRequest(f"{what} is {datatype}; values must be in {lo}..{hi}") from None
    if kind in "iu":
        if target == "b":
            if arr.size and ((arr != 0) & (arr != 1)).any():
                raise BadRequest(f"{what} is BOOL; data must be true/false (or 0/1)")
            return arr != 0
        if target in "iu":
            _check_bounds(arr, dtype, datatype, what)
        return arr.astype(dtype, copy=False)
    if kind == "b":
        if target == "b":
            return arr
        raise BadRequest(f"{what} is {datatype}; data must be numbers, got true/false")
    if kind == "O" and target in "iu" and all(type(v) is int for v in arr.ravel()):
        # integers beyond int64/uint64 mixed with others: NumPy falls back to objects
        try:
            return np.asarray(data, dtype=dtype)
        except OverflowError:
            lo, hi = _BOUNDS[dtype]
            raise BadRequest(f"{what} is {datatype}; values must be in {lo}..{hi}") from None
    raise BadRequest(f"{what} is {datatype}; data must be numbers, got {_describe(arr)}")


def _check_bounds(arr: Array, dtype: np.dtype[Any], datatype: str, what: str) -> None:
    if not arr.size:
        return
    lo, hi = _BOUNDS[dtype]
    low, high = arr.min(), arr.max()
    if low < lo or high > hi:
        bad = low if low < lo else high
        raise BadRequest(f"{what} is {datatype}; values must be in {lo}..{hi}, got {bad}")


def _describe(arr: Array) -> str:
    if arr.dtype.kind in "US":
        return "strings"
    if arr.dtype.kind == "O":
        types = sorted({type(v).__name__ for v in arr.ravel()[:100]} - {"int", "float"})
        names = {"NoneType": "null", "str": "strings", "dict": "objects", "list": "ragged lists"}
        return ", ".join(names.get(t, t) for t in types) or "mixed values"
    return f"{arr.dtype} values"


def nested_leaves(data: Any, what: str) -> tuple[tuple[int, ...], list[Any]]:
    """The shape of a rectangular nested list and its leaves in row-major order."""
    shape: list[int] = []
    leaves: list[Any] = []
    leaf_depth = -1

    def walk(value: Any, depth: int) -> None:
        nonlocal leaf_depth
        if isinstance(value, list):
            if leaf_depth != -1 and depth >= leaf_depth:
                raise BadRequest(f"{what}: nested lists must be rectangular")
            if depth == len(shape):
                shape.append(len(value))
            elif shape[depth] != len(value):
                raise BadRequest(f"{what}: nested lists must be rectangular")
            for item in value:
                walk(item, depth + 1)
        else:
            if leaf_depth == -1:
                if depth != len(shape):
                    raise BadRequest(f"{what}: nested lists must be rectangular")
                leaf_depth = depth
            elif depth != leaf_depth:
                raise BadRequest(f"{what}: nested lists must be rectangular")
            leaves.append(value)

    try:
        walk(data, 0)
    except RecursionError:
        raise BadRequest(f"{what}: data is nested too deeply") from None
    return tuple(shape), leaves


def is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def to_bytes_element(value: Any, what: str, *, allow_b64: bool) -> bytes:
    """One BYTES element from JSON: a string (UTF-8 encoded) or, for TF Serving, ``{"b64": ...}``."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if allow_b64 and is_b64(value):
        encoded = value["b64"]
        if not isinstance(encoded, str):
            raise BadRequest(f'{what}: "b64" must hold a base64 string')
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f'{what}: "b64" value is not valid base64') from None
    allowed = 'strings or {"b64": "..."} objects' if allow_b64 else "strings"
    raise BadRequest(f"{what} is BYTES; data must be {allowed}, got {type(value).__name__}")


def bytes_array(elements: list[bytes], shape: tuple[int, ...]) -> Array:
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    return arr.reshape(shape)


def element_as_bytes(value: Any) -> bytes:
    """One element of a BYTES output as bytes (str is UTF-8 encoded, anything else goes through str())."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview, np.bytes_)):
        return bytes(value)
    return str(value).encode("utf-8")
