"""The sample library: data uploads, pushes, reads, files, download, labels, shares, deletion.

Another tenant's shared dataset is addressed with ``?owner=TENANT`` on the same routes (the SDK and the CLI
write it ``OWNER/NAME``); without ``owner`` a name is the caller's tenant's.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import StreamingResponse

from dlcloud.api import registry
from dlcloud.api.deps import CallerDep, PlatformDep, set_audit_resource
from dlcloud.api.params import DatasetUploadId, Owner, VersionRef
from dlcloud.api.params import Name as DatasetName
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

registry.upload_routes(
    router, "datasets", "/dataset-uploads", DatasetUpload, DatasetUploadId, svc.upload_data, svc.delete_upload
)


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


registry.entry_routes(
    router, "datasets", Dataset, DatasetDetail, svc.list_datasets, svc.describe_dataset, svc.delete_dataset
)
registry.version_routes(router, "datasets", DatasetVersion, svc.list_versions, svc.get_version, svc.delete_version)


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


registry.label_routes(router, "datasets", DatasetLabel, DatasetLabelSet, svc.set_label, svc.remove_label)
registry.share_routes(router, "datasets", DatasetShare, svc.share_dataset, svc.unshare_dataset)
