"""Request-scoped dependencies: the platform handles and the authenticated caller."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Request

from dlcloud import signing
from dlcloud.api.guard import signed_path
from dlcloud.errors import InvalidArgument, Unauthenticated
from dlcloud.services.auth import BatchVerifier, Caller, SignedRequest
from dlcloud.services.metrics import JobToken, read_token
from dlcloud.services.platform import Platform
from dlcloud.services.uploads import Incoming

T = TypeVar("T")


async def get_platform(request: Request) -> Platform:
    # async on purpose: FastAPI runs a plain ``def`` dependency in the thread pool, a thread hop per request
    return request.app.state.platform


async def _authenticate(request: Request, body_sha256: str | None) -> Caller:
    verifier: BatchVerifier = request.app.state.verifier
    signed = SignedRequest(
        method=request.method,
        # the path as sent, decoded once (docs/api-auth.md), checked and kept by the guard (api/guard.py);
        # not request.url.path, which re-parses the decoded path and cuts it at a decoded '?' or '#'
        path=signed_path(request.scope),
        query=request.url.query,
        headers={k.lower(): v for k, v in request.headers.items()},
        body_sha256=body_sha256,
    )
    caller = await verifier.verify(signed)
    request.state.caller = caller
    # counted after authentication, so an unsigned or forged flood spends no key's or tenant's budget
    request.app.state.rate_limits.admit(caller)
    return caller


async def caller(request: Request) -> Caller:
    """The caller of a request whose body is small enough to hash here."""
    body = await request.body()
    return await _authenticate(request, hashlib.sha256(body).hexdigest())


async def streaming_caller(request: Request) -> Caller:
    """The caller of a streamed upload: the declared body hash is signed and checked by the service."""
    return await _authenticate(request, None)


async def job_token(request: Request) -> JobToken:
    """The job attempt of a metrics push (``Authorization: Bearer <DLCLOUD_METRICS_TOKEN>``), the only credential
    that route takes: a signed user request is refused, and no other API route reads a bearer token (``/metrics``
    outside the API reads the scrape token, ``metrics_scrape_token``)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        signed = signing.HEADER_SIGNATURE.lower() in request.headers
        raise Unauthenticated(
            "this endpoint takes only a job's metrics token (Authorization: Bearer $DLCLOUD_METRICS_TOKEN), "
            + ("not a signed user request; users read metrics with GET" if signed else "and none was sent")
        )
    job = read_token(request.app.state.platform, token.strip())
    # its own bucket per job attempt, never its user's or tenant's: a user's flood cannot starve a job's pushes
    request.app.state.rate_limits.admit_job(job.job_id, job.attempt)
    return job


# the dependencies a route declares, by type: ``c: CallerDep, p: PlatformDep`` instead of a ``Depends`` pair each time
CallerDep = Annotated[Caller, Depends(caller)]
StreamingCallerDep = Annotated[Caller, Depends(streaming_caller)]
PlatformDep = Annotated[Platform, Depends(get_platform)]
JobTokenDep = Annotated[JobToken, Depends(job_token)]


async def run_read(platform: Platform, call: Callable[..., T], *args: Any) -> T:
    """Run a short read-only service call for an ``async`` route.

    SQLite (WAL): right here in the event loop. WAL readers never wait for a writer, so the call is CPU
    work that the GIL serialises anyway, and a thread-pool hop costs more than the read: every SQLite
    call in a worker thread hands the GIL back and forth with the busy event loop (measured under load:
    ~60k context switches/s, half of the server's CPU). PostgreSQL: in the thread pool, as a read there
    waits for network round trips.
    """
    if platform.db.is_sqlite:
        return call(*args)
    return await anyio.to_thread.run_sync(call, *args)


def set_audit_resource(request: Request, resource: str) -> None:
    request.state.audit_resource = resource


def incoming(request: Request) -> Incoming:
    """An upload's body as its request brings it: the SHA-256 its client signed and its declared length (400 for
    a Content-Length that is no integer)."""
    length = request.headers.get("content-length")
    try:
        content_length = int(length) if length is not None else None
    except ValueError:
        raise InvalidArgument("Content-Length must be an integer") from None
    return Incoming(request.headers[signing.HEADER_CONTENT_SHA256.lower()], content_length, request.stream())
