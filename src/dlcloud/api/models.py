"""The model registry: artifact uploads, register, read, labels, shares, deletion, deployment leases.

Another tenant's shared model is addressed with ``?owner=TENANT`` on the same routes (the SDK and the CLI
write it ``OWNER/NAME``); without ``owner`` a name is the caller's tenant's.
"""

from __future__ import annotations

from fastapi import APIRouter, Path, Request, status
from fastapi.responses import StreamingResponse

from dlcloud import signing
from dlcloud.api.deps import (
    CallerDep,
    PlatformDep,
    StreamingCallerDep,
    set_audit_resource,
)
from dlcloud.api.params import Deployment, Label, Owner, TenantName, UploadId, VersionRef
from dlcloud.api.params import Name as ModelName
from dlcloud.errors import InvalidArgument
from dlcloud.schemas.models import (
    ARTIFACT_NAME_HEADER,
    ARTIFACT_SHA256_HEADER,
    VERSION_HEADER,
    DeploymentLease,
    LabelSet,
    Model,
    ModelDeployment,
    ModelDetail,
    ModelLabel,
    ModelRegister,
    ModelShare,
    ModelUpload,
    ModelVersion,
)
from dlcloud.services import model_leases as leases
from dlcloud.services import models as svc

router = APIRouter()
Version = Path(..., ge=1, le=999_999_999)


@router.post("/model-uploads", response_model=ModelUpload, status_code=status.HTTP_201_CREATED, name="models.upload")
async def upload_artifact(c: StreamingCallerDep, p: PlatformDep, request: Request) -> ModelUpload:
    length = request.headers.get("content-length")
    try:
        content_length = int(length) if length is not None else None
    except ValueError:
        raise InvalidArgument("Content-Length must be an integer") from None
    upload = await svc.upload_artifact(
        p,
        c,
        declared_sha256=request.headers[signing.HEADER_CONTENT_SHA256.lower()],
        content_length=content_length,
        chunks=request.stream(),
    )
    set_audit_resource(request, upload.id)
    return upload


@router.delete("/model-uploads/{upload_id}", status_code=status.HTTP_204_NO_CONTENT, name="models.upload_delete")
def delete_upload(c: CallerDep, p: PlatformDep, upload_id: UploadId) -> None:
    svc.delete_upload(p, c, upload_id)


@router.post("/models", response_model=ModelVersion, status_code=status.HTTP_201_CREATED, name="models.register")
def register_model(
    c: CallerDep, p: PlatformDep, body: ModelRegister, request: Request, owner: Owner = None
) -> ModelVersion:
    # a plain ``def``: staging, checksumming and signature inference block, so they run in the thread pool
    set_audit_resource(request, body.name)
    version = svc.register_model(p, c, body, owner)
    set_audit_resource(request, f"{body.name}:{version.version}")
    return version


@router.get("/models", response_model=list[Model], name="models.list")
def list_models(c: CallerDep, p: PlatformDep) -> list[Model]:
    return svc.list_models(p, c)


@router.get("/models/{name}", response_model=ModelDetail, name="models.describe")
def describe_model(c: CallerDep, p: PlatformDep, name: ModelName, owner: Owner = None) -> ModelDetail:
    return svc.describe_model(p, c, name, owner)


@router.delete("/models/{name}", status_code=status.HTTP_204_NO_CONTENT, name="models.delete")
def delete_model(c: CallerDep, p: PlatformDep, name: ModelName, owner: Owner = None) -> None:
    svc.delete_model(p, c, name, owner)


@router.get("/models/{name}/versions", response_model=list[ModelVersion], name="models.versions")
def list_versions(c: CallerDep, p: PlatformDep, name: ModelName, owner: Owner = None) -> list[ModelVersion]:
    return svc.list_versions(p, c, name, owner)


# ``{version}`` in every path under /versions/: OpenAPI reads /versions/{ref} and /versions/{version} as one
# template with two names, which is not allowed; GET takes a number, a label or 'latest', DELETE a number
@router.get("/models/{name}/versions/{version}", response_model=ModelVersion, name="models.version")
def get_version(
    c: CallerDep, p: PlatformDep, name: ModelName, version: VersionRef, owner: Owner = None
) -> ModelVersion:
    return svc.get_version(p, c, name, version, owner)


@router.delete(
    "/models/{name}/versions/{version}", status_code=status.HTTP_204_NO_CONTENT, name="models.delete_version"
)
def delete_version(
    c: CallerDep, p: PlatformDep, request: Request, name: ModelName, version: int = Version, owner: Owner = None
) -> None:
    set_audit_resource(request, f"{name}:{version}")
    svc.delete_version(p, c, name, version, owner)


@router.get("/models/{name}/versions/{version}/artifact", name="models.download", response_class=StreamingResponse)
def download_artifact(
    c: CallerDep, p: PlatformDep, name: ModelName, version: VersionRef, owner: Owner = None
) -> StreamingResponse:
    found, stream = svc.open_artifact(p, c, name, version, owner)
    headers = {
        ARTIFACT_SHA256_HEADER: found.sha256,
        ARTIFACT_NAME_HEADER: found.artifact,
        VERSION_HEADER: str(found.version),
        "Content-Disposition": f'attachment; filename="{name}-v{found.version}.tar.gz"',
    }
    return StreamingResponse(stream, media_type="application/gzip", headers=headers)


@router.put("/models/{name}/labels/{label}", response_model=ModelLabel, name="models.set_label")
def set_label(
    c: CallerDep, p: PlatformDep, request: Request, name: ModelName, label: Label, body: LabelSet, owner: Owner = None
) -> ModelLabel:
    set_audit_resource(request, f"{name}@{label}")
    return svc.set_label(p, c, name, label, body.version, owner)


@router.delete("/models/{name}/labels/{label}", status_code=status.HTTP_204_NO_CONTENT, name="models.remove_label")
def remove_label(
    c: CallerDep, p: PlatformDep, request: Request, name: ModelName, label: Label, owner: Owner = None
) -> None:
    set_audit_resource(request, f"{name}@{label}")
    svc.remove_label(p, c, name, label, owner)


@router.post("/models/{name}/shares/{tenant}", response_model=ModelShare, name="models.share")
def share_model(
    c: CallerDep, p: PlatformDep, request: Request, name: ModelName, tenant: TenantName, owner: Owner = None
) -> ModelShare:
    set_audit_resource(request, f"{name}->{tenant}")
    return svc.share_model(p, c, name, tenant, owner)


@router.delete("/models/{name}/shares/{tenant}", status_code=status.HTTP_204_NO_CONTENT, name="models.unshare")
def unshare_model(
    c: CallerDep, p: PlatformDep, request: Request, name: ModelName, tenant: TenantName, owner: Owner = None
) -> None:
    set_audit_resource(request, f"{name}->{tenant}")
    svc.unshare_model(p, c, name, tenant, owner)


@router.post(
    "/models/{name}/versions/{version}/deployments", response_model=ModelDeployment, name="models.deployment_renew"
)
def record_deployment(
    c: CallerDep,
    p: PlatformDep,
    request: Request,
    name: ModelName,
    body: DeploymentLease,
    version: int = Version,
    owner: Owner = None,
) -> ModelDeployment:
    set_audit_resource(request, f"{name}:{version}")
    lease = leases.record_deployment(p, c, name, version, body, owner)
    if lease.created_at != lease.last_seen:
        request.state.audit_skip = True  # a renewal: the audit log keeps the lease's first heartbeat only
    return lease


@router.delete(
    "/models/{name}/versions/{version}/deployments/{deployment}",
    status_code=status.HTTP_204_NO_CONTENT,
    name="models.deployment_release",
)
def release_deployment(
    c: CallerDep,
    p: PlatformDep,
    request: Request,
    name: ModelName,
    deployment: Deployment,
    version: int = Version,
    owner: Owner = None,
) -> None:
    set_audit_resource(request, f"{name}:{version}")
    leases.release_deployment(p, c, name, version, deployment, owner)
