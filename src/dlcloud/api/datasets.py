"""The sample library: data uploads, pushes, reads, files, download, labels, shares, deletion.

A dataset of another tenant shared with the caller's is addressed as api/registry.py says: ``?owner=TENANT``.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, status
from fastapi.responses import StreamingResponse

from dlcloud.api import registry
from dlcloud.api.params import DatasetUploadId, Name, Owner, VersionRef
from dlcloud.api.registry import CallDep
from dlcloud.schemas import datasets as schemas
from dlcloud.services import dataset_sources
from dlcloud.services import datasets as svc
from dlcloud.services.datasets import FILES_PAGE, FILES_PAGE_MAX

router = APIRouter()

registry.upload_routes(
    router, "datasets", "/dataset-uploads", schemas.DatasetUpload, DatasetUploadId, svc.upload_data, svc.delete_upload
)


@router.post(
    "/datasets/{name}/versions",
    response_model=schemas.DatasetVersion,
    status_code=status.HTTP_201_CREATED,
    name="datasets.push",
)
def push_version(call: CallDep, name: Name, body: schemas.DatasetPush, owner: Owner = None) -> schemas.DatasetVersion:
    # a plain ``def``: unpacking, checksumming and storing block, so they run in the thread pool
    return registry.add_version(call.request, name, lambda: call(dataset_sources.push_version, name, body, owner))


registry.entry_routes(
    router,
    "datasets",
    schemas.Dataset,
    schemas.DatasetDetail,
    svc.list_datasets,
    svc.describe_dataset,
    svc.delete_dataset,
)
registry.version_routes(
    router, "datasets", schemas.DatasetVersion, svc.list_versions, svc.get_version, svc.delete_version
)


@router.get(
    "/datasets/{name}/versions/{version}/files", response_model=list[schemas.DatasetFile], name="datasets.files"
)
def list_files(
    call: CallDep,
    name: Name,
    version: VersionRef,
    owner: Owner = None,
    limit: int = Query(FILES_PAGE, ge=1, le=FILES_PAGE_MAX, description="at most this many files"),
    after: str | None = Query(None, max_length=4096, description="the files whose path sorts after this one"),
) -> list[schemas.DatasetFile]:
    """The version's files sorted by path, a page at a time: fewer than ``limit`` means the last page; the
    next page starts ``after`` the last path of this one."""
    return call(svc.list_files, name, version, owner, limit=limit, after=after)[1]


@router.get("/datasets/{name}/versions/{version}/data", name="datasets.download", response_class=StreamingResponse)
def download_version(call: CallDep, name: Name, version: VersionRef, owner: Owner = None) -> StreamingResponse:
    found, stream = call(svc.open_version, name, version, owner)
    return registry.archive_download(name, found, stream)


registry.label_routes(
    router, "datasets", schemas.DatasetLabel, schemas.DatasetLabelSet, svc.set_label, svc.remove_label
)
registry.share_routes(router, "datasets", schemas.DatasetShare, svc.share_dataset, svc.unshare_dataset)
