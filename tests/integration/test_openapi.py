"""The OpenAPI document tells the truth: declared errors, the error body, the rules the server enforces, 405s
with ``Allow``, one name per path template. The fuzz (``make fuzz``, tests/fuzz) checks it against a real
server; these tests pin each rule down."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from dlcloud import signing
from dlcloud.api.openapi import ERRORS
from dlcloud.schemas.common import NAME_RE
from tests.conftest import assert_api_error, build_env, make_settings

API = "/api/v1"


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("openapi")
    url = f"sqlite:///{tmp / 'dlcloud.db'}"
    from dlcloud.store.db import migrate

    migrate(url)
    env = build_env(make_settings(Path(tmp), url))
    with env.http:
        resp = env.http.get(f"{API}/openapi.json")
    env.platform.db.dispose()
    assert resp.status_code == 200
    return resp.json()


def _operations(document: dict):
    for path, item in document["paths"].items():
        for method, op in item.items():
            yield path, method, op


def test_every_operation_declares_its_errors_with_the_error_schema(document):
    names = set()
    for path, method, op in _operations(document):
        names.add(op["operationId"])
        responses = op["responses"]
        assert "401" in responses, (method, path)  # every /api/v1 call is signed
        for status in ERRORS[op["operationId"]]:
            assert str(status) in responses, (method, path, status)
        for status, response in responses.items():
            if not status.startswith("2"):
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)
    assert names == set(ERRORS), "ERRORS lists exactly the routes"
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    error = schemas["Error"]
    assert error["required"] == ["error"]
    assert set(schemas["ErrorInfo"]["required"]) == {"code", "message", "details"}


def test_every_operation_declares_the_rate_limit_with_retry_after(document):
    for path, method, op in _operations(document):
        response = op["responses"]["429"]  # the rate limits apply to every call (docs/quotas-and-usage.md)
        assert "rate_limited" in response["description"], (method, path)
        assert response["headers"]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}, (method, path)


def test_no_two_paths_are_the_same_template(document):
    templates: dict[str, str] = {}
    for path in document["paths"]:
        shape = re.sub(r"\{[^}]+\}", "{}", path)
        assert shape not in templates, f"{path} and {templates[shape]} are one template with two names"
        templates[shape] = path


def test_the_rules_the_server_enforces_are_in_the_document(document):
    schemas = document["components"]["schemas"]
    assert schemas["TenantCreate"]["properties"]["name"]["pattern"] == NAME_RE.pattern
    # exactly one of command / module / template, upload / from_job
    one_of = {tuple(b["required"]) for b in schemas["JobSpec"]["oneOf"]}
    assert one_of == {("command",), ("module",), ("template",)}
    assert {tuple(b["required"]) for b in schemas["ModelRegister"]["oneOf"]} == {("upload",), ("from_job",)}
    gpus = schemas["QuotaSpec-Input"]["properties"]["gpus"]["anyOf"][0]
    assert gpus == {"type": "integer", "minimum": 0, "maximum": 100_000}
    memory = schemas["Resources"]["properties"]["memory"]["anyOf"]
    assert {m["type"] for m in memory} == {"integer", "string"}  # 4294967296 or "4Gi"

    def param(path: str, method: str, name: str) -> dict:
        [p] = [p for p in document["paths"][path][method]["parameters"] if p["name"] == name]
        return p["schema"]

    assert param(f"{API}/code", "post", "kind")["enum"] == ["archive", "wheel", "sdist"]
    assert param(f"{API}/jobs/{{name}}", "get", "name")["pattern"] == NAME_RE.pattern
    assert param(f"{API}/usage", "get", "since")["anyOf"][0] == {"type": "string", "format": "date-time"}
    assert document["paths"][f"{API}/jobs/{{name}}/logs"]["get"]["responses"]["200"]["content"] == {
        "text/plain": {"schema": {"type": "string"}}
    }


def _send(env, method: str, path: str, content: bytes = b"", query: str = ""):
    creds = env.admin_creds
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, method, unquote(path), query, hashlib.sha256(content).hexdigest()
    ).headers
    url = path + (f"?{query}" if query else "")
    return env.http.request(
        method, url, content=content or None, headers={**headers, "Content-Type": "application/json"}
    )


def test_a_wrong_method_is_405_with_every_allowed_method(env):
    resp = env.http.request("PUT", f"{API}/jobs/train")
    err = assert_api_error(resp, 405, "method_not_allowed", "allowed: DELETE, GET")
    assert resp.headers["allow"] == "DELETE, GET"  # Starlette alone names only the first route's (GET)
    assert err["details"] == {}
    assert env.http.request("DELETE", f"{API}/jobs").headers["allow"] == "GET, POST"


@pytest.mark.parametrize("value", ["0", "1795218536", "1.5", "yesterday"])
def test_time_parameters_refuse_numbers(env, value):
    assert_api_error(_send(env, "GET", f"{API}/usage", query=f"since={value}"), 422, "validation_error", "ISO 8601")


def test_time_parameters_take_iso_times_and_refuse_times_out_of_range(env):
    ok = _send(env, "GET", f"{API}/usage", query="since=2026-11-01T00%3A00%3A00Z")
    assert ok.status_code == 200, ok.text
    assert ok.json()["since"] == "2026-11-01T00:00:00Z"
    far = _send(env, "GET", f"{API}/usage", query="until=9999-12-31T23%3A59%3A59-23%3A59")
    assert_api_error(far, 422, "validation_error", "out of range")


@pytest.mark.parametrize("quota", [{"gpus": True}, {"cpus": False}, {"max_running_jobs": "3"}])
def test_quotas_are_numbers_not_booleans(env, quota):
    body = json.dumps({"name": "strict", "quota": quota}).encode()
    assert_api_error(_send(env, "POST", f"{API}/tenants", body), 422, "validation_error", "must be a number")
    assert "strict" not in {t.name for t in env.admin.tenants.list()}


def test_a_body_that_is_not_utf8_is_a_validation_error(env):
    err = assert_api_error(_send(env, "POST", f"{API}/tenants", b"\xff\xfe\x00"), 422, "validation_error", "JSON")
    assert err["details"]["errors"] == [{"field": "(body)", "problem": "the body is not valid JSON (UTF-8)"}]


# a control character (a%0Ab) is refused before the signature: tests/security/test_http_attacks.py
@pytest.mark.parametrize("raw, decoded", [("a%3Fb", "a?b"), ("a%23b", "a#b")])
def test_a_path_with_an_encoded_question_mark_is_signed_as_decoded(env, raw, decoded):
    # found by the fuzz: the server read the path from request.url, which cut it at a decoded '?' or '#'
    creds = env.admin_creds
    headers = signing.sign_request(creds.access_key, creds.secret_key, "GET", f"{API}/jobs/{decoded}").headers
    assert_api_error(env.http.get(f"{API}/jobs/{raw}", headers=headers), 404, "not_found", "not found")


@pytest.mark.parametrize(
    "path, query, body",
    [
        (f"{API}/models/m", "owner=a%00", None),
        (f"{API}/audit", "action=x%00", None),
        (f"{API}/tenants", "", json.dumps({"name": "t", "quota": {}, "x": "\x00"}).encode()),
        (f"{API}/jobs", "", json.dumps({"name": "n", "command": "echo", "env": {"A": "\x00"}}).encode()),
    ],
)
def test_a_nul_anywhere_is_a_validation_error(env, path, query, body):
    # found by the fuzz on PostgreSQL, which cannot store or compare a NUL: it was a 500 there
    method = "GET" if body is None else "POST"
    resp = _send(env, method, path, body or b"", query)
    assert_api_error(resp, 422, "validation_error", "NUL")


@pytest.mark.parametrize("path", [f"{API}/jobs/a%00b", f"{API}/keys/AK%00/disable"])
def test_a_nul_in_the_path_is_an_invalid_path(env, path):
    # like every control character in a path, before the signature is checked (docs/api-auth.md)
    resp = _send(env, "POST" if path.endswith("disable") else "GET", path, b"", "")
    assert_api_error(resp, 400, "invalid_path", "control characters")
