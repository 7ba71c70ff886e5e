"""Jobs: submit, list, describe, cancel, delete, logs."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import StreamingResponse

from dlcloud.api.deps import CallerDep, PlatformDep, run_read, set_audit_resource
from dlcloud.api.params import Follow, JobName, PageLimit, PageOffset, Tail
from dlcloud.schemas.jobs import Job, JobDetail, JobSpec, JobState, LogSection, QueueEntry
from dlcloud.services import jobs as svc
from dlcloud.services.logs import open_log_stream

router = APIRouter()


@router.post("/jobs", response_model=Job, status_code=status.HTTP_201_CREATED, name="jobs.submit")
def submit_job(c: CallerDep, p: PlatformDep, spec: JobSpec, request: Request) -> Job:
    set_audit_resource(request, spec.name)
    return svc.submit_job(p, c, spec)


@router.get("/jobs", response_model=list[Job], name="jobs.list")
def list_jobs(
    c: CallerDep,
    p: PlatformDep,
    state: list[JobState] | None = Query(None),
    limit: PageLimit = 100,
    offset: PageOffset = 0,
) -> list[Job]:
    return svc.list_jobs(p, c, states=state, limit=limit, offset=offset)


@router.get("/queue", response_model=list[QueueEntry], name="queue.list")
def list_queue(c: CallerDep, p: PlatformDep, limit: int = Query(1000, ge=1, le=10_000)) -> list[QueueEntry]:
    """The waiting jobs in the scheduler's order: a platform admin sees every tenant's, others their tenant's."""
    return svc.list_queue(p, c, limit=limit)


@router.get("/jobs/{name}", response_model=JobDetail, name="jobs.describe")
async def describe_job(c: CallerDep, p: PlatformDep, name: JobName) -> JobDetail:
    # async, not a plain ``def``: describe is polled hard, and FastAPI would run a sync endpoint in the
    # thread pool and then validate its result in the thread pool again
    return await run_read(p, svc.describe_job, p, c, name)


@router.post("/jobs/{name}/cancel", response_model=Job, name="jobs.cancel")
def cancel_job(c: CallerDep, p: PlatformDep, name: JobName) -> Job:
    return svc.cancel_job(p, c, name)


@router.delete("/jobs/{name}", status_code=status.HTTP_204_NO_CONTENT, name="jobs.delete")
def delete_job(c: CallerDep, p: PlatformDep, name: JobName) -> None:
    svc.delete_job(p, c, name)


@router.get("/jobs/{name}/logs", name="jobs.logs", response_class=StreamingResponse)
async def job_logs(
    c: CallerDep,
    p: PlatformDep,
    name: JobName,
    follow: Follow = False,
    tail: Tail = None,
    section: LogSection = Query(LogSection.ALL, description="only the lines of the pre, main or post phase"),
    replica: str | None = Query(
        None, max_length=64, pattern=r"^[a-z]+-[0-9]+(\.[0-9]+)?$", description="only this replica's lines (worker-1)"
    ),
) -> StreamingResponse:
    lines = await open_log_stream(p, c, name, follow=follow, tail=tail, section=section, replica=replica)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")
