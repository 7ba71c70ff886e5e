"""The routes every versioned registry (models, datasets) has alike: uploads, entries, versions, labels, shares.

Each registry's router adds them with its own path prefix, route names and read models, and its own service
functions; what differs (a model's artifact, a dataset's files) stays in its own router. The OpenAPI document
names every route as before: ``{plural}.versions``, ``{plural}.set_label`` and so on.
"""

# no ``from __future__ import annotations``: the routes' annotations name the registry's own schemas, which
# FastAPI reads from the functions when they are defined here

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Path, Request, status
from pydantic import BaseModel

from dlcloud import signing
from dlcloud.api.deps import CallerDep, PlatformDep, StreamingCallerDep, set_audit_resource
from dlcloud.api.params import Label, Name, Owner, TenantName, VersionRef
from dlcloud.errors import InvalidArgument

Version = Path(..., ge=1, le=999_999_999)

Read = Callable[..., Any]  # a service function (platform, caller, name, ..., owner) -> a read model or None


def upload_routes(
    router: APIRouter,
    plural: str,
    path: str,
    upload_model: type[BaseModel],
    upload_id: Any,
    upload: Callable[..., Awaitable[Any]],
    delete_upload: Read,
) -> None:
    """``POST {path}`` (a streamed .tar.gz, checked against its declared checksum) and ``DELETE {path}/{upload_id}``;
    ``upload_id`` is the id's path parameter type."""

    @router.post(path, response_model=upload_model, status_code=status.HTTP_201_CREATED, name=f"{plural}.upload")
    async def post_upload(c: StreamingCallerDep, p: PlatformDep, request: Request) -> Any:
        length = request.headers.get("content-length")
        try:
            content_length = int(length) if length is not None else None
        except ValueError:
            raise InvalidArgument("Content-Length must be an integer") from None
        found = await upload(
            p,
            c,
            declared_sha256=request.headers[signing.HEADER_CONTENT_SHA256.lower()],
            content_length=content_length,
            chunks=request.stream(),
        )
        set_audit_resource(request, found.id)
        return found

    @router.delete(f"{path}/{{upload_id}}", status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.upload_delete")
    def remove_upload(c: CallerDep, p: PlatformDep, upload_id: upload_id) -> None:
        delete_upload(p, c, upload_id)


def entry_routes(
    router: APIRouter,
    plural: str,
    entry_model: type[BaseModel],
    detail_model: type[BaseModel],
    list_entries: Read,
    describe: Read,
    delete: Read,
) -> None:
    """``GET /{plural}`` (the caller's and those shared with it), ``GET`` and ``DELETE /{plural}/{name}``."""

    @router.get(f"/{plural}", response_model=list[entry_model], name=f"{plural}.list")  # type: ignore[valid-type]
    def entries(c: CallerDep, p: PlatformDep) -> Any:
        return list_entries(p, c)

    @router.get(f"/{plural}/{{name}}", response_model=detail_model, name=f"{plural}.describe")
    def entry(c: CallerDep, p: PlatformDep, name: Name, owner: Owner = None) -> Any:
        return describe(p, c, name, owner)

    @router.delete(f"/{plural}/{{name}}", status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.delete")
    def remove_entry(c: CallerDep, p: PlatformDep, name: Name, owner: Owner = None) -> None:
        delete(p, c, name, owner)


def version_routes(
    router: APIRouter,
    plural: str,
    version_model: type[BaseModel],
    list_versions: Read,
    get_version: Read,
    delete_version: Read,
) -> None:
    """``GET /{plural}/{name}/versions``, ``GET`` and ``DELETE /{plural}/{name}/versions/{version}``."""

    @router.get(f"/{plural}/{{name}}/versions", response_model=list[version_model], name=f"{plural}.versions")  # type: ignore[valid-type]
    def versions(c: CallerDep, p: PlatformDep, name: Name, owner: Owner = None) -> Any:
        return list_versions(p, c, name, owner)

    # ``{version}`` in every path under /versions/: OpenAPI reads /versions/{ref} and /versions/{version} as one
    # template with two names, which is not allowed; GET takes a number, a label or 'latest', DELETE a number
    @router.get(f"/{plural}/{{name}}/versions/{{version}}", response_model=version_model, name=f"{plural}.version")
    def version(c: CallerDep, p: PlatformDep, name: Name, version: VersionRef, owner: Owner = None) -> Any:
        return get_version(p, c, name, version, owner)

    @router.delete(
        f"/{plural}/{{name}}/versions/{{version}}",
        status_code=status.HTTP_204_NO_CONTENT,
        name=f"{plural}.delete_version",
    )
    def remove_version(
        c: CallerDep, p: PlatformDep, request: Request, name: Name, version: int = Version, owner: Owner = None
    ) -> None:
        set_audit_resource(request, f"{name}:{version}")
        delete_version(p, c, name, version, owner)


def label_routes(
    router: APIRouter,
    plural: str,
    label_model: type[BaseModel],
    label_set: type[BaseModel],
    set_label: Read,
    remove_label: Read,
) -> None:
    """``PUT`` and ``DELETE /{plural}/{name}/labels/{label}``; ``label_set`` is the PUT's body."""
    path = f"/{plural}/{{name}}/labels/{{label}}"

    @router.put(path, response_model=label_model, name=f"{plural}.set_label")
    def put_label(
        c: CallerDep,
        p: PlatformDep,
        request: Request,
        name: Name,
        label: Label,
        body: label_set,  # type: ignore[valid-type]
        owner: Owner = None,
    ) -> Any:
        set_audit_resource(request, f"{name}@{label}")
        return set_label(p, c, name, label, body.version, owner)  # type: ignore[attr-defined]

    @router.delete(path, status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.remove_label")
    def delete_label(
        c: CallerDep, p: PlatformDep, request: Request, name: Name, label: Label, owner: Owner = None
    ) -> None:
        set_audit_resource(request, f"{name}@{label}")
        remove_label(p, c, name, label, owner)


def share_routes(router: APIRouter, plural: str, share_model: type[BaseModel], share: Read, unshare: Read) -> None:
    """``POST`` and ``DELETE /{plural}/{name}/shares/{tenant}``."""
    path = f"/{plural}/{{name}}/shares/{{tenant}}"

    @router.post(path, response_model=share_model, name=f"{plural}.share")
    def post_share(
        c: CallerDep, p: PlatformDep, request: Request, name: Name, tenant: TenantName, owner: Owner = None
    ) -> Any:
        set_audit_resource(request, f"{name}->{tenant}")
        return share(p, c, name, tenant, owner)

    @router.delete(path, status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.unshare")
    def delete_share(
        c: CallerDep, p: PlatformDep, request: Request, name: Name, tenant: TenantName, owner: Owner = None
    ) -> None:
        set_audit_resource(request, f"{name}->{tenant}")
        unshare(p, c, name, tenant, owner)
