"""The canonical request and its HMAC-SHA256 signature, shared by the SDK and the API.

Pure standard library so the SDK, the server and a user's own scripts compute exactly the same bytes.
The canonical request is these lines joined by ``\\n`` (no trailing newline)::

    DLCLOUD-HMAC-SHA256
    <METHOD, upper case>
    <URL path as sent, each %XX decoded once, read as UTF-8 (``canonical_path``)>
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
import re
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote_to_bytes

ALGORITHM = "DLCLOUD-HMAC-SHA256"
HEADER_KEY = "X-Dlcloud-Access-Key"
HEADER_TIMESTAMP = "X-Dlcloud-Timestamp"
HEADER_NONCE = "X-Dlcloud-Nonce"
HEADER_CONTENT_SHA256 = "X-Dlcloud-Content-Sha256"
HEADER_SIGNATURE = "X-Dlcloud-Signature"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# what a path may not contain, raw or percent-encoded: control characters (a decoded line feed would let one
# signature stand for two requests, the canonical request being lines), and '%' not starting an escape
_PATH_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_RAW_PATH = re.compile(rb"^(?:[\x21-\x24\x26-\x7e]|%[0-9A-Fa-f]{2})*$")  # printable ASCII, '%' only in %XX


class PathNotAllowed(ValueError):
    """A request path that is refused before its signature is checked; the message says why."""


def canonical_path(raw_path: bytes | str) -> str:
    """The path line of the canonical request, from the path exactly as sent (the request target up to '?').

    Each ``%XX`` is decoded once and the bytes are read as UTF-8: ``/api/v1/jobs/a%3Fb`` signs as
    ``/api/v1/jobs/a?b``. Raises ``PathNotAllowed`` for what no request may carry: control characters
    (%00-%1F, %7F) raw or percent-encoded, spaces or other bytes outside printable ASCII sent raw, a '%'
    that does not start a two-digit hex escape, and escapes that do not decode to UTF-8.
    """
    raw = raw_path.encode("latin-1") if isinstance(raw_path, str) else raw_path
    if _PATH_CONTROL.search(raw.decode("latin-1")):
        raise PathNotAllowed("the path may not contain control characters (%00-%1F, %7F), raw or percent-encoded")
    if not _RAW_PATH.match(raw):
        raise PathNotAllowed(
            "the path may contain only printable ASCII characters, with '%' only in %XX escapes; "
            "percent-encode anything else (spaces as %20)"
        )
    try:
        path = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise PathNotAllowed("the path does not decode to UTF-8: its %XX escapes must encode UTF-8 text") from None
    if _PATH_CONTROL.search(path):
        raise PathNotAllowed("the path may not contain control characters (%00-%1F, %7F), raw or percent-encoded")
    return path


def url_path(path: str) -> str:
    """The path to send for a decoded ``path``: every byte but ``/`` and RFC 3986 unreserved characters
    percent-encoded, so that ``canonical_path(url_path(p)) == p`` and no client library reinterprets it
    (a '?' or '#' in a name would otherwise start the query or the fragment)."""
    return quote(path, safe="/")


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
