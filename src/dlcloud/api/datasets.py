"""The sample library: data uploads, pushes, reads, files, download, labels, shares, deletion.

Another tenant's shared dataset is addressed with ``?owner=TENANT`` on the same routes (the SDK and the CLI
write it ``OWNER/NAME``); without ``owner`` a name is the caller's tenant's.
"""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import StreamingResponse

from dlcloud import signing
from dlcloud.api.deps import (
    CallerDep,
    PlatformDep,
    StreamingCallerDep,
    set_audit_resource,
)
from dlcloud.api.params import DatasetUploadId, Label, Owner, TenantName, VersionRef
from dlcloud.api.params import Name as DatasetName
from dlcloud.errors import InvalidArgument
from dlcloud.schemas.datasets import (
    Dataset,
    DatasetDetail,
    DatasetFile,
    DatasetLabel,
    DatasetLabelSet,
    DatasetPush,
    DatasetShare,
    DatasetUpload,
    DatasetVersion,
)
from dlcloud.schemas.models import ARTIFACT_SHA256_HEADER, VERSION_HEADER
from dlcloud.services import dataset_sources
from dlcloud.services import datasets as svc
from dlcloud.services.datasets import FILES_PAGE, FILES_PAGE_MAX

router = APIRouter()
Version = Path(..., ge=1, le=999_999_999)


@router.post(
    "/dataset-uploads", response_model=DatasetUpload, status_code=status.HTTP_201_CREATED, name="datasets.upload"
)
async def upload_data(c: StreamingCallerDep, p: PlatformDep, request: Request) -> DatasetUpload:
    length = request.headers.get("content-length")
    try:
        content_length = int(length) if length is not None else None
    except ValueError:
        raise InvalidArgument("Content-Length must be an integer") from None
    upload = await svc.upload_data(
        p,
        c,
        declared_sha256=request.headers[signing.HEADER_CONTENT_SHA256.lower()],
        content_length=content_length,
        chunks=request.stream(),
    )
    set_audit_resource(request, upload.id)
    return upload


@router.delete("/dataset-uploads/{upload_id}", status_code=status.HTTP_204_NO_CONTENT, name="datasets.upload_delete")
def delete_upload(c: CallerDep, p: PlatformDep, upload_id: DatasetUploadId) -> None:
    svc.delete_upload(p, c, upload_id)


@router.post(
    "/datasets/{name}/versions",
    response_model=DatasetVersion,
    status_code=status.HTTP_201_CREATED,
    name="datasets.push",
)
def push_version(
    c: CallerDep, p: PlatformDep, name: DatasetName, body: DatasetPush, request: Request, owner: Owner = None
) -> DatasetVersion:
    # a plain ``def``: unpacking, checksumming and storing block, so they run in the thread pool
    set_audit_resource(request, name)
    version = dataset_sources.push_version(p, c, name, body, owner)
    set_audit_resource(request, f"{name}:{version.version}")
    return version


@router.get("/datasets", response_model=list[Dataset], name="datasets.list")
def list_datasets(c: CallerDep, p: PlatformDep) -> list[Dataset]:
    return svc.list_datasets(p, c)


@router.get("/datasets/{name}", response_model=DatasetDetail, name="datasets.describe")
def describe_dataset(c: CallerDep, p: PlatformDep, name: DatasetName, owner: Owner = None) -> DatasetDetail:
    return svc.describe_dataset(p, c, name, owner)


@router.delete("/datasets/{name}", status_code=status.HTTP_204_NO_CONTENT, name="datasets.delete")
def delete_dataset(c: CallerDep, p: PlatformDep, name: DatasetName, owner: Owner = None) -> None:
    svc.delete_dataset(p, c, name, owner)


@router.get("/datasets/{name}/versions", response_model=list[DatasetVersion], name="datasets.versions")
def list_versions(c: CallerDep, p: PlatformDep, name: DatasetName, owner: Owner = None) -> list[DatasetVersion]:
    return svc.list_versions(p, c, name, owner)


# ``{version}`` in every path under /versions/ (one template for OpenAPI): GET takes a number, a label or
# 'latest', DELETE a number
@router.get("/datasets/{name}/versions/{version}", response_model=DatasetVersion, name="datasets.version")
def get_version(
    c: CallerDep, p: PlatformDep, name: DatasetName, version: VersionRef, owner: Owner = None
) -> DatasetVersion:
    return svc.get_version(p, c, name, version, owner)


@router.delete(
    "/datasets/{name}/versions/{version}", status_code=status.HTTP_204_NO_CONTENT, name="datasets.delete_version"
)
def delete_version(
    c: CallerDep, p: PlatformDep, request: Request, name: DatasetName, version: int = Version, owner: Owner = None
) -> None:
    set_audit_resource(request, f"{name}:{version}")
    svc.delete_version(p, c, name, version, owner)


@router.get("/datasets/{name}/versions/{version}/files", response_model=list[DatasetFile], name="datasets.files")
def list_files(
    c: CallerDep,
    p: PlatformDep,
    name: DatasetName,
    version: VersionRef,
    owner: Owner = None,
    limit: int = Query(FILES_PAGE, ge=1, le=FILES_PAGE_MAX, description="at most this many files"),
    after: str | None = Query(None, max_length=4096, description="the files whose path sorts after this one"),
) -> list[DatasetFile]:
    """The version's files sorted by path, a page at a time: fewer than ``limit`` means the last page; the
    next page starts ``after`` the last path of this one."""
    return svc.list_files(p, c, name, version, owner, limit=limit, after=after)[1]


@router.get("/datasets/{name}/versions/{version}/data", name="datasets.download", response_class=StreamingResponse)
def download_version(
    c: CallerDep, p: PlatformDep, name: DatasetName, version: VersionRef, owner: Owner = None
) -> StreamingResponse:
    found, stream = svc.open_version(p, c, name, version, owner)
    headers = {
        ARTIFACT_SHA256_HEADER: found.sha256,
        VERSION_HEADER: str(found.version),
        "Content-Disposition": f'attachment; filename="{name}-v{found.version}.tar.gz"',
    }
    return StreamingResponse(stream, media_type="application/gzip", headers=headers)


@router.put("/datasets/{name}/labels/{label}", response_model=DatasetLabel, name="datasets.set_label")
def set_label(
    c: CallerDep,
    p: PlatformDep,
    request: Request,
    name: DatasetName,
    label: Label,
    body: DatasetLabelSet,
    owner: Owner = None,
) -> DatasetLabel:
    set_audit_resource(request, f"{name}@{label}")
    return svc.set_label(p, c, name, label, body.version, owner)


@router.delete("/datasets/{name}/labels/{label}", status_code=status.HTTP_204_NO_CONTENT, name="datasets.remove_label")
def remove_label(
    c: CallerDep, p: PlatformDep, request: Request, name: DatasetName, label: Label, owner: Owner = None
) -> None:
    set_audit_resource(request, f"{name}@{label}")
    svc.remove_label(p, c, name, label, owner)


@router.post("/datasets/{name}/shares/{tenant}", response_model=DatasetShare, name="datasets.share")
def share_dataset(
    c: CallerDep, p: PlatformDep, request: Request, name: DatasetName, tenant: TenantName, owner: Owner = None
) -> DatasetShare:
    set_audit_resource(request, f"{name}->{tenant}")
    return svc.share_dataset(p, c, name, tenant, owner)


@router.delete("/datasets/{name}/shares/{tenant}", status_code=status.HTTP_204_NO_CONTENT, name="datasets.unshare")
def unshare_dataset(
    c: CallerDep, p: PlatformDep, request: Request, name: DatasetName, tenant: TenantName, owner: Owner = None
) -> None:
    set_audit_resource(request, f"{name}->{tenant}")
    svc.unshare_dataset(p, c, name, tenant, owner)
