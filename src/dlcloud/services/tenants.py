"""Tenants, users, access keys and the bootstrap of a fresh installation."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlcloud.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from dlcloud.schemas.common import format_memory
from dlcloud.schemas.tenants import (
    BorrowLimitSpec,
    GuaranteeSpec,
    NetworkSpec,
    QuotaSpec,
    SandboxSpec,
    SchedulingSpec,
    Tenant,
    TenantCreate,
    TenantUpdate,
)
from dlcloud.schemas.users import AccessKey, AccessKeyCreated, KeyCreate, Role, User, UserCreate
from dlcloud.services.auth import Caller
from dlcloud.services.secrets import SecretBox
from dlcloud.store import tenants as store
from dlcloud.store.db import Database
from dlcloud.store.ids import new_id
from dlcloud.store.rows import AccessKeyRow, TenantRow, UserRow, utcnow

KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def quota_model(row: TenantRow) -> QuotaSpec:
    """The tenant's quota as it was set (None: no limit), as ``tenants describe`` and ``quota`` show it."""
    return QuotaSpec(
        gpus=row.quota_gpus,
        cpus=row.quota_cpus,
        memory=row.quota_memory,
        max_running_jobs=row.quota_max_running_jobs,
        max_queued_jobs=row.quota_max_queued_jobs,
        storage=row.quota_storage,
    )


def _tenant_model(row: TenantRow) -> Tenant:
    return Tenant(
        id=row.id,
        name=row.name,
        created_at=row.created_at,
        quota=quota_model(row),
        scheduling=scheduling_model(row),
        network=NetworkSpec(egress=row.egress, allow=list(row.egress_allow or ())),  # type: ignore[arg-type]
        sandbox=SandboxSpec(user_namespaces=bool(row.user_namespaces)),
    )


def _apply_network(row: TenantRow, spec: NetworkSpec) -> None:
    row.egress = spec.egress
    row.egress_allow = list(spec.allow) or None


def scheduling_model(row: TenantRow) -> SchedulingSpec:
    return SchedulingSpec(
        guarantee=GuaranteeSpec(gpus=row.guarantee_gpus, cpus=row.guarantee_cpus, memory=row.guarantee_memory),
        borrow_limit=BorrowLimitSpec(gpus=row.borrow_gpus, cpus=row.borrow_cpus, memory=row.borrow_memory),
        weight=row.weight,
        priority_min=row.priority_min,
        priority_max=row.priority_max,
    )


def _apply_scheduling(row: TenantRow, spec: SchedulingSpec) -> None:
    row.guarantee_gpus = spec.guarantee.gpus
    row.guarantee_cpus = spec.guarantee.cpus
    row.guarantee_memory = spec.guarantee.memory
    row.borrow_gpus = spec.borrow_limit.gpus
    row.borrow_cpus = spec.borrow_limit.cpus
    row.borrow_memory = spec.borrow_limit.memory
    row.weight = spec.weight
    row.priority_min = spec.priority_min
    row.priority_max = spec.priority_max


def _check_guarantee(row: TenantRow) -> None:
    """A guarantee is a share of the tenant's hard quota: never above it."""
    checks: list[tuple[str, float, float | None, Callable[[Any], str]]] = [
        ("gpus", row.guarantee_gpus, row.quota_gpus, str),
        ("cpus", row.guarantee_cpus, row.quota_cpus, lambda v: f"{v:g}"),
        ("memory", row.guarantee_memory, row.quota_memory, format_memory),
    ]
    for what, guaranteed, quota, fmt in checks:
        if quota is not None and guaranteed > quota:
            raise InvalidArgument(
                f"tenant {row.name!r}: the guarantee of {fmt(guaranteed)} {what} is above its quota of "
                f"{fmt(quota)}; raise the quota first or guarantee at most {fmt(quota)}",
                details={"resource": what, "guarantee": guaranteed, "quota": quota},
            )


def _apply_quota(row: TenantRow, quota: QuotaSpec) -> None:
    row.quota_gpus = quota.gpus
    row.quota_cpus = quota.cpus
    row.quota_memory = quota.memory
    row.quota_max_running_jobs = quota.max_running_jobs
    row.quota_max_queued_jobs = quota.max_queued_jobs
    row.quota_storage = quota.storage


def create_tenant(db: Database, caller: Caller, req: TenantCreate) -> Tenant:
    caller.require_platform_admin("creating tenants")
    with db.write() as s:
        if store.get_tenant_by_name(s, req.name):
            raise AlreadyExists(f"tenant {req.name!r} already exists")
        row = TenantRow(id=new_id("t-"), name=req.name, created_at=utcnow(), sandbox_slot=store.next_sandbox_slot(s))
        _apply_quota(row, req.quota)
        _apply_scheduling(row, req.scheduling)
        _apply_network(row, req.network)
        row.user_namespaces = req.sandbox.user_namespaces
        _check_guarantee(row)
        s.add(row)
        s.flush()
        return _tenant_model(row)


def list_tenants(db: Database, caller: Caller) -> list[Tenant]:
    with db.read() as s:
        if caller.is_platform_admin:
            return [_tenant_model(r) for r in store.list_tenants(s)]
        row = store.get_tenant(s, caller.tenant_id)
        return [_tenant_model(row)] if row else []


def resolve_tenant(s: Session, caller: Caller, name: str | None) -> TenantRow:
    """The tenant ``name`` as seen by the caller: others' tenants are 'not found' unless platform admin."""
    if name is None or name == caller.tenant:
        row = store.get_tenant(s, caller.tenant_id)
    elif caller.is_platform_admin:
        row = store.get_tenant_by_name(s, name)
    else:
        row = None
    if row is None:
        raise NotFound(f"tenant {name!r} not found")
    return row


def get_tenant(db: Database, caller: Caller, name: str) -> Tenant:
    with db.read() as s:
        return _tenant_model(resolve_tenant(s, caller, name))


def update_tenant(db: Database, caller: Caller, name: str, req: TenantUpdate) -> Tenant:
    with db.write() as s:
        row = resolve_tenant(s, caller, name)
        caller.require_platform_admin("changing quotas, scheduling terms, network policies and sandbox terms")
        if req.quota is not None:
            _apply_quota(row, req.quota)
        if req.scheduling is not None:
            _apply_scheduling(row, req.scheduling)
        if req.network is not None:
            _apply_network(row, req.network)
        if req.sandbox is not None:
            row.user_namespaces = req.sandbox.user_namespaces
        _check_guarantee(row)
        s.flush()
        return _tenant_model(row)


def _user_model(row: UserRow, tenant: str) -> User:
    return User(id=row.id, name=row.name, tenant=tenant, role=Role(row.role), created_at=row.created_at)


def create_user(db: Database, caller: Caller, req: UserCreate) -> User:
    caller.require_tenant_admin("creating users")
    if req.role == Role.PLATFORM_ADMIN and not caller.is_platform_admin:
        raise PermissionDenied("only a platform admin can create platform admins")
    with db.write() as s:
        tenant = resolve_tenant(s, caller, req.tenant)
        if store.get_user_by_name(s, tenant.id, req.name):
            raise AlreadyExists(f"user {req.name!r} already exists in tenant {tenant.name!r}")
        row = UserRow(id=new_id("u-"), tenant_id=tenant.id, name=req.name, role=req.role.value, created_at=utcnow())
        s.add(row)
        s.flush()
        return _user_model(row, tenant.name)


def list_users(db: Database, caller: Caller, tenant: str | None) -> list[User]:
    with db.read() as s:
        if tenant is None and caller.is_platform_admin:
            scope = None
        else:
            scope = resolve_tenant(s, caller, tenant).id
        return [_user_model(u, t) for u, t in store.list_users(s, scope)]


def _new_key_pair() -> tuple[str, str]:
    access = "AK" + "".join(secrets.choice(KEY_ALPHABET) for _ in range(18))
    secret = secrets.token_urlsafe(30)
    return access, secret


def _add_key(s: Session, box: SecretBox, tenant_id: str, user_id: str) -> tuple[AccessKeyRow, str]:
    """A new enabled key of the user, added to the session: its row and its secret (shown once, stored encrypted)."""
    access, secret = _new_key_pair()
    row = AccessKeyRow(
        id=access,
        tenant_id=tenant_id,
        user_id=user_id,
        secret_encrypted=box.encrypt(secret),
        enabled=True,
        created_at=utcnow(),
    )
    s.add(row)
    return row, secret


def create_key(db: Database, box: SecretBox, caller: Caller, req: KeyCreate) -> AccessKeyCreated:
    if req.user is None and req.tenant not in (None, caller.tenant):
        # it would be a key of the caller's own, in the caller's own tenant: never what was asked
        raise InvalidArgument(
            f"a key for tenant {req.tenant!r} needs the user it is for: give both user and tenant; without "
            f"user a key is always your own, in your own tenant (then give no tenant, or {caller.tenant!r})"
        )
    with db.write() as s:
        if req.user is None or (req.user == caller.user and req.tenant in (None, caller.tenant)):
            tenant = resolve_tenant(s, caller, None)
            user = s.get(UserRow, caller.user_id)
        else:
            tenant = resolve_tenant(s, caller, req.tenant)
            caller.require_tenant_admin("creating keys for other users")
            user = store.get_user_by_name(s, tenant.id, req.user)
        if user is None:
            raise NotFound(f"user {req.user!r} not found in tenant {tenant.name!r}")
        _require_may_manage_keys_of(caller, user)
        row, secret = _add_key(s, box, tenant.id, user.id)
        s.flush()
        return AccessKeyCreated(
            access_key=row.id,
            secret_key=secret,
            user=user.name,
            tenant=tenant.name,
            enabled=True,
            created_at=row.created_at,
        )


def list_keys(db: Database, caller: Caller, user: str | None, tenant: str | None) -> list[AccessKey]:
    with db.read() as s:
        if tenant is None and user is None and caller.is_platform_admin:
            rows = store.list_keys(s, None, None)
        else:
            t = resolve_tenant(s, caller, tenant)
            user_id: str | None
            if caller.is_tenant_admin:
                user_id = None
                if user is not None:
                    u = store.get_user_by_name(s, t.id, user)
                    if u is None:
                        raise NotFound(f"user {user!r} not found in tenant {t.name!r}")
                    user_id = u.id
            else:
                if user not in (None, caller.user):
                    raise PermissionDenied("members can list only their own keys")
                user_id = caller.user_id
            rows = store.list_keys(s, t.id, user_id)
        return [
            AccessKey(access_key=k.id, user=u, tenant=t, enabled=k.enabled, created_at=k.created_at) for k, u, t in rows
        ]


def _require_may_manage_keys_of(caller: Caller, owner: UserRow) -> None:
    """A tenant admin manages its tenant's keys, but never a platform admin's: that would be an escalation."""
    if owner.role == Role.PLATFORM_ADMIN.value and not caller.is_platform_admin:
        raise PermissionDenied("only a platform admin can manage a platform admin's keys")


def _key_for_change(s: Session, caller: Caller, key_id: str) -> AccessKeyRow:
    key = store.get_key(s, None if caller.is_platform_admin else caller.tenant_id, key_id)
    if key is None or (not caller.is_tenant_admin and key.user_id != caller.user_id):
        raise NotFound(f"access key {key_id!r} not found")
    owner = s.get(UserRow, key.user_id)
    assert owner is not None
    _require_may_manage_keys_of(caller, owner)
    return key


def set_key_enabled(db: Database, caller: Caller, key_id: str, enabled: bool) -> AccessKey:
    with db.write() as s:
        key = _key_for_change(s, caller, key_id)
        if not enabled and key.id == caller.access_key:
            raise InvalidArgument("you cannot disable the key this request is signed with; use another key")
        key.enabled = enabled
        user = s.get(UserRow, key.user_id)
        tenant = s.get(TenantRow, key.tenant_id)
        assert user is not None and tenant is not None
        return AccessKey(
            access_key=key.id, user=user.name, tenant=tenant.name, enabled=key.enabled, created_at=key.created_at
        )


def delete_key(db: Database, caller: Caller, key_id: str) -> None:
    with db.write() as s:
        key = _key_for_change(s, caller, key_id)
        if key.id == caller.access_key:
            raise InvalidArgument("you cannot delete the key this request is signed with; use another key")
        s.delete(key)


@dataclass(frozen=True)
class Bootstrap:
    created: bool
    access_key: str | None
    secret_key: str | None


def bootstrap(db: Database, box: SecretBox, tenant_name: str, admin_name: str) -> Bootstrap:
    """Create the first tenant, the platform admin and its key when the database has no users."""
    with db.write() as s:
        if store.any_user(s):
            return Bootstrap(False, None, None)
        tenant = store.get_tenant_by_name(s, tenant_name)
        if tenant is None:
            tenant = TenantRow(
                id=new_id("t-"), name=tenant_name, created_at=utcnow(), sandbox_slot=store.next_sandbox_slot(s)
            )
            s.add(tenant)
            s.flush()
        user = UserRow(
            id=new_id("u-"), tenant_id=tenant.id, name=admin_name, role=Role.PLATFORM_ADMIN.value, created_at=utcnow()
        )
        s.add(user)
        s.flush()
        key, secret = _add_key(s, box, tenant.id, user.id)
        try:
            s.flush()
        except IntegrityError:
            raise AlreadyExists("bootstrap raced with another process") from None
        return Bootstrap(True, key.id, secret)
