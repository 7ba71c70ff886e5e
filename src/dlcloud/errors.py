"""One error base and one table from error code to HTTP status.

Every error a user can see is a ``DlcloudError`` with a stable ``code``. The API turns it into
``{"error": {"code", "message", "details"}}`` with the status from ``HTTP_STATUS``; the SDK turns that
body back into the same class. Nothing here imports other dlcloud modules.
"""

from __future__ import annotations

from typing import Any

HTTP_STATUS: dict[str, int] = {
    "invalid_argument": 400,
    "invalid_spec": 400,
    "invalid_archive": 400,
    "checksum_mismatch": 400,
    "invalid_signature": 400,
    "unknown_format": 400,
    "duplicate_header": 400,
    "invalid_path": 400,
    "priority_not_allowed": 400,
    "validation_error": 422,
    "unauthenticated": 401,
    "missing_signature": 401,
    "unknown_access_key": 401,
    "disabled_access_key": 401,
    "bad_signature": 401,
    "clock_skew": 401,
    "replayed_nonce": 401,
    "invalid_token": 401,
    "permission_denied": 403,
    "untrusted_code": 403,
    "isolation_unavailable": 403,
    "source_not_allowed": 403,
    "not_found": 404,
    "model_not_found": 404,
    "model_version_not_found": 404,
    "dataset_not_found": 404,
    "dataset_version_not_found": 404,
    "already_exists": 409,
    "conflict": 409,
    "invalid_state": 409,
    "model_deployed": 409,
    "inputs_unavailable": 409,
    "dataset_in_use": 409,
    "dataset_version_not_ready": 409,
    "payload_too_large": 413,
    "outputs_too_large": 413,
    "quota_exceeded": 429,
    "rate_limited": 429,
    "unavailable": 503,
    "storage_unavailable": 503,
    "object_missing": 500,
    "object_damaged": 500,
    "cache_full": 507,
    "not_configured": 400,
    "internal": 500,
}


class DlcloudError(Exception):
    """Base of every user-facing error."""

    code = "internal"

    def __init__(self, message: str, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details or {}

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def __str__(self) -> str:
        return self.message


class InvalidArgument(DlcloudError):
    code = "invalid_argument"


class InvalidSpec(DlcloudError):
    code = "invalid_spec"


class InvalidArchive(DlcloudError):
    code = "invalid_archive"


class PriorityNotAllowed(InvalidSpec):
    """A job's priority (its class's or its own) outside its tenant's allowed range, or an unknown class."""

    code = "priority_not_allowed"


class NotFound(DlcloudError):
    code = "not_found"


class AlreadyExists(DlcloudError):
    code = "already_exists"


class InvalidState(DlcloudError):
    code = "invalid_state"


class PermissionDenied(DlcloudError):
    code = "permission_denied"


class Unauthenticated(DlcloudError):
    code = "unauthenticated"


class InvalidToken(Unauthenticated):
    """A job's metrics token that is not valid for the request, or whose attempt ended (docs/metrics.md)."""

    code = "invalid_token"


class PayloadTooLarge(DlcloudError):
    code = "payload_too_large"


class QuotaExceeded(DlcloudError):
    code = "quota_exceeded"


class RateLimited(DlcloudError):
    """Too many requests of one access key, tenant or job attempt (docs/quotas-and-usage.md#request-rate-limits).

    The API answers it with ``Retry-After``: ``details["retry_after_seconds"]``, whole seconds."""

    code = "rate_limited"

    @property
    def retry_after(self) -> int:
        """Seconds to wait before the request can be admitted (at least 1)."""
        value = self.details.get("retry_after_seconds")
        return max(1, int(value)) if isinstance(value, int | float) else 1


class Unavailable(DlcloudError):
    code = "unavailable"


class ModelNotFound(NotFound):
    code = "model_not_found"


class ModelVersionNotFound(NotFound):
    code = "model_version_not_found"


class ModelDeployed(InvalidState):
    """A model version cannot be deleted while a deployment lease on it is live."""

    code = "model_deployed"


class UntrustedCode(PermissionDenied):
    """Serving another tenant's model whose format runs code, without trusting it (``--trust-code``)."""

    code = "untrusted_code"


class InvalidSignature(InvalidArgument):
    code = "invalid_signature"


class UnknownFormat(InvalidArgument):
    code = "unknown_format"


class DuplicateHeader(InvalidArgument):
    """A header that must appear once (signature, length, type, host) appeared more than once."""

    code = "duplicate_header"


class InvalidPath(InvalidArgument):
    """A request path with control characters, a bad escape or bytes that are not UTF-8."""

    code = "invalid_path"


class DatasetNotFound(NotFound):
    code = "dataset_not_found"


class DatasetVersionNotFound(NotFound):
    code = "dataset_version_not_found"


class DatasetInUse(InvalidState):
    code = "dataset_in_use"


class DatasetVersionNotReady(InvalidState):
    """A dataset version registered in place whose manifest is still being computed, or failed."""

    code = "dataset_version_not_ready"


class InputsUnavailable(DlcloudError):
    """A workload's code, dataset or checkpoints are missing from the server's storage or do not hold what it
    names: the attempt can never start as it is (it ends with ``LAUNCH_FAILED`` and this message, which names no
    storage key). 409: trying again does not help; the inputs must be pushed again (or the job submitted anew)."""

    code = "inputs_unavailable"


class OutputsTooLarge(DlcloudError):
    """A job's outputs over the limits of what is saved (files, bytes): nothing of them is saved."""

    code = "outputs_too_large"


class SourceNotAllowed(PermissionDenied):
    """A dataset source (``s3://bucket/prefix``) outside the admin's allow-list, or the platform's own store."""

    code = "source_not_allowed"


_BY_CODE: dict[str, type[DlcloudError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        InvalidSpec,
        PriorityNotAllowed,
        InvalidArchive,
        NotFound,
        AlreadyExists,
        InvalidState,
        PermissionDenied,
        Unauthenticated,
        InvalidToken,
        PayloadTooLarge,
        QuotaExceeded,
        RateLimited,
        Unavailable,
        ModelNotFound,
        DatasetNotFound,
        DatasetVersionNotFound,
        DatasetInUse,
        DatasetVersionNotReady,
        SourceNotAllowed,
        ModelVersionNotFound,
        ModelDeployed,
        UntrustedCode,
        InvalidSignature,
        UnknownFormat,
        DuplicateHeader,
        InvalidPath,
        InputsUnavailable,
        OutputsTooLarge,
    )
}


def error_from_body(status: int, body: Any) -> DlcloudError:
    """Rebuild the error the server raised from its JSON body (used by the SDK)."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        code = err["code"]
        message = str(err.get("message", ""))
        details = err.get("details") if isinstance(err.get("details"), dict) else {}
        cls = _BY_CODE.get(code)
        if cls is None:
            cls = Unauthenticated if HTTP_STATUS.get(code) == 401 else DlcloudError
        return cls(message, code=code, details=details)
    return DlcloudError(f"server answered HTTP {status}: {str(body)[:500]}", code="internal")
