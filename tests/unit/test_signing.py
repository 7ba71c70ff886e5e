"""The canonical request: every component is signed; query order and encoding are canonical."""

from __future__ import annotations

import hashlib

import pytest

from dlcloud import signing

BASE = {
    "method": "POST",
    "path": "/api/v1/jobs",
    "query": "b=2&a=1",
    "body_sha256": hashlib.sha256(b"{}").hexdigest(),
    "timestamp": "1700000000",
    "nonce": "n" * 32,
    "access_key": "AKTEST",
}


def _sig(**changes: str) -> str:
    parts = {**BASE, **changes}
    return signing.sign("secret", signing.canonical_request(**parts))


def test_canonical_request_layout():
    text = signing.canonical_request(**BASE)
    assert text.split("\n") == [
        "DLCLOUD-HMAC-SHA256",
        "POST",
        "/api/v1/jobs",
        "a=1&b=2",
        BASE["body_sha256"],
        "1700000000",
        "n" * 32,
        "AKTEST",
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"method": "GET"},
        {"path": "/api/v1/jobs/x"},
        {"query": "a=1&b=3"},
        {"query": "a=1"},
        {"query": "a=1&b=2&c=3"},
        {"body_sha256": signing.EMPTY_SHA256},
        {"timestamp": "1700000001"},
        {"nonce": "m" * 32},
        {"access_key": "AKOTHER"},
    ],
)
def test_every_component_changes_the_signature(change):
    assert _sig(**change) != _sig()


def test_query_order_and_encoding_are_canonical():
    assert signing.canonical_query("b=2&a=1&a=0") == "a=0&a=1&b=2"
    assert signing.canonical_query("q=a+b&r=a%20b") == "q=a%20b&r=a%20b"
    assert signing.canonical_query("x=%7E-_.") == "x=~-_."
    assert signing.canonical_query("") == ""


def test_sign_request_headers_verify():
    signed = signing.sign_request("AK1", "sk", "GET", "/api/v1/whoami", timestamp=1700000000, nonce="abc" * 6)
    h = signed.headers
    assert h[signing.HEADER_KEY] == "AK1"
    assert h[signing.HEADER_CONTENT_SHA256] == signing.EMPTY_SHA256
    assert signing.signatures_equal(h[signing.HEADER_SIGNATURE], signing.sign("sk", signed.canonical))
    assert not signing.signatures_equal(h[signing.HEADER_SIGNATURE], signing.sign("other", signed.canonical))
