"""Request signing through the raw HTTP client: every part of the canonical request is covered by the
signature, replays and skewed clocks are refused, and secrets never leave the create response."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import secrets

import pytest
from starlette.testclient import TestClient

from dlcloud import signing
from dlcloud.api.app import create_app
from dlcloud.client import Credentials
from dlcloud.services import auth as auth_service
from dlcloud.store.db import Database
from tests.conftest import SteppedClock, assert_api_error

API = "/api/v1"


def _signed_headers(creds: Credentials, method: str, path: str, query: str = "", body: bytes = b"", **kw) -> dict:
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, method, path, query, hashlib.sha256(body).hexdigest(), **kw
    ).headers
    if body:
        headers["Content-Type"] = "application/json"
    return dict(headers)


def _send(http: TestClient, method: str, path: str, query: str, body: bytes, headers: dict):
    url = path + (f"?{query}" if query else "")
    return http.request(method, url, content=body or None, headers=headers)


def _call(env, creds: Credentials, method: str, path: str, query: str = "", body: bytes = b""):
    return _send(env.http, method, path, query, body, _signed_headers(creds, method, path, query, body))


def _new_key(env, user: str = "admin", tenant: str = "default") -> Credentials:
    key = env.admin.keys.create(user=user, tenant=tenant)
    return Credentials("http://testserver", key.access_key, key.secret_key)


def _user_body(name: str) -> bytes:
    return json.dumps({"name": name, "role": "member"}).encode()


def _user_names(env) -> set[str]:
    return {u.name for u in env.admin.users.list()}


# --- correctly signed requests ---------------------------------------------------------------------------


def test_signed_get_succeeds(env):
    resp = _call(env, env.admin_creds, "GET", f"{API}/whoami")
    assert resp.status_code == 200, resp.text
    assert resp.json()["user"] == "admin"


def test_signed_post_succeeds(env):
    resp = _call(env, env.admin_creds, "POST", f"{API}/users", body=_user_body("signed-post"))
    assert resp.status_code == 201, resp.text
    assert "signed-post" in _user_names(env)


def test_query_parameter_order_does_not_matter(env):
    creds = env.admin_creds
    headers = _signed_headers(creds, "GET", f"{API}/keys", "user=admin&tenant=default")
    resp = _send(env.http, "GET", f"{API}/keys", "tenant=default&user=admin", b"", headers)
    assert resp.status_code == 200, resp.text
    assert [k["user"] for k in resp.json()] == ["admin"]
    headers = _signed_headers(creds, "GET", f"{API}/jobs", "state=RUNNING&state=QUEUED&limit=5")
    resp = _send(env.http, "GET", f"{API}/jobs", "limit=5&state=QUEUED&state=RUNNING", b"", headers)
    assert resp.status_code == 200, resp.text


# --- tampering with each component of the canonical request ----------------------------------------------


def test_tampered_method_is_rejected(env):
    env.admin.jobs.submit({"name": "keep-me", "command": "true"})
    env.admin.jobs.cancel("keep-me")
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/jobs/keep-me")
    resp = _send(env.http, "DELETE", f"{API}/jobs/keep-me", "", b"", headers)
    assert_api_error(resp, 401, "bad_signature")
    assert env.admin.jobs.get("keep-me").state == "CANCELLED"


def test_tampered_path_is_rejected(env):
    env.admin.tenants.create("other")
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/tenants/default")
    resp = _send(env.http, "GET", f"{API}/tenants/other", "", b"", headers)
    assert_api_error(resp, 401, "bad_signature")


def test_tampered_query_is_rejected(env, subtests):
    env.admin.tenants.create("other")
    for case, signed_query, sent_query in [
        ("changed", "tenant=default", "tenant=other"),
        ("added", "", "tenant=default"),
        ("removed", "tenant=default", ""),
        ("repeated", "tenant=default", "tenant=default&tenant=other"),
    ]:
        with subtests.test(case=case):
            headers = _signed_headers(env.admin_creds, "GET", f"{API}/users", signed_query)
            resp = _send(env.http, "GET", f"{API}/users", sent_query, b"", headers)
            assert_api_error(resp, 401, "bad_signature")


def test_tampered_body_is_rejected_with_declared_hash(env):
    headers = _signed_headers(env.admin_creds, "POST", f"{API}/users", body=_user_body("signed-name"))
    resp = _send(env.http, "POST", f"{API}/users", "", _user_body("other-name"), headers)
    err = assert_api_error(resp, 401, "bad_signature")
    assert "does not match the body" in err["message"]
    assert not {"signed-name", "other-name"} & _user_names(env)


def test_tampered_body_is_rejected_without_declared_hash(env):
    headers = _signed_headers(env.admin_creds, "POST", f"{API}/jobs", body=b'{"name": "a", "command": "true"}')
    del headers[signing.HEADER_CONTENT_SHA256]
    resp = _send(env.http, "POST", f"{API}/jobs", "", b'{"name": "b", "command": "true"}', headers)
    assert_api_error(resp, 401, "bad_signature")
    assert env.admin.jobs.list() == []


def test_tampered_header_is_rejected(env, subtests):
    for case, header, replacement in [
        ("timestamp", signing.HEADER_TIMESTAMP, lambda v: str(int(v) - 1)),
        ("nonce", signing.HEADER_NONCE, lambda v: secrets.token_hex(16)),
        ("signature-char", signing.HEADER_SIGNATURE, lambda v: ("0" if v[0] != "0" else "1") + v[1:]),
        ("signature-case", signing.HEADER_SIGNATURE, lambda v: v.upper()),
        ("signature-truncated", signing.HEADER_SIGNATURE, lambda v: v[:-2]),
    ]:
        with subtests.test(case=case):
            headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
            headers[header] = replacement(headers[header])
            resp = _send(env.http, "GET", f"{API}/whoami", "", b"", headers)
            assert_api_error(resp, 401, "bad_signature")


def test_another_valid_key_id_is_a_bad_signature(env):
    other = _new_key(env)
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
    headers[signing.HEADER_KEY] = other.access_key
    assert_api_error(_send(env.http, "GET", f"{API}/whoami", "", b"", headers), 401, "bad_signature")
    # and the right key id signed with the wrong secret
    wrong_secret = Credentials("http://testserver", env.admin_creds.access_key, other.secret_key)
    assert_api_error(_call(env, wrong_secret, "GET", f"{API}/whoami"), 401, "bad_signature")


def test_unknown_key_id_is_rejected(env):
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
    headers[signing.HEADER_KEY] = "AKNOSUCHKEY000000000"
    err = assert_api_error(_send(env.http, "GET", f"{API}/whoami", "", b"", headers), 401, "unknown_access_key")
    assert "AKNOSUCHKEY000000000" in err["message"]


# --- replays and clocks ----------------------------------------------------------------------------------


def test_replayed_request_is_rejected(env):
    body = _user_body("replayed")
    headers = _signed_headers(env.admin_creds, "POST", f"{API}/users", body=body)
    first = _send(env.http, "POST", f"{API}/users", "", body, headers)
    assert first.status_code == 201, first.text
    second = _send(env.http, "POST", f"{API}/users", "", body, headers)
    assert_api_error(second, 401, "replayed_nonce")
    assert sorted(u.name for u in env.admin.users.list() if u.name == "replayed") == ["replayed"]


def test_replay_is_rejected_after_a_restart(env):
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
    assert _send(env.http, "GET", f"{API}/whoami", "", b"", headers).status_code == 200
    # a new process: new engine, new app, same database
    db = Database(env.settings.resolved_database_url)
    try:
        platform = dataclasses.replace(env.platform, db=db)
        with TestClient(create_app(platform), base_url="http://testserver") as http:
            assert_api_error(_send(http, "GET", f"{API}/whoami", "", b"", headers), 401, "replayed_nonce")
            fresh = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
            assert _send(http, "GET", f"{API}/whoami", "", b"", fresh).status_code == 200
    finally:
        db.dispose()


@pytest.fixture
def frozen_server_clock(monkeypatch):
    """The signature check's clock stopped at a whole second: the window's edges are exact, however slow the machine."""
    clock = SteppedClock()
    monkeypatch.setattr(auth_service, "time", clock)
    return int(clock.time())


def test_skewed_timestamp_is_rejected(env, frozen_server_clock, subtests):
    for offset in (-301, 301, -400, 86_400):
        with subtests.test(offset=offset):
            headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami", timestamp=frozen_server_clock + offset)
            err = assert_api_error(_send(env.http, "GET", f"{API}/whoami", "", b"", headers), 401, "clock_skew")
            assert f"{offset} s away from server time" in err["message"]
            assert "at most 300 s allowed" in err["message"]


def test_timestamp_inside_the_window_is_accepted(env, frozen_server_clock, subtests):
    for offset in (-300, -299, 0, 299, 300):
        with subtests.test(offset=offset):
            headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami", timestamp=frozen_server_clock + offset)
            resp = _send(env.http, "GET", f"{API}/whoami", "", b"", headers)
            assert resp.status_code == 200, resp.text


def test_non_integer_timestamp_is_rejected(env):
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
    headers[signing.HEADER_TIMESTAMP] = "yesterday"
    assert_api_error(_send(env.http, "GET", f"{API}/whoami", "", b"", headers), 401, "clock_skew")


# --- key state and missing headers -----------------------------------------------------------------------


def test_disabled_key_is_rejected_until_enabled(env):
    env.admin.users.create("dana")
    creds = _new_key(env, user="dana")
    assert _call(env, creds, "GET", f"{API}/whoami").json()["user"] == "dana"
    env.admin.keys.disable(creds.access_key)
    err = assert_api_error(_call(env, creds, "GET", f"{API}/whoami"), 401, "disabled_access_key")
    assert creds.access_key in err["message"]
    env.admin.keys.enable(creds.access_key)
    resp = _call(env, creds, "GET", f"{API}/whoami")
    assert resp.status_code == 200, resp.text
    assert resp.json()["user"] == "dana"


def test_missing_headers_are_rejected(env, subtests):
    every = [
        signing.HEADER_KEY,
        signing.HEADER_TIMESTAMP,
        signing.HEADER_NONCE,
        signing.HEADER_SIGNATURE,
        signing.HEADER_CONTENT_SHA256,
    ]
    for dropped in [[name] for name in every[:4]] + [every]:
        with subtests.test(dropped=dropped):
            headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
            for name in dropped:
                del headers[name]
            resp = _send(env.http, "GET", f"{API}/whoami", "", b"", headers)
            err = assert_api_error(resp, 401, "missing_signature")
            for name in dropped:
                if name != signing.HEADER_CONTENT_SHA256:
                    assert name in err["message"]


def test_unsigned_post_is_rejected_and_changes_nothing(env):
    resp = env.http.post(f"{API}/users", content=_user_body("unsigned"), headers={"Content-Type": "application/json"})
    assert_api_error(resp, 401, "missing_signature")
    assert "unsigned" not in _user_names(env)


# --- the secret key stays secret -------------------------------------------------------------------------


def test_secret_appears_only_in_the_create_response(env, caplog):
    caplog.set_level(logging.DEBUG)
    env.admin.users.create("sam")
    resp = _call(env, env.admin_creds, "POST", f"{API}/keys", body=json.dumps({"user": "sam"}).encode())
    assert resp.status_code == 201, resp.text
    created = resp.json()
    secret = created["secret_key"]
    assert len(secret) >= 32
    creds = Credentials("http://testserver", created["access_key"], secret)

    seen: list[str] = []
    for c, method, path, query in [
        (creds, "GET", f"{API}/whoami", ""),
        (creds, "GET", f"{API}/keys", ""),
        (env.admin_creds, "GET", f"{API}/keys", ""),
        (env.admin_creds, "GET", f"{API}/keys", "user=sam&tenant=default"),
        (env.admin_creds, "GET", f"{API}/users", ""),
        (env.admin_creds, "GET", f"{API}/audit", "all=true"),
        (env.admin_creds, "GET", f"{API}/audit", ""),
    ]:
        r = _call(env, c, method, path, query)
        assert r.status_code == 200, r.text
        seen.append(r.text)
    # a failing call with the key (a bad signature) and a disable/enable round trip are logged and audited too
    bad = Credentials("http://testserver", creds.access_key, secret[::-1])
    assert_api_error(_call(env, bad, "GET", f"{API}/whoami"), 401, "bad_signature")
    for action in ("disable", "enable"):
        r = _call(env, env.admin_creds, "POST", f"{API}/keys/{creds.access_key}/{action}")
        assert r.status_code == 200, r.text
        seen.append(r.text)
    audit = _call(env, env.admin_creds, "GET", f"{API}/audit", "all=true")
    seen.append(audit.text)

    assert json.loads(seen[0])["user"] == "sam"
    listed = json.loads(seen[1])
    assert [k["access_key"] for k in listed] == [creds.access_key]
    assert all("secret_key" not in k for keys in (listed, json.loads(seen[2])) for k in keys)
    assert any(e["access_key"] == creds.access_key for e in audit.json())
    for text in seen:
        assert secret not in text
    assert caplog.records, "expected log records to be captured"
    assert secret not in caplog.text
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert secret not in repr(record.args)


def test_secret_sent_as_key_id_is_neither_echoed_nor_audited(env):
    """A client that swaps its key and secret must not leak the secret into errors or the audit log."""
    secret = env.admin_creds.secret_key
    headers = _signed_headers(env.admin_creds, "GET", f"{API}/whoami")
    headers[signing.HEADER_KEY] = secret
    err = assert_api_error(_send(env.http, "GET", f"{API}/whoami", "", b"", headers), 401, "unknown_access_key")
    assert secret not in err["message"]
    events = env.admin.accounting.audit(all_tenants=True, limit=1000)
    assert events and all(secret not in str(e) for e in events)
