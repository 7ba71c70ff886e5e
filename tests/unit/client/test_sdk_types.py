"""The SDK's public calls say what they return: a read model of ``dlcloud.schemas`` (or a list of them), a
path, an id, log lines or nothing; never a bare ``dict`` nor ``Any``, so a caller's attribute typo is a mypy
error (mypy checks ``dlcloud.client`` strictly; pyproject.toml)."""

from __future__ import annotations

import collections.abc
import inspect
import typing
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from dlcloud.client.accounting import AccountingAPI
from dlcloud.client.base import Client
from dlcloud.client.datasets import DatasetsAPI
from dlcloud.client.environments import EnvironmentsAPI
from dlcloud.client.jobs import CodeAPI, JobsAPI, LogLine
from dlcloud.client.models import ModelsAPI
from dlcloud.client.registry import RegistryAPI
from dlcloud.client.studies import StudiesAPI
from dlcloud.client.tenants import KeysAPI, TenantsAPI, UsersAPI

APIS = [Client, JobsAPI, CodeAPI, EnvironmentsAPI, ModelsAPI, DatasetsAPI, TenantsAPI, UsersAPI, KeysAPI]
APIS += [AccountingAPI, StudiesAPI]
NOT_CALLS = {"close", "from_env"}  # the client's own plumbing, not calls of the API


def _bindings(cls: type) -> dict[Any, Any]:
    """What a registry API binds ``RegistryAPI``'s type variables to (``EntryT`` -> ``Model``)."""
    for base in getattr(cls, "__orig_bases__", ()):
        if typing.get_origin(base) is RegistryAPI:
            return dict(zip(RegistryAPI.__parameters__, typing.get_args(base), strict=True))
    return {}


def _allowed(hint: Any) -> bool:
    """A read model, a list of them, a Path, a str, log lines, or None."""
    if hint in (type(None), Path, str):
        return True
    if inspect.isclass(hint):
        return issubclass(hint, BaseModel)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return _allowed(args[0])
    if origin is collections.abc.Iterator:
        return args == (LogLine,)
    return False


def public_calls() -> list[tuple[str, type, Any]]:
    out = []
    for cls in APIS:
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or name in NOT_CALLS:
                continue
            out.append((f"{cls.__name__}.{name}", cls, fn))
    return out


@pytest.mark.parametrize(("name", "cls", "fn"), public_calls(), ids=[c[0] for c in public_calls()])
def test_each_public_call_returns_a_read_model_never_a_dict(name: str, cls: type, fn: Any) -> None:
    hint = typing.get_type_hints(fn)["return"]
    if isinstance(hint, TypeVar):
        hint = _bindings(cls)[hint]
    elif typing.get_origin(hint) is list and isinstance(typing.get_args(hint)[0], TypeVar):
        hint = list[_bindings(cls)[typing.get_args(hint)[0]]]  # type: ignore[misc]
    assert hint is not Any and typing.get_origin(hint) is not dict, f"{name} returns {hint}"
    assert _allowed(hint), f"{name} returns {hint}, not a read model of dlcloud.schemas"


def test_the_registry_calls_are_typed_per_registry() -> None:
    models, datasets = _bindings(ModelsAPI), _bindings(DatasetsAPI)
    assert [t.__name__ for t in models.values()] == ["Model", "ModelDetail", "ModelVersion", "ModelLabel", "ModelShare"]
    assert [t.__name__ for t in datasets.values()] == [
        "Dataset",
        "DatasetDetail",
        "DatasetVersion",
        "DatasetLabel",
        "DatasetShare",
    ]
    # the class attributes the calls read answers with are the same types
    for api, bound in ((ModelsAPI, models), (DatasetsAPI, datasets)):
        attrs = [api.entry_model, api.detail_model, api.version_model, api.label_model, api.share_model]
        assert attrs == list(bound.values())


def test_there_are_calls_to_check() -> None:
    assert len(public_calls()) >= 50
