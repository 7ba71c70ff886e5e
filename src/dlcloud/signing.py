"""The canonical request and its HMAC-SHA256 signature, shared by the SDK and the API.

Pure standard library so the SDK, the server and a user's own scripts compute exactly the same bytes.
The canonical request is these lines joined by ``\\n`` (no trailing newline)::

    DLCLOUD-HMAC-SHA256
    <METHOD, upper case>
    <URL path, percent-decoded, UTF-8>
    <query: name=value pairs percent-encoded (RFC 3986 unreserved kept), sorted by name then value, joined by &>
    <hex SHA-256 of the body; of the empty string when there is none>
    <timestamp: integer Unix seconds>
    <nonce>
    <access key id>

signature = hex(HMAC-SHA256(secret_key, canonical_request)). See docs/api-auth.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote

ALGORITHM = "DLCLOUD-HMAC-SHA256"
HEADER_KEY = "X-Dlcloud-Access-Key"
HEADER_TIMESTAMP = "X-Dlcloud-Timestamp"
HEADER_NONCE = "X-Dlcloud-Nonce"
HEADER_CONTENT_SHA256 = "X-Dlcloud-Content-Sha256"
HEADER_SIGNATURE = "X-Dlcloud-Signature"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def canonical_query(query: str) -> str:
    """Sort and re-encode a raw query string (``a=1&b=x%20y``)."""
    pairs = parse_qsl(query, keep_blank_values=True)
    pairs.sort()
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in pairs)


def canonical_request(
    method: str, path: str, query: str, body_sha256: str, timestamp: str, nonce: str, access_key: str
) -> str:
    return "\n".join(
        [ALGORITHM, method.upper(), path, canonical_query(query), body_sha256, timestamp, nonce, access_key]
    )


def sign(secret_key: str, canonical: str) -> str:
    return hmac.new(secret_key.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def signatures_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True)
class SignedHeaders:
    headers: dict[str, str]
    canonical: str


def sign_request(
    access_key: str,
    secret_key: str,
    method: str,
    path: str,
    query: str = "",
    body_sha256: str = EMPTY_SHA256,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> SignedHeaders:
    """Headers that authenticate one request. ``body_sha256`` may be declared for streamed bodies."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or secrets.token_hex(16)
    canonical = canonical_request(method, path, query, body_sha256, ts, nonce, access_key)
    return SignedHeaders(
        headers={
            HEADER_KEY: access_key,
            HEADER_TIMESTAMP: ts,
            HEADER_NONCE: nonce,
            HEADER_CONTENT_SHA256: body_sha256,
            HEADER_SIGNATURE: sign(secret_key, canonical),
        },
        canonical=canonical,
    )
