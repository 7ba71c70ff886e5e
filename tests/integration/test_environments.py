"""Runtime environments through the in-process API, the SDK and the real control loop, on SQLite and
PostgreSQL: built once per spec and reused (also across tenants creating it at the same time), jobs running
in the venv, inheritance of the server's packages, built-ins, readable build failures, delete rules and bad
input that leaves nothing behind. Requirements come from wheels made in the test: no package index."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud.client import Client
from dlcloud.control.loop import ControlLoop
from dlcloud.errors import DlcloudError
from dlcloud.executors import host_venvs
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.schemas.jobs import JobDetail
from dlcloud.store.rows import EnvironmentBuildRow, EnvironmentRow
from tests.conftest import WAIT_FOR_GO, Env, assert_api_error, release, wait_for
from tests.wheels import make_wheel

API = "/api/v1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
PROBE = (
    "python -c \"import os, sys, importlib.util as u, tinypkg; print('prefix', sys.prefix); "
    "print('tiny', tinypkg.VERSION, tinypkg.__file__); print('torch', u.find_spec('torch').origin); "
    "print('env', os.environ['DLCLOUD_ENVIRONMENT'], os.environ['VIRTUAL_ENV'])\""
)


def _wait_end(client: Client, name: str, timeout: float = 120.0) -> JobDetail:
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end"
    )


def _stdout(client: Client, job: str) -> dict[str, list[str]]:
    """stdout lines of a job keyed by their first word."""
    out: dict[str, list[str]] = {}
    for line in client.jobs.logs(job):
        if line.stream == "stdout":
            key, _, rest = line.text.partition(" ")
            out[key] = rest.split()
    return out


def _rows(env: Env) -> tuple[int, int]:
    with env.platform.db.read() as s:
        envs = s.scalar(select(func.count()).select_from(EnvironmentRow)) or 0
        builds = s.scalar(select(func.count()).select_from(EnvironmentBuildRow)) or 0
    return int(envs), int(builds)


def test_built_once_reused_across_tenants_and_jobs_run_in_the_venv(running_env: Env, tmp_path: Path):
    env = running_env
    alice = env.new_tenant_user("acme", "alice")
    bob = env.new_tenant_user("beta", "bob")
    wheel = make_wheel(tmp_path / "dist")
    spec = dict(wheels=[wheel], inherit=True, no_index=True, description="tiny + the server's torch")

    # two tenants create the same spec at the same moment: one build serves both
    with ThreadPoolExecutor(2) as pool:
        created = list(pool.map(lambda a: a[0].environments.create(a[1], **spec), [(alice, "tiny"), (bob, "tiny-too")]))
    assert {c.state for c in created} <= {"BUILDING", "READY"}
    assert created[0].spec_hash == created[1].spec_hash
    spec_hash = created[0].spec_hash
    # a job submitted at once waits for the build (or finds it ready) and then runs in the venv
    alice.jobs.submit({"name": "probe", "command": PROBE, "environment": "tiny"})

    ready = alice.environments.wait("tiny", timeout=120, interval=0.1)
    assert ready.state == "READY", ready
    assert ready.size_bytes > 0 and ready.ready_at is not None
    job = _wait_end(alice, "probe")
    assert job.state == "SUCCEEDED", job
    assert (job.environment, job.environment_hash) == ("tiny", spec_hash)
    venv = env.settings.envs_dir / spec_hash
    out = _stdout(alice, "probe")
    assert out["prefix"] == [str(venv)]
    assert out["tiny"][0] == "0.1" and out["tiny"][1].startswith(str(venv))
    # inheritance: torch is importable from the server's environment and was not installed into the venv
    assert not out["torch"][0].startswith(str(venv))
    assert not list(venv.glob("lib/python*/site-packages/torch"))
    assert out["env"] == ["tiny", str(venv)]

    # bob's environment is the same build: READY, never built a second time
    detail = bob.environments.get("tiny-too")
    assert (detail.state, detail.builds, detail.spec_hash) == ("READY", 1, spec_hash)
    assert detail.wheels == [wheel.name] and detail.no_index is True
    assert "torch" in detail.base_packages
    assert sum("build started" in line for line in detail.log_tail) == 1
    log_before = host_venvs.log_path(env.settings.envs_dir, spec_hash).read_text()
    bob.jobs.submit({"name": "again", "command": PROBE, "environment": "tiny-too"})
    assert _wait_end(bob, "again").state == "SUCCEEDED"
    assert _stdout(bob, "again")["prefix"] == [str(venv)]
    assert host_venvs.log_path(env.settings.envs_dir, spec_hash).read_text() == log_before
    assert bob.environments.get("tiny-too").builds == 1
    assert _rows(env) == (2, 1)

    # delete is refused while an unfinished job uses the environment
    alice.jobs.submit({"name": "holder", "command": WAIT_FOR_GO, "environment": "tiny"})
    assert alice.environments.get("tiny").jobs == ["holder"]
    with pytest.raises(DlcloudError, match="environment 'tiny' is used by unfinished job\\(s\\) holder") as exc:
        alice.environments.delete("tiny")
    assert exc.value.code == "invalid_state"
    release(env.settings.data_dir, alice.jobs.get("holder").id)
    assert _wait_end(alice, "holder").state == "SUCCEEDED"

    # the venv stays while another tenant's environment shares it, and goes with the last one
    alice.environments.delete("tiny")
    assert venv.is_dir() and _rows(env) == (1, 1)
    assert [e.name for e in alice.environments.list() if not e.builtin] == []
    bob.environments.delete("tiny-too")
    assert not venv.exists() and _rows(env) == (0, 0)


def test_builtins_are_listed_for_everyone_and_built_on_first_use(running_env: Env):
    c = running_env.new_tenant_user("acme", "alice")
    listed = {e.name: e for e in c.environments.list()}
    assert list(listed) == ["default", "python", "pytorch", "tensorflow", "sklearn"]
    assert all(e.builtin for e in listed.values())
    assert listed["default"].state == "READY" and listed["default"].spec_hash is None
    assert listed["pytorch"].state == "NOT_BUILT" and listed["pytorch"].inherit is True
    assert listed["python"].inherit is False
    assert "torch" in c.environments.get("pytorch").base_packages

    check = (
        "python -c \"import os, sys, importlib.util as u; print(os.environ['DLCLOUD_ENVIRONMENT'], "
        "sys.prefix, u.find_spec('torch') is not None)\""
    )
    c.jobs.submit({"name": "torchy", "command": check, "environment": "pytorch"})
    c.jobs.submit({"name": "plain", "command": check})
    torchy, plain = _wait_end(c, "torchy"), _wait_end(c, "plain")
    assert torchy.state == plain.state == "SUCCEEDED"
    built = c.environments.get("pytorch")
    assert built.state == "READY" and built.builds == 1 and torchy.environment_hash == built.spec_hash
    assert _stdout(c, "torchy")["pytorch"] == [str(running_env.settings.envs_dir / built.spec_hash), "True"]
    assert plain.environment == "default" and _stdout(c, "plain")["default"][1] == "True"

    with pytest.raises(DlcloudError, match="'pytorch' is a built-in environment; built-ins cannot be deleted"):
        c.environments.delete("pytorch")
    with pytest.raises(DlcloudError, match="'default' is the server's own environment"):
        list(c.environments.logs("default"))
    assert any("build finished" in line.text for line in c.environments.logs("pytorch"))


def test_broken_requirement_fails_readably_and_fails_its_jobs(env: Env):
    """Driven step by step: no control loop runs, the test schedules and builds."""
    c = env.admin
    created = c.environments.create(
        "broken", requirements=["nonexistent-pkg-dlcloud==9.9"], inherit=True, no_index=True
    )
    assert created.state == "BUILDING"
    c.jobs.submit({"name": "waiter", "command": "echo never", "environment": "broken"})
    control = ControlLoop(env.platform, SimulatedExecutor())
    assert control.schedule() == 0
    waiting = c.jobs.get("waiter")
    assert (waiting.state, waiting.wait_reason) == ("QUEUED", "environment 'broken' is building")

    control.builds.build(created.spec_hash)
    failed = c.environments.get("broken")
    assert failed.state == "FAILED"
    assert "No matching distribution found for nonexistent-pkg-dlcloud==9.9" in failed.error
    assert failed.builds == 1 and failed.ready_at is None
    assert any("build failed: pip install failed" in line for line in failed.log_tail)
    assert not (env.settings.envs_dir / created.spec_hash).exists()

    control.schedule()
    job = c.jobs.get("waiter")
    assert job.state == "FAILED" and job.attempts == []
    assert job.reason.startswith("environment 'broken' failed to build: pip install failed (exit code 1)")
    assert "No matching distribution found for nonexistent-pkg-dlcloud==9.9" in job.reason

    resp = env.signed(
        env.admin_creds, "POST", f"{API}/jobs", {"name": "later", "command": "x", "environment": "broken"}
    )
    err = assert_api_error(resp, 400, "invalid_spec", "environment 'broken' failed to build: pip install failed")
    assert "No matching distribution found for nonexistent-pkg-dlcloud==9.9" in err["message"]

    # creating the same spec again (after a delete) retries the build
    c.environments.delete("broken")
    again = c.environments.create("broken", requirements=["nonexistent-pkg-dlcloud==9.9"], inherit=True, no_index=True)
    assert again.state == "BUILDING" and again.spec_hash == created.spec_hash
    with pytest.raises(DlcloudError, match="still building") as exc:
        c.environments.delete("broken")
    assert exc.value.code == "invalid_state"


def test_bad_input_is_refused_and_nothing_is_stored(env: Env, subtests, tmp_path: Path):
    c = env.admin
    upload = c.code.upload(make_wheel(tmp_path / "dist"), kind="wheel", filename="tinypkg-0.1-py3-none-any.whl")
    archive = tmp_path / "code.tar.gz"
    import tarfile

    with tarfile.open(archive, "w:gz"):
        pass
    not_a_wheel = c.code.upload(archive, kind="archive")
    cases = {
        "python-missing": ({"python": "3.9"}, 400, "invalid_argument", "Python 3.9 is not installed on the server"),
        "python-format": ({"python": "3"}, 422, "validation_error", "python"),
        "name-bad": ({"name": "Bad_Name"}, 422, "validation_error", "'Bad_Name' is not a valid name"),
        "name-builtin": ({"name": "pytorch"}, 400, "invalid_argument", "'pytorch' is a built-in environment"),
        "requirement-option": ({"requirements": ["-r /etc/passwd"]}, 422, "validation_error", "is a pip option"),
        "requirement-file-url": (
            {"requirements": ["x @ file:///etc/passwd"]},
            422,
            "validation_error",
            "only https, http, git+https URLs are allowed",
        ),
        "requirement-garbage": (
            {"requirements": ["not a requirement!"]},
            422,
            "validation_error",
            "not a pip requirement",
        ),
        "requirement-newline": ({"requirements": ["a\nb"]}, 422, "validation_error", "control character"),
        "too-many": ({"requirements": ["a"] * 257}, 422, "validation_error", "requirements"),
        "index-url": ({"index_url": "ftp://x"}, 422, "validation_error", "not an http(s) URL"),
        # pip expands ${NAME} from its environment: refused wherever a string reaches pip
        "requirement-expansion": (
            {"requirements": ["x @ https://127.0.0.1:9/${PIP_INDEX_URL}/x.whl"]},
            400,
            "invalid_argument",
            "contains '${': pip would replace ${NAME} with an environment variable of the server",
        ),
        "index-url-expansion": ({"index_url": "https://${HOME}/simple"}, 400, "invalid_argument", "index_url"),
        "extra-index-expansion": (
            {"extra_index_urls": ["https://x/${PIP_EXTRA_INDEX_URL}"]},
            400,
            "invalid_argument",
            "extra_index_urls 'https://x/${PIP_EXTRA_INDEX_URL}' contains '${'",
        ),
        "no-index-and-index": (
            {"no_index": True, "index_url": "https://x/simple"},
            422,
            "validation_error",
            "no_index excludes index_url",
        ),
        "wheel-unknown": (
            {"wheels": ["c-0000000000000000"]},
            400,
            "invalid_argument",
            "wheel 'c-0000000000000000' not",
        ),
        "wheel-not-a-wheel": ({"wheels": [not_a_wheel.id]}, 400, "invalid_argument", "is a archive, not a wheel"),
        "unknown-field": ({"packages": ["x"]}, 422, "validation_error", "packages: unknown field"),
    }
    for case, (overrides, status, code, fragment) in cases.items():
        with subtests.test(case=case):
            body = {"name": "ok", "wheels": [upload.id], **overrides}
            resp = env.signed(env.admin_creds, "POST", f"{API}/environments", body)
            assert_api_error(resp, status, code, fragment)
            assert _rows(env) == (0, 0)
    c.environments.create("taken", inherit=True)
    resp = env.signed(env.admin_creds, "POST", f"{API}/environments", {"name": "taken"})
    assert_api_error(resp, 409, "already_exists", "environment 'taken' already exists")
    assert _rows(env) == (1, 1)

    resp = env.signed(env.admin_creds, "POST", f"{API}/jobs", {"name": "j", "command": "x", "environment": "nope"})
    err = assert_api_error(resp, 400, "invalid_spec", "environment 'nope' does not exist; available: default, python")
    assert err["details"]["available"] == ["default", "python", "pytorch", "tensorflow", "sklearn", "taken"]
    assert c.jobs.list() == []
    assert_api_error(
        env.signed(env.admin_creds, "GET", f"{API}/environments/nope"), 404, "not_found", "'nope' not found"
    )
    assert_api_error(env.signed(env.admin_creds, "DELETE", f"{API}/environments/nope"), 404, "not_found")


def test_environments_are_tenant_scoped(env: Env):
    alice = env.new_tenant_user("acme", "alice")
    amy = env.new_tenant_user("acme", "amy")
    bob = env.new_tenant_user("beta", "bob")
    alice.environments.create("mine", inherit=True, description="alice's")
    assert [e.name for e in bob.environments.list() if not e.builtin] == []
    with pytest.raises(DlcloudError, match="environment 'mine' not found"):
        bob.environments.get("mine")
    with pytest.raises(DlcloudError, match="environment 'mine' does not exist"):
        bob.jobs.submit({"name": "j", "command": "x", "environment": "mine"})
    # the same name in another tenant is another environment
    bob.environments.create("mine", inherit=True)
    assert json.dumps(alice.environments.get("mine").description) == '"alice\'s"'
    with pytest.raises(DlcloudError, match="only the author or a tenant admin") as exc:
        amy.environments.delete("mine")
    assert exc.value.code == "permission_denied"


def test_a_build_moves_only_as_its_state_machine_says(env: Env):
    """services/env_builds.py is the one writer of a build's state: BUILDING -> READY | FAILED, FAILED ->
    BUILDING on a retry; an outcome recorded twice (a second leader) writes nothing the second time."""
    from dlcloud.executors.environments import BuildSpec
    from dlcloud.schemas.environments import EnvironmentState
    from dlcloud.services import env_builds

    spec = BuildSpec(python="3.11", requirements=("tinypkg==0.1",))
    spec_hash = spec.spec_hash()
    with env.platform.db.write() as s:
        assert env_builds.request_build(s, spec, spec_hash).state == "BUILDING"
    with env.platform.db.write() as s:
        assert env_builds.start_build(s, spec_hash) == spec
        with pytest.raises(ValueError, match="a build ends READY or FAILED"):
            env_builds.finish_build(s, spec_hash, EnvironmentState.BUILDING, built=True)
        assert env_builds.finish_build(s, spec_hash, EnvironmentState.FAILED, error="pip said no", built=True)
    with env.platform.db.write() as s:
        assert not env_builds.finish_build(s, spec_hash, EnvironmentState.READY, size=1, built=True)
        assert env_builds.start_build(s, spec_hash) is None  # FAILED: nothing to build until it is asked again
        row = s.get(EnvironmentBuildRow, spec_hash)
        assert (row.state, row.error, row.builds) == ("FAILED", "pip said no", 1)
        assert env_builds.request_build(s, spec, spec_hash).state == "BUILDING"  # a retry
    with env.platform.db.write() as s:
        assert env_builds.finish_build(s, spec_hash, EnvironmentState.READY, size=42, built=False)
        row = s.get(EnvironmentBuildRow, spec_hash)
        assert (row.state, row.error, row.size_bytes, row.builds) == ("READY", None, 42, 1)
