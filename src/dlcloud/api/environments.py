"""Runtime environments: create, list, describe, delete, build logs."""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from fastapi.responses import StreamingResponse

from dlcloud.api.deps import CallerDep, PlatformDep, set_audit_resource
from dlcloud.api.params import Follow, Name, Tail
from dlcloud.schemas.environments import Environment, EnvironmentCreate, EnvironmentDetail
from dlcloud.services import environments as svc

router = APIRouter()


@router.post(
    "/environments", response_model=Environment, status_code=status.HTTP_201_CREATED, name="environments.create"
)
def create_environment(c: CallerDep, p: PlatformDep, body: EnvironmentCreate, request: Request) -> Environment:
    set_audit_resource(request, body.name)
    return svc.create_environment(p, c, body)


@router.get("/environments", response_model=list[Environment], name="environments.list")
def list_environments(c: CallerDep, p: PlatformDep) -> list[Environment]:
    return svc.list_environments(p, c)


@router.get("/environments/{name}", response_model=EnvironmentDetail, name="environments.describe")
def describe_environment(c: CallerDep, p: PlatformDep, name: Name) -> EnvironmentDetail:
    return svc.describe_environment(p, c, name)


@router.delete("/environments/{name}", status_code=status.HTTP_204_NO_CONTENT, name="environments.delete")
def delete_environment(c: CallerDep, p: PlatformDep, name: Name) -> None:
    svc.delete_environment(p, c, name)


@router.get("/environments/{name}/logs", name="environments.logs", response_class=StreamingResponse)
async def environment_logs(
    c: CallerDep, p: PlatformDep, name: Name, follow: Follow = False, tail: Tail = None
) -> StreamingResponse:
    lines = await svc.open_log_stream(p, c, name, follow=follow, tail=tail)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")
