"""ASGI middleware that refuses malformed and oversized requests before routing and authentication.

It runs inside ``RequestMiddleware`` (request id, metrics, audit) and outside everything else, so a refused
request never reaches a route, the signature check or the database. In order:

1. **The path.** The path line of the signature is computed here, once, from the path exactly as sent
   (``scope["raw_path"]``, see ``signing.canonical_path``) and kept in ``state["signed_path"]``; routing
   then sees that same decoded path (``scope["path"]``). Control characters (raw or %00-%1F, %7F), bad
   escapes and non-UTF-8 paths are ``400 invalid_path``.
2. **Headers that must appear once** (``X-Dlcloud-*``, ``Authorization``, ``Content-Length``,
   ``Content-Type``, ``Content-Encoding``, ``Transfer-Encoding``, ``Host``): a second copy is
   ``400 duplicate_header``. Otherwise the signature check and a route could read different copies.
3. **The body** is at most ``limits.for_request(method, path)`` bytes: ``max_upload_bytes`` on the upload
   routes, ``max_request_bytes`` on every other. A declared ``Content-Length`` over the limit is
   ``413 payload_too_large`` at once, the body unread. A body without a length is counted as the app reads
   it and cut at the limit (413); a body never runs past its declared length (400).

Invariants: the body is never read here, only counted as the app reads it; the guard's own refusals close
the connection (``Connection: close``: the unread body must not be taken as the next request) and are not
audited when nobody authenticated (``state["rejected_before_auth"]``): refusing costs no database write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.routing import compile_path

from dlcloud import signing
from dlcloud.errors import DlcloudError, DuplicateHeader, InvalidArgument, InvalidPath, PayloadTooLarge
from dlcloud.schemas.common import format_memory

SINGLE_HEADERS = frozenset(
    {b"authorization", b"content-length", b"content-type", b"content-encoding", b"transfer-encoding", b"host"}
)
_DIGITS = re.compile(rb"^[0-9]{1,19}$")

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
UploadRoutes = tuple[tuple[str, re.Pattern[str]], ...]


@dataclass(frozen=True)
class BodyLimits:
    """``upload`` bytes for the (method, path pattern) pairs in ``upload_routes``, ``default`` elsewhere."""

    default: int
    upload: int
    upload_routes: UploadRoutes = field(default=())

    def for_request(self, method: str, path: str) -> tuple[int, bool]:
        """The limit, and whether the route is an upload route."""
        for route_method, pattern in self.upload_routes:
            if method == route_method and pattern.match(path):
                return self.upload, True
        return self.default, False


def upload_routes(prefix: str, routers: Iterable[APIRouter], streaming_dependency: Callable[..., Any]) -> UploadRoutes:
    """(method, path pattern) of every route of ``routers`` (included under ``prefix``) that takes
    ``streaming_dependency``: the upload routes."""

    def calls(dependant: Any) -> Iterator[Any]:
        for dep in dependant.dependencies:
            yield dep.call
            yield from calls(dep)

    return tuple(
        (method, compile_path(prefix + route.path)[0])
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and streaming_dependency in calls(route.dependant)
        for method in sorted(route.methods or ())
    )


def check_headers(headers: list[tuple[bytes, bytes]]) -> None:
    """Raise DuplicateHeader when a header that must appear once appears twice."""
    seen: set[bytes] = set()
    for raw_name, _ in headers:
        name = raw_name.lower()
        if name in SINGLE_HEADERS or name.startswith(b"x-dlcloud-"):
            if name in seen:
                shown = name.decode("latin-1")
                raise DuplicateHeader(
                    f"header {shown!r} was sent more than once; send each X-Dlcloud-* header, Authorization, "
                    "Content-Length, Content-Type, Content-Encoding, Transfer-Encoding and Host at most once",
                    details={"header": shown},
                )
            seen.add(name)


def signed_path(scope: MutableMapping[str, Any]) -> str:
    """The decoded path the signature covers (the guard's, once it ran); raises InvalidPath."""
    state = scope.get("state") or {}
    if "signed_path" in state:
        return state["signed_path"]
    root = scope.get("root_path", "") or ""
    raw = scope.get("raw_path")
    try:
        if raw is None:  # optional in ASGI: the server's own decoding is all there is
            path = scope["path"]
            signing.canonical_path(signing.url_path(path))  # the same characters are refused
        else:
            path = signing.canonical_path(raw)
    except signing.PathNotAllowed as exc:
        raise InvalidPath(str(exc)) from None
    # servers disagree whether raw_path (and path) carry root_path; the signed path always does
    return path if not root or path.startswith(root) else root + path


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length, None when absent; raises InvalidArgument when malformed or beside chunking."""
    length = chunked = None
    for raw_name, value in headers:
        name = raw_name.lower()
        if name == b"content-length":
            length = value.strip()
        elif name == b"transfer-encoding":
            chunked = value
    if length is None:
        return None
    if chunked is not None:
        raise InvalidArgument("send either Content-Length or Transfer-Encoding, not both")
    if not _DIGITS.match(length):
        raise InvalidArgument("Content-Length must be a non-negative integer of at most 19 digits")
    return int(length)


def _too_large(limit: int, upload: bool, size: int | None = None) -> PayloadTooLarge:
    """``size``: the declared length; None when the body ran past the limit."""
    what = "upload" if upload else "request body"
    told = f"is {size} bytes; the limit is" if size is not None else "exceeds the limit of"
    hint = "" if upload else "; files go to the upload endpoints (code, model artifacts)"
    return PayloadTooLarge(f"{what} {told} {limit} bytes ({format_memory(limit)}){hint}", details={"limit": limit})


class RequestGuard:
    def __init__(self, app: Any, limits: BodyLimits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        try:
            path = signed_path(scope)
            headers = scope.get("headers") or []
            check_headers(headers)
            length = declared_length(headers)
            limit, upload = self.limits.for_request(scope["method"], path[len(scope.get("root_path", "") or "") :])
            if length is not None and length > limit:
                raise _too_large(limit, upload, length)
        except DlcloudError as exc:
            state["rejected_before_auth"] = True
            await _send_error(send, state, exc)
            return
        state["signed_path"] = path
        if scope["path"] != path and not scope.get("root_path"):
            scope["path"] = path  # route on exactly the path that is signed (some servers decode twice)
        body = _Body(limit, upload, length, state)

        async def receive_counted() -> dict:
            if body.refused is not None:
                raise body.refused
            message = await receive()
            if message["type"] == "http.request":
                body.count(len(message.get("body", b"")), message.get("more_body", False))
            return message

        async def send_checked(message: dict) -> None:
            if message["type"] == "http.response.start":
                if body.answered:
                    return
                body.answered = True
                if body.refused is not None:
                    # the app answered a body it could not read (FastAPI makes that a 400): the answer is ours
                    body.replaced = True
                    await _send_error(send, state, body.refused)
                    return
            if not body.replaced:
                await send(message)

        try:
            await self.app(scope, receive_counted, send_checked)
        except DlcloudError as exc:
            if exc is not body.refused or body.answered:
                raise
        if body.refused is not None and not body.answered:  # the app gave up without answering
            body.answered = True
            await _send_error(send, state, body.refused)


class _Body:
    """Counts the body as the app reads it; ``refused`` is set (and raised to the app) past a limit."""

    def __init__(self, limit: int, upload: bool, declared: int | None, state: dict):
        self.limit = limit
        self.upload = upload
        self.declared = declared
        self.state = state
        self.size = 0
        self.refused: DlcloudError | None = None
        self.answered = False  # a response was started
        self.replaced = False  # ... by the guard, in place of the app's

    def count(self, n: int, more: bool) -> None:
        self.size += n
        if self.declared is not None and self.size > self.declared:
            self._refuse(
                InvalidArgument(
                    f"the request body is longer than its Content-Length ({self.declared} bytes); "
                    "send exactly the declared number of bytes"
                )
            )
        elif self.size > self.limit:
            self._refuse(_too_large(self.limit, self.upload))
        elif not more and self.declared is not None and self.size < self.declared:
            self._refuse(
                InvalidArgument(
                    f"the request body ended after {self.size} of the {self.declared} bytes its Content-Length declares"
                )
            )

    def _refuse(self, exc: DlcloudError) -> None:
        self.refused = exc
        if self.state.get("caller") is None:
            self.state["rejected_before_auth"] = True
        raise exc


async def _send_error(send: Send, state: dict, exc: DlcloudError) -> None:
    state["error_code"] = exc.code
    body = json.dumps(exc.to_body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.http_status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
