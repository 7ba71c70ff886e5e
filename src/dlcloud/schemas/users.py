"""Users and access keys on the wire."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from dlcloud.schemas.common import Name, Request, Response


class Role(StrEnum):
    PLATFORM_ADMIN = "platform-admin"
    TENANT_ADMIN = "tenant-admin"
    MEMBER = "member"


class UserCreate(Request):
    name: Name
    tenant: Name | None = None  # default: the caller's tenant
    role: Role = Role.MEMBER


class User(Response):
    id: str
    name: str
    tenant: str
    role: Role
    created_at: datetime


class KeyCreate(Request):
    user: Name | None = None  # default: the caller
    tenant: Name | None = None  # with user: that user's tenant (platform admin only)


class AccessKey(Response):
    access_key: str
    user: str
    tenant: str
    enabled: bool
    created_at: datetime


class AccessKeyCreated(AccessKey):
    secret_key: str  # shown once


class Whoami(Response):
    user: str
    tenant: str
    role: Role
    access_key: str
