"""What every versioned registry (models, datasets) does alike: version references, labels, shares, version
numbers and deletion.

- A version is named by its number, a label or ``latest``; a missing one is 404 with the registry's own code,
  a reference that is none of these is the registry's own ``bad_ref`` (a model's 404, a dataset's 400).
- A new version takes the entry's next number (``take_number``: the storage quota checked, the entry created
  with its first version); numbers are never given again.
- A label points at one version of its entry; setting it moves it, and a label is named like a DNS-1123 label
  starting with a letter (400 otherwise). Setting and removing labels need the entry to be the caller's own.
- Sharing lets another tenant read the entry (idempotent); it is for the entry's author or a tenant admin. A
  share with a tenant that does not exist answers as a stored one: whether a tenant exists must not leak
  (docs/tenancy.md). Unsharing ends what the tenant held on the entry (``end_share``: a model's deployment
  leases, a dataset's reading jobs).
- Deleting an entry or a version is for its author or a tenant admin, refused while it is held (``Deletion``:
  a model deployed, a dataset read by a job that has not ended).

Each registry's service module keeps its own read models and what differs (signatures and formats for
models, manifests, sources and the cache for datasets).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlcloud.errors import DlcloudError, InvalidArgument, NotFound
from dlcloud.schemas.models import LABEL_RE, check_label
from dlcloud.services import storage_quota
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.services.registry_access import Registry, require_author_or_admin
from dlcloud.store import tenants as tenant_store
from dlcloud.store.ids import new_id
from dlcloud.store.registry import Tables
from dlcloud.store.rows import utcnow


class Entry(Protocol):
    """An entry row: what the shared rules read of it."""

    @property
    def id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def created_by(self) -> str: ...


log = logging.getLogger(__name__)
E = TypeVar("E", bound=Entry)
T = TypeVar("T")
DIGITS_RE = re.compile(r"^[0-9]{1,9}$")


@dataclass(frozen=True)
class Versioned(Generic[E]):
    """One registry's tables and rules for version references, labels and shares.

    ``tables``: its rows and their queries (store/registry.py); ``label_change``: what setting and removing a
    label are called when a shared entry refuses them (403)."""

    access: Registry[E]
    tables: Tables[E, Any]
    version_not_found: type[NotFound]
    bad_ref: Callable[[str, str], DlcloudError]  # (ref, shown name): a ref that is no number, label or 'latest'
    label_change: tuple[str, str]
    end_share: Callable[[Session, Caller, E, str, str], None]  # (s, caller, entry, name, tenant id)
    answers: tuple[type[Any], type[Any]]  # the read models of a label and of a share

    def find_version(self, s: Session, entry: E, ref: str, shown: str) -> Any:
        """A version by number, by label, or ``latest``; ``shown`` is the entry's name as the caller wrote it."""
        noun = self.access.noun
        row = None
        if DIGITS_RE.match(ref):
            row = self.tables.get_version(s, entry.tenant_id, entry.id, int(ref))
            missing = f"{noun} {shown!r} has no version {ref}"
        elif ref == "latest":
            row = self.tables.get_latest_version(s, entry.tenant_id, entry.id)
            missing = f"{noun} {shown!r} has no versions"
        elif LABEL_RE.match(ref):
            label = s.get(self.tables.label_row, (entry.id, ref))
            row = s.get(self.tables.version_row, label.version_id) if label is not None else None
            missing = f"{noun} {shown!r} has no label {ref!r}"
        else:
            raise self.bad_ref(ref, shown)
        if row is None:
            raise self.version_not_found(missing)
        return row

    def set_label(
        self, platform: Platform, caller: Caller, name: str, label: str, version: int, owner: str | None = None
    ) -> Any:
        """Point ``label`` at ``version``; it leaves the version it pointed at before."""
        noun = self.access.noun
        try:
            check_label(label)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        with platform.db.write() as s:
            entry = self.access.writable(s, caller, name, owner, self.label_change[0])
            row = self.tables.get_version(s, caller.tenant_id, entry.id, version)
            if row is None:
                raise self.version_not_found(f"{noun} {name!r} has no version {version}")
            existing = s.get(self.tables.label_row, (entry.id, label))
            if existing is None:
                key = {self.tables.entry_key: entry.id}
                s.add(self.tables.label_row(**key, label=label, version_id=row.id, updated_at=utcnow()))
            else:
                existing.version_id, existing.updated_at = row.id, utcnow()
        return self.answers[0](label=label, version=version)

    def remove_label(self, platform: Platform, caller: Caller, name: str, label: str, owner: str | None = None) -> None:
        with platform.db.write() as s:
            entry = self.access.writable(s, caller, name, owner, self.label_change[1])
            existing = s.get(self.tables.label_row, (entry.id, label))
            if existing is None:
                raise NotFound(f"{self.access.noun} {name!r} has no label {label!r}")
            s.delete(existing)

    def share(self, platform: Platform, caller: Caller, name: str, tenant: str, owner: str | None = None) -> Any:
        """Let ``tenant`` read the entry (idempotent)."""
        noun = self.access.noun
        with platform.db.write() as s:
            entry = self.access.writable(s, caller, name, owner, "sharing")
            require_author_or_admin(caller, entry.created_by, f"share {noun} {name!r}")
            if tenant == caller.tenant:
                raise InvalidArgument(
                    f"{noun} {name!r} already belongs to tenant {tenant!r}; share it with another tenant"
                )
            target = tenant_store.get_tenant_by_name(s, tenant)
            if target is None:
                # the answer of a share that was stored: whether a tenant exists must not leak (docs/tenancy.md)
                return self.answers[1](tenant=tenant, created_at=utcnow())
            row = s.get(self.tables.share_row, (entry.id, target.id))
            if row is None:
                row = self.tables.share_row(
                    **{self.tables.entry_key: entry.id},
                    tenant_id=target.id,
                    created_by=caller.user_id,
                    created_at=utcnow(),
                )
                s.add(row)
            return self.answers[1](tenant=tenant, created_at=row.created_at)

    def unshare(self, platform: Platform, caller: Caller, name: str, tenant: str, owner: str | None = None) -> None:
        noun = self.access.noun
        with platform.db.write() as s:
            entry = self.access.writable(s, caller, name, owner, "unsharing")
            require_author_or_admin(caller, entry.created_by, f"unshare {noun} {name!r}")
            target = tenant_store.get_tenant_by_name(s, tenant)
            row = s.get(self.tables.share_row, (entry.id, target.id)) if target is not None else None
            if row is None:
                raise NotFound(f"{noun} {name!r} is not shared with tenant {tenant!r}")
            s.delete(row)
            self.end_share(s, caller, entry, name, row.tenant_id)


def take_number(
    s: Session, caller: Caller, tables: Tables[E, Any], name: str, description: str, size: int, id_prefix: str
) -> tuple[E, int, bool]:
    """In the write transaction ``s``: the storage quota checked for ``size`` more bytes, the caller's entry
    ``name`` locked (created with ``description`` and an id starting ``id_prefix`` when it does not exist) and
    its next version number taken. (entry, number, whether the entry was created now); numbers are never
    given again, even when the version is not added in the end."""
    storage_quota.check_fits(s, caller.tenant_id, caller.tenant, size)
    entry: Any = tables.get(s, caller.tenant_id, name, for_update=True)
    created = entry is None
    if entry is None:
        new_entry: Any = tables.entry_row
        entry = new_entry(
            id=new_id(id_prefix),
            tenant_id=caller.tenant_id,
            name=name,
            description=description,
            last_version=0,
            created_by=caller.user_id,
            created_at=utcnow(),
        )
        s.add(entry)
        s.flush()
    entry.last_version += 1
    number: int = entry.last_version
    return entry, number, created


def retry_on_conflict(write: Callable[[], T]) -> T:
    """``write()``, once more when another request created the same entry first (PostgreSQL: an
    IntegrityError on its name; its row exists now)."""
    try:
        return write()
    except IntegrityError:
        return write()


@dataclass(frozen=True)
class Deletion(Generic[E]):
    """How a registry deletes an entry or a version: for its author or a tenant admin, refused while held.

    ``release(s, caller, version rows, what)`` refuses while ``what`` is held (a model deployed, a dataset read
    by a job that has not ended) and lets go of what only records an ended hold; ``key_column`` is the version
    row's storage key, ``stored_what`` how the log names what is under it ("model artifact")."""

    registry: Versioned[E]
    release: Callable[[Session, Caller, list[Any], str], None]
    key_column: str
    stored_what: str

    def delete(self, platform: Platform, caller: Caller, name: str, owner: str | None = None) -> str:
        """Delete the entry with all its versions, labels and shares (ON DELETE CASCADE) and stored trees; the
        deleted entry's id."""
        noun = self.registry.access.noun
        with platform.db.write() as s:
            entry = self.registry.access.writable(s, caller, name, owner, "deleting")
            require_author_or_admin(caller, entry.created_by, f"delete {noun} {name!r}")
            versions = self.registry.tables.list_versions(s, caller.tenant_id, entry.id)
            self.release(s, caller, versions, f"{noun} {name!r}")
            keys = [getattr(v, self.key_column) for v in versions]
            entry_id = entry.id
            s.delete(entry)
        self.remove_stored(platform, keys)
        return entry_id

    def delete_version(
        self, platform: Platform, caller: Caller, name: str, version: int, owner: str | None = None
    ) -> None:
        """Delete one version and what is stored of it; labels on it are removed, the number is not reused."""
        noun = self.registry.access.noun
        with platform.db.write() as s:
            entry = self.registry.access.writable(s, caller, name, owner, "deleting versions")
            row = self.registry.tables.get_version(s, caller.tenant_id, entry.id, version)
            if row is None:
                raise self.registry.version_not_found(f"{noun} {name!r} has no version {version}")
            require_author_or_admin(caller, row.created_by, f"delete version {version} of {noun} {name!r}")
            self.release(s, caller, [row], f"version {version} of {noun} {name!r}")
            key = getattr(row, self.key_column)
            s.delete(row)
        self.remove_stored(platform, [key])

    def remove_stored(self, platform: Platform, keys: list[str]) -> None:
        for key in keys:
            try:
                platform.objects.delete_tree(key)
            except Exception:  # the rows are gone; a leftover tree is only storage space
                log.exception("could not remove the %s %s from %s", self.stored_what, key, platform.objects.url)
