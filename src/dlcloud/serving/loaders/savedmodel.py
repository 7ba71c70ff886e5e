"""TensorFlow SavedModels (a directory holding ``saved_model.pb``), run with ``tf.saved_model.load``.

The signature is the SavedModel's own: the input names, dtypes and shapes of the chosen signature
function's keyword arguments (``structured_input_signature``), and its ``structured_outputs`` (a dict;
a bare tensor output is named ``output_0`` as TensorFlow does), both sorted by name as ``tf.nest``
orders dict keys (the SavedModel does not keep the order they were written in). Unknown dimensions become -1, unknown
ranks an empty shape (not checked). TF Serving's REST protocol and this loader agree on these names.

Works with tensorflow-cpu. TensorFlow's C++ log chatter goes to stderr; the server may set
``TF_CPP_MIN_LOG_LEVEL`` before the first load to quiet it.

Options:
- ``signature_name``: which signature to serve (default ``serving_default``).
- ``tags``: the MetaGraph tags to load (default: TensorFlow's, ``serve``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlcloud.serving.errors import InferenceFailed
from dlcloud.serving.loaders.base import Arrays, Predictor, dims, import_optional
from dlcloud.serving.types import Signature, TensorSpec, numpy_to_v2

DEFAULT_SIGNATURE = "serving_default"


def _spec(tf: Any, name: str, spec: Any) -> TensorSpec:
    dtype = spec.dtype
    if dtype == tf.string:
        datatype = "BYTES"
    elif dtype == tf.bfloat16:
        datatype = "BF16"
    else:
        datatype = numpy_to_v2(np.dtype(dtype.as_numpy_dtype))
    shape = dims(spec.shape.as_list()) if spec.shape.rank is not None else ()
    return TensorSpec(name, datatype, shape)


class SavedModelPredictor(Predictor):
    format = "savedmodel"
    platform = "tensorflow_savedmodel"
    option_names = ("signature_name", "tags")

    _tf: Any = None
    _model: Any = None
    _function: Any = None
    _dtypes: dict[str, Any]

    def _load(self) -> Signature | None:
        tf = import_optional("tensorflow", fmt=self.format, extra="tensorflow", package="tensorflow-cpu")
        if not (self.path / "saved_model.pb").is_file():
            raise ValueError(f"{self.path} is not a SavedModel directory (it has no saved_model.pb)")
        tags = self.options.get("tags")
        model = tf.saved_model.load(str(self.path), tags=tags)
        name = str(self.options.get("signature_name", DEFAULT_SIGNATURE))
        if name not in model.signatures:
            available = ", ".join(sorted(model.signatures)) or "none"
            raise ValueError(f"the SavedModel at {self.path} has no signature {name!r}; it has {available}")
        function = model.signatures[name]
        args, kwargs = function.structured_input_signature
        if args:
            raise ValueError(f"the SavedModel signature {name!r} takes positional inputs; only named inputs are served")
        inputs = tuple(_spec(tf, key, kwargs[key]) for key in sorted(kwargs))
        structured = function.structured_outputs
        if not isinstance(structured, dict):
            structured = {"output_0": structured}
        outputs = tuple(_spec(tf, key, structured[key]) for key in sorted(structured))
        self._tf, self._model, self._function = tf, model, function
        self._dtypes = {key: spec.dtype for key, spec in kwargs.items()}
        return Signature(inputs=inputs, outputs=outputs)

    def _predict(self, inputs: Arrays) -> Arrays:
        tf = self._tf
        tensors = {name: tf.convert_to_tensor(array, dtype=self._dtypes.get(name)) for name, array in inputs.items()}
        result = self._function(**tensors)
        if not isinstance(result, dict):
            raise InferenceFailed(f"the SavedModel returned {type(result).__name__}, not a dict of tensors")
        return {str(name): np.asarray(tensor.numpy()) for name, tensor in result.items()}

    def _unload(self) -> None:
        self._model = self._function = None
