"""Job metrics: a job attempt pushes them with its metrics token, the job's tenant reads them (docs/metrics.md).

The push takes ``Authorization: Bearer <DLCLOUD_METRICS_TOKEN>`` and nothing else (``deps.job_token``);
the read is a signed user request, scoped to the caller's tenant like ``GET /jobs/{name}``.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response, status

from dlcloud.api.deps import CallerDep, JobTokenDep, PlatformDep, set_audit_resource
from dlcloud.api.params import JobName
from dlcloud.schemas.metrics import DEFAULT_MAX_POINTS, MAX_MAX_POINTS, REPLICA_RE, JobMetrics, MetricName, MetricsPush
from dlcloud.services import metrics as svc

router = APIRouter()


@router.post(
    "/jobs/{name}/metrics",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    name="jobs.metrics_push",
)
def push_metrics(token: JobTokenDep, p: PlatformDep, name: JobName, push: MetricsPush, request: Request) -> Response:
    """Store points of the job attempt the token was given to (``name``: the job id in DLCLOUD_METRICS_URL)."""
    request.state.audit_skip = True  # routine: a job pushes every few seconds
    set_audit_resource(request, name)
    svc.push_metrics(p, token, name, push)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/jobs/{name}/metrics", response_model=JobMetrics, name="jobs.metrics")
def get_metrics(
    c: CallerDep,
    p: PlatformDep,
    name: JobName,
    metric: list[MetricName] | None = Query(
        None, max_length=100, description="only these metrics (repeat it); default: all"
    ),
    attempt: int | None = Query(None, ge=1, le=1_000_000, description="only this attempt; default: all"),
    replica: str | None = Query(
        None, max_length=64, pattern=REPLICA_RE, description="only this replica ('' for one process)"
    ),
    max_points: int = Query(DEFAULT_MAX_POINTS, ge=1, le=MAX_MAX_POINTS, description="points per series at most"),
) -> JobMetrics:
    return svc.get_job_metrics(
        p, c, name, metrics=metric or (), attempt=attempt, replica=replica, max_points=max_points
    )
