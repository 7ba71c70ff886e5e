"""Tenant, user and access-key queries."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from dlcloud.store.rows import AccessKeyRow, CodeRow, DatasetVersionRow, JobRow, ModelVersionRow, TenantRow, UserRow


@dataclass(frozen=True)
class KeyOwner:
    """What authentication needs about one access key, read in one Core query."""

    enabled: bool
    secret_encrypted: bytes
    user_id: str
    user: str
    role: str
    tenant_id: str
    tenant: str


_keys, _users, _tenants = AccessKeyRow.__table__, UserRow.__table__, TenantRow.__table__
# built once: a constant statement's cache key is memoised, so executing it skips query construction
_KEY_OWNER = (
    select(
        _keys.c.enabled,
        _keys.c.secret_encrypted,
        _users.c.id,
        _users.c.name,
        _users.c.role,
        _tenants.c.id,
        _tenants.c.name,
    )
    .join(_users, _users.c.id == _keys.c.user_id)
    .join(_tenants, _tenants.c.id == _keys.c.tenant_id)
    .where(_keys.c.id == bindparam("key_id"))
)


def get_tenant_by_name(s: Session, name: str, *, for_update: bool = False) -> TenantRow | None:
    q = select(TenantRow).where(TenantRow.name == name)
    if for_update:
        q = q.with_for_update()
    return s.scalars(q).first()


def get_tenant(s: Session, tenant_id: str, *, for_update: bool = False) -> TenantRow | None:
    q = select(TenantRow).where(TenantRow.id == tenant_id)
    if for_update:
        q = q.with_for_update()
    return s.scalars(q).first()


def list_tenants(s: Session) -> list[TenantRow]:
    return list(s.scalars(select(TenantRow).order_by(TenantRow.name)))


def get_user_by_name(s: Session, tenant_id: str, name: str) -> UserRow | None:
    return s.scalars(select(UserRow).where(UserRow.tenant_id == tenant_id, UserRow.name == name)).first()


def list_users(s: Session, tenant_id: str | None) -> list[tuple[UserRow, str]]:
    q = select(UserRow, TenantRow.name).join(TenantRow, TenantRow.id == UserRow.tenant_id)
    if tenant_id is not None:
        q = q.where(UserRow.tenant_id == tenant_id)
    return [(u, t) for u, t in s.execute(q.order_by(TenantRow.name, UserRow.name))]


def get_key_owner(conn: Connection, key_id: str) -> KeyOwner | None:
    """The key with its user and tenant (Core, for the per-request authentication)."""
    row = conn.execute(_KEY_OWNER, {"key_id": key_id}).first()
    return KeyOwner(bool(row[0]), bytes(row[1]), *row[2:]) if row else None


def get_key(s: Session, tenant_id: str | None, key_id: str) -> AccessKeyRow | None:
    q = select(AccessKeyRow).where(AccessKeyRow.id == key_id)
    if tenant_id is not None:
        q = q.where(AccessKeyRow.tenant_id == tenant_id)
    return s.scalars(q).first()


def list_keys(s: Session, tenant_id: str | None, user_id: str | None) -> list[tuple[AccessKeyRow, str, str]]:
    q = (
        select(AccessKeyRow, UserRow.name, TenantRow.name)
        .join(UserRow, UserRow.id == AccessKeyRow.user_id)
        .join(TenantRow, TenantRow.id == AccessKeyRow.tenant_id)
    )
    if tenant_id is not None:
        q = q.where(AccessKeyRow.tenant_id == tenant_id)
    if user_id is not None:
        q = q.where(AccessKeyRow.user_id == user_id)
    return [(k, u, t) for k, u, t in s.execute(q.order_by(AccessKeyRow.created_at))]


def user_names(s: Session, user_ids: Iterable[str]) -> dict[str, str]:
    """user id -> name for these ids, each asked once (a user deleted since is left out: a read model then shows
    the id); no query for none."""
    ids = list(set(user_ids))
    if not ids:
        return {}
    return {uid: name for uid, name in s.execute(select(UserRow.id, UserRow.name).where(UserRow.id.in_(ids)))}


def user_name(s: Session, user_id: str) -> str:
    """The name of the user with this id; the id itself for a user deleted since."""
    user = s.get(UserRow, user_id)
    return user.name if user else user_id


def any_user(s: Session) -> bool:
    """Whether the platform has a user at all (before its first start it has none)."""
    return s.scalar(select(UserRow.id).limit(1)) is not None


def next_sandbox_slot(s: Session) -> int:
    """One more than any tenant's sandbox slot. Tenants are never deleted, so a slot is never reused (a
    tenant deletion must keep its slot taken, or files left by the old tenant's uid pass to the new one)."""
    return (s.scalar(select(func.max(TenantRow.sandbox_slot))) or 0) + 1


def get_storage_quota(s: Session, tenant_id: str) -> int | None:
    """The tenant's storage quota in bytes; None when it has none (or no such tenant)."""
    return s.scalar(select(TenantRow.quota_storage).where(TenantRow.id == tenant_id))


def storage_used(s: Session, tenant_id: str) -> int:
    """The bytes the tenant's storage quota counts (``services/storage_quota.py`` says what counts): its dataset
    versions the platform stores (not those registered in place), model versions, code uploads, and its jobs'
    saved outputs and checkpoints."""
    total = 0
    for column, where in (
        (
            DatasetVersionRow.size_bytes,
            (DatasetVersionRow.tenant_id == tenant_id, DatasetVersionRow.source_url.is_(None)),
        ),
        (ModelVersionRow.size_bytes, (ModelVersionRow.tenant_id == tenant_id,)),
        (CodeRow.size, (CodeRow.tenant_id == tenant_id,)),
        (JobRow.outputs_bytes + JobRow.checkpoints_bytes, (JobRow.tenant_id == tenant_id,)),
    ):
        total += int(s.scalar(select(func.coalesce(func.sum(column), 0)).where(*where)) or 0)
    return total
