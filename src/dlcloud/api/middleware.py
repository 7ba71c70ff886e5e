"""ASGI middleware: request ids, Prometheus metrics and the audit log.

Audited: every mutating call (POST, PUT, PATCH, DELETE under /api/) and every authentication failure.
A route may mark a successful call as routine (``request.state.audit_skip``, e.g. the renewal of a
deployment lease, which a model server sends every few seconds); it is then not recorded. Not audited
either: a request the guard refused before anyone authenticated (``state["rejected_before_auth"]``:
malformed path or headers, body too large; api/guard.py). Authentication failures go through
``AuthFailureAudit``: repeats of one source within a window are counted in one event; so are the refusals of
a rate limit (``429 rate_limited``, services/admission.py), per access key and route, so a flood cannot grow
the log by a row per request.
The audit record never contains request bodies or headers, so secrets cannot reach it.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from dlcloud.services.accounting import AuditRecord, AuthFailureAudit, record_audit

log = logging.getLogger(__name__)
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Metrics:
    """The API's request counters and latencies, and ``registry``, what ``/metrics`` shows. ``multiprocess_dir``:
    the directory where the API processes of one ``dlcloud up --api-workers N`` keep their values
    (``PROMETHEUS_MULTIPROC_DIR``, set before this process imported prometheus_client): ``/metrics`` then sums
    every process's, those of processes that died included."""

    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        own = CollectorRegistry()
        self.requests = Counter("dlcloud_http_requests", "HTTP requests", ["method", "route", "status"], registry=own)
        self.latency = Histogram(
            "dlcloud_http_request_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=own,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.registry = own
        if multiprocess_dir is not None:
            self.registry = CollectorRegistry()
            MultiProcessCollector(self.registry, str(multiprocess_dir))


class RequestMiddleware:
    def __init__(self, app: Any, metrics: Metrics, platform: Any):
        self.app = app
        self.metrics = metrics
        self.platform = platform
        self.auth_failures = AuthFailureAudit(platform.db, platform.settings.auth_failure_audit_window_seconds)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = secrets.token_hex(8)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        status_holder = [500]
        start = time.perf_counter()

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            status = status_holder[0]
            route = scope.get("route")
            route_name = getattr(route, "name", None) or "unmatched"
            method = scope["method"]
            self.metrics.requests.labels(method, route_name, str(status)).inc()
            self.metrics.latency.labels(method, route_name).observe(time.perf_counter() - start)
            path = scope.get("path", "")
            routine = bool(state.get("audit_skip")) and status < 400
            refused = bool(state.get("rejected_before_auth")) and state.get("caller") is None
            if path.startswith("/api/") and (method in MUTATING or status == 401) and not (routine or refused):
                await self._audit(scope, state, route_name, status)

    async def _audit(self, scope: dict, state: dict, route_name: str, status: int) -> None:
        caller = state.get("caller")
        params = scope.get("path_params") or {}
        resource = state.get("audit_resource") or (next(iter(params.values())) if params else None)
        client = scope.get("client")
        rec = AuditRecord(
            tenant_id=caller.tenant_id if caller else None,
            tenant=caller.tenant if caller else None,
            user=caller.user if caller else None,
            access_key=caller.access_key if caller else state.get("auth_access_key"),
            action=route_name if status != 401 or caller else f"auth.{state.get('error_code', 'failure')}",
            resource=str(resource)[:255] if resource is not None else None,
            status_code=status,
            error_code=state.get("error_code"),
            request_id=state["request_id"],
            client_address=client[0] if client else None,
        )
        try:
            if (status == 401 and caller is None) or rec.error_code == "rate_limited":
                await self.auth_failures.record(rec)
            else:
                await anyio.to_thread.run_sync(record_audit, self.platform.db, rec)
        except Exception:  # auditing must not turn a served response into a crash
            log.exception("could not write audit event for request %s", state["request_id"])
