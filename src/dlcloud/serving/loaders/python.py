"""Custom Python predictors: a directory with ``predictor.py`` (or the module ``model.yaml`` names).

The module defines one class with ``load(self)`` and ``predict(self, batch: dict[str, np.ndarray]) ->
dict[str, np.ndarray]``. The loader imports the module from the directory, instantiates the class (with
the model directory as the only argument when its constructor takes one), calls ``load()``, and then
calls ``predict`` once per batch. After ``load()``, an optional ``signature`` attribute (a dict in
``Signature.to_dict`` form, or a ``Signature``) describes the inputs and outputs; without it a
``signature.json``/``signature.yaml`` in the directory is used, else there is none. An optional
``unload(self)`` is called when the version is unloaded.

``model.yaml`` (optional)::

    module: my_model.py     # default predictor.py
    class: MyModel          # default: the one class in the module with load and predict

Isolation: every load imports the module under a fresh, unique name (``_dlcloud_model_<hex>``) as a
package whose path is the model directory, so two versions that both ship ``predictor.py`` and a
``helpers.py`` never share modules. Sibling modules are imported relatively (``from . import helpers``);
``sys.path`` is not touched. Unload removes the module and its submodules from ``sys.modules``.

Security: this runs the directory's code in the server process; it must come from the trusted registry.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dlcloud.serving.errors import InferenceFailed
from dlcloud.serving.loaders.base import Arrays, Predictor, read_sidecar_signature
from dlcloud.serving.types import Signature

DEFAULT_MODULE = "predictor.py"
CONFIG = "model.yaml"


def read_config(directory: Path) -> dict[str, Any]:
    """The directory's ``model.yaml`` (empty when there is none)."""
    config_path = directory / CONFIG
    if not config_path.is_file():
        return {}
    import yaml  # yaml: loaded only for a predictor with a config

    data = yaml.safe_load(config_path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{config_path} must hold a mapping (module:, class:)")
    unknown = sorted(set(data) - {"module", "class"})
    if unknown:
        raise ValueError(f"{config_path}: unknown key(s) {', '.join(unknown)}; allowed: module, class")
    return data


def module_path(directory: Path) -> Path:
    """The file that defines the predictor class."""
    name = str(read_config(directory).get("module", DEFAULT_MODULE))
    if not name.endswith(".py"):
        name = name.replace(".", "/") + ".py"
    path = (directory / name).resolve()
    if not path.is_relative_to(directory.resolve()):
        raise ValueError(f"{directory / CONFIG}: module {name!r} must be inside the model directory")
    if not path.is_file():
        raise ValueError(f"the python model at {directory} has no {name}")
    return path


def _is_predictor_class(obj: Any, module: ModuleType) -> bool:
    return (
        inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and callable(getattr(obj, "load", None))
        and callable(getattr(obj, "predict", None))
    )


def _takes_argument(cls: type) -> bool:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


class PythonPredictor(Predictor):
    format = "python"
    platform = "python"

    _instance: Any = None
    _module_name: str | None = None

    def _load(self) -> Signature | None:
        if not self.path.is_dir():
            raise ValueError(f"a python model is a directory with {DEFAULT_MODULE}; {self.path} is not a directory")
        file = module_path(self.path)
        module = self._import(file)
        try:
            return self._instantiate(module, file)
        except BaseException:
            self._instance = None
            self._forget_modules()
            raise

    def _instantiate(self, module: ModuleType, file: Path) -> Signature | None:
        config = read_config(self.path)
        if "class" in config:
            cls = getattr(module, str(config["class"]), None)
            if cls is None or not _is_predictor_class(cls, module):
                raise ValueError(f"{file.name} has no class {config['class']!r} with load() and predict()")
        else:
            candidates = [obj for obj in vars(module).values() if _is_predictor_class(obj, module)]
            if len(candidates) != 1:
                found = ", ".join(c.__name__ for c in candidates) or "none"
                raise ValueError(
                    f"{file.name} must define exactly one class with load() and predict() (found {found}); "
                    f"name the class in {CONFIG} (class: ...)"
                )
            cls = candidates[0]
        instance = cls(self.path) if _takes_argument(cls) else cls()
        instance.load()
        self._instance = instance
        declared = getattr(instance, "signature", None)
        if isinstance(declared, Signature):
            return declared
        if isinstance(declared, Mapping):
            try:
                return Signature.from_dict(dict(declared))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{cls.__name__}.signature is not a valid signature: {exc}") from exc
        if declared is not None:
            raise ValueError(
                f"{cls.__name__}.signature must be a dict (inputs, outputs), got {type(declared).__name__}"
            )
        return read_sidecar_signature(self.path)

    def _import(self, file: Path) -> ModuleType:
        name = f"_dlcloud_model_{uuid.uuid4().hex}"
        spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=[str(self.path)])
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {file}")
        module = importlib.util.module_from_spec(spec)
        # registered while loaded: dataclasses, pickle and relative imports look the module up by name
        sys.modules[name] = module
        self._module_name = name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            self._forget_modules()
            raise
        return module

    def _predict(self, inputs: Arrays) -> Arrays:
        result = self._instance.predict(inputs)
        if not isinstance(result, Mapping):
            raise InferenceFailed(f"the python model's predict returned {type(result).__name__}, not a dict of arrays")
        return {str(name): np.asarray(value) for name, value in result.items()}

    def _forget_modules(self) -> None:
        name = self._module_name
        if name is None:
            return
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        self._module_name = None

    def _unload(self) -> None:
        unload = getattr(self._instance, "unload", None)
        if callable(unload):
            unload()
        self._instance = None
        self._forget_modules()
