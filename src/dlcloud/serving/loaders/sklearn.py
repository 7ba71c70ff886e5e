"""scikit-learn estimators and pipelines, pickled with joblib or pickle (``.joblib``, ``.pkl``, ``.pickle``).

Security: unpickling runs arbitrary code. Artifacts must come from the trusted model registry (which
only accepts uploads from authenticated tenants); never point the server at a pickle from elsewhere.

Naming (fixed, so a declared signature must use these names):
- one input ``input``: FP64, ``[-1, n_features_in_]`` (``[-1, -1]`` when the estimator does not say);
  FP32 or integer requests are widened to FP64 by ``check_inputs``.
- classifiers (an array ``classes_``): ``label`` from ``predict`` (``[-1]``, the datatype of the classes:
  INT64, BYTES for strings, ...) and, when the estimator has ``predict_proba``, ``probabilities`` (FP64,
  ``[-1, n_classes]``, columns in ``classes_`` order). Multi-output classifiers give ``label``
  ``[-1, n_outputs]`` only.
- everything else (regressors, clusterers): ``predictions`` from ``predict``; its datatype and shape come
  from one probe on a row of zeros when ``n_features_in_`` is known, else FP64 ``[-1]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlcloud.serving.errors import BadRequest
from dlcloud.serving.loaders.base import Arrays, Predictor, find_artifact, import_optional
from dlcloud.serving.types import Signature, TensorSpec, numpy_to_v2

SUFFIXES = (".joblib", ".pkl", ".pickle")
INPUT = "input"


class SklearnPredictor(Predictor):
    format = "sklearn"
    platform = "sklearn"

    _estimator: Any = None
    _proba = False
    _label = "predictions"

    def _load(self) -> Signature | None:
        import_optional("sklearn", fmt=self.format, extra="sklearn", package="scikit-learn")
        joblib = import_optional("joblib", fmt=self.format, extra="sklearn")
        artifact = find_artifact(self.path, SUFFIXES, self.format)
        estimator = joblib.load(artifact)  # joblib reads plain pickles too
        if not callable(getattr(estimator, "predict", None)):
            raise ValueError(f"{artifact} holds a {type(estimator).__name__}, which has no predict method")
        self._estimator = estimator
        n_features = getattr(estimator, "n_features_in_", None)
        width = int(n_features) if n_features is not None else -1
        inputs = (TensorSpec(INPUT, "FP64", (-1, width)),)
        classes = getattr(estimator, "classes_", None)
        outputs: list[TensorSpec] = []
        if isinstance(classes, np.ndarray):
            self._label = "label"
            outputs.append(TensorSpec("label", numpy_to_v2(classes.dtype), (-1,)))
            self._proba = hasattr(estimator, "predict_proba")  # hasattr honours sklearn's available_if
            if self._proba:
                outputs.append(TensorSpec("probabilities", "FP64", (-1, len(classes))))
        elif isinstance(classes, list):  # multi-output classifier: one array of classes per output
            self._label = "label"
            outputs.append(TensorSpec("label", numpy_to_v2(classes[0].dtype), (-1, len(classes))))
        else:
            self._label = "predictions"
            outputs.append(self._probe(estimator, width))
        return Signature(inputs=inputs, outputs=tuple(outputs))

    @staticmethod
    def _probe(estimator: Any, width: int) -> TensorSpec:
        if width > 0:
            try:
                result = np.asarray(estimator.predict(np.zeros((1, width))))
                return TensorSpec("predictions", numpy_to_v2(result.dtype), (-1, *result.shape[1:]))
            except Exception:  # a probe only; the signature falls back to FP64 [-1]
                pass
        return TensorSpec("predictions", "FP64", (-1,))

    def _predict(self, inputs: Arrays) -> Arrays:
        if len(inputs) != 1:
            raise BadRequest(f"the sklearn model takes one input {INPUT!r}, got {len(inputs)}")
        (features,) = inputs.values()
        estimator = self._estimator
        outputs = {self._label: np.asarray(estimator.predict(features))}
        if self._proba:
            outputs["probabilities"] = np.asarray(estimator.predict_proba(features))
        return outputs

    def _unload(self) -> None:
        self._estimator = None
