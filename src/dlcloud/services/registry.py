"""What every versioned registry (models, datasets) does alike: version references, labels, shares, reads,
version numbers and deletion.

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
- Reads (``Reads``) list the caller's entries, then those shared with it (named ``OWNER/NAME``); the fields
  every registry's read models have alike are filled here (``entry_fields``, ``VersionFields``), the registry's
  own ones by its service module.

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

from dlcloud.errors import DlcloudError, InvalidArgument, NotFound, Unavailable
from dlcloud.schemas.common import Response
from dlcloud.schemas.models import LABEL_RE, check_label
from dlcloud.services import storage_quota
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.services.registry_access import Registry, require_author_or_admin, shown_name
from dlcloud.storage.objects import Manifest, ObjectMissing, ObjectStore
from dlcloud.store import tenants as tenant_store
from dlcloud.store.ids import new_id
from dlcloud.store.registry import Tables
from dlcloud.store.rows import utcnow
from dlcloud.store.tenants import user_names


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

    ``tables``: its rows and their queries (store/registry.py); ``key_column``: the version row's key of what
    is stored of it; ``label_change``: what setting and removing a label are called when a shared entry refuses
    them (403)."""

    access: Registry[E]
    tables: Tables[E, Any]
    key_column: str
    version_not_found: type[NotFound]
    bad_ref: Callable[[str, str], DlcloudError]  # (ref, shown name): a ref that is no number, label or 'latest'
    label_change: tuple[str, str]
    end_share: Callable[[Session, Caller, E, str, str], None]  # (s, caller, entry, name, tenant id)
    answers: tuple[type[Any], type[Any]]  # the read models of a label and of a share

    def check_writable(self, platform: Platform, caller: Caller, name: str, owner: str | None, what: str) -> None:
        """Before any work on a new version: another tenant's entry is read-only (403; 404 unless shared)."""
        if owner is not None and owner != caller.tenant:
            with platform.db.read() as s:
                self.access.writable(s, caller, name, owner, what)

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
                s.add(self.tables.label_row(entry_id=entry.id, label=label, version_id=row.id, updated_at=utcnow()))
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
                    entry_id=entry.id, tenant_id=target.id, created_by=caller.user_id, created_at=utcnow()
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


def new_version_row(
    tables: Tables[E, Any], caller: Caller, entry_id: str, number: int, description: str, id_prefix: str, **fields: Any
) -> Any:
    """A new version row of the entry ``entry_id`` numbered ``number``, made by the caller now, with the
    registry's own ``fields`` (its key, checksum, size...)."""
    fields[tables.entry_key] = entry_id
    return tables.version_row(
        id=new_id(id_prefix),
        tenant_id=caller.tenant_id,
        version=number,
        description=description,
        created_by=caller.user_id,
        created_at=utcnow(),
        **fields,
    )


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
    by a job that has not ended) and lets go of what only records an ended hold; ``stored_what`` is how the log
    names what is stored under a version's key ("model artifact")."""

    registry: Versioned[E]
    release: Callable[[Session, Caller, list[Any], str], None]
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
            keys = [getattr(v, self.registry.key_column) for v in versions]
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
            key = getattr(row, self.registry.key_column)
            s.delete(row)
        self.remove_stored(platform, [key])

    def remove_stored(self, platform: Platform, keys: list[str]) -> None:
        for key in keys:
            try:
                platform.objects.delete_tree(key)
            except Exception:  # the rows are gone; a leftover tree is only storage space
                log.exception("could not remove the %s %s from %s", self.stored_what, key, platform.objects.url)


def stored_manifest(objects: ObjectStore, key: str, what: str, verb: str = "is") -> Manifest:
    """The manifest of what a version stored under ``key``. Gone (the storage lost it), it is 503 for the
    caller: ``what`` ("the files of version 3 of dataset 'clicks'") ``verb`` ("are") missing."""
    try:
        return objects.tree_manifest(key)
    except ObjectMissing:
        log.error("%s %s missing at %s in %s", what, verb, key, objects.url)
        raise Unavailable(f"{what} {verb} missing from the server's storage; ask an administrator") from None


def entry_fields(
    s: Session, caller: Caller, tables: Tables[Any, Any], rows: list[tuple[Any, str]]
) -> list[dict[str, Any]]:
    """The fields of the entries' read models, alike in every registry, for (entry row, owner's tenant name)
    pairs: an entry of another tenant is named ``OWNER/NAME`` and its shares are not shown; ``size_bytes`` is the
    bytes of all its versions."""
    ids = [e.id for e, _ in rows]
    stats = tables.version_stats(s, ids)
    labels = tables.labels_of(s, ids)
    shares = tables.shares_of(s, [e.id for e, owner in rows if owner == caller.tenant])
    users = user_names(s, [e.created_by for e, _ in rows])
    out = []
    for e, owner in rows:
        count, newest, size = stats[e.id]
        out.append(
            {
                "name": shown_name(e.name, owner, caller),
                "owner": owner,
                "shared": owner != caller.tenant,
                "description": e.description,
                "created_by": users.get(e.created_by, e.created_by),
                "created_at": e.created_at,
                "latest_version": newest,
                "version_count": count,
                "size_bytes": size,
                "labels": {label: number for label, (_id, number) in labels[e.id].items()},
                "shared_with": [tenant for tenant, _ in shares.get(e.id, [])],
            }
        )
    return out


class VersionFields:
    """The fields of the versions' read models that every registry fills alike from its version rows
    (``of(row)``): number, checksum, size, labels, description, author and time. ``users`` names the authors
    and ``more_users`` (a model's lease holders)."""

    def __init__(
        self, s: Session, tables: Tables[Any, Any], entry_id: str, rows: list[Any], more_users: list[str] | None = None
    ) -> None:
        self.labels: dict[str, list[str]] = {}
        for label, (version_id, _number) in tables.labels_of(s, [entry_id])[entry_id].items():
            self.labels.setdefault(version_id, []).append(label)
        self.users = user_names(s, [r.created_by for r in rows] + (more_users or []))

    def of(self, row: Any) -> dict[str, Any]:
        return {
            "version": row.version,
            "sha256": row.sha256,
            "size_bytes": row.size_bytes,
            "labels": sorted(self.labels.get(row.id, [])),
            "description": row.description,
            "created_by": self.users.get(row.created_by, row.created_by),
            "created_at": row.created_at,
        }


# (s, caller, entry row, the entry's name as the caller wrote it, its owner's tenant name, version rows)
VersionModels = Callable[[Session, Caller, Any, str, str, list[Any]], list[Any]]


@dataclass(frozen=True)
class Reads(Generic[E]):
    """How a registry answers reads: its entries as ``entry_model`` (listed) and ``detail_model`` (described,
    with ``versions``), and the read models of versions, which its own ``versions`` builds."""

    registry: Versioned[E]
    entry_model: type[Response]
    detail_model: type[Response]
    versions: VersionModels

    def _entries(self, s: Session, caller: Caller, rows: list[tuple[E, str]]) -> list[Any]:
        """The entries' read models, each taking those of ``entry_fields`` it has."""
        model = self.entry_model
        fields = entry_fields(s, caller, self.registry.tables, rows)
        return [model.model_validate({k: v for k, v in f.items() if k in model.model_fields}) for f in fields]

    def list_entries(self, platform: Platform, caller: Caller) -> list[Any]:
        """The tenant's entries, then those other tenants share with it (named ``OWNER/NAME``)."""
        tables = self.registry.tables
        with platform.db.read() as s:
            rows = [(e, caller.tenant) for e in tables.list_entries(s, caller.tenant_id)]
            rows += tables.shared(s, caller.tenant_id)
            return self._entries(s, caller, rows)

    def describe(self, platform: Platform, caller: Caller, name: str, owner: str | None = None) -> Any:
        """The entry with its versions."""
        with platform.db.read() as s:
            entry, owner_name = self.registry.access.readable(s, caller, name, owner)
            [base] = self._entries(s, caller, [(entry, owner_name)])
            rows = self.registry.tables.list_versions(s, entry.tenant_id, entry.id)
            versions = self.versions(s, caller, entry, base.name, owner_name, rows)
            return self.detail_model.model_validate({**base.model_dump(), "versions": versions})

    def list_versions(self, platform: Platform, caller: Caller, name: str, owner: str | None = None) -> list[Any]:
        with platform.db.read() as s:
            entry, owner_name = self.registry.access.readable(s, caller, name, owner)
            rows = self.registry.tables.list_versions(s, entry.tenant_id, entry.id)
            return self.versions(s, caller, entry, shown_name(name, owner_name, caller), owner_name, rows)

    def get_version(self, platform: Platform, caller: Caller, name: str, ref: str, owner: str | None = None) -> Any:
        """A version by number, label or ``latest``."""
        return self.version_and_key(platform, caller, name, ref, owner)[0]

    def version_and_key(
        self, platform: Platform, caller: Caller, name: str, ref: str, owner: str | None = None
    ) -> tuple[Any, str]:
        """A version's read model and the key of what is stored of it."""
        with platform.db.read() as s:
            entry, owner_name = self.registry.access.readable(s, caller, name, owner)
            shown = shown_name(name, owner_name, caller)
            row = self.registry.find_version(s, entry, ref, shown)
            [version] = self.versions(s, caller, entry, shown, owner_name, [row])
            return version, getattr(row, self.registry.key_column)
