"""The model registry: artifact uploads, register, read, labels, shares, deletion, deployment leases.

Another tenant's shared model is addressed with ``?owner=TENANT`` on the same routes (the SDK and the CLI
write it ``OWNER/NAME``); without ``owner`` a name is the caller's tenant's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from fastapi.responses import StreamingResponse

from dlcloud.api import registry
from dlcloud.api.deps import CallerDep, PlatformDep, set_audit_resource
from dlcloud.api.params import Deployment, Owner, UploadId, VersionRef
from dlcloud.api.params import Name as ModelName
from dlcloud.api.registry import Version
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

registry.upload_routes(
    router, "models", "/model-uploads", ModelUpload, UploadId, svc.upload_artifact, svc.delete_upload
)


@router.post("/models", response_model=ModelVersion, status_code=status.HTTP_201_CREATED, name="models.register")
def register_model(
    c: CallerDep, p: PlatformDep, body: ModelRegister, request: Request, owner: Owner = None
) -> ModelVersion:
    # a plain ``def``: staging, checksumming and signature inference block, so they run in the thread pool
    set_audit_resource(request, body.name)
    version = svc.register_model(p, c, body, owner)
    set_audit_resource(request, f"{body.name}:{version.version}")
    return version


registry.entry_routes(router, "models", Model, ModelDetail, svc.list_models, svc.describe_model, svc.delete_model)
registry.version_routes(router, "models", ModelVersion, svc.list_versions, svc.get_version, svc.delete_version)


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


registry.label_routes(router, "models", ModelLabel, LabelSet, svc.set_label, svc.remove_label)
registry.share_routes(router, "models", ModelShare, svc.share_model, svc.unshare_model)


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
