"""Bad input is refused with a 4xx, a stable error code and a message that names the problem, and
nothing is persisted."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dlcloud import signing
from dlcloud.client import Credentials
from tests.conftest import assert_api_error

API = "/api/v1"


def _post(env, path: str, body: bytes, creds: Credentials | None = None):
    creds = creds or env.admin_creds
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, "POST", path, "", hashlib.sha256(body).hexdigest()
    ).headers
    return env.http.post(path, content=body, headers={**headers, "Content-Type": "application/json"})


_DROP = object()  # an override that removes the field


def _spec(**overrides) -> dict:
    spec: dict = {"name": "train", "command": "python train.py"}
    for key, value in overrides.items():
        if value is _DROP:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


# group -> case -> (spec overrides, status, error code, message fragment)
BAD_SPECS: dict[str, dict] = {
    "fields": {
        "unknown-field": ({"bogus_field": 1}, 422, "validation_error", "bogus_field: unknown field"),
        "unknown-nested-field": ({"resources": {"cpu": 1, "tpus": 2}}, 422, "validation_error", "resources.tpus"),
        "name-missing": ({"name": _DROP}, 422, "validation_error", "name: Field required"),
    },
    "cpu-memory": {
        "cpu-negative": ({"resources": {"cpu": -1}}, 422, "validation_error", "resources.cpu"),
        "cpu-zero": ({"resources": {"cpu": 0}}, 422, "validation_error", "greater than 0"),
        "cpu-absurd": ({"resources": {"cpu": 100000}}, 422, "validation_error", "less than or equal to 1024"),
        "cpu-more-than-host": ({"resources": {"cpu": 100}}, 400, "invalid_spec", "this platform has 8 CPU(s)"),
        "memory-absurd": ({"resources": {"memory": "100Ti"}}, 422, "validation_error", "at most 16Ti"),
        "memory-words": ({"resources": {"memory": "lots"}}, 422, "validation_error", "'lots' is not a quantity"),
        "memory-negative": ({"resources": {"memory": -5}}, 422, "validation_error", "must not be negative"),
        "memory-tiny": ({"resources": {"memory": "1Ki"}}, 422, "validation_error", "at least 16Mi"),
        "memory-more-than-host": ({"resources": {"memory": "1Ti"}}, 400, "invalid_spec", "this platform has 32Gi"),
    },
    "gpus": {
        "gpus-absurd": ({"resources": {"gpus": 65}}, 422, "validation_error", "resources.gpus"),
        "gpus-negative": ({"resources": {"gpus": -1}}, 422, "validation_error", "resources.gpus"),
        "gpus-more-than-inventory": (
            {"resources": {"gpus": 3}},
            400,
            "invalid_spec",
            "resources.gpus is 3 but this platform has 2 matching GPU(s)",
        ),
        "gpu-type-unknown": (
            {"resources": {"gpus": 1, "gpu_type": "A100"}},
            400,
            "invalid_spec",
            "no GPU of type 'A100' exists; GPU types here: NVIDIA H100",
        ),
    },
    "names": {
        "name-uppercase-underscore": ({"name": "Bad_Name"}, 422, "validation_error", "'Bad_Name' is not a valid name"),
        "name-leading-dash": ({"name": "-x"}, 422, "validation_error", "'-x' is not a valid name"),
        "name-64-chars": ({"name": "a" * 64}, 422, "validation_error", "at most 63 characters"),
        "name-empty": ({"name": ""}, 422, "validation_error", "name"),
    },
    "command": {
        "command-and-module": ({"module": "trainer.task"}, 422, "validation_error", "give exactly one of 'command'"),
        "neither-command-nor-module": ({"command": _DROP}, 422, "validation_error", "give exactly one of 'command'"),
        "args-without-module": ({"args": ["--x"]}, 422, "validation_error", "'args' goes with 'module'"),
        "replicas-unknown-group": ({"replicas": {"ps": 2}}, 422, "validation_error", "framework none has no replica"),
        "framework-unknown": ({"framework": "caffe"}, 422, "validation_error", "framework"),
        "environment-unknown": ({"environment": "nope"}, 400, "invalid_spec", "environment 'nope' does not exist"),
        "code-unknown": ({"code": "c-doesnotexist"}, 400, "invalid_spec", "code 'c-doesnotexist' not found"),
    },
    "env": {
        "env-dlcloud-prefix": ({"env": {"DLCLOUD_X": "1"}}, 422, "validation_error", "env DLCLOUD_X is set by dlcloud"),
        "env-cuda-visible-devices": (
            {"env": {"CUDA_VISIBLE_DEVICES": "0"}},
            422,
            "validation_error",
            "env CUDA_VISIBLE_DEVICES is set by dlcloud",
        ),
        "env-bad-key": ({"env": {"1BAD": "x"}}, 422, "validation_error", "env.1BAD"),
    },
    "timeout-priority": {
        "timeout-forever": ({"timeout": "forever"}, 422, "validation_error", "duration 'forever' is not understood"),
        "timeout-zero": ({"timeout": 0}, 422, "validation_error", "duration must be positive"),
        "timeout-too-long": ({"timeout": "31d"}, 422, "validation_error", "at most 30d"),
        "priority-absurd": ({"priority": 5000}, 422, "validation_error", "priority"),
    },
    "types": {
        "type-name-int": ({"name": 123}, 422, "validation_error", "name: Input should be a valid string"),
        "type-cpu-string": ({"resources": {"cpu": "many"}}, 422, "validation_error", "resources.cpu"),
        "type-resources-string": ({"resources": "big"}, 422, "validation_error", "resources"),
        "type-env-list": ({"env": ["A=1"]}, 422, "validation_error", "env: Input should be a valid dictionary"),
        "type-priority-float": ({"priority": 1.5}, 422, "validation_error", "priority"),
        "type-restart-string": ({"restart": {"max_restarts": "x"}}, 422, "validation_error", "restart.max_restarts"),
    },
}


BAD_SPECS["publish"] = {
    "publish-twice": ({"publish": [8888, 8888]}, 422, "validation_error", "publish names port(s) 8888 more than once"),
    "publish-zero": ({"publish": [0]}, 422, "validation_error", "publish.0"),
    "publish-too-many": ({"publish": list(range(9000, 9009))}, 422, "validation_error", "at most 8"),
}


def test_a_job_may_not_publish_the_port_it_reaches_the_api_at(env):
    api_port = urlsplit(env.settings.resolved_job_api_url).port
    resp = _post(env, f"{API}/jobs", json.dumps(_spec(publish=[6006, api_port])).encode())
    assert_api_error(resp, 400, "invalid_spec", f"publish names port {api_port}, where jobs reach the platform's API")
    assert env.admin.jobs.list() == []


@pytest.mark.parametrize("group", list(BAD_SPECS))
def test_bad_job_spec_is_refused_and_nothing_is_stored(env, subtests, group):
    for case, (overrides, status, code, fragment) in BAD_SPECS[group].items():
        with subtests.test(case=case):
            resp = _post(env, f"{API}/jobs", json.dumps(_spec(**overrides)).encode())
            assert_api_error(resp, status, code, fragment)
            assert env.admin.jobs.list() == []


def test_malformed_job_body_is_refused(env, subtests):
    for case, body, fragment in [
        ("truncated", b'{"name": "train", "command": ', "JSON decode error"),
        ("garbage", b"not json at all", "JSON decode error"),
        ("list", b'["name", "train"]', "valid dictionary"),
        ("string", b'"train"', "valid dictionary"),
        ("empty", b"", "Field required"),
    ]:
        with subtests.test(case=case):
            assert_api_error(_post(env, f"{API}/jobs", body), 422, "validation_error", fragment)
            assert env.admin.jobs.list() == []


def test_validation_error_lists_every_problem(env):
    spec = _spec(name="Bad_Name", resources={"cpu": -1, "gpus": 65})
    err = assert_api_error(_post(env, f"{API}/jobs", json.dumps(spec).encode()), 422, "validation_error", "name")
    fields = {p["field"] for p in err["details"]["errors"]}
    assert {"name", "resources.cpu", "resources.gpus"} <= fields
    assert env.admin.jobs.list() == []


def test_gpu_type_that_exists_is_accepted(env):
    # the counterpart of the refused gpu cases: the same shape with a valid type and count goes through
    resp = _post(env, f"{API}/jobs", json.dumps(_spec(resources={"gpus": 2, "gpu_type": "H100"})).encode())
    assert resp.status_code == 201, resp.text
    assert [j.name for j in env.admin.jobs.list()] == ["train"]


def test_duplicate_job_name_is_a_conflict(env):
    first = env.admin.jobs.submit(_spec(command="echo first"))
    resp = _post(env, f"{API}/jobs", json.dumps(_spec(command="echo second")).encode())
    assert_api_error(resp, 409, "already_exists", "job 'train' already exists")
    jobs = env.admin.jobs.list()
    assert [(j.id, j.command) for j in jobs] == [(first.id, "echo first")]


def _tar_gz(path: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("train.py")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"1\n"))
    path.write_bytes(buf.getvalue())
    return path


def test_code_of_another_tenant_is_refused(env, tmp_path):
    other = env.new_tenant_user("other", "olga")
    code = other.code.upload(_tar_gz(tmp_path / "code.tar.gz"))
    resp = _post(env, f"{API}/jobs", json.dumps(_spec(code=code.id)).encode())
    assert_api_error(resp, 400, "invalid_spec", f"code {code.id!r} not found")
    assert env.admin.jobs.list() == []
    assert other.jobs.list() == []


def test_wheel_code_with_command_is_refused(env, tmp_path):
    import zipfile

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
    code = env.admin.code.upload(wheel, kind="wheel")
    resp = _post(env, f"{API}/jobs", json.dumps(_spec(code=code.id)).encode())
    assert_api_error(resp, 400, "invalid_spec", "run a package with 'module:'")
    assert env.admin.jobs.list() == []


# --- tenants, users, keys ----------------------------------------------------------------------------------


BAD_TENANTS = {
    "uppercase": ({"name": "Bad_Tenant"}, "'Bad_Tenant' is not a valid name"),
    "trailing-dash": ({"name": "team-"}, "'team-' is not a valid name"),
    "too-long": ({"name": "t" * 64}, "at most 63 characters"),
    "missing-name": ({}, "name: Field required"),
    "unknown-field": ({"name": "ok-name", "owner": "x"}, "owner: unknown field"),
    "quota-negative-gpus": ({"name": "ok-name", "quota": {"gpus": -1}}, "quota.gpus"),
    "quota-memory-words": ({"name": "ok-name", "quota": {"memory": "lots"}}, "is not a quantity"),
    "quota-unknown": ({"name": "ok-name", "quota": {"tpus": 1}}, "quota.tpus: unknown field"),
    "quota-type": ({"name": "ok-name", "quota": {"max_running_jobs": "ten"}}, "quota.max_running_jobs"),
}


def test_bad_tenant_is_refused(env, subtests):
    for case, (body, fragment) in BAD_TENANTS.items():
        with subtests.test(case=case):
            assert_api_error(_post(env, f"{API}/tenants", json.dumps(body).encode()), 422, "validation_error", fragment)
            assert [t.name for t in env.admin.tenants.list()] == ["default"]


def test_duplicate_tenant_is_a_conflict(env):
    created = env.admin.tenants.create("team", {"gpus": 1})
    resp = _post(env, f"{API}/tenants", json.dumps({"name": "team", "quota": {"gpus": 2}}).encode())
    assert_api_error(resp, 409, "already_exists", "tenant 'team' already exists")
    tenant = env.admin.tenants.get("team")
    assert tenant.id == created.id
    assert tenant.quota.gpus == 1


BAD_USERS = {
    "uppercase": ({"name": "Bob"}, 422, "validation_error", "'Bob' is not a valid name"),
    "space": ({"name": "bob smith"}, 422, "validation_error", "is not a valid name"),
    "too-long": ({"name": "u" * 64}, 422, "validation_error", "at most 63 characters"),
    "bad-role": ({"name": "bob", "role": "god"}, 422, "validation_error", "role"),
    "role-type": ({"name": "bob", "role": 1}, 422, "validation_error", "role"),
    "bad-tenant-name": ({"name": "bob", "tenant": "No_Such"}, 422, "validation_error", "tenant"),
    "unknown-tenant": ({"name": "bob", "tenant": "nowhere"}, 404, "not_found", "tenant 'nowhere' not found"),
    "unknown-field": ({"name": "bob", "password": "x"}, 422, "validation_error", "password: unknown field"),
}


def test_bad_user_is_refused(env, subtests):
    for case, (body, status, code, fragment) in BAD_USERS.items():
        with subtests.test(case=case):
            assert_api_error(_post(env, f"{API}/users", json.dumps(body).encode()), status, code, fragment)
            assert [u.name for u in env.admin.users.list()] == ["admin"]


def test_duplicate_user_is_a_conflict(env):
    env.admin.users.create("bob", role="member")
    resp = _post(env, f"{API}/users", json.dumps({"name": "bob", "role": "tenant-admin"}).encode())
    assert_api_error(resp, 409, "already_exists", "user 'bob' already exists in tenant 'default'")
    assert [(u.name, u.role) for u in env.admin.users.list() if u.name == "bob"] == [("bob", "member")]


def test_tenant_admin_cannot_create_a_platform_admin(env):
    team_admin = env.new_tenant_user("team", "tara", role="tenant-admin")
    creds = team_admin.transport.creds
    resp = _post(env, f"{API}/users", json.dumps({"name": "eve", "role": "platform-admin"}).encode(), creds)
    assert_api_error(resp, 403, "permission_denied", "only a platform admin can create platform admins")
    assert [u.name for u in team_admin.users.list()] == ["tara"]


def test_bad_key_request_is_refused(env, subtests):
    before = [k.access_key for k in env.admin.keys.list()]
    for case, body, status, code, fragment in [
        ("unknown-user", {"user": "nobody"}, 404, "not_found", "user 'nobody' not found"),
        ("bad-name", {"user": "Bad_User"}, 422, "validation_error", "is not a valid name"),
        ("own-secret", {"secret_key": "mine"}, 422, "validation_error", "secret_key: unknown field"),
        ("unknown-tenant", {"user": "admin", "tenant": "nowhere"}, 404, "not_found", "tenant 'nowhere' not found"),
    ]:
        with subtests.test(case=case):
            assert_api_error(_post(env, f"{API}/keys", json.dumps(body).encode()), status, code, fragment)
            assert [k.access_key for k in env.admin.keys.list()] == before


def test_bad_query_parameters_are_refused(env, subtests):
    creds = env.admin_creds
    for query, fragment in [
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("state=DONE", "state"),
        ("offset=-1", "offset"),
    ]:
        with subtests.test(query=query):
            headers = signing.sign_request(creds.access_key, creds.secret_key, "GET", f"{API}/jobs", query).headers
            resp = env.http.get(f"{API}/jobs?{query}", headers=headers)
            assert_api_error(resp, 422, "validation_error", fragment)
