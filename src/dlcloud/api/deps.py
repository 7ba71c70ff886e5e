"""Request-scoped dependencies: the platform handles and the authenticated caller."""

from __future__ import annotations

import hashlib

from fastapi import Request

from dlcloud.services.auth import BatchVerifier, Caller, SignedRequest
from dlcloud.services.platform import Platform


async def get_platform(request: Request) -> Platform:
    # async on purpose: FastAPI runs a plain ``def`` dependency in the thread pool, a thread hop per request
    return request.app.state.platform


async def _authenticate(request: Request, body_sha256: str | None) -> Caller:
    verifier: BatchVerifier = request.app.state.verifier
    signed = SignedRequest(
        method=request.method,
        path=request.url.path,
        query=request.url.query,
        headers={k.lower(): v for k, v in request.headers.items()},
        body_sha256=body_sha256,
    )
    caller = await verifier.verify(signed)
    request.state.caller = caller
    return caller


async def caller(request: Request) -> Caller:
    """The caller of a request whose body is small enough to hash here."""
    body = await request.body()
    return await _authenticate(request, hashlib.sha256(body).hexdigest())


async def streaming_caller(request: Request) -> Caller:
    """The caller of a streamed upload: the declared body hash is signed and checked by the service."""
    return await _authenticate(request, None)


def set_audit_resource(request: Request, resource: str) -> None:
    request.state.audit_resource = resource
