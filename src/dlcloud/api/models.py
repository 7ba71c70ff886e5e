"""The model registry: artifact uploads, register, read, labels, shares, deletion, deployment leases.

A model of another tenant shared with the caller's is addressed as api/registry.py says: ``?owner=TENANT``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from fastapi.responses import StreamingResponse

from dlcloud.api import registry
from dlcloud.api.deps import CallerDep, PlatformDep
from dlcloud.api.params import Deployment, Name, Owner, UploadId, VersionRef
from dlcloud.api.registry import CallDep, Version
from dlcloud.schemas import models as schemas
from dlcloud.services import model_leases as leases
from dlcloud.services import models as svc

router = APIRouter()

registry.upload_routes(
    router, "models", "/model-uploads", schemas.ModelUpload, UploadId, svc.upload_artifact, svc.delete_upload
)


@router.post(
    "/models", response_model=schemas.ModelVersion, status_code=status.HTTP_201_CREATED, name="models.register"
)
def register_model(
    c: CallerDep, p: PlatformDep, body: schemas.ModelRegister, request: Request, owner: Owner = None
) -> schemas.ModelVersion:
    # a plain ``def``: staging, checksumming and signature inference block, so they run in the thread pool
    return registry.add_version(request, body.name, lambda: svc.register_model(p, c, body, owner))


registry.entry_routes(
    router, "models", schemas.Model, schemas.ModelDetail, svc.list_models, svc.describe_model, svc.delete_model
)
registry.version_routes(router, "models", schemas.ModelVersion, svc.list_versions, svc.get_version, svc.delete_version)


@router.get("/models/{name}/versions/{version}/artifact", name="models.download", response_class=StreamingResponse)
def download_artifact(call: CallDep, name: Name, version: VersionRef, owner: Owner = None) -> StreamingResponse:
    found, stream = call(svc.open_artifact, name, version, owner)
    return registry.archive_download(name, found, stream, {schemas.ARTIFACT_NAME_HEADER: found.artifact})


registry.label_routes(router, "models", schemas.ModelLabel, schemas.LabelSet, svc.set_label, svc.remove_label)
registry.share_routes(router, "models", schemas.ModelShare, svc.share_model, svc.unshare_model)


@router.post(
    "/models/{name}/versions/{version}/deployments",
    response_model=schemas.ModelDeployment,
    name="models.deployment_renew",
)
def record_deployment(
    call: CallDep, name: Name, body: schemas.DeploymentLease, version: int = Version, owner: Owner = None
) -> schemas.ModelDeployment:
    call.audit(f"{name}:{version}")
    lease: schemas.ModelDeployment = call(leases.record_deployment, name, version, body, owner)
    if lease.created_at != lease.last_seen:
        call.request.state.audit_skip = True  # a renewal: the audit log keeps the lease's first heartbeat only
    return lease


@router.delete(
    "/models/{name}/versions/{version}/deployments/{deployment}",
    status_code=status.HTTP_204_NO_CONTENT,
    name="models.deployment_release",
)
def release_deployment(
    call: CallDep, name: Name, deployment: Deployment, version: int = Version, owner: Owner = None
) -> None:
    call.audit(f"{name}:{version}")
    call(leases.release_deployment, name, version, deployment, owner)
