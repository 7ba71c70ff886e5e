"""Tensor specs, model signatures and the V2 datatype tables shared by loaders, protocols and the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
DATATYPES: tuple[str, ...] = (*V2_TO_NUMPY, "BF16")


def numpy_to_v2(dtype: np.dtype[Any]) -> str:
    """The V2 datatype of a NumPy dtype (strings and bytes map to BYTES)."""
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, candidate in V2_TO_NUMPY.items():
        if candidate == dtype:
            return name
    raise ValueError(f"no V2 datatype for numpy dtype {dtype}")


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output. ``shape`` includes the batch dimension; -1 marks a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        datatype = str(data["datatype"]).upper()
        if datatype not in DATATYPES:
            raise ValueError(f"datatype must be one of {', '.join(DATATYPES)}, got {data['datatype']!r}")
        shape = tuple(int(d) for d in data.get("shape", ()))
        if any(d < -1 for d in shape):
            raise ValueError(f"shape dimensions must be >= -1, got {list(shape)}")
        return cls(name=str(data["name"]), datatype=datatype, shape=shape)


@dataclass(frozen=True)
class Signature:
    """Inputs and outputs of a model, in the order the model declares them."""

    inputs: tuple[TensorSpec, ...] = field(default_factory=tuple)
    outputs: tuple[TensorSpec, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signature:
        return cls(
            inputs=tuple(TensorSpec.from_dict(t) for t in data.get("inputs", ())),
            outputs=tuple(TensorSpec.from_dict(t) for t in data.get("outputs", ())),
        )

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)
