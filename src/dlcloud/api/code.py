"""Code uploads (streamed request bodies)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, status

from dlcloud.api.deps import CallerDep, PlatformDep, StreamingCallerDep, incoming, set_audit_resource
from dlcloud.api.params import CodeId
from dlcloud.schemas.jobs import CodeUpload
from dlcloud.services import code as svc

router = APIRouter()


@router.post("/code", response_model=CodeUpload, status_code=status.HTTP_201_CREATED, name="code.upload")
async def upload_code(
    c: StreamingCallerDep,
    p: PlatformDep,
    request: Request,
    # kind and filename are checked by the service (400 invalid_argument); the schema states the same rules
    kind: str = Query(
        "archive",
        description="archive (a .tar.gz of a directory), wheel or sdist",
        json_schema_extra={"enum": list(svc.KINDS)},
    ),
    filename: str = Query(
        "code.tar.gz",
        max_length=200,
        description="a wheel's ends in .whl, an sdist's in .tar.gz or .tgz",
        json_schema_extra={"pattern": svc.FILENAME_RE.pattern},
    ),
) -> CodeUpload:
    body = incoming(request)
    upload = await svc.upload_code(
        p.db,
        p.settings,
        p.objects,
        c,
        kind=kind,
        filename=filename,
        declared_sha256=body.declared_sha256,
        content_length=body.content_length,
        chunks=body.chunks,
    )
    set_audit_resource(request, upload.id)
    return upload


@router.get("/code/{code_id}", response_model=CodeUpload, name="code.get")
def get_code(c: CallerDep, p: PlatformDep, code_id: CodeId) -> CodeUpload:
    return svc.get_code(p.db, c, code_id)
