"""Who may see and change an entry of a versioned registry (models, datasets): names resolved to rows.

- Entries are tenant-scoped. Another tenant's entry is visible only when it is shared with the caller's tenant,
  and then only for reading (``readable``); any change to it is 403 (``writable``). An entry that is not shared
  with the caller is 404 with the registry's own code, exactly like one that does not exist.
- Deleting an entry or a version and sharing are for its author or a tenant admin (``require_author_or_admin``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

from dlcloud.errors import NotFound, PermissionDenied
from dlcloud.services.auth import Caller
from dlcloud.store import tenants as tenant_store

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class _Lookup(Protocol[R_co]):
    def __call__(self, s: Session, tenant_id: str, name: str, *, for_update: bool = False) -> R_co | None: ...


@dataclass(frozen=True)
class Registry(Generic[R]):
    """One registry's lookups: ``get`` by tenant id and name, ``is_shared(s, entry, tenant id)``."""

    noun: str  # "model", "dataset": how messages name an entry
    get: _Lookup[R]
    is_shared: Callable[[Session, R, str], bool]
    not_found: type[NotFound]

    def readable(
        self, s: Session, caller: Caller, name: str, owner: str | None, *, lock: bool = False
    ) -> tuple[R, str]:
        """The entry ``owner/name`` for reading, with its owner's tenant name: own, or shared with the caller.

        ``lock`` takes the entry row's lock (which every deletion takes too)."""
        if owner is None or owner == caller.tenant:
            row = self.get(s, caller.tenant_id, name, for_update=lock)
            if row is None:
                raise self.not_found(f"{self.noun} {name!r} not found")
            return row, caller.tenant
        tenant = tenant_store.get_tenant_by_name(s, owner)
        row = self.get(s, tenant.id, name, for_update=lock) if tenant is not None else None
        if row is None or not self.is_shared(s, row, caller.tenant_id):
            raise self.not_found(f"{self.noun} '{owner}/{name}' not found")
        return row, owner

    def writable(self, s: Session, caller: Caller, name: str, owner: str | None, what: str) -> R:
        """The caller's own entry ``name``, locked: a shared entry of another tenant is read-only (403)."""
        if owner is not None and owner != caller.tenant:
            self.readable(s, caller, name, owner)  # 404 unless shared with the caller
            raise PermissionDenied(
                f"{self.noun} '{owner}/{name}' is shared with tenant {caller.tenant!r} read-only; {what} is for "
                f"tenant {owner!r}"
            )
        row = self.get(s, caller.tenant_id, name, for_update=True)
        if row is None:
            raise self.not_found(f"{self.noun} {name!r} not found")
        return row


def shown_name(name: str, owner: str | None, caller: Caller) -> str:
    """An entry's name as the caller sees it: its own by name, another tenant's as ``OWNER/NAME``."""
    return name if owner is None or owner == caller.tenant else f"{owner}/{name}"


def require_author_or_admin(caller: Caller, author_id: str, what: str) -> None:
    if author_id != caller.user_id and not caller.is_tenant_admin:
        raise PermissionDenied(f"only the author or a tenant admin can {what}")
