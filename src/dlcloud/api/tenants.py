"""Tenants, users and access keys."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Depends, Query, Request, status

from dlcloud.api.deps import caller, get_platform, set_audit_resource
from dlcloud.api.params import KeyId, TenantName
from dlcloud.schemas.common import Name
from dlcloud.schemas.tenants import Tenant, TenantCreate, TenantUpdate
from dlcloud.schemas.users import AccessKey, AccessKeyCreated, KeyCreate, User, UserCreate, Whoami
from dlcloud.services import tenants as svc
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform

router = APIRouter()


@router.get("/whoami", response_model=Whoami, name="whoami")
def whoami(c: Caller = Depends(caller)) -> Whoami:
    return Whoami(user=c.user, tenant=c.tenant, role=c.role, access_key=c.access_key)


@router.post("/tenants", response_model=Tenant, status_code=status.HTTP_201_CREATED, name="tenants.create")
def create_tenant(
    body: TenantCreate, request: Request, c: Caller = Depends(caller), p: Platform = Depends(get_platform)
) -> Tenant:
    set_audit_resource(request, body.name)
    return svc.create_tenant(p.db, c, body)


@router.get("/tenants", response_model=list[Tenant], name="tenants.list")
def list_tenants(c: Caller = Depends(caller), p: Platform = Depends(get_platform)) -> list[Tenant]:
    return svc.list_tenants(p.db, c)


@router.get("/tenants/{name}", response_model=Tenant, name="tenants.get")
def get_tenant(name: TenantName, c: Caller = Depends(caller), p: Platform = Depends(get_platform)) -> Tenant:
    return svc.get_tenant(p.db, c, name)


@router.patch("/tenants/{name}", response_model=Tenant, name="tenants.update")
def update_tenant(
    name: TenantName, body: TenantUpdate, c: Caller = Depends(caller), p: Platform = Depends(get_platform)
) -> Tenant:
    return svc.update_tenant(p.db, c, name, body)


@router.post("/users", response_model=User, status_code=status.HTTP_201_CREATED, name="users.create")
def create_user(
    body: UserCreate, request: Request, c: Caller = Depends(caller), p: Platform = Depends(get_platform)
) -> User:
    set_audit_resource(request, f"{body.tenant or c.tenant}/{body.name}")
    return svc.create_user(p.db, c, body)


@router.get("/users", response_model=list[User], name="users.list")
def list_users(
    tenant: Name | None = Query(None), c: Caller = Depends(caller), p: Platform = Depends(get_platform)
) -> list[User]:
    return svc.list_users(p.db, c, tenant)


@router.post("/keys", response_model=AccessKeyCreated, status_code=status.HTTP_201_CREATED, name="keys.create")
async def create_key(
    body: KeyCreate, request: Request, c: Caller = Depends(caller), p: Platform = Depends(get_platform)
) -> AccessKeyCreated:
    created = await anyio.to_thread.run_sync(svc.create_key, p.db, p.box, c, body)
    set_audit_resource(request, created.access_key)
    return created


@router.get("/keys", response_model=list[AccessKey], name="keys.list")
def list_keys(
    user: Name | None = Query(None),
    tenant: Name | None = Query(None),
    c: Caller = Depends(caller),
    p: Platform = Depends(get_platform),
) -> list[AccessKey]:
    return svc.list_keys(p.db, c, user, tenant)


@router.post("/keys/{key_id}/disable", response_model=AccessKey, name="keys.disable")
def disable_key(key_id: KeyId, c: Caller = Depends(caller), p: Platform = Depends(get_platform)) -> AccessKey:
    return svc.set_key_enabled(p.db, c, key_id, False)


@router.post("/keys/{key_id}/enable", response_model=AccessKey, name="keys.enable")
def enable_key(key_id: KeyId, c: Caller = Depends(caller), p: Platform = Depends(get_platform)) -> AccessKey:
    return svc.set_key_enabled(p.db, c, key_id, True)


@router.delete("/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT, name="keys.delete")
def delete_key(key_id: KeyId, c: Caller = Depends(caller), p: Platform = Depends(get_platform)) -> None:
    svc.delete_key(p.db, c, key_id)
