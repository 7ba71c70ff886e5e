"""Tenant isolation: another tenant's objects are 'not found' (never 'forbidden') on every scoped endpoint
and never appear in a list; roles gate user creation and the audit log."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from dlcloud import signing
from dlcloud.client import Client, Credentials
from dlcloud.errors import DlcloudError

API = "/api/v1"


@dataclass
class World:
    env: object
    a_member: Client
    a_admin: Client
    b_member: Client
    b_admin: Client
    job_id: str
    code_id: str
    key_id: str


def _tar_gz(path: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"print('hello from tenant a')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture
def world(env, tmp_path) -> World:
    def user(tenant: str, name: str, role: str) -> Client:
        env.admin.users.create(name, tenant=tenant, role=role)
        key = env.admin.keys.create(user=name, tenant=tenant)
        return env.client(Credentials("http://testserver", key.access_key, key.secret_key))

    env.admin.tenants.create("tenant-a")
    env.admin.tenants.create("tenant-b")
    a_member = user("tenant-a", "alice", "member")
    a_admin = user("tenant-a", "anna", "tenant-admin")
    b_member = user("tenant-b", "bob", "member")
    b_admin = user("tenant-b", "bella", "tenant-admin")
    job = a_member.jobs.submit({"name": "a-job", "command": "echo a"})
    assert job.state == "QUEUED"
    code = a_member.code.upload(_tar_gz(tmp_path / "a-code.tar.gz"))
    key = a_member.keys.create()
    return World(env, a_member, a_admin, b_member, b_admin, job.id, code.id, key.access_key)


def _raw(client: Client, method: str, path: str, query: str = ""):
    """A signed request through the SDK's transport, returning the raw response (status and body)."""
    creds = client.transport.creds
    headers = signing.sign_request(creds.access_key, creds.secret_key, method, path, query).headers
    return client.transport._http.request(method, path + (f"?{query}" if query else ""), headers=headers)


# (method, path template, query template); {job}, {job_id}, {code}, {key}, {tenant} are tenant A's objects
SCOPED_ENDPOINTS = [
    ("GET", "/jobs/{job}", ""),
    ("GET", "/jobs/{job_id}", ""),
    ("GET", "/jobs/{job}/logs", ""),
    ("POST", "/jobs/{job}/cancel", ""),
    ("DELETE", "/jobs/{job}", ""),
    ("GET", "/code/{code}", ""),
    ("POST", "/keys/{key}/disable", ""),
    ("POST", "/keys/{key}/enable", ""),
    ("DELETE", "/keys/{key}", ""),
    ("GET", "/tenants/{tenant}", ""),
    ("GET", "/quota", "tenant={tenant}"),
    ("GET", "/users", "tenant={tenant}"),
    ("GET", "/keys", "tenant={tenant}"),
    ("GET", "/usage", "tenant={tenant}"),
]


@pytest.mark.parametrize(
    ("method", "path", "query"), SCOPED_ENDPOINTS, ids=[f"{m} {p}?{q}" for m, p, q in SCOPED_ENDPOINTS]
)
def test_other_tenants_objects_are_not_found(world, method, path, query):
    values = {"job": "a-job", "job_id": world.job_id, "code": world.code_id, "key": world.key_id, "tenant": "tenant-a"}
    for caller in (world.b_member, world.b_admin):  # both roles of tenant B
        resp = _raw(caller, method, API + path.format(**values), query.format(**values))
        assert resp.status_code == 404, resp.text
        err = resp.json()["error"]
        assert err["code"] == "not_found"
        assert "tenant-b" not in err["message"]
    # nothing changed on tenant A's side
    job = world.a_member.jobs.get("a-job")
    assert job.state == "QUEUED"
    keys = {k.access_key: k for k in world.a_member.keys.list()}
    assert keys[world.key_id].enabled is True
    assert world.a_member.transport.request("GET", f"{API}/code/{world.code_id}")["id"] == world.code_id


def test_the_owning_tenant_does_see_its_objects(world):
    # the same calls succeed for tenant A, so the 404s above are about tenancy, not about bad ids
    assert world.a_member.jobs.get(world.job_id).name == "a-job"
    assert world.a_admin.tenants.get("tenant-a").name == "tenant-a"
    assert world.a_admin.accounting.quota("tenant-a").tenant == "tenant-a"
    assert {u.name for u in world.a_admin.users.list("tenant-a")} == {"alice", "anna"}
    assert world.key_id in {k.access_key for k in world.a_admin.keys.list(tenant="tenant-a")}
    # and the platform admin reaches other tenants by name
    admin = world.env.admin
    assert admin.tenants.get("tenant-a").name == "tenant-a"
    assert {u.name for u in admin.users.list("tenant-a")} == {"alice", "anna"}
    assert {t.name for t in admin.tenants.list()} >= {"default", "tenant-a", "tenant-b"}


def test_lists_never_show_other_tenants_objects(world, subtests):
    for role, caller in (("member", world.b_member), ("tenant-admin", world.b_admin)):
        with subtests.test(role=role):
            _assert_lists_are_clean(world, role, caller)


def _assert_lists_are_clean(world: World, role: str, caller: Client) -> None:
    a_strings = ["a-job", world.job_id, world.code_id, world.key_id, "tenant-a", "alice", "anna"]

    jobs = caller.jobs.list()
    keys = caller.keys.list()
    users = caller.users.list()
    tenants = caller.tenants.list()
    assert jobs == []
    assert keys and {k.tenant for k in keys} == {"tenant-b"}
    assert {u.name for u in users} == {"bob", "bella"}
    assert [t.name for t in tenants] == ["tenant-b"]
    listings = [jobs, keys, users, tenants]
    if role == "tenant-admin":
        # both tenants produce audit events; B must see only its own
        world.a_admin.users.create("anton")
        caller.users.create("boris")
        audit = caller.accounting.audit(limit=10_000)
        assert audit, "tenant B's own mutations are audited"
        assert {e.tenant for e in audit} == {"tenant-b"}
        listings.append(audit)
    text = json.dumps([[item.model_dump(mode="json") for item in listing] for listing in listings])
    for s in a_strings:
        assert json.dumps(s) not in text, s


def test_member_cannot_create_users(world):
    with pytest.raises(DlcloudError, match="creating users needs the tenant-admin") as exc:
        world.b_member.users.create("mallory")
    assert exc.value.code == "permission_denied"
    assert exc.value.http_status == 403
    assert "mallory" not in {u.name for u in world.b_admin.users.list()}


def test_tenant_admin_cannot_create_users_or_keys_in_another_tenant(world):
    with pytest.raises(DlcloudError, match="tenant 'tenant-a' not found") as exc:
        world.b_admin.users.create("mallory", tenant="tenant-a")
    assert exc.value.code == "not_found"
    with pytest.raises(DlcloudError, match="tenant 'tenant-a' not found") as exc:
        world.b_admin.keys.create(user="alice", tenant="tenant-a")
    assert exc.value.code == "not_found"
    assert "mallory" not in {u.name for u in world.a_admin.users.list()}
    assert {k.user for k in world.a_admin.keys.list()} == {"alice", "anna"}


def test_audit_log_access_by_role(world):
    with pytest.raises(DlcloudError, match="reading the audit log needs") as exc:
        world.b_member.accounting.audit()
    assert (exc.value.code, exc.value.http_status) == ("permission_denied", 403)
    with pytest.raises(DlcloudError, match="the audit log of all tenants needs the platform-admin") as exc:
        world.b_admin.accounting.audit(all_tenants=True)
    assert (exc.value.code, exc.value.http_status) == ("permission_denied", 403)


def test_audit_is_scoped_to_the_tenant_and_platform_admin_sees_all(world):
    world.a_admin.users.create("anton")
    world.b_admin.users.create("boris")
    a_events = world.a_admin.accounting.audit(limit=10_000)
    b_events = world.b_admin.accounting.audit(limit=10_000)
    assert {e.tenant for e in a_events} == {"tenant-a"}
    assert {e.tenant for e in b_events} == {"tenant-b"}
    assert "tenant-a/anton" in {e.resource for e in a_events}
    assert "tenant-b/boris" in {e.resource for e in b_events}
    assert "tenant-a/anton" not in {e.resource for e in b_events}

    admin = world.env.admin
    own = admin.accounting.audit(limit=10_000)
    assert {e.tenant for e in own} == {"default"}
    everything = admin.accounting.audit(all_tenants=True, limit=10_000)
    assert {"default", "tenant-a", "tenant-b"} <= {e.tenant for e in everything}
    resources = {e.resource for e in everything}
    assert {"tenant-a/anton", "tenant-b/boris"} <= resources
    assert len(everything) >= len(a_events) + len(b_events) + len(own)


def test_code_of_another_tenant_cannot_be_used_in_a_job(world):
    with pytest.raises(DlcloudError, match=f"code '{world.code_id}' not found") as exc:
        world.b_member.jobs.submit({"name": "steal", "code": world.code_id, "command": "python train.py"})
    assert exc.value.code == "invalid_spec"
    assert world.b_member.jobs.list() == []


def test_code_upload_is_stored_under_the_owning_tenant(world):
    tenant_a = world.env.admin.tenants.get("tenant-a").id
    tenant_b = world.env.admin.tenants.get("tenant-b").id
    objects = world.env.platform.objects
    [stored] = list(objects.list(f"code/{tenant_a}"))
    assert stored.key == f"code/{tenant_a}/{world.code_id}/code.tar.gz"
    assert list(objects.list(f"code/{tenant_b}")) == []
    a_files = [objects.local_path(stored.key)]
    digest = hashlib.sha256(a_files[0].read_bytes()).hexdigest()
    assert world.a_member.transport.request("GET", f"{API}/code/{world.code_id}")["sha256"] == digest


def test_same_job_name_in_two_tenants_are_separate_jobs(world):
    b_job = world.b_member.jobs.submit({"name": "a-job", "command": "echo b"})
    assert b_job.id != world.job_id
    assert b_job.tenant == "tenant-b"
    world.b_member.jobs.cancel("a-job")
    assert world.b_member.jobs.get("a-job").state == "CANCELLED"
    assert world.a_member.jobs.get("a-job").state == "QUEUED"
