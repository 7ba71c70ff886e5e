"""The OpenAPI document at ``/api/v1/openapi.json``: FastAPI's, made to tell the truth.

FastAPI documents each route's success response and a ``422 HTTPValidationError`` (``{"detail": [...]}``)
that this server never sends. ``install(app)`` post-processes the generated document once:

- every operation lists the error statuses it really answers, each with the ``Error`` schema that
  ``api/app.py`` sends (``{"error": {"code", "message", "details"}}``): 401 for every signed call, 400 and
  413 for every call (a malformed path or headers, a body over its limit: ``api/guard.py``), 429 for every
  call (a request rate limit, with ``Retry-After``: services/admission.py), 422 where FastAPI validates
  parameters or a body, and the statuses of ``ERRORS`` (what the route's service raises); FastAPI's
  ``HTTPValidationError`` and ``ValidationError`` components are dropped;
- streamed responses (logs, artifact downloads) and streamed request bodies (uploads) get their real
  media types;
- operation ids are the route names (``jobs.submit``), so generated clients get stable method names;
- the signed-request scheme is declared as a security scheme (see docs/api-auth.md).

Invariant: every ``/api/v1`` route has an ``ERRORS`` entry (``tests/unit/api/test_openapi.py``), so a new
route cannot ship with an undocumented status. The fuzz (``make fuzz``) checks the statuses against the
running server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import compile_path

from dlcloud.errors import HTTP_STATUS
from dlcloud.schemas.errors import ErrorResponse
from dlcloud.schemas.models import ARTIFACT_NAME_HEADER, ARTIFACT_SHA256_HEADER, VERSION_HEADER

ERROR_REF = "#/components/schemas/Error"

# The error statuses each route's service can answer, besides 401 and 422 (added for every operation that
# needs them). 400: a value the schema cannot express was refused; 403: the caller may not (its role, a
# model shared read-only, a host without a sandbox; another tenant's resources are 404, never 403);
# 404: a named resource does not exist for the caller; 409: the resource's state forbids it; 413: the body
# is over a limit; 429: over a tenant quota (storage included); 503: the object store is unreachable or lost
# a file.
ERRORS: dict[str, tuple[int, ...]] = {
    "jobs.submit": (400, 403, 404, 409, 429),
    "jobs.list": (),
    "queue.list": (),
    "jobs.describe": (404,),
    "jobs.cancel": (403, 404, 409),
    "jobs.delete": (403, 404, 409),
    "jobs.logs": (404,),
    "jobs.metrics": (404,),
    "jobs.metrics_push": (400,),  # 401 invalid_token: another job's, an ended attempt's (docs/metrics.md)
    "studies.submit": (400, 403, 404, 409, 429),
    "studies.list": (),
    "studies.describe": (404,),
    "studies.trials": (404,),
    "studies.best": (404,),  # 404 too while no trial has completed
    "studies.stop": (403, 404, 409),
    "studies.resume": (403, 404, 409),
    "whoami": (),
    "tenants.create": (403, 409),
    "tenants.list": (),
    "tenants.get": (404,),
    "tenants.update": (403, 404),
    "users.create": (403, 404, 409),
    "users.list": (404,),
    "keys.create": (403, 404),
    "keys.list": (403, 404),
    "keys.disable": (400, 403, 404),
    "keys.enable": (403, 404),
    "keys.delete": (400, 403, 404),
    "quota.get": (404,),
    "usage.get": (400, 403, 404),
    "audit.list": (403,),
    "code.upload": (400, 413, 429, 503),
    "code.get": (404,),
    "models.upload": (400, 413, 429, 503),
    "models.upload_delete": (404,),
    "models.register": (400, 403, 404, 409, 429, 503),
    "models.list": (),
    "models.describe": (404,),
    "models.delete": (403, 404, 409),
    "models.versions": (404,),
    "models.version": (404,),
    "models.delete_version": (403, 404, 409),
    "models.download": (404, 503),
    "models.set_label": (400, 403, 404),
    "models.remove_label": (403, 404),
    "models.share": (400, 403, 404),
    "models.unshare": (403, 404),
    "models.deployment_renew": (403, 404),
    "models.deployment_release": (403, 404),
    "datasets.upload": (400, 413, 429, 503),
    "datasets.upload_delete": (404,),
    "datasets.push": (400, 403, 404, 409, 429, 503),
    "datasets.list": (),
    "datasets.describe": (404,),
    "datasets.delete": (403, 404, 409),
    "datasets.versions": (404,),
    "datasets.version": (404,),
    "datasets.delete_version": (403, 404, 409),
    "datasets.files": (404, 503),
    "datasets.download": (404, 503),
    "datasets.set_label": (400, 403, 404),
    "datasets.remove_label": (403, 404),
    "datasets.share": (400, 403, 404),
    "datasets.unshare": (403, 404),
    "environments.create": (400, 403, 409),
    "environments.list": (),
    "environments.describe": (404,),
    "environments.delete": (400, 403, 404, 409),
    "environments.logs": (400, 404),
}

# routes that take a bearer token instead of a signed request
BEARER_ROUTES: dict[str, str] = {"jobs.metrics_push": "jobMetricsToken"}

_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
# success responses that are streams, not JSON
STREAMED_RESPONSES: dict[str, dict[str, Any]] = {
    "jobs.logs": {"description": "Log lines, one per line (streamed; follow=true keeps it open).", "content": _TEXT},
    "environments.logs": {"description": "Build log lines (streamed).", "content": _TEXT},
    "datasets.download": {
        "description": "The version's files as a .tar.gz (streamed).",
        "content": {"application/gzip": _BINARY},
        "headers": {
            ARTIFACT_SHA256_HEADER: {"description": "dlcloud checksum of the files", "schema": {"type": "string"}},
            VERSION_HEADER: {"description": "the version sent", "schema": {"type": "integer"}},
        },
    },
    "models.download": {
        "description": "The version's artifact as a .tar.gz (streamed).",
        "content": {"application/gzip": _BINARY},
        "headers": {
            ARTIFACT_SHA256_HEADER: {"description": "dlcloud checksum of the artifact", "schema": {"type": "string"}},
            ARTIFACT_NAME_HEADER: {
                "description": "the artifact's file or directory name",
                "schema": {"type": "string"},
            },
            VERSION_HEADER: {"description": "the version sent", "schema": {"type": "integer"}},
        },
    },
}
# request bodies read as a stream (their SHA-256 is declared in X-Dlcloud-Content-Sha256 and signed)
STREAMED_BODIES: dict[str, str] = {
    "code.upload": "application/octet-stream",
    "models.upload": "application/octet-stream",
    "datasets.upload": "application/octet-stream",
}

_STATUS_TEXT = {
    400: "Bad request",
    401: "Not authenticated (docs/api-auth.md)",
    403: "Not allowed for the caller",
    404: "Not found (or not visible to the caller's tenant)",
    409: "Conflicts with the resource's state",
    413: "Payload too large",
    422: "Validation error: details.errors lists {field, problem}",
    429: "Tenant quota exceeded, or a request rate limit (then with Retry-After)",
    503: "Unavailable",
}
_EXTRA_CODES = {404: ("not_found",), 405: ("method_not_allowed",)}  # sent by the handlers in api/app.py


def _codes(status: int) -> list[str]:
    codes = {code for code, s in HTTP_STATUS.items() if s == status} | set(_EXTRA_CODES.get(status, ()))
    if status == 401:
        codes.add("unauthenticated")
    return sorted(codes)


_RETRY_AFTER = {
    "description": "with rate_limited: whole seconds to wait before the request can be admitted",
    "schema": {"type": "integer", "minimum": 1},
}


def error_response(status: int) -> dict[str, Any]:
    """The OpenAPI response object of an error status: the ``Error`` schema and the codes it may carry."""
    response: dict[str, Any] = {
        "description": f"{_STATUS_TEXT.get(status, 'Error')}; codes: {', '.join(_codes(status))}",
        "content": {"application/json": {"schema": {"$ref": ERROR_REF}}},
    }
    if status == 429:
        response["headers"] = {"Retry-After": _RETRY_AFTER}
    return response


def _error_components() -> dict[str, Any]:
    schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.pop("$defs", {})
    components["Error"] = schema
    return components


def document(app: FastAPI, schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite FastAPI's generated ``schema`` in place (see the module docstring); returns it."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas.update(_error_components())
    components["securitySchemes"] = {
        "dlcloudSignature": {
            "type": "apiKey",
            "in": "header",
            "name": "X-Dlcloud-Signature",
            "description": "HMAC-SHA256 request signature with X-Dlcloud-Access-Key, -Timestamp and -Nonce: "
            "see docs/api-auth.md",
        }
    }
    components["securitySchemes"]["jobMetricsToken"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a job attempt's DLCLOUD_METRICS_TOKEN: only for pushing that job's metrics (docs/metrics.md)",
    }
    for item in schema["paths"].values():
        for op in item.values():
            name = op["operationId"]  # the route name: see ``operation_id``
            op["security"] = [{BEARER_ROUTES.get(name, "dlcloudSignature"): []}]
            responses = op.setdefault("responses", {})
            validated = responses.pop("422", None) is not None
            # 400, 413: api/guard.py, before routing; 429: the rate limits (services/admission.py)
            statuses = {400, 401, 413, 429, *ERRORS[name]}
            if validated:
                statuses.add(422)
            for status in sorted(statuses):
                responses[str(status)] = error_response(status)
            if name in STREAMED_RESPONSES:
                ok = next(s for s in responses if s.startswith("2"))
                responses[ok] = STREAMED_RESPONSES[name]
            if name in STREAMED_BODIES:
                op["requestBody"] = {"required": True, "content": {STREAMED_BODIES[name]: _BINARY}}
    return schema


def operation_id(route: APIRoute) -> str:
    """A route's operation id is its name (``jobs.submit``): what ``ERRORS`` and the metrics call it."""
    return route.name


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the document lists for ``path`` (a concrete path, e.g. /api/v1/jobs/x), for ``Allow``."""
    matchers = getattr(app.state, "openapi_matchers", None)
    if matchers is None:
        matchers = [
            (compile_path(template)[0], {method.upper() for method in item})
            for template, item in app.openapi()["paths"].items()
        ]
        app.state.openapi_matchers = matchers
    return sorted({m for regex, methods in matchers if regex.match(path) for m in methods})


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` return the rewritten document (built once, then cached by FastAPI)."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app, generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
