"""Shared fixtures: a platform on SQLite and PostgreSQL, the in-process API and SDK clients.

PostgreSQL: ``DLCLOUD_TEST_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1:5432/postgres) names a
server where the tests may create a database. Where it is unreachable the PostgreSQL variants are skipped,
except under CI=true, where they fail: a CI run never silently drops a tier.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from starlette.testclient import TestClient

from dlcloud import signing
from dlcloud.api.app import create_app
from dlcloud.client import Client, Credentials
from dlcloud.control.loop import ControlLoop
from dlcloud.executors.base import Executor
from dlcloud.executors.local.environments import LocalVenvBackend
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.local.sandbox import Sandbox
from dlcloud.scheduler.inventory import Inventory, build_inventory
from dlcloud.services.platform import Platform
from dlcloud.services.secrets import SecretBox
from dlcloud.services.tenants import bootstrap
from dlcloud.settings import GpuSpec, Settings
from dlcloud.storage.stores import open_object_store
from dlcloud.store.db import Database, migrate
from dlcloud.store.rows import Base
from tests.job_files import touch_for_job

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# pytest-xdist workers run with COLUMNS=80 in their environment, and the CLI's Rich consoles fix their width from
# COLUMNS when they are created (on the first import of dlcloud.cli): without it, each CliRunner invocation's own
# COLUMNS applies, as it does in one process
os.environ.pop("COLUMNS", None)

# Under pytest-xdist (make test) each worker runs its own platforms on this one host: each gets its own slice
# of the distributed jobs' port range (29500-30499), else two platforms hand out the same MASTER_PORT. In-process
# Settings read it from the environment; e2e servers get it in theirs (``WORKER_ENV``).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_SLICE = int(_WORKER[2:]) % 4 if _WORKER.startswith("gw") and _WORKER[2:].isdigit() else 0
WORKER_ENV = {
    "DLCLOUD_JOB_PORT_RANGE_START": str(29500 + 250 * _SLICE),
    "DLCLOUD_JOB_PORT_RANGE_END": str(29500 + 250 * _SLICE + 249),
}
os.environ.update(WORKER_ENV)
PG_ADMIN_URL = os.environ.get("DLCLOUD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class ShiftedClock:
    """Real UTC time plus an adjustable offset: lets a test say how long an attempt ran, or when a lease expires
    without waiting for it (``advance``)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


class SteppedClock:
    """A stand-in for the ``time`` module of code under test: ``time()`` and ``monotonic()`` stand still (at a whole
    second) until the test moves them (``advance``), so that a deadline's edges are exact however slow the machine."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def registry_clock(monkeypatch: pytest.MonkeyPatch) -> ShiftedClock:
    """The model registry's clock (it gives and checks deployment leases, and dates versions), moved on by the test
    instead of waiting."""
    from dlcloud.services import model_leases, registry

    clock = ShiftedClock()
    for module in (registry, model_leases):
        monkeypatch.setattr(module, "utcnow", clock)
    return clock


NOBODY = 65534


def python_for_nobody() -> str:
    """An interpreter the unprivileged uid ``NOBODY`` can run: this one where the directories above it let that
    uid through (a pyenv under a private /root does not), else the system's of the same version, whose C ABI is
    this one's (so this venv's packages import in it too)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}"):
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", candidate, "-c", "pass"]
        if Path(candidate).exists() and subprocess.run(argv, capture_output=True).returncode == 0:
            return candidate
    pytest.fail(f"no Python {version} that uid {NOBODY} may run: neither {sys.executable} nor /usr/bin/python{version}")


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll until ``predicate()`` is truthy; returns its value. Fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# a job command that waits until the test calls ``release``: jobs run sandboxed and see none of the test's
# files, so the signal is a file in the job's outputs directory, the one place both see
WAIT_FOR_GO = 'while [ ! -e "$DLCLOUD_OUTPUT_DIR/go" ]; do sleep 0.05; done'


def release(data_dir: Path, job_id: str) -> None:
    """Let a job waiting in ``WAIT_FOR_GO`` go on (once it has been placed: its outputs directory exists)."""
    (outputs,) = wait_for(
        lambda: list((data_dir / "runs").glob(f"*/{job_id}/outputs")), what=f"job {job_id} to be placed"
    )
    touch_for_job(outputs / "go")


def _sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql://") else url


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    admin_url = _sa_url(PG_ADMIN_URL)
    try:
        admin = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # driver errors vary: any failure means no server
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required in CI but unreachable: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc}")
    name = f"dlcloud_test_{os.getpid()}_{secrets.token_hex(3)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    migrate(url)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _truncate_postgres(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every store-backed test runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'dlcloud.db'}"
        migrate(url)
        return url
    url = request.getfixturevalue("postgres_database")
    _truncate_postgres(url)
    return url


@dataclass
class Env:
    """An in-process platform: settings, platform handles, the API app and the admin's SDK client."""

    settings: Settings
    platform: Platform
    app: object
    http: TestClient
    admin: Client
    admin_creds: Credentials
    control: ControlLoop | None

    def client(self, creds: Credentials) -> Client:
        return Client(creds, http_client=self.http)

    def new_tenant_user(self, tenant: str, user: str, role: str = "member", quota: dict | None = None) -> Client:
        names = {t.name for t in self.admin.tenants.list()}
        if tenant not in names:
            self.admin.tenants.create(tenant, quota or {})
        self.admin.users.create(user, tenant=tenant, role=role)
        key = self.admin.keys.create(user=user, tenant=tenant)
        return self.client(Credentials("http://testserver", key.access_key, key.secret_key))

    def signed(self, creds: Credentials, method: str, path: str, body: object = None, query: str = ""):
        """A request signed with ``creds`` (``body`` sent as JSON) through the test client; the raw response."""
        content = b"" if body is None else json.dumps(body).encode()
        headers = signing.sign_request(
            creds.access_key, creds.secret_key, method, path, query, hashlib.sha256(content).hexdigest()
        ).headers
        if body is not None:
            headers = {**headers, "Content-Type": "application/json"}
        url = path + (f"?{query}" if query else "")
        return self.http.request(method, url, content=content or None, headers=headers)


def make_settings(tmp_path: Path, db_url: str, **overrides: object) -> Settings:
    values: dict = {
        "data_dir": tmp_path / "data",
        "database_url": db_url,
        "gpu_inventory": [
            GpuSpec(index=0, name="NVIDIA H100 80GB HBM3"),
            GpuSpec(index=1, name="NVIDIA H100 80GB HBM3"),
        ],
        "cpu_capacity": 8,
        "memory_capacity_bytes": 32 * 1024**3,
        "host_name": "testhost",
        "stop_grace_seconds": 2.0,
        "supervisor_interval_seconds": 0.05,
    }
    values.update(overrides)
    return Settings(**values)


def build_env(settings: Settings, executor: Executor | None = None, inventory: Inventory | None = None) -> Env:
    """The platform, its API in-process and a signed client as the admin; a control loop when ``executor`` is
    given. ``inventory``: the GPUs, CPUs and memory it schedules (default: the settings' declared host)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    box = SecretBox.from_file(settings.resolved_server_key_file)
    boot = bootstrap(db, box, "default", "admin")
    assert boot.created and boot.access_key and boot.secret_key
    # None: detect the host's GPUs (as the server does); [] declares a host without any
    gpus = settings.gpu_inventory
    declared = None if gpus is None else [(g.index, g.name, g.memory_mb) for g in gpus]
    if inventory is None:
        inventory = build_inventory(declared, settings.cpu_capacity, settings.memory_capacity_bytes, settings.host_name)
    holder: dict[str, ControlLoop] = {}
    objects = open_object_store(settings)
    platform = Platform(
        settings,
        db,
        box,
        inventory,
        wake=lambda: holder["c"].wake() if "c" in holder else None,
        objects=objects,
        environments=executor.environments(settings, objects)
        if executor
        else LocalVenvBackend.from_settings(settings, objects),
        # as in ``dlcloud up``, every process has an executor, if only to read the logs of jobs that others ran
        executor=executor or LocalExecutor(sandbox=Sandbox(False, "this process runs no jobs")),
    )
    control = None
    if executor is not None:
        control = ControlLoop(platform, executor)
        holder["c"] = control
    app = create_app(platform)
    http = TestClient(app, base_url="http://testserver")
    creds = Credentials("http://testserver", boot.access_key, boot.secret_key)
    return Env(settings, platform, app, http, Client(creds, http_client=http), creds, control)


@pytest.fixture
def env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """The API in-process on SQLite and PostgreSQL, with no control loop (jobs stay queued)."""
    e = build_env(make_settings(tmp_path, db_url))
    with e.http:
        yield e
    e.platform.db.dispose()


@pytest.fixture
def running_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """Like ``env`` plus the control loop and the local executor running in a background thread."""
    with control_running(build_env(make_settings(tmp_path, db_url), LocalExecutor())) as e:
        yield e


@contextmanager
def control_running(e: Env) -> Iterator[Env]:
    """``e`` (built with an executor) with its control loop running in a background thread and its HTTP client
    open; on leaving, the loop is stopped and woken, joined, and the database's connections are closed."""
    assert e.control is not None
    stop = threading.Event()
    thread = threading.Thread(target=e.control.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with e.http:
            yield e
    finally:
        stop.set()
        e.control.wake()
        thread.join(timeout=10)
        e.platform.db.dispose()


def assert_api_error(resp, status: int, code: str, fragment: str | None = None) -> dict:
    """The response is an API error of the documented shape, with this status and code (and message part)."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"code", "message", "details"}
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["details"], dict)
    if fragment is not None:
        assert fragment in err["message"], err["message"]
    return err
