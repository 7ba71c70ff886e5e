"""Who is calling: request-signature verification, replay protection and roles.

Verification order (each failure is a 401 with its own code): headers present (missing_signature),
timestamp within the skew window (clock_skew), key known (unknown_access_key) and enabled
(disabled_access_key), signature equal in constant time (bad_signature), nonce not seen in the window
(replayed_nonce; nonces live in the database so the check holds across restarts and API replicas).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, insert
from sqlalchemy.exc import IntegrityError

from dlcloud import signing
from dlcloud.errors import DlcloudError, PermissionDenied
from dlcloud.schemas.users import Role
from dlcloud.services.secrets import SecretBox
from dlcloud.store import tenants as tenant_store
from dlcloud.store.db import Database
from dlcloud.store.models import NonceRow, utcnow

NONCE_RE = re.compile(r"^[A-Za-z0-9_\-]{16,128}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_INSERT_NONCE = insert(NonceRow.__table__)


@dataclass(frozen=True)
class Caller:
    """The authenticated principal of one request."""

    tenant_id: str
    tenant: str
    user_id: str
    user: str
    role: Role
    access_key: str

    @property
    def is_platform_admin(self) -> bool:
        return self.role == Role.PLATFORM_ADMIN

    @property
    def is_tenant_admin(self) -> bool:
        return self.role in (Role.PLATFORM_ADMIN, Role.TENANT_ADMIN)

    def require_platform_admin(self, what: str) -> None:
        if not self.is_platform_admin:
            raise PermissionDenied(f"{what} needs the platform-admin role; you are {self.role.value}")

    def require_tenant_admin(self, what: str) -> None:
        if not self.is_tenant_admin:
            raise PermissionDenied(f"{what} needs the tenant-admin or platform-admin role; you are {self.role.value}")


class AuthError(DlcloudError):
    """A 401; ``access_key`` is kept for the audit log when one was given."""

    def __init__(self, message: str, code: str, access_key: str | None = None):
        super().__init__(message, code=code)
        self.access_key = access_key


@dataclass(frozen=True)
class SignedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names
    body_sha256: str | None  # computed by the server; None when the body is streamed (declared hash used)


def verify(db: Database, box: SecretBox, skew_seconds: int, req: SignedRequest) -> Caller:
    h = req.headers
    key_id = h.get(signing.HEADER_KEY.lower())
    ts = h.get(signing.HEADER_TIMESTAMP.lower())
    nonce = h.get(signing.HEADER_NONCE.lower())
    sig = h.get(signing.HEADER_SIGNATURE.lower())
    declared = h.get(signing.HEADER_CONTENT_SHA256.lower())
    missing = [
        name
        for name, value in (
            (signing.HEADER_KEY, key_id),
            (signing.HEADER_TIMESTAMP, ts),
            (signing.HEADER_NONCE, nonce),
            (signing.HEADER_SIGNATURE, sig),
        )
        if not value
    ]
    if missing:
        raise AuthError(
            f"request is not signed: missing header(s) {', '.join(missing)}; see docs/api-auth.md",
            "missing_signature",
            key_id,
        )
    assert key_id and ts and nonce and sig
    if len(key_id) > 40:
        raise AuthError("access key id is too long", "unknown_access_key")
    if not NONCE_RE.match(nonce):
        raise AuthError("nonce must be 16-128 characters of A-Z a-z 0-9 _ -", "bad_signature", key_id)
    try:
        ts_int = int(ts)
    except ValueError:
        raise AuthError(f"{signing.HEADER_TIMESTAMP} must be integer Unix seconds", "clock_skew", key_id) from None
    now = time.time()
    if abs(now - ts_int) > skew_seconds:
        raise AuthError(
            f"request timestamp is {int(ts_int - now)} s away from server time; at most {skew_seconds} s allowed",
            "clock_skew",
            key_id,
        )
    body_hash = req.body_sha256
    if body_hash is None:
        if not declared or not SHA256_RE.match(declared):
            raise AuthError(
                f"streamed uploads must declare {signing.HEADER_CONTENT_SHA256} (hex SHA-256 of the body)",
                "bad_signature",
                key_id,
            )
        body_hash = declared
    elif declared is not None and declared != body_hash:
        raise AuthError(f"{signing.HEADER_CONTENT_SHA256} does not match the body", "bad_signature", key_id)
    canonical = signing.canonical_request(req.method, req.path, req.query, body_hash, ts, nonce, key_id)

    # Core, not the ORM: this runs on every request. The key is read in the same write transaction that
    # records the nonce, so a key disabled before the commit can no longer authenticate anything.
    with db.write_connection() as conn:
        key = tenant_store.get_key_owner(conn, key_id)
        if key is None:
            raise AuthError(f"unknown access key {key_id}", "unknown_access_key", key_id)
        if not key.enabled:
            raise AuthError(f"access key {key_id} is disabled", "disabled_access_key", key_id)
        expected = signing.sign(box.decrypt(key.secret_encrypted), canonical)
        if not signing.signatures_equal(expected, sig):
            raise AuthError(
                "signature does not match the request; check the secret key and the canonical request "
                "(docs/api-auth.md)",
                "bad_signature",
                key_id,
            )
        caller = Caller(key.tenant_id, key.tenant, key.user_id, key.user, Role(key.role), key_id)
        try:
            conn.execute(_INSERT_NONCE, {"access_key": key_id, "nonce": nonce, "seen_at": utcnow()})
        except IntegrityError:
            raise AuthError("nonce was already used: replayed request", "replayed_nonce", key_id) from None
    return caller


def purge_nonces(db: Database, skew_seconds: int) -> int:
    """Forget nonces older than twice the skew window (timestamps that old are rejected anyway)."""
    cutoff = utcnow() - timedelta(seconds=2 * skew_seconds)
    with db.write() as s:
        result = s.execute(delete(NonceRow).where(NonceRow.seen_at < cutoff))
        return int(getattr(result, "rowcount", 0) or 0)
