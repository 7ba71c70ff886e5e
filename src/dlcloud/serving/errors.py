"""Errors the model server answers with. The protocol layer renders them as ``{"error": message}``."""

from __future__ import annotations


class ServingError(Exception):
    """An error with the HTTP status the client gets. Messages say what was wrong and what is allowed."""

    status = 500

    def __init__(self, message: str, *, status: int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.headers = headers or {}


class BadRequest(ServingError):
    status = 400


class NotFound(ServingError):
    status = 404


class PayloadTooLarge(ServingError):
    status = 413


class Unavailable(ServingError):
    """The model or version is not ready (loading, unloading, failed)."""

    status = 503


class Overloaded(ServingError):
    """The batch queue is full: 429 with Retry-After (seconds)."""

    status = 429

    def __init__(self, message: str, *, retry_after: float = 1.0):
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after)))})
        self.retry_after = retry_after


class Timeout(ServingError):
    """The request's own deadline passed before its batch ran."""

    status = 504


class InferenceFailed(ServingError):
    """The model raised while computing a batch; only the requests of that batch fail."""

    status = 500
