"""``create_app(platform)``: the FastAPI application with error handlers, middleware and routers."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from dlcloud import __version__
from dlcloud.api import accounting, code, datasets, environments, jobs, metrics, models, openapi, studies, tenants
from dlcloud.api.deps import streaming_caller
from dlcloud.api.guard import BodyLimits, RequestGuard, upload_routes
from dlcloud.api.middleware import Metrics, RequestMiddleware
from dlcloud.api.scheduling_metrics import SchedulingCollector
from dlcloud.errors import DlcloudError, RateLimited
from dlcloud.schemas.errors import validation_problems
from dlcloud.services.admission import RateLimits
from dlcloud.services.auth import AuthError, BatchVerifier
from dlcloud.services.platform import Platform
from dlcloud.services.rate_table import SharedBuckets

log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"
_BODY_NOT_PARSED = "There was an error parsing the body"
# the object store's failures, as callers see them (the details go to the server log)
_STORAGE_FAILURES = {
    "storage_unavailable": "the server's storage cannot be reached right now; try again later",
    "object_missing": "stored data this request needs is missing from the server's storage; ask an administrator",
    "object_damaged": "stored data this request needs is damaged in the server's storage; ask an administrator",
}  # FastAPI's 400 when a JSON body cannot be decoded


def _error(
    request: Request,
    status: int,
    code: str,
    message: str,
    details: dict | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    request.state.error_code = code
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(body, status_code=status, headers=headers)


@dataclass(frozen=True)
class SharedByProcesses:
    """What the API processes of one ``dlcloud up --api-workers N`` share (``api_workers.py``)."""

    rate_table: Path  # the rate limits' buckets (``services/rate_table.py``)
    metrics_dir: Path  # prometheus_client's multiprocess files: ``/metrics`` sums every process's counters


def create_app(platform: Platform, *, ready_check: Any = None, shared: SharedByProcesses | None = None) -> FastAPI:
    """Build the API. ``ready_check`` returns None when ready or a reason string (the control loop);
    ``shared``: what this process shares with the other API processes of the host; None: it is the only one."""
    app = FastAPI(
        title="dlcloud",
        version=__version__,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
    )
    app.state.platform = platform
    app.state.verifier = BatchVerifier(platform.db, platform.box, platform.settings.clock_skew_seconds)
    buckets = SharedBuckets(shared.rate_table) if shared is not None else None
    app.state.rate_limits = RateLimits(platform.settings, buckets)  # after authentication: api/deps.py
    prometheus_metrics = Metrics(shared.metrics_dir if shared is not None else None)
    scrape_token = platform.settings.metrics_scrape_token
    prometheus_metrics.registry.register(SchedulingCollector(platform, per_tenant=scrape_token is not None))
    app.state.metrics = prometheus_metrics

    _install_error_handlers(app)
    _install_probes(app, platform, ready_check, prometheus_metrics)
    # jobs first: routes are matched in order, and job calls (describe, logs) are the bulk of the traffic
    routers = [
        module.router for module in (jobs, metrics, tenants, accounting, code, models, datasets, environments, studies)
    ]
    for router in routers:
        app.include_router(router, prefix=API_PREFIX)
    settings = platform.settings
    uploads = upload_routes(API_PREFIX, routers, streaming_caller)
    limits = BodyLimits(settings.max_request_bytes, settings.max_upload_bytes, uploads)
    app.add_middleware(RequestGuard, limits=limits)  # inside RequestMiddleware: refusals get ids and metrics
    app.add_middleware(RequestMiddleware, metrics=prometheus_metrics, platform=platform)
    openapi.install(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Every error answers ``{"error": {"code", "message", "details"}}`` with the status of its code."""

    @app.exception_handler(DlcloudError)
    async def _dlcloud_error(request: Request, exc: DlcloudError) -> JSONResponse:
        if isinstance(exc, AuthError) and exc.access_key:
            request.state.auth_access_key = exc.access_key[:40]
        if exc.code in _STORAGE_FAILURES:
            # where the store is and what it said (endpoints, buckets, keys) is for the operator's log only
            log.error("%s %s: %s (%s)", request.method, request.url.path, exc.message, exc.details)
            return _error(request, exc.http_status, exc.code, _STORAGE_FAILURES[exc.code], {})
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
        return _error(request, exc.http_status, exc.code, exc.message, exc.details, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, details = validation_problems(exc.errors())
        return _error(request, 422, "validation_error", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _BODY_NOT_PARSED:
            # a body that is not UTF-8: the same validation_error as a body that is not JSON
            problem = "the body is not valid JSON (UTF-8)"
            details = {"errors": [{"field": "(body)", "problem": problem}]}
            return _error(request, 422, "validation_error", f"invalid request: (body): {problem}", details)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_argument")
        message = str(exc.detail)
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            # Starlette's 405 names only the methods of the first route that matched the path
            allowed = openapi.allowed_methods(request.app, request.scope["path"])
            if allowed:
                headers["Allow"] = ", ".join(allowed)
            message = f"{request.method} is not allowed here; allowed: {headers.get('Allow', 'none')}"
        return _error(request, exc.status_code, code, message, headers=headers or None)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error(request, 500, "internal", "internal server error; the server log has the details")


def _install_probes(app: FastAPI, platform: Platform, ready_check: Any, prometheus_metrics: Metrics) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` (per-tenant series only for the holder of the scrape token)."""
    scrape_token = platform.settings.metrics_scrape_token

    @app.get("/healthz", include_in_schema=False, name="healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False, name="readyz")
    def readyz() -> JSONResponse:
        try:
            platform.db.ping()
        except Exception as exc:  # any driver error means not ready
            return JSONResponse({"status": "unavailable", "reason": f"database: {type(exc).__name__}"}, 503)
        reason = ready_check() if ready_check else None
        if reason:
            return JSONResponse({"status": "unavailable", "reason": reason}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", include_in_schema=False, name="metrics")
    def prometheus(request: Request) -> Response:
        if scrape_token is not None:
            # per-tenant series: only for the scraper that holds the token (settings.metrics_scrape_token)
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            expected = scrape_token.get_secret_value().encode()
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
                message = "/metrics takes the scrape token: Authorization: Bearer <metrics_scrape_token>"
                return _error(request, 401, "unauthenticated", message, headers={"WWW-Authenticate": "Bearer"})
        return PlainTextResponse(generate_latest(prometheus_metrics.registry), media_type=CONTENT_TYPE_LATEST)
