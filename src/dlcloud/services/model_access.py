"""Who may see and change a model: names resolved to rows, shares honoured, authors and admins told apart.

- Models are tenant-scoped. Another tenant's model is visible only when it is shared with the caller's tenant,
  and then only for reading (``readable``: describe, versions, download, deployment leases); any change to it is
  403 (``writable``). A model that is not shared with the caller is 404 ``model_not_found``, exactly like one
  that does not exist.
- Deleting a model or a version and sharing are for its author or a tenant admin (``require_author_or_admin``).
"""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from dlcloud.errors import ModelNotFound, ModelVersionNotFound, PermissionDenied
from dlcloud.schemas.models import LABEL_RE
from dlcloud.services.auth import Caller
from dlcloud.store import models as store
from dlcloud.store import tenants as tenant_store
from dlcloud.store.rows import ModelRow, ModelVersionRow

DIGITS_RE = re.compile(r"^[0-9]{1,9}$")


def shown_name(name: str, owner: str | None, caller: Caller) -> str:
    return name if owner is None or owner == caller.tenant else f"{owner}/{name}"


def readable(s: Session, caller: Caller, name: str, owner: str | None, *, lock: bool = False) -> tuple[ModelRow, str]:
    """The model ``owner/name`` for reading, with its owner's tenant name: own, or shared with the caller.

    ``lock`` takes the model row's lock, which every deletion takes too (leases are written under it).
    """
    if owner is None or owner == caller.tenant:
        row = store.get_model(s, caller.tenant_id, name, for_update=lock)
        if row is None:
            raise ModelNotFound(f"model {name!r} not found")
        return row, caller.tenant
    tenant = tenant_store.get_tenant_by_name(s, owner)
    row = store.get_model(s, tenant.id, name, for_update=lock) if tenant is not None else None
    if row is None or not store.is_shared(s, row.id, caller.tenant_id):
        raise ModelNotFound(f"model '{owner}/{name}' not found")
    return row, owner


def writable(s: Session, caller: Caller, name: str, owner: str | None, what: str) -> ModelRow:
    """The caller's own model ``name``, locked: a shared model of another tenant is read-only (403)."""
    if owner is not None and owner != caller.tenant:
        readable(s, caller, name, owner)  # 404 unless shared with the caller
        raise PermissionDenied(
            f"model '{owner}/{name}' is shared with tenant {caller.tenant!r} read-only; {what} is for tenant {owner!r}"
        )
    row = store.get_model(s, caller.tenant_id, name, for_update=True)
    if row is None:
        raise ModelNotFound(f"model {name!r} not found")
    return row


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


def require_author_or_admin(caller: Caller, author_id: str, what: str) -> None:
    if author_id != caller.user_id and not caller.is_tenant_admin:
        raise PermissionDenied(f"only the author or a tenant admin can {what}")
