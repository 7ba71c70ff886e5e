"""Who may see and change a model (``MODELS``: the registries' shared rules, services/registry_access.py),
which version a reference names (``find_version``), its labels and shares (``MODEL_REGISTRY``:
services/registry.py).

- Models are tenant-scoped. Another tenant's model is visible only when it is shared with the caller's tenant,
  and then only for reading (``MODELS.readable``: describe, versions, download, deployment leases); any change to it is
  403 (``MODELS.writable``). A model that is not shared with the caller is 404 ``model_not_found``, exactly like one
  that does not exist.
- Deleting a model or a version and sharing are for its author or a tenant admin (``require_author_or_admin``).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from dlcloud.errors import ModelNotFound, ModelVersionNotFound
from dlcloud.schemas.models import ModelLabel, ModelShare
from dlcloud.services.auth import Caller
from dlcloud.services.registry import Versioned
from dlcloud.services.registry_access import Registry, require_author_or_admin, shown_name
from dlcloud.store import models as store
from dlcloud.store.rows import ModelRow

__all__ = ["MODELS", "MODEL_REGISTRY", "find_version", "require_author_or_admin", "shown_name"]


def _is_shared(s: Session, model: ModelRow, tenant_id: str) -> bool:
    return store.is_shared(s, model.id, tenant_id)


MODELS = Registry("model", store.get_model, _is_shared, ModelNotFound)


def _bad_ref(ref: str, shown: str) -> ModelVersionNotFound:
    return ModelVersionNotFound(
        f"{ref!r} is not a version of model {shown!r}: give a version number, a label or 'latest'"
    )


def _end_share(s: Session, caller: Caller, model: ModelRow, name: str, tenant_id: str) -> None:
    # the tenant can no longer read the model, nor renew or release its leases on it: they end now
    store.delete_tenant_deployments(s, model.id, tenant_id)


MODEL_REGISTRY = Versioned(
    MODELS,
    store.TABLES,
    "artifact_key",
    ModelVersionNotFound,
    _bad_ref,
    ("setting labels", "removing labels"),
    _end_share,
    (ModelLabel, ModelShare),
)
find_version = MODEL_REGISTRY.find_version
