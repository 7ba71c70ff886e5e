"""TorchScript models (``torch.jit.save`` files: ``.pt``, ``.pth``, ``.torchscript``).

Inputs are passed to ``forward`` positionally, in signature order. TorchScript does not record shapes
or dtypes, so the signature is None unless one is declared or a ``signature.json``/``signature.yaml``
sits in the artifact's directory. Without a signature, inputs are matched by ``forward``'s argument
names, else by Triton-style ``INPUT__0``, ``INPUT__1``..., and a single input under any name is passed
as the only argument.

Outputs: a tensor, a tuple/list of tensors or a dict of tensors. Tensors and tuples are named after
the signature's outputs, in order, or ``OUTPUT__0``, ``OUTPUT__1``... when there is none; dict keys are
kept.

Options:
- ``device``: ``"cpu"`` (default) or ``"cuda"``/``"cuda:N"``; the module is loaded there
  (``map_location``) and every batch is moved there and back.

Threads: torch's intra-op thread pool is process-wide (``torch.set_num_threads``), so one model cannot
size it without resizing it for every other model in the server; the loader leaves torch's default
(one thread per physical core) alone, and the server process sets it once (e.g. ``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from dlcloud.serving.errors import BadRequest, InferenceFailed
from dlcloud.serving.loaders.base import (
    Arrays,
    Predictor,
    find_artifact,
    import_optional,
    read_sidecar_signature,
)
from dlcloud.serving.types import Signature

SUFFIXES = (".pt", ".pth", ".torchscript")
_TRITON_INPUT = re.compile(r"^INPUT__(\d+)$")


class TorchScriptPredictor(Predictor):
    format = "torchscript"
    platform = "pytorch_torchscript"
    option_names = ("device",)

    _torch: Any = None
    _module: Any = None
    _device: Any = None
    _arg_names: tuple[str, ...] = ()

    def _load(self) -> Signature | None:
        torch = import_optional("torch", fmt=self.format, extra="pytorch")
        device = str(self.options.get("device", "cpu"))
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"the torchscript model asks for device {device!r}, but torch sees no CUDA device")
        artifact = find_artifact(self.path, SUFFIXES, self.format)
        module = torch.jit.load(str(artifact), map_location=device)
        module.eval()
        self._torch, self._module, self._device = torch, module, torch.device(device)
        arguments = [a.name for a in module.forward.schema.arguments]
        self._arg_names = tuple(arguments[1:])  # drop self
        return read_sidecar_signature(self.path)

    def _order(self, inputs: Arrays) -> list[str]:
        """Input names in ``forward``'s argument order."""
        signature = self._declared or self._signature
        if signature is not None and signature.inputs:
            return [spec.name for spec in signature.inputs]
        if set(inputs) == set(self._arg_names):
            return list(self._arg_names)
        indexed = {int(m.group(1)): name for name in inputs if (m := _TRITON_INPUT.match(name))}
        if len(indexed) == len(inputs) and sorted(indexed) == list(range(len(inputs))):
            return [indexed[i] for i in range(len(inputs))]
        if len(inputs) == 1:
            return list(inputs)
        names = ", ".join(repr(n) for n in self._arg_names)
        raise BadRequest(
            f"cannot tell which input is which: the torchscript model takes {names} (or INPUT__0, INPUT__1, ...); "
            f"got {', '.join(repr(n) for n in inputs)}"
        )

    def _tensor(self, name: str, array: np.ndarray) -> Any:
        if array.dtype.kind in ("O", "S", "U"):
            raise BadRequest(f"input {name!r}: torchscript models take numeric tensors, not BYTES")
        if not array.flags.writeable or any(s < 0 for s in array.strides):
            array = np.array(array)  # torch.from_numpy wants writable memory with positive strides
        return self._torch.from_numpy(array).to(self._device)

    def _numpy(self, tensor: Any) -> np.ndarray:
        torch = self._torch
        if not isinstance(tensor, torch.Tensor):
            raise InferenceFailed(f"the torchscript model returned {type(tensor).__name__}, not a tensor")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return np.asarray(tensor.cpu().numpy())

    def _predict(self, inputs: Arrays) -> Arrays:
        torch = self._torch
        with torch.inference_mode():
            args = [self._tensor(name, inputs[name]) for name in self._order(inputs)]
            result = self._module(*args)
        return self._name_outputs(result)

    def _name_outputs(self, result: Any) -> Arrays:
        if isinstance(result, dict):
            return {str(k): self._numpy(v) for k, v in result.items()}
        values = list(result) if isinstance(result, tuple | list) else [result]
        signature = self._declared or self._signature
        if signature is not None and signature.outputs:
            if len(signature.outputs) != len(values):
                raise InferenceFailed(
                    f"the torchscript model returned {len(values)} tensor(s), but its signature names "
                    f"{len(signature.outputs)} output(s)"
                )
            names = [spec.name for spec in signature.outputs]
        else:
            names = [f"OUTPUT__{i}" for i in range(len(values))]
        return {name: self._numpy(v) for name, v in zip(names, values, strict=True)}

    def _unload(self) -> None:
        self._module = None
