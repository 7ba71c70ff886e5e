"""HTTP endpoints of the model server: KServe V2 (``/v2``), TF Serving REST (``/v1``), repository admin, metrics.

Routes only read the body, call the protocol layer to decode, the repository to infer, and the protocol
layer to encode. No pydantic bodies: ``tritonclient`` sends no Content-Type, and the body may be binary.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send

from dlcloud import __version__
from dlcloud.serving.config import ServerConfig
from dlcloud.serving.errors import BadRequest, NotFound, PayloadTooLarge, ServingError, Unavailable
from dlcloud.serving.metrics import ServingMetrics
from dlcloud.serving.protocol import tfserving, v2
from dlcloud.serving.repository import ModelRepository, ModelVersion, ServedModel, VersionState
from dlcloud.serving.types import Signature

log = logging.getLogger("dlcloud.serving")
access_log = logging.getLogger("dlcloud.serving.access")

EXTENSIONS = ["binary_tensor_data", "model_repository"]
JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status, headers=headers, media_type=JSON)


def _error(exc: ServingError) -> Response:
    return Response(v2.encode_error(exc.message), exc.status, headers=exc.headers, media_type=JSON)


def _failure(exc: Exception, what: str, model: str) -> Response:
    """The answer to an inference request that raised: a ``ServingError`` as it says, anything else a logged 500."""
    if isinstance(exc, ServingError):
        return _error(exc)
    log.exception("%s on model %s failed", what, model)
    return _error(ServingError(f"internal error: {type(exc).__name__}: {exc}"))


def _version(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise BadRequest(f"model version must be a positive integer, got {raw!r}")
    return int(raw)


def _load_parameters(body: bytes) -> dict[str, Any]:
    """The ``parameters`` of a repository load request: an empty body or ``{"parameters": {...}}``."""
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError included
        raise BadRequest(f"load request body is not valid JSON: {exc}") from None
    params = doc.get("parameters", {}) if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        raise BadRequest('load request body must be a JSON object: {"parameters": {...}} or nothing')
    return params


# the headers v2.decode_infer_request reads (ASGI servers give header names in lower case)
_V2_HEADERS = frozenset((b"content-encoding", v2.HEADER_LENGTH.encode()))


def _v2_headers(request: Request) -> dict[str, str]:
    """Those of the request's headers that the V2 decoder reads, the first of each (as ``Headers.get`` would).

    Cheaper than ``request.headers``, on which each absent header costs the decoder a scan of them all.
    """
    found: dict[str, str] = {}
    for key, value in request.scope["headers"]:
        if key in _V2_HEADERS:
            found.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return found


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes before reading them where the length is declared."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class ServingApp:
    """Holds the repository and metrics; its methods are the route handlers."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = ServingMetrics()
        self.repository = ModelRepository(config, self.metrics)
        self.log_access = config.access_log

    # helpers ---------------------------------------------------------------------------------------

    def _record(self, request: Request, model: str, version: str, protocol: str, status: int, started: float) -> None:
        took = time.perf_counter() - started
        code = str(status)
        # metric labels only take names the server knows: a client must not create series at will (a request
        # for an unknown model or version counts under model="" / version="", the access log has the name)
        served = self.repository.models.get(model)
        known_model = model if served is not None else ""
        known_version = version if served is not None and version.isdigit() and int(version) in served.versions else ""
        self.metrics.requests.labels(known_model, known_version, protocol, code).inc()
        if status >= 400:
            self.metrics.errors.labels(known_model, known_version, protocol, code).inc()
        else:
            self.metrics.latency.labels(known_model, known_version).observe(took)
        if self.log_access and access_log.isEnabledFor(logging.INFO):
            client = request.client
            access_log.info(
                json.dumps(
                    {
                        "ts": round(time.time(), 6),
                        "method": request.method,
                        "path": request.url.path,
                        "status": status,
                        "model": model,
                        "version": version,
                        "protocol": protocol,
                        "ms": round(took * 1000, 3),
                        "client": f"{client.host}:{client.port}" if client else None,
                    }
                )
            )

    def _check_admin(self, request: Request) -> None:
        token = self.config.admin_token
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ServingError("repository endpoints need 'Authorization: Bearer <admin token>'", status=401)

    # KServe V2 ----------------------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.repository.ready() else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json(v2.server_metadata(self.config.name, __version__, EXTENSIONS))

    def _served_version(self, request: Request) -> tuple[ServedModel, ModelVersion]:
        served = self.repository.get(request.path_params["model"])
        return served, served.route(_version(request.path_params.get("version")))

    async def model_metadata(self, request: Request) -> Response:
        try:
            served, mv = self._served_version(request)
            versions = [m.label for m in served.available()]
            sig = mv.signature
            if sig is None:
                sig = Signature()
            return _json(v2.model_metadata(served.name, versions, mv.platform, sig))
        except ServingError as exc:
            return _error(exc)

    async def model_ready(self, request: Request) -> Response:
        try:
            self._served_version(request)
            return Response(status_code=200)
        except NotFound as exc:
            return _error(exc)
        except ServingError:
            return Response(status_code=503)

    async def model_config(self, request: Request) -> Response:
        try:
            served, mv = self._served_version(request)
            sig = mv.signature
            if sig is None:
                sig = Signature()
            batching = None
            if served.spec is not None and mv.max_batch_size > 0:
                b = served.spec.batching
                batching = {
                    "preferred_batch_size": list(b.preferred_batch_sizes),
                    "max_queue_delay_microseconds": int(b.max_queue_delay * 1e6),
                }
            return _json(v2.model_config(served.name, mv.platform, mv.max_batch_size, sig, dynamic_batching=batching))
        except ServingError as exc:
            return _error(exc)

    async def infer(self, request: Request) -> Response:
        started = time.perf_counter()
        model = request.path_params["model"]
        version = request.path_params.get("version") or ""
        status = 200
        try:
            body = await read_body(request, self.config.max_body_bytes)
            served = self.repository.get(model)
            mv = served.route(_version(version or None))
            version = mv.label
            single = mv.signature.inputs[0] if mv.signature is not None and len(mv.signature.inputs) == 1 else None
            req = v2.decode_infer_request(
                body, _v2_headers(request), max_body_bytes=self.config.max_body_bytes, single_input=single
            )
            sig = mv.signature
            if sig is not None and sig.outputs:
                v2.check_requested_outputs(served.name, req.outputs, (o.name for o in sig.outputs))
            outputs = await mv.run({t.name: t.array for t in req.inputs}, None)
            payload, headers = v2.encode_infer_response(
                served.name,
                mv.label,
                req.id,
                outputs,
                req.outputs,
                req.binary_output_default,
                mv.output_datatypes,
            )
            return Response(payload, headers=headers)
        except Exception as exc:
            response = _failure(exc, "infer", model)
            status = response.status_code
            return response
        finally:
            self._record(request, model, version, "v2", status, started)

    # repository extension --------------------------------------------------------------------------------

    async def repository_index(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            return _json(self.repository.index())
        except ServingError as exc:
            return _error(exc)

    async def repository_load(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            name = request.path_params["model"]
            params = _load_parameters(await read_body(request, 1024 * 1024))
            if "config" in params or any(k.startswith("file:") for k in params):
                raise BadRequest("loading with an override config or files is not supported; edit the model path")
            version = _version(request.path_params.get("version"))
            if version is None:
                failed = await self.repository.sync_model(name)
                served = self.repository.get(name)
                if failed:
                    live = served.available_versions()
                    serving = f"; serving version(s) {', '.join(map(str, live))}" if live else "; no version serves"
                    raise Unavailable(
                        "; ".join(f"version {mv.version} of model '{name}' failed to load: {mv.error}" for mv in failed)
                        + serving
                    )
                if not served.ready():
                    raise BadRequest(f"model '{name}' has no version ready{served._why()}")
            else:
                await self.repository.load_version(name, version)
            self.metrics.model_events.labels(name, str(version or ""), "load_request").inc()
            return Response(status_code=200)
        except ServingError as exc:
            return _error(exc)

    async def repository_unload(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            name = request.path_params["model"]
            version = _version(request.path_params.get("version"))
            if version is None:
                await self.repository.unload_model(name)
            else:
                await self.repository.unload_version(name, version)
            return Response(status_code=200)
        except ServingError as exc:
            return _error(exc)

    # TF Serving REST ---------------------------------------------------------------------------------

    def _tf_version(self, served: ServedModel, version: int | None, label: str | None) -> ModelVersion:
        return served.route(version, label)

    async def tf_get(self, request: Request) -> Response:
        try:
            parsed = tfserving.parse_model_path("/v1/models/" + request.path_params["rest"])
            if parsed is None:
                raise NotFound(f"no such TF Serving route: {request.url.path}")
            name, version, label, action = parsed
            served = self.repository.get(name)
            if action == "metadata":
                mv = served.route(version, label)
                return _json(tfserving.model_metadata(served.name, mv.version, mv.signature or Signature()))
            if action not in ("", None, "status"):
                raise NotFound(f"'{action}' needs POST")
            if label is not None:
                version = served.route(None, label).version
            states = [(v, _tf_state(mv.state)) for v, mv in sorted(served.versions.items()) if version in (None, v)]
            if version is not None and not states:
                raise NotFound(f"model '{name}' has no version {version}")
            if not states:
                raise NotFound(f"model '{name}' has no versions loaded{served._why()}")
            errors = {v: mv.error for v, mv in served.versions.items() if mv.error}
            return _json(tfserving.model_status(states, errors=errors))
        except ServingError as exc:
            return _error(exc)

    async def tf_post(self, request: Request) -> Response:
        started = time.perf_counter()
        model, version_label, status = "", "", 200
        try:
            parsed = tfserving.parse_model_path("/v1/models/" + request.path_params["rest"])
            if parsed is None:
                raise NotFound(f"no such TF Serving route: {request.url.path}")
            model, version, label, action = parsed
            if action not in ("predict", "classify", "regress"):
                raise NotFound(f"unknown TF Serving method {action!r}; use :predict, :classify or :regress")
            body = await read_body(request, self.config.max_body_bytes)
            served = self.repository.get(model)
            mv = served.route(version, label)
            version_label = mv.label
            if mv.signature is None:
                raise BadRequest(f"model '{model}' has no declared signature; TF Serving requests need one")
            inputs, fmt = tfserving.decode_predict(body, mv.signature)
            outputs = await mv.run(inputs, None)
            if action == "predict":
                payload = tfserving.encode_predict(outputs, fmt)
            else:
                payload = tfserving.encode_results(outputs, method=action)
            return Response(payload, media_type=JSON)
        except Exception as exc:
            response = _failure(exc, "predict", model)
            status = response.status_code
            return response
        finally:
            self._record(request, model, version_label, "tfserving", status, started)

    # metrics -----------------------------------------------------------------------------------------

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list[BaseRoute]:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        repo = "/v2/repository/models/{model}"
        return [
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route(model, self.model_metadata, methods=["GET"]),
            Route(versioned, self.model_metadata, methods=["GET"]),
            Route(model + "/ready", self.model_ready, methods=["GET"]),
            Route(versioned + "/ready", self.model_ready, methods=["GET"]),
            Route(model + "/config", self.model_config, methods=["GET"]),
            Route(versioned + "/config", self.model_config, methods=["GET"]),
            Route(model + "/infer", self.infer, methods=["POST"]),
            Route(versioned + "/infer", self.infer, methods=["POST"]),
            Route("/v2/repository/index", self.repository_index, methods=["GET", "POST"]),
            Route(repo + "/load", self.repository_load, methods=["POST"]),
            Route(repo + "/unload", self.repository_unload, methods=["POST"]),
            Route(repo + "/versions/{version}/load", self.repository_load, methods=["POST"]),
            Route(repo + "/versions/{version}/unload", self.repository_unload, methods=["POST"]),
            Route("/v1/models/{rest:path}", self.tf_get, methods=["GET"]),
            Route("/v1/models/{rest:path}", self.tf_post, methods=["POST"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]


# the paths of the two V2 infer routes below (Starlette's {model} and {version} match [^/]+)
_V2_INFER = re.compile(r"/v2/models/([^/]+)/(?:versions/([^/]+)/)?infer")


class _ServingStarlette(Starlette):
    """Starlette, with a shortcut for V2 infer requests, the hot path: they go straight to their handler.

    The router would try the routes one by one and wrap the handler in four layers of middleware and exception
    handling, which ``ServingApp.infer`` does not need (it answers every error itself); skipping them saves
    about a tenth of the server's time per request. The request the handler sees is the one the router would
    have made: same path params, same scope. Everything else (and every infer request under a ``root_path``
    that Starlette would route differently) goes through Starlette as usual.
    """

    def __init__(self, *args: Any, infer: Handler, prefix: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._infer = infer
        # Mount(prefix) takes every path under prefix/ (and a prefix with {params} would take more: no shortcut)
        self._prefix = prefix + "/" if prefix else ""
        self._shortcut = "{" not in prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and self._shortcut and not scope.get("root_path"):
            path = scope["path"]
            mounted = bool(self._prefix) and path.startswith(self._prefix)
            if mounted:
                path = path[len(self._prefix) - 1 :]
            match = _V2_INFER.fullmatch(path)
            if match is not None:
                model, version = match.groups()
                if mounted:  # as Mount sets them for its routes
                    scope["app_root_path"] = ""
                    scope["root_path"] = self._prefix[:-1]
                scope["app"] = self
                scope["endpoint"] = self._infer
                scope["path_params"] = {"model": model} if version is None else {"model": model, "version": version}
                response = await self._infer(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _tf_state(state: VersionState) -> str:
    return {
        VersionState.LOADING: "LOADING",
        VersionState.AVAILABLE: "AVAILABLE",
        VersionState.UNLOADING: "UNLOADING",
        VersionState.FAILED: "END",
    }[state]


def create_serving_app(config: ServerConfig) -> Starlette:
    """The model server as an ASGI app; models load in its lifespan."""
    serving = ServingApp(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await serving.repository.start()
        try:
            yield
        finally:
            await serving.repository.stop()

    routes = serving.routes()
    prefix = config.root_path.rstrip("/")
    if prefix:
        routes = [Mount(prefix, routes=serving.routes()), *routes]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _json({"error": f"no route for {request.method} {request.url.path}"}, 404)

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _json({"error": f"{request.method} is not allowed on {request.url.path}"}, 405)

    app = _ServingStarlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: method_not_allowed},
        infer=serving.infer,
        prefix=prefix,
    )
    app.state.serving = serving
    return app
