"""Tensor specs and model signatures: plain data, no NumPy, so the registry validates signatures without loading it.

``serving/types.py`` adds the NumPy side (the V2 datatype <-> dtype tables) and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the V2 / Open Inference Protocol datatypes with a NumPy dtype (``types.V2_TO_NUMPY``, in this order), then BF16,
# which has none: it is accepted in binary form and widened to FP32 (see protocol/v2.py)
NUMPY_DATATYPES: tuple[str, ...] = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
)
DATATYPES: tuple[str, ...] = (*NUMPY_DATATYPES, "BF16")


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
