"""The Predictor plugin base and the loader registry.

A Predictor wraps one model artifact (a file or a directory). ``load()`` imports the heavy library and
reads the artifact; ``predict()`` is synchronous, runs in a worker thread, takes and returns dicts of
NumPy arrays whose first dimension is the batch; ``unload()`` drops references so memory can be freed.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import ClassVar

import numpy as np

from dlcloud.serving.types import Signature

Arrays = dict[str, np.ndarray]


class Predictor(abc.ABC):
    """One loaded model version. Subclasses fill ``_load``, ``_predict`` and optionally ``_unload``."""

    format: ClassVar[str]
    #: the ``platform`` string of V2 model metadata (e.g. ``pytorch_torchscript``, ``onnxruntime_onnx``)
    platform: ClassVar[str]

    def __init__(self, path: Path, signature: Signature | None = None) -> None:
        self.path = path
        self._declared = signature
        self._signature: Signature | None = None
        self.loaded = False

    @property
    def signature(self) -> Signature:
        """The declared signature, else the one the loader inferred from the artifact."""
        if self._declared is not None:
            return self._declared
        if self._signature is None:
            raise ValueError(
                f"the {self.format} model at {self.path} does not describe its inputs and outputs; "
                "declare a signature (inputs/outputs with name, datatype, shape)"
            )
        return self._signature

    def load(self) -> None:
        self._signature = self._load()
        self.loaded = True

    def predict(self, inputs: Arrays) -> Arrays:
        return self._predict(inputs)

    def unload(self) -> None:
        self._unload()
        self.loaded = False

    @abc.abstractmethod
    def _load(self) -> Signature | None:
        """Import the library, read the artifact, return the inferred signature (None if it cannot be)."""

    @abc.abstractmethod
    def _predict(self, inputs: Arrays) -> Arrays:
        """Run one batch."""

    def _unload(self) -> None:  # noqa: B027 - optional hook
        """Drop the model."""
