"""XGBoost boosters saved with ``save_model`` as JSON (``.json``) or UBJSON (``.ubj``).

Loading reads no pickle, so unlike scikit-learn artifacts these run no code. Models saved from the
scikit-learn wrappers (``XGBClassifier.save_model``) load as plain boosters: ``predictions`` then holds
what ``inplace_predict`` returns (class probabilities for ``multi:softprob``/``binary:logistic``, not
labels).

Naming (fixed):
- one input ``input``: FP32, ``[-1, num_features]``; FP64 requests are narrowed by ``check_inputs``.
- one output ``predictions``: FP32; its shape follows the objective (``[-1]`` for regression, binary
  and ``multi:softmax``; ``[-1, num_class]`` for ``multi:softprob``; ``[-1, num_target]`` for
  multi-target models). The shape is read from one probe prediction on a row of zeros at load.

Options:
- ``threads``: the booster's ``nthread`` (XGBoost's default: all cores). Per booster, not process-wide.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlcloud.serving.errors import BadRequest
from dlcloud.serving.loaders.base import Arrays, Predictor, find_artifact, import_optional
from dlcloud.serving.types import Signature, TensorSpec

SUFFIXES = (".json", ".ubj")
INPUT = "input"
OUTPUT = "predictions"


class XGBoostPredictor(Predictor):
    format = "xgboost"
    platform = "xgboost"
    option_names = ("threads",)

    _booster: Any = None

    def _load(self) -> Signature | None:
        xgb = import_optional("xgboost", fmt=self.format, extra="xgboost", package="xgboost-cpu")
        artifact = find_artifact(self.path, SUFFIXES, self.format)
        booster = xgb.Booster()
        booster.load_model(str(artifact))
        if "threads" in self.options:
            threads = int(self.options["threads"])
            if threads < 1:
                raise ValueError(f"the xgboost option threads must be >= 1, got {threads}")
            booster.set_param({"nthread": threads})
        self._booster = booster
        width = int(booster.num_features())
        shape: tuple[int, ...] = (-1,)
        if width > 0:
            probe = np.asarray(booster.inplace_predict(np.zeros((1, width), dtype=np.float32)))
            shape = (-1, *probe.shape[1:])
        return Signature(
            inputs=(TensorSpec(INPUT, "FP32", (-1, width if width > 0 else -1)),),
            outputs=(TensorSpec(OUTPUT, "FP32", shape),),
        )

    def _predict(self, inputs: Arrays) -> Arrays:
        if len(inputs) != 1:
            raise BadRequest(f"the xgboost model takes one input {INPUT!r}, got {len(inputs)}")
        (features,) = inputs.values()
        return {OUTPUT: np.asarray(self._booster.inplace_predict(features))}

    def _unload(self) -> None:
        self._booster = None
