"""Several models behind one name ("multi-model fusion"): preprocess once, fan out, combine.

A pipeline is served like a model on both protocols. Each step goes through its model's own batch queue,
so a pipeline request and a direct request to the same model share batches. User functions:

- ``preprocess(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`` runs once per request;
- ``combine(outputs: dict[str, dict[str, np.ndarray]], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``
  gets every step's outputs keyed by model name, plus the preprocessed inputs.

Built-in combines: ``concat`` (every step's outputs, named ``<model>.<output>``) and ``mean:<output>``
(element-wise mean of that output over the steps, named ``<output>``). User functions run in a worker thread.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dlcloud.serving.config import PipelineSpec
from dlcloud.serving.errors import BadRequest
from dlcloud.serving.loaders.base import Arrays
from dlcloud.serving.types import Signature, TensorSpec


class StepModels(Protocol):
    """What a pipeline asks of the models its steps run (``repository.ModelRepository`` is one)."""

    def signature_of(self, name: str) -> Signature | None:
        """The signature of model ``name``'s default version; None when it has none (or no version)."""
        ...

    async def infer(
        self, name: str, version: int | None, label: str | None, inputs: Arrays, timeout: float | None = None
    ) -> tuple[object, Arrays]: ...


_module_ids = itertools.count(1)


def load_function(reference: str, base_dir: Path) -> Callable[..., Any]:
    """``file.py:function`` (relative to ``base_dir``) -> the function, imported under a private name."""
    file_part, sep, func_name = reference.rpartition(":")
    if not sep or not file_part or not func_name:
        raise ValueError(f"{reference!r} must look like file.py:function")
    path = Path(file_part)
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise ValueError(f"{path} does not exist (from {reference!r})")
    module_name = f"_dlcloud_pipeline_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling inside user code need it registered
    spec.loader.exec_module(module)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"{path} has no function {func_name!r}")
    return func


def _concat(outputs: dict[str, Arrays], inputs: Arrays) -> Arrays:
    return {f"{model}.{name}": array for model, arrays in outputs.items() for name, array in arrays.items()}


def _mean(output: str) -> Callable[[dict[str, Arrays], Arrays], Arrays]:
    def combine(outputs: dict[str, Arrays], inputs: Arrays) -> Arrays:
        try:
            parts = [np.asarray(arrays[output], dtype=np.float64) for arrays in outputs.values()]
        except KeyError as exc:
            raise BadRequest(f"combine mean:{output}: a step returned no output {output!r}") from exc
        return {output: np.mean(np.stack(parts), axis=0).astype(np.float32)}

    return combine


class Pipeline:
    def __init__(self, spec: PipelineSpec, repository: StepModels, base_dir: Path) -> None:
        self.spec = spec
        self.repository = repository
        self.base_dir = base_dir
        self._preprocess: Callable[[Arrays], Arrays] | None = None
        self._combine: Callable[[dict[str, Arrays], Arrays], Arrays] = _concat

    def load(self) -> None:
        if self.spec.preprocess:
            self._preprocess = load_function(self.spec.preprocess, self.base_dir)
        combine = self.spec.combine
        if combine == "concat":
            self._combine = _concat
        elif combine.startswith("mean:"):
            self._combine = _mean(combine.partition(":")[2])
        else:
            self._combine = load_function(combine, self.base_dir)

    def signature(self) -> Signature | None:
        """The declared signature; else, when there is no preprocess step, the first step's inputs."""
        if self.spec.signature is not None:
            return Signature.from_dict(self.spec.signature)
        if self._preprocess is not None:
            return None
        first = self.repository.signature_of(self.spec.steps[0].model)
        if first is None:
            return None
        outputs: tuple[TensorSpec, ...] = ()
        if self._combine is _concat:
            specs: list[TensorSpec] = []
            for step in self.spec.steps:
                signature = self.repository.signature_of(step.model)
                if signature is None:
                    break
                specs.extend(TensorSpec(f"{step.model}.{o.name}", o.datatype, o.shape) for o in signature.outputs)
            else:
                outputs = tuple(specs)
        return Signature(inputs=first.inputs, outputs=outputs)

    async def run(self, inputs: Arrays, timeout: float | None) -> Arrays:
        prepared = await asyncio.to_thread(self._preprocess, inputs) if self._preprocess is not None else inputs
        if not isinstance(prepared, dict):
            raise BadRequest(f"pipeline '{self.spec.name}': preprocess must return a dict of arrays")

        async def step(model: str, version: int | None, mapping: dict[str, str]) -> Arrays:
            try:
                step_inputs = {name: prepared[source] for name, source in mapping.items()} if mapping else prepared
            except KeyError as exc:
                raise BadRequest(f"pipeline '{self.spec.name}': step {model} needs tensor {exc}") from exc
            _, out = await self.repository.infer(model, version, None, step_inputs, timeout)
            return out

        results = await asyncio.gather(*(step(s.model, s.version, s.inputs) for s in self.spec.steps))
        by_model = {s.model: out for s, out in zip(self.spec.steps, results, strict=True)}
        if self._combine is _concat:
            return _concat(by_model, prepared)
        return await asyncio.to_thread(self._combine, by_model, prepared)
