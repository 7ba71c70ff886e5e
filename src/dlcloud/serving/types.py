"""Tensor specs, model signatures and the V2 datatype tables shared by loaders, protocols and the registry."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlcloud.serving.signatures import DATATYPES, NUMPY_DATATYPES, Signature, TensorSpec

__all__ = ["DATATYPES", "V2_TO_NUMPY", "Signature", "TensorSpec", "numpy_to_v2"]

# V2 / Open Inference Protocol datatype -> NumPy dtype. BYTES is an object array of ``bytes``.
# BF16 has no NumPy dtype: it is accepted in binary form and widened to FP32 (see protocol/v2.py).
V2_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
assert tuple(V2_TO_NUMPY) == NUMPY_DATATYPES  # one list of datatypes: signatures.py


def numpy_to_v2(dtype: np.dtype[Any]) -> str:
    """The V2 datatype of a NumPy dtype (strings and bytes map to BYTES)."""
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, candidate in V2_TO_NUMPY.items():
        if candidate == dtype:
            return name
    raise ValueError(f"no V2 datatype for numpy dtype {dtype}")
