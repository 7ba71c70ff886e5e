"""Security fixtures: a real ``dlcloud up`` (SQLite or PostgreSQL) with two tenants, an attacker and a victim,
each with a member's key and a CLI profile, and a server environment full of secrets a job must never see."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import dlcloud
from tests.conftest import IN_CI, PG_ADMIN_URL, _sa_url
from tests.e2e.conftest import Server, free_port

DB_PASSWORD = "db-pass-" + secrets.token_hex(8)  # PostgreSQL trusts loopback here: any password is accepted
PIP_SECRET = "pip-secret-" + secrets.token_hex(8)
JOB_PIDS_MAX = 256
JOB_DISK_MAX_BYTES = 64 * 1024 * 1024


@dataclass
class Platform:
    server: Server
    backend: str

    def as_(self, profile: str, *args: str, check: bool = True):
        return self.server.cli("--profile", profile, *args, check=check)


def _fresh_postgres_database() -> tuple[str, str]:
    """(admin SQLAlchemy URL, name) of a new empty database; the server migrates it itself."""
    admin_url = _sa_url(PG_ADMIN_URL)
    try:
        engine = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any driver failure means no server
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required in CI but unreachable: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc}")
    name = f"dlcloud_sec_{os.getpid()}_{secrets.token_hex(3)}"
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return admin_url, name


def _drop_database(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def add_member(server: Server, tenant: str, user: str, **quota: str) -> None:
    """A tenant with a member and a CLI profile named after the user."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in quota.items()]
    server.cli("--profile", "local", "tenants", "create", tenant, *flags)
    server.cli("--profile", "local", "users", "create", user, "--tenant", tenant, "--role", "member")
    key = server.cli_json("--profile", "local", "keys", "create", "--user", user, "--tenant", tenant)
    assert isinstance(key, dict)
    server.cli(
        "configure",
        "--profile",
        user,
        "--endpoint",
        server.endpoint,
        "--access-key",
        key["access_key"],
        "--secret-key",
        key["secret_key"],
        "--no-check",
    )


TEST_USER = "dlcloud-sectest"


def _unprivileged_uid() -> int:
    """The uid to run an unprivileged control plane as: a system user made for it (as root, as CI runs)."""
    try:
        return pwd.getpwnam(TEST_USER).pw_uid
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(TEST_USER).pw_uid


def _let_traverse(uid: int) -> None:
    """The user must reach this Python and dlcloud: add search (x, never read) permission for others on the
    directories above them that lack it (a Python under /root, whose mode is 0700, on CI machines)."""
    targets = [os.path.realpath(sys.executable), os.path.dirname(dlcloud.__file__)]
    check = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "test", "-r"]
    if all(subprocess.run([*check, t], capture_output=True, check=False).returncode == 0 for t in targets):
        return
    for target in (Path(sys.executable), Path(os.path.realpath(sys.executable)), Path(dlcloud.__file__)):
        for parent in reversed(target.parents):
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    for t in targets:
        subprocess.run([*check, t], capture_output=True, check=True)


@pytest.fixture(
    params=[("sqlite", "root"), ("postgres", "root"), ("sqlite", "user"), ("postgres", "user")],
    ids=lambda p: "-".join(p),
)
def platform(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Platform]:
    """A real dlcloud up on SQLite or PostgreSQL, run as root (jobs get per-tenant uids) or as an
    unprivileged user (jobs get a user namespace): each attack runs against all four."""
    backend, who = request.param
    if backend != "sqlite" and request.node.get_closest_marker("sqlite_only"):
        pytest.skip("this attack does not depend on the database: its SQLite variants try it")
    run_as = None
    root_dir = tmp_path
    if who == "root":
        if os.geteuid() != 0:
            pytest.skip("the root variant needs root (CI runs as root)")
    elif os.geteuid() == 0:
        run_as = _unprivileged_uid()
        _let_traverse(run_as)
        root_dir = Path(tempfile.mkdtemp(prefix="dlcloud-sec-"))
        os.chown(root_dir, run_as, run_as)
    extra_env = {
        "PIP_INDEX_URL": f"https://user:{PIP_SECRET}@127.0.0.1:9/simple",
        # bounds small enough for the attacks on them to finish fast (tests/security/test_network_and_limits.py)
        "DLCLOUD_JOB_PIDS_MAX": str(JOB_PIDS_MAX),
        "DLCLOUD_JOB_DISK_MAX_BYTES": str(JOB_DISK_MAX_BYTES),
    }
    pg: tuple[str, str] | None = None
    if backend == "postgres":
        pg = _fresh_postgres_database()
        extra_env["DLCLOUD_DATABASE_URL"] = f"postgresql://postgres:{DB_PASSWORD}@127.0.0.1:5432/{pg[1]}"
    server = Server(root_dir, free_port(), extra_env=extra_env, run_as=run_as)
    if run_as is not None:
        for d in ("home", "config"):
            (root_dir / d).mkdir(exist_ok=True)
            os.chown(root_dir / d, run_as, run_as)
    server.start()
    try:
        add_member(server, "victim", "vera", cpus="4", max_running_jobs="2")
        add_member(server, "attacker", "mallory", cpus="2", max_running_jobs="1")
        yield Platform(server, backend)
    finally:
        server.stop()
        if pg is not None:
            _drop_database(*pg)
        if root_dir != tmp_path:
            shutil.rmtree(root_dir, ignore_errors=True)
