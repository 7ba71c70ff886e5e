"""Tenants, users and access keys through the API, and the audit trail every mutating call leaves."""

from __future__ import annotations

import json

import pytest

from dlcloud.client import Client, Credentials
from dlcloud.errors import DlcloudError
from dlcloud.schemas.users import AccessKeyCreated

API = "/api/v1"


def _creds(key: AccessKeyCreated) -> Credentials:
    return Credentials("http://testserver", key.access_key, key.secret_key)


def _who(client: Client) -> str:
    return client.whoami().user


# --- tenants ------------------------------------------------------------------------------------------------


def test_platform_admin_creates_lists_and_sets_quota(env):
    created = env.admin.tenants.create("vision", {"gpus": 2, "cpus": 8, "memory": "64Gi", "max_queued_jobs": 10})
    assert created.name == "vision"
    assert created.quota.model_dump(mode="json") == {
        "gpus": 2,
        "cpus": 8.0,
        "memory": 64 * 1024**3,
        "max_running_jobs": None,
        "max_queued_jobs": 10,
        "storage": None,
    }
    assert [t.name for t in env.admin.tenants.list()] == ["default", "vision"]
    updated = env.admin.tenants.set_quota("vision", {"gpus": 1, "max_running_jobs": 3})
    assert updated.quota.gpus == 1
    assert updated.quota.max_running_jobs == 3
    assert updated.quota.cpus is None  # set_quota replaces the whole quota
    assert env.admin.tenants.get("vision").quota == updated.quota
    assert env.admin.accounting.quota("vision").limits == updated.quota


@pytest.mark.parametrize("role", ["tenant-admin", "member"])
def test_only_the_platform_admin_manages_tenants(env, role):
    user = env.new_tenant_user("team", "tess", role=role, quota={"gpus": 1})
    with pytest.raises(DlcloudError, match="creating tenants needs the platform-admin role") as exc:
        user.tenants.create("rogue")
    assert exc.value.code == "permission_denied"
    assert exc.value.http_status == 403
    with pytest.raises(
        DlcloudError,
        match="changing quotas, scheduling terms, network policies and sandbox terms needs the platform-admin role",
    ) as exc:
        user.tenants.set_quota("team", {"gpus": 64})
    assert exc.value.code == "permission_denied"
    assert [t.name for t in env.admin.tenants.list()] == ["default", "team"]
    assert env.admin.tenants.get("team").quota.gpus == 1
    assert [t.name for t in user.tenants.list()] == ["team"]


def test_only_the_platform_admin_lets_a_tenants_jobs_make_user_namespaces(env):
    member = env.new_tenant_user("lab", "lena", role="tenant-admin")
    assert env.admin.tenants.get("lab").sandbox.user_namespaces is False  # the default: denied
    with pytest.raises(DlcloudError, match="sandbox terms needs the platform-admin role") as exc:
        member.tenants.update("lab", sandbox={"user_namespaces": True})
    assert exc.value.http_status == 403
    assert env.admin.tenants.get("lab").sandbox.user_namespaces is False  # nothing changed
    updated = env.admin.tenants.update("lab", sandbox={"user_namespaces": True})
    assert updated.sandbox.user_namespaces is True
    assert updated.network.model_dump(mode="json") == {"egress": None, "allow": []}  # what was left out stays
    with pytest.raises(DlcloudError) as exc:
        env.admin.tenants.update("lab", sandbox={"user_namespaces": "sometimes"})
    assert exc.value.http_status == 422
    assert env.admin.tenants.get("lab").sandbox.user_namespaces is True


# --- users --------------------------------------------------------------------------------------------------


def test_users_are_created_with_roles(env):
    env.admin.tenants.create("team")
    lead = env.admin.users.create("lead", tenant="team", role="tenant-admin")
    assert (lead.tenant, lead.role) == ("team", "tenant-admin")
    lead_client = env.client(_creds(env.admin.keys.create(user="lead", tenant="team")))
    member = lead_client.users.create("mia")  # default role, the caller's tenant
    assert (member.tenant, member.role) == ("team", "member")
    second_admin = lead_client.users.create("max", role="tenant-admin")
    assert second_admin.role == "tenant-admin"
    roles = {u.name: u.role for u in lead_client.users.list()}
    assert roles == {"lead": "tenant-admin", "mia": "member", "max": "tenant-admin"}
    all_users = {(u.tenant, u.name) for u in env.admin.users.list()}
    assert {("default", "admin"), ("team", "lead"), ("team", "mia"), ("team", "max")} == all_users


# --- keys ---------------------------------------------------------------------------------------------------


def test_a_user_may_hold_several_keys_and_the_secret_is_shown_once(env):
    first = env.new_tenant_user("team", "kim")
    second_key = env.admin.keys.create(user="kim", tenant="team")
    own_key = first.keys.create()
    assert own_key.user == "kim" and own_key.tenant == "team" and own_key.enabled is True
    for key in (second_key, own_key):
        assert key.secret_key and key.access_key.startswith("AK")
        assert _who(env.client(_creds(key))) == "kim"
    listed = first.keys.list()
    assert len(listed) == 3
    assert {second_key.access_key, own_key.access_key} <= {k.access_key for k in listed}
    for k in first.transport.request("GET", f"{API}/keys"):  # what the wire holds: no secret in a listing
        assert set(k) == {"access_key", "user", "tenant", "enabled", "created_at"}
    assert all("secret_key" not in k for k in env.admin.transport.request("GET", f"{API}/keys"))


def test_disable_enable_and_delete_a_key(env):
    main = env.new_tenant_user("team", "kim")
    spare = main.keys.create()
    spare_client = env.client(_creds(spare))
    assert main.keys.disable(spare.access_key).enabled is False
    with pytest.raises(DlcloudError, match="is disabled") as exc:
        spare_client.whoami()
    assert exc.value.code == "disabled_access_key"
    assert {k.access_key: k.enabled for k in main.keys.list()}[spare.access_key] is False
    assert main.keys.enable(spare.access_key).enabled is True
    assert _who(spare_client) == "kim"
    main.keys.delete(spare.access_key)
    with pytest.raises(DlcloudError, match="unknown access key") as exc:
        spare_client.whoami()
    assert exc.value.code == "unknown_access_key"
    assert spare.access_key not in {k.access_key for k in main.keys.list()}


@pytest.mark.parametrize("action", ["disable", "enable", "delete"])
def test_member_cannot_touch_another_users_key(env, action):
    alice = env.new_tenant_user("team", "alice")
    bob_key = env.admin.keys.create(user=env.admin.users.create("bob", tenant="team").name, tenant="team")
    if action == "enable":
        env.admin.keys.disable(bob_key.access_key)
    with pytest.raises(DlcloudError, match=f"access key '{bob_key.access_key}' not found") as exc:
        getattr(alice.keys, action)(bob_key.access_key)
    assert exc.value.code == "not_found"
    state = {k.access_key: k.enabled for k in env.admin.keys.list(tenant="team")}
    assert state[bob_key.access_key] is (action != "enable")


def test_tenant_admin_manages_members_keys(env):
    lead = env.new_tenant_user("team", "lead", role="tenant-admin")
    env.admin.users.create("mia", tenant="team")
    mia_key = lead.keys.create(user="mia")
    assert mia_key.user == "mia"
    assert lead.keys.disable(mia_key.access_key).enabled is False
    lead.keys.delete(mia_key.access_key)
    assert mia_key.access_key not in {k.access_key for k in lead.keys.list()}


def test_cannot_disable_or_delete_the_signing_key(env, subtests):
    clients = {
        "member": env.new_tenant_user("team", "kim"),
        "tenant-admin": env.new_tenant_user("team", "lead", role="tenant-admin"),
        "platform-admin": env.admin,
    }
    for role, client in clients.items():
        for action in ("disable", "delete"):
            with subtests.test(role=role, action=action):
                own = client.transport.creds.access_key
                with pytest.raises(DlcloudError, match=f"you cannot {action} the key this request is signed with") as e:
                    getattr(client.keys, action)(own)
                assert e.value.code == "invalid_argument"
                assert e.value.http_status == 400
                assert {k.access_key: k.enabled for k in client.keys.list()}[own] is True
                assert client.whoami().access_key == own


# --- audit --------------------------------------------------------------------------------------------------


def _audit_by_request(env) -> dict[str, dict]:
    resp = env.signed(env.admin_creds, "GET", f"{API}/audit", query="all=true&limit=10000")
    assert resp.status_code == 200, resp.text
    return {e["request_id"]: e for e in resp.json()}


def test_every_mutating_call_is_audited(env):
    admin = env.admin_creds
    calls: list[tuple[object, str, str | None, str]] = []  # (response, action, resource, outcome)

    def do(creds, method, path, body=None, *, action, resource, status):
        """Make a call and remember what its audit event must say; ``resource`` may read the response."""
        resp = env.signed(creds, method, path, body)
        assert resp.status_code == status, resp.text
        if callable(resource):
            resource = resource(resp)
        calls.append((resp, action, resource, "success" if status < 400 else "failure"))
        return resp

    def new_key(resp):
        return resp.json()["access_key"]

    do(admin, "POST", f"{API}/tenants", {"name": "team"}, action="tenants.create", resource="team", status=201)
    do(
        admin,
        "PATCH",
        f"{API}/tenants/team",
        {"quota": {"gpus": 1}},
        action="tenants.update",
        resource="team",
        status=200,
    )
    do(
        admin,
        "POST",
        f"{API}/users",
        {"name": "kim", "tenant": "team", "role": "tenant-admin"},
        action="users.create",
        resource="team/kim",
        status=201,
    )
    body = {"user": "kim", "tenant": "team"}
    kim_key = do(admin, "POST", f"{API}/keys", body, action="keys.create", resource=new_key, status=201).json()
    kim = _creds(AccessKeyCreated.model_validate(kim_key))
    spare = do(kim, "POST", f"{API}/keys", {}, action="keys.create", resource=new_key, status=201).json()
    for verb, method, suffix in (("disable", "POST", "/disable"), ("enable", "POST", "/enable")):
        do(
            kim,
            method,
            f"{API}/keys/{spare['access_key']}{suffix}",
            action=f"keys.{verb}",
            resource=spare["access_key"],
            status=200,
        )
    do(
        kim,
        "DELETE",
        f"{API}/keys/{spare['access_key']}",
        action="keys.delete",
        resource=spare["access_key"],
        status=204,
    )
    do(kim, "POST", f"{API}/jobs", {"name": "j1", "command": "true"}, action="jobs.submit", resource="j1", status=201)
    do(kim, "POST", f"{API}/jobs/j1/cancel", action="jobs.cancel", resource="j1", status=200)
    do(kim, "DELETE", f"{API}/jobs/j1", action="jobs.delete", resource="j1", status=204)
    # refused calls are audited as failures with their error code
    do(kim, "POST", f"{API}/tenants", {"name": "rogue"}, action="tenants.create", resource="rogue", status=403)
    do(kim, "DELETE", f"{API}/keys/{kim.access_key}", action="keys.delete", resource=kim.access_key, status=400)

    events = _audit_by_request(env)
    for resp, action, resource, outcome in calls:
        request_id = resp.headers["x-request-id"]
        assert request_id in events, (action, resource)
        event = events[request_id]
        assert event["action"] == action
        assert event["resource"] == resource
        assert event["outcome"] == outcome
        assert event["status_code"] == resp.status_code
        assert event["client_address"] == "testclient"
        if outcome == "failure":
            assert event["error_code"] == resp.json()["error"]["code"]
        else:
            assert event["error_code"] is None
    by_action = {(e["action"], e["resource"]): e for e in events.values()}
    assert by_action[("tenants.create", "rogue")]["error_code"] == "permission_denied"
    assert by_action[("users.create", "team/kim")]["user"] == "admin"
    assert by_action[("users.create", "team/kim")]["tenant"] == "default"
    assert by_action[("jobs.submit", "j1")]["user"] == "kim"
    assert by_action[("jobs.submit", "j1")]["tenant"] == "team"
    assert by_action[("jobs.submit", "j1")]["access_key"] == kim.access_key

    # reads are not audited
    read = env.signed(admin, "GET", f"{API}/tenants")
    assert read.headers["x-request-id"] not in _audit_by_request(env)

    secrets_ = [env.admin_creds.secret_key, kim_key["secret_key"], spare["secret_key"]]
    text = json.dumps(list(events.values()))
    for secret in secrets_:
        assert secret not in text


def test_authentication_failures_are_audited(env):
    member = env.new_tenant_user("team", "kim")
    creds = member.transport.creds
    bad = Credentials("http://testserver", creds.access_key, "not-the-secret")
    bad_sig = env.signed(bad, "GET", f"{API}/whoami")
    assert bad_sig.status_code == 401
    unknown = env.signed(Credentials("http://testserver", "AKUNKNOWN00000000000", "x"), "POST", f"{API}/jobs", {})
    assert unknown.status_code == 401
    unsigned = env.http.post(f"{API}/users", json={"name": "eve"})
    assert unsigned.status_code == 401

    events = _audit_by_request(env)
    e = events[bad_sig.headers["x-request-id"]]
    assert e["action"] == "auth.bad_signature"
    assert e["outcome"] == "failure"
    assert e["error_code"] == "bad_signature"
    assert e["status_code"] == 401
    assert e["access_key"] == creds.access_key
    assert e["tenant"] == "team"  # a failure with a known key lands in that key's tenant's log
    assert e["user"] is None
    assert e["client_address"] == "testclient"
    assert e["resource"] is None

    e = events[unknown.headers["x-request-id"]]
    assert (e["action"], e["error_code"], e["outcome"]) == ("auth.unknown_access_key", "unknown_access_key", "failure")
    assert e["access_key"] == "AKUNKNOWN00000000000"
    assert e["tenant"] is None

    e = events[unsigned.headers["x-request-id"]]
    assert (e["action"], e["error_code"]) == ("auth.missing_signature", "missing_signature")

    # the tenant admin of 'team' sees the failure against its member's key; the default tenant does not
    lead = env.new_tenant_user("team", "lead", role="tenant-admin")
    team_ids = {e.request_id for e in lead.accounting.audit(limit=10_000)}
    assert bad_sig.headers["x-request-id"] in team_ids
    assert unknown.headers["x-request-id"] not in team_ids
    default_ids = {e.request_id for e in env.admin.accounting.audit(limit=10_000)}
    assert bad_sig.headers["x-request-id"] not in default_ids

    text = json.dumps(list(events.values()))
    assert creds.secret_key not in text
    assert "not-the-secret" not in text
    assert env.admin_creds.secret_key not in text


def test_audit_filters_by_action_and_user(env):
    lead = env.new_tenant_user("team", "lead", role="tenant-admin")
    lead.users.create("mia")
    lead.users.create("max")
    lead.keys.create()
    created = lead.accounting.audit(action="users.create")
    assert sorted(e.resource for e in created) == ["team/max", "team/mia"]
    assert {e.user for e in lead.accounting.audit(user="lead")} == {"lead"}
    assert lead.accounting.audit(user="mia") == []
    assert len(lead.accounting.audit(limit=1)) == 1


def test_tenant_admin_cannot_mint_or_revoke_a_platform_admins_key(env):
    # a tenant admin in the platform admin's own tenant must not become the platform admin
    env.admin.users.create("deputy", role="tenant-admin")
    deputy = env.client(_creds(env.admin.keys.create(user="deputy")))
    with pytest.raises(DlcloudError, match="platform admin") as exc:
        deputy.keys.create(user="admin")
    assert exc.value.code == "permission_denied"
    admin_keys = [k.access_key for k in env.admin.keys.list(user="admin", tenant="default")]
    assert admin_keys == [env.admin_creds.access_key]
    for action in ("disable", "delete"):
        with pytest.raises(DlcloudError, match="platform admin") as exc:
            getattr(deputy.keys, action)(env.admin_creds.access_key)
        assert exc.value.code == "permission_denied"
    assert env.admin.whoami().role == "platform-admin"
    # the deputy still manages ordinary members' keys
    env.admin.users.create("mia")
    assert deputy.keys.create(user="mia").user == "mia"
