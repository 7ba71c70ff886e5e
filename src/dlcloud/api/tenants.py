"""Tenants, users and access keys."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Query, Request, status

from dlcloud.api.deps import CallerDep, PlatformDep, set_audit_resource
from dlcloud.api.params import KeyId, TenantName
from dlcloud.schemas.common import Name
from dlcloud.schemas.tenants import Tenant, TenantCreate, TenantUpdate
from dlcloud.schemas.users import AccessKey, AccessKeyCreated, KeyCreate, User, UserCreate, Whoami
from dlcloud.services import tenants as svc

router = APIRouter()


@router.get("/whoami", response_model=Whoami, name="whoami")
def whoami(c: CallerDep) -> Whoami:
    return Whoami(user=c.user, tenant=c.tenant, role=c.role, access_key=c.access_key)


@router.post("/tenants", response_model=Tenant, status_code=status.HTTP_201_CREATED, name="tenants.create")
def create_tenant(c: CallerDep, p: PlatformDep, body: TenantCreate, request: Request) -> Tenant:
    set_audit_resource(request, body.name)
    return svc.create_tenant(p.db, c, body)


@router.get("/tenants", response_model=list[Tenant], name="tenants.list")
def list_tenants(c: CallerDep, p: PlatformDep) -> list[Tenant]:
    return svc.list_tenants(p.db, c)


@router.get("/tenants/{name}", response_model=Tenant, name="tenants.get")
def get_tenant(c: CallerDep, p: PlatformDep, name: TenantName) -> Tenant:
    return svc.get_tenant(p.db, c, name)


@router.patch("/tenants/{name}", response_model=Tenant, name="tenants.update")
def update_tenant(c: CallerDep, p: PlatformDep, name: TenantName, body: TenantUpdate) -> Tenant:
    return svc.update_tenant(p.db, c, name, body)


@router.post("/users", response_model=User, status_code=status.HTTP_201_CREATED, name="users.create")
def create_user(c: CallerDep, p: PlatformDep, body: UserCreate, request: Request) -> User:
    set_audit_resource(request, f"{body.tenant or c.tenant}/{body.name}")
    return svc.create_user(p.db, c, body)


@router.get("/users", response_model=list[User], name="users.list")
def list_users(c: CallerDep, p: PlatformDep, tenant: Name | None = Query(None)) -> list[User]:
    return svc.list_users(p.db, c, tenant)


@router.post("/keys", response_model=AccessKeyCreated, status_code=status.HTTP_201_CREATED, name="keys.create")
async def create_key(c: CallerDep, p: PlatformDep, body: KeyCreate, request: Request) -> AccessKeyCreated:
    created = await anyio.to_thread.run_sync(svc.create_key, p.db, p.box, c, body)
    set_audit_resource(request, created.access_key)
    return created


@router.get("/keys", response_model=list[AccessKey], name="keys.list")
def list_keys(
    c: CallerDep, p: PlatformDep, user: Name | None = Query(None), tenant: Name | None = Query(None)
) -> list[AccessKey]:
    return svc.list_keys(p.db, c, user, tenant)


@router.post("/keys/{key_id}/disable", response_model=AccessKey, name="keys.disable")
def disable_key(c: CallerDep, p: PlatformDep, key_id: KeyId) -> AccessKey:
    return svc.set_key_enabled(p.db, c, key_id, False)


@router.post("/keys/{key_id}/enable", response_model=AccessKey, name="keys.enable")
def enable_key(c: CallerDep, p: PlatformDep, key_id: KeyId) -> AccessKey:
    return svc.set_key_enabled(p.db, c, key_id, True)


@router.delete("/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT, name="keys.delete")
def delete_key(c: CallerDep, p: PlatformDep, key_id: KeyId) -> None:
    svc.delete_key(p.db, c, key_id)
