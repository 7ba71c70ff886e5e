"""Who may see and change a model (``MODELS``: the registries' shared rules, services/registry_access.py) and
which version a reference names (``find_version``).

- Models are tenant-scoped. Another tenant's model is visible only when it is shared with the caller's tenant,
  and then only for reading (``MODELS.readable``: describe, versions, download, deployment leases); any change to it is
  403 (``MODELS.writable``). A model that is not shared with the caller is 404 ``model_not_found``, exactly like one
  that does not exist.
- Deleting a model or a version and sharing are for its author or a tenant admin (``require_author_or_admin``).
"""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from dlcloud.errors import ModelNotFound, ModelVersionNotFound
from dlcloud.schemas.models import LABEL_RE
from dlcloud.services.registry_access import Registry, require_author_or_admin, shown_name
from dlcloud.store import models as store
from dlcloud.store.rows import ModelRow, ModelVersionRow

__all__ = ["MODELS", "find_version", "require_author_or_admin", "shown_name"]

DIGITS_RE = re.compile(r"^[0-9]{1,9}$")


def _is_shared(s: Session, model: ModelRow, tenant_id: str) -> bool:
    return store.is_shared(s, model.id, tenant_id)


MODELS = Registry("model", store.get_model, _is_shared, ModelNotFound)


def find_version(s: Session, model: ModelRow, ref: str, shown: str) -> ModelVersionRow:
    """A version by number, by label, or ``latest``."""
    row = None
    if DIGITS_RE.match(ref):
        row = store.get_version(s, model.tenant_id, model.id, int(ref))
        missing = f"model {shown!r} has no version {ref}"
    elif ref == "latest":
        row = store.get_latest_version(s, model.tenant_id, model.id)
        missing = f"model {shown!r} has no versions"
    elif LABEL_RE.match(ref):
        row = store.get_labelled_version(s, model.tenant_id, model.id, ref)
        missing = f"model {shown!r} has no label {ref!r}"
    else:
        missing = f"{ref!r} is not a version of model {shown!r}: give a version number, a label or 'latest'"
    if row is None:
        raise ModelVersionNotFound(missing)
    return row
