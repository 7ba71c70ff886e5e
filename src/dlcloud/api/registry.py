"""The routes every versioned registry (models, datasets) has alike: uploads, entries, versions, labels, shares.

Each registry's router adds them with its own path prefix, route names and read models, and its own service
functions; what differs (a model's artifact, a dataset's files) stays in its own router. The OpenAPI document
names every route as before: ``{plural}.versions``, ``{plural}.set_label`` and so on.

Another tenant's shared entry is addressed with ``?owner=TENANT`` on the same routes (the SDK and the CLI write
it ``OWNER/NAME``); without ``owner`` a name is the caller's tenant's.
"""

# no ``from __future__ import annotations``: the routes' annotations name the registry's own schemas, which
# FastAPI reads from the functions when they are defined here

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import APIRouter, Depends, Path, Request, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from dlcloud.api.deps import CallerDep, PlatformDep, StreamingCallerDep, incoming, set_audit_resource
from dlcloud.api.params import Label, Name, Owner, TenantName, VersionRef
from dlcloud.schemas.models import ARTIFACT_SHA256_HEADER, VERSION_HEADER
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform

Version = Path(..., ge=1, le=999_999_999)

Read = Callable[..., Any]  # a service function (platform, caller, name, ..., owner) -> a read model or None


class Numbered(Protocol):
    @property
    def version(self) -> int: ...

    @property
    def sha256(self) -> str: ...


N = TypeVar("N", bound=Numbered)


class Call:
    """What every registry route takes besides its parameters: the caller, the platform, and the request (for the
    audit log). A dependency of no parameters of its own: a route's parameters, and the OpenAPI document, stay
    the route's."""

    def __init__(self, c: CallerDep, p: PlatformDep, request: Request) -> None:
        self.c: Caller = c
        self.p: Platform = p
        self.request = request

    def audit(self, resource: str) -> None:
        """Name what the request is about in the audit log."""
        set_audit_resource(self.request, resource)

    def __call__(self, service: Read, *args: Any, **kwargs: Any) -> Any:
        """``service(platform, caller, *args, **kwargs)``."""
        return service(self.p, self.c, *args, **kwargs)


CallDep = Annotated[Call, Depends()]


def add_version(request: Request, name: str, add: Callable[[], N]) -> N:
    """``add()`` a version to the entry ``name``; the audit log names the entry, then the version it made."""
    set_audit_resource(request, name)
    version = add()
    set_audit_resource(request, f"{name}:{version.version}")
    return version


def archive_download(
    name: str, version: Numbered, stream: Iterator[bytes], headers: dict[str, str] | None = None
) -> StreamingResponse:
    """A version's stored tree as a .tar.gz download: its checksum, the registry's own ``headers`` and its
    number in the headers, its file named ``NAME-vVERSION.tar.gz``."""
    sent = {
        ARTIFACT_SHA256_HEADER: version.sha256,
        **(headers or {}),
        VERSION_HEADER: str(version.version),
        "Content-Disposition": f'attachment; filename="{name}-v{version.version}.tar.gz"',
    }
    return StreamingResponse(stream, media_type="application/gzip", headers=sent)


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
        found = await upload(p, c, incoming(request))
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
    def entries(call: CallDep) -> Any:
        return call(list_entries)

    @router.get(f"/{plural}/{{name}}", response_model=detail_model, name=f"{plural}.describe")
    def entry(call: CallDep, name: Name, owner: Owner = None) -> Any:
        return call(describe, name, owner)

    @router.delete(f"/{plural}/{{name}}", status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.delete")
    def remove_entry(call: CallDep, name: Name, owner: Owner = None) -> None:
        call(delete, name, owner)


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
    def versions(call: CallDep, name: Name, owner: Owner = None) -> Any:
        return call(list_versions, name, owner)

    # ``{version}`` in every path under /versions/: OpenAPI reads /versions/{ref} and /versions/{version} as one
    # template with two names, which is not allowed; GET takes a number, a label or 'latest', DELETE a number
    @router.get(f"/{plural}/{{name}}/versions/{{version}}", response_model=version_model, name=f"{plural}.version")
    def version(call: CallDep, name: Name, version: VersionRef, owner: Owner = None) -> Any:
        return call(get_version, name, version, owner)

    @router.delete(
        f"/{plural}/{{name}}/versions/{{version}}",
        status_code=status.HTTP_204_NO_CONTENT,
        name=f"{plural}.delete_version",
    )
    def remove_version(call: CallDep, name: Name, version: int = Version, owner: Owner = None) -> None:
        call.audit(f"{name}:{version}")
        call(delete_version, name, version, owner)


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
    def put_label(call: CallDep, name: Name, label: Label, body: label_set, owner: Owner = None) -> Any:  # type: ignore[valid-type]
        call.audit(f"{name}@{label}")
        return call(set_label, name, label, body.version, owner)  # type: ignore[attr-defined]

    @router.delete(path, status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.remove_label")
    def delete_label(call: CallDep, name: Name, label: Label, owner: Owner = None) -> None:
        call.audit(f"{name}@{label}")
        call(remove_label, name, label, owner)


def share_routes(router: APIRouter, plural: str, share_model: type[BaseModel], share: Read, unshare: Read) -> None:
    """``POST`` and ``DELETE /{plural}/{name}/shares/{tenant}``."""
    path = f"/{plural}/{{name}}/shares/{{tenant}}"

    @router.post(path, response_model=share_model, name=f"{plural}.share")
    def post_share(call: CallDep, name: Name, tenant: TenantName, owner: Owner = None) -> Any:
        call.audit(f"{name}->{tenant}")
        return call(share, name, tenant, owner)

    @router.delete(path, status_code=status.HTTP_204_NO_CONTENT, name=f"{plural}.unshare")
    def delete_share(call: CallDep, name: Name, tenant: TenantName, owner: Owner = None) -> None:
        call.audit(f"{name}->{tenant}")
        call(unshare, name, tenant, owner)
