"""ONNX models, run by onnxruntime.

The signature is inferred from the session: input and output names as the graph declares them, ONNX
element types mapped to V2 datatypes, symbolic or unknown dimensions as -1. Outputs that are not tensors
(sequences, maps, e.g. skl2onnx's ZipMap) cannot be described by a V2 signature; they are left out of
the signature and not computed. A model whose inputs are not all tensors is refused at load.

Options:
- ``device``: ``"cpu"`` (default) or ``"cuda"``/``"cuda:N"``, which needs the onnxruntime-gpu build
  (the CUDA execution provider) and falls back to the CPU for operators CUDA lacks.
- ``threads``: intra-op threads of this session (onnxruntime's default: one per physical core). Unlike
  torch's, this pool belongs to the session, so it can be sized per model.
"""

from __future__ import annotations

from typing import Any

from dlcloud.serving.loaders.base import Arrays, Predictor, dims, find_artifact, import_optional
from dlcloud.serving.types import Signature, TensorSpec

SUFFIXES = (".onnx",)

#: onnxruntime's element type strings -> V2 datatypes
ONNX_TO_V2 = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}

_ERROR_SEVERITY = 3  # onnxruntime logs: 0 verbose .. 3 error; warnings would otherwise go to stderr per session


class OnnxPredictor(Predictor):
    format = "onnx"
    platform = "onnxruntime_onnx"
    option_names = ("device", "threads")

    _session: Any = None
    _outputs: list[str]

    def _load(self) -> Signature | None:
        ort = import_optional("onnxruntime", fmt=self.format, extra="onnx")
        artifact = find_artifact(self.path, SUFFIXES, self.format)
        options = ort.SessionOptions()
        options.log_severity_level = _ERROR_SEVERITY
        if "threads" in self.options:
            threads = int(self.options["threads"])
            if threads < 1:
                raise ValueError(f"the onnx option threads must be >= 1, got {threads}")
            options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(artifact), sess_options=options, providers=self._providers(ort))
        inputs = []
        for arg in session.get_inputs():
            if arg.type not in ONNX_TO_V2:
                raise ValueError(f"the onnx model's input {arg.name!r} is a {arg.type}; only tensors can be served")
            inputs.append(TensorSpec(arg.name, ONNX_TO_V2[arg.type], dims(arg.shape)))
        outputs = [
            TensorSpec(arg.name, ONNX_TO_V2[arg.type], dims(arg.shape))
            for arg in session.get_outputs()
            if arg.type in ONNX_TO_V2
        ]
        if not outputs:
            raise ValueError("the onnx model has no tensor outputs")
        # a declared signature may list fewer outputs: compute only those
        wanted = self._declared.outputs if self._declared is not None and self._declared.outputs else outputs
        self._session, self._outputs = session, [spec.name for spec in wanted]
        return Signature(inputs=tuple(inputs), outputs=tuple(outputs))

    def _providers(self, ort: Any) -> list[Any]:
        device = str(self.options.get("device", "cpu"))
        if device == "cpu":
            return ["CPUExecutionProvider"]
        if device == "cuda" or device.startswith("cuda:"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise ValueError(
                    f"the onnx model asks for device {device!r}, but this onnxruntime has no CUDA execution "
                    "provider (install onnxruntime-gpu on a machine with CUDA)"
                )
            device_id = int(device.partition(":")[2] or 0)
            return [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
        raise ValueError(f"the onnx option device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")

    def _predict(self, inputs: Arrays) -> Arrays:
        results = self._session.run(self._outputs, inputs)
        return dict(zip(self._outputs, results, strict=True))

    def _unload(self) -> None:
        self._session = None
