"""The queries every versioned registry (models, datasets) makes alike: entries, versions, labels, shares.

A registry's tables (``Tables``) are its rows of ``store/rows.py``: an entry row with ``id``, ``tenant_id`` and
``name``; a version row with ``id``, ``tenant_id``, ``version`` and ``size_bytes``; a label row keyed by (entry
id, label) and a share row keyed by (entry id, tenant id), both holding the entry's id as ``entry_id``; the
version row holds it as the registry's own column (``entry_key``: ``model_id``). Every lookup of an entry takes
the owning ``tenant_id``; another tenant's entry is visible only through ``shared`` and ``is_shared``, which
check the share row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dlcloud.store.rows import TenantRow

E = TypeVar("E")  # the entry row
V = TypeVar("V")  # the version row


@dataclass(frozen=True)
class Tables(Generic[E, V]):
    entry_row: type[E]
    version_row: type[V]
    label_row: type[Any]
    share_row: type[Any]

    @property
    def entry_key(self) -> str:
        """The version row's column of the entry's id (``model_id``)."""
        entry: Any = self.entry_row
        return f"{entry.kind}_id"

    @property
    def _version(self) -> Any:
        """The version row, typed loosely for building queries."""
        return self.version_row

    def _key(self, row: type[Any]) -> Any:
        return row.entry_id if row is not self.version_row else getattr(row, self.entry_key)

    def get(self, s: Session, tenant_id: str, name: str, *, for_update: bool = False) -> E | None:
        entry: Any = self.entry_row
        q = select(self.entry_row).where(entry.tenant_id == tenant_id, entry.name == name)
        if for_update:
            q = q.with_for_update()
        return s.scalars(q).first()

    def list_entries(self, s: Session, tenant_id: str) -> list[E]:
        entry: Any = self.entry_row
        return list(s.scalars(select(self.entry_row).where(entry.tenant_id == tenant_id).order_by(entry.name)))

    def shared(self, s: Session, tenant_id: str) -> list[tuple[E, str]]:
        """Other tenants' entries shared with ``tenant_id``, with the owner's tenant name."""
        entry: Any = self.entry_row
        q = (
            select(self.entry_row, TenantRow.name)
            .join(self.share_row, self._key(self.share_row) == entry.id)
            .join(TenantRow, TenantRow.id == entry.tenant_id)
            .where(self.share_row.tenant_id == tenant_id)
            .order_by(TenantRow.name, entry.name)
        )
        return [(e, t) for e, t in s.execute(q)]

    def is_shared(self, s: Session, entry_id: str, tenant_id: str) -> bool:
        return s.get(self.share_row, (entry_id, tenant_id)) is not None

    def shares_of(self, s: Session, entry_ids: Iterable[str]) -> dict[str, list[tuple[str, datetime]]]:
        """entry id -> [(tenant name, shared at)] sorted by tenant name."""
        ids = [*entry_ids]
        out: dict[str, list[tuple[str, datetime]]] = {i: [] for i in ids}
        if ids:
            share = self.share_row
            q = (
                select(self._key(share), TenantRow.name, share.created_at)
                .join(TenantRow, TenantRow.id == share.tenant_id)
                .where(self._key(share).in_(ids))
                .order_by(TenantRow.name)
            )
            for entry_id, tenant, at in s.execute(q):
                out[entry_id].append((tenant, at))
        return out

    def version_stats(self, s: Session, entry_ids: Iterable[str]) -> dict[str, tuple[int, int | None, int]]:
        """entry id -> (number of versions, newest version number, bytes of all versions)."""
        ids = [*entry_ids]
        out: dict[str, tuple[int, int | None, int]] = {i: (0, None, 0) for i in ids}
        if ids:
            version = self._version
            key = self._key(version)
            sizes = func.coalesce(func.sum(version.size_bytes), 0)
            q = select(key, func.count(), func.max(version.version), sizes).where(key.in_(ids)).group_by(key)
            for entry_id, count, newest, size in s.execute(q):
                out[entry_id] = (int(count), int(newest) if newest is not None else None, int(size))
        return out

    def labels_of(self, s: Session, entry_ids: Iterable[str]) -> dict[str, dict[str, tuple[str, int]]]:
        """entry id -> {label: (version id, version number)}, sorted by label."""
        ids = [*entry_ids]
        out: dict[str, dict[str, tuple[str, int]]] = {i: {} for i in ids}
        if ids:
            label, version = self.label_row, self._version
            q = (
                select(label.entry_id, label.label, version.id, version.version)
                .join(version, version.id == label.version_id)
                .where(label.entry_id.in_(ids))
                .order_by(label.label)
            )
            for entry_id, name, version_id, number in s.execute(q):
                out[entry_id][name] = (version_id, int(number))
        return out

    def list_versions(self, s: Session, tenant_id: str, entry_id: str) -> list[V]:
        version: Any = self.version_row
        q = (
            select(self.version_row)
            .where(version.tenant_id == tenant_id, self._key(version) == entry_id)
            .order_by(version.version)
        )
        return list(s.scalars(q))

    def get_version(self, s: Session, tenant_id: str, entry_id: str, number: int) -> V | None:
        version: Any = self.version_row
        q = select(self.version_row).where(
            version.tenant_id == tenant_id, self._key(version) == entry_id, version.version == number
        )
        return s.scalars(q).first()

    def get_latest_version(self, s: Session, tenant_id: str, entry_id: str) -> V | None:
        version: Any = self.version_row
        q = (
            select(self.version_row)
            .where(version.tenant_id == tenant_id, self._key(version) == entry_id)
            .order_by(version.version.desc())
            .limit(1)
        )
        return s.scalars(q).first()
