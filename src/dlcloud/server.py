"""The composition root of ``dlcloud up``: one process with the API, the scheduler and the local executor.

Start-up order: settings -> data dir -> database + migrations -> server key -> bootstrap admin (first
start) -> inventory -> platform -> executor + control loop (leader only) -> HTTP server. SIGTERM/SIGINT
stop the HTTP server, then the control loop; running jobs keep running (they are detached) and are
re-adopted on the next start.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

from dlcloud import api_workers
from dlcloud.api.app import create_app
from dlcloud.api_workers import WakeReceiver, WorkerSetup, build_platform, worker_app
from dlcloud.control.dataset_sources import SourceWorker
from dlcloud.control.housekeeping import Housekeeping
from dlcloud.control.leader import Leadership
from dlcloud.control.loop import ControlLoop
from dlcloud.errors import InvalidArgument
from dlcloud.executors.base import Executor
from dlcloud.executors.registry import get_executor_class
from dlcloud.schemas.tenants import egress_target
from dlcloud.services import rate_table
from dlcloud.services.platform import Platform
from dlcloud.services.secrets import SecretBox
from dlcloud.services.tenants import bootstrap
from dlcloud.settings import Settings
from dlcloud.store.db import Database, migrate
from dlcloud.uvicorn_server import Uvicorn

log = logging.getLogger("dlcloud")


@dataclass
class Server:
    settings: Settings
    platform: Platform
    control: ControlLoop
    leadership: Leadership
    app: FastAPI
    bootstrap_file: Path
    stop_event: threading.Event
    sources: SourceWorker  # computes the manifests of dataset versions registered in place
    housekeeping: Housekeeping  # purges expired nonces, sweeps what crashed requests left behind


def _write_bootstrap_file(path: Path, access: str, secret: str, endpoint: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"access_key": access, "secret_key": secret, "endpoint": endpoint}, f, indent=2)
    os.chmod(path, 0o600)


def public_endpoint(settings: Settings, port: int | None = None) -> str:
    """The endpoint ``dlcloud up`` hands its first user (the bootstrap file, the CLI's profile)."""
    return settings.local_url(port)


def build_server(settings: Settings, executor: Executor | None = None) -> Server:
    for entry in settings.job_egress_allow:  # an admin's typo refused at start, not at a job's
        try:
            egress_target(entry)
        except ValueError as exc:
            raise InvalidArgument(f"job_egress_allow: {exc}") from None
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    url = settings.resolved_database_url
    migrate(url)
    db = Database(url)
    box = SecretBox.from_file(settings.resolved_server_key_file)
    boot = bootstrap(db, box, settings.bootstrap_tenant_name, settings.bootstrap_admin_name)
    bootstrap_file = data_dir / "bootstrap-admin.json"
    if boot.created:
        assert boot.access_key and boot.secret_key
        _write_bootstrap_file(bootstrap_file, boot.access_key, boot.secret_key, public_endpoint(settings))
        log.info("created the platform admin %r; its key is in %s", settings.bootstrap_admin_name, bootstrap_file)
    if executor is None:
        executor = get_executor_class(settings.executor).from_settings(settings)
    holder: dict[str, ControlLoop] = {}
    workers: dict[str, SourceWorker] = {}
    platform = build_platform(
        settings,
        db,
        box,
        executor,
        wake=lambda: holder["c"].wake(),
        wake_sources=lambda: workers["w"].wake(),
    )
    platform.objects.check()
    log.info("storage: %s", platform.objects.url)
    log.info("isolation of user code: %s", platform.isolation)
    if not platform.isolated:
        log.warning(
            "user code runs WITHOUT a sandbox: %s",
            "every tenant's jobs may run (--allow-unsandboxed-tenants): they can read each other's data and the "
            "server's secrets"
            if settings.allow_unsandboxed_tenants
            else f"only tenant {settings.bootstrap_tenant_name!r} may run jobs and build environments",
        )
    leadership = Leadership(db, data_dir)
    control = ControlLoop(platform, executor, leadership)
    holder["c"] = control
    workers["w"] = SourceWorker(platform)
    stop_event = threading.Event()
    server = Server(
        settings,
        platform,
        control,
        leadership,
        FastAPI(),
        bootstrap_file,
        stop_event,
        workers["w"],
        Housekeeping(platform),
    )

    def ready() -> str | None:
        return None if server_state["leader"] or server_state["follower"] else "control loop not started"

    server_state = {"leader": False, "follower": False}
    server.app = create_app(platform, ready_check=ready)
    server.app.router.lifespan_context = _lifespan(server, server_state)
    return server


def _lifespan(server: Server, state: dict[str, bool]):
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threads = _start_background(server, state)
        try:
            yield
        finally:
            _stop_background(server, threads)

    return lifespan


def _start_background(
    server: Server, state: dict[str, bool], *more: threading.Thread, announce: Callable[[], None] = lambda: None
) -> list[threading.Thread]:
    """The control process's threads, started: the election and the control loop (``announce``: told when its
    state changed), housekeeping, the dataset-source worker (and ``more``)."""
    threads = [
        threading.Thread(target=_leader_loop, args=(server, state, announce), name="dlcloud-control", daemon=True),
        # every process, leader or follower: sweeps remove only what no live request uses, and claims keep
        # two processes from computing one dataset version
        threading.Thread(
            target=server.housekeeping.run, args=(server.stop_event,), name="dlcloud-housekeeping", daemon=True
        ),
        threading.Thread(
            target=server.sources.run, args=(server.stop_event,), name="dlcloud-dataset-sources", daemon=True
        ),
        *more,
    ]
    for t in threads:
        t.start()
    return threads


def _stop_background(server: Server, threads: list[threading.Thread]) -> None:
    server.stop_event.set()
    server.control.wake()
    server.sources.wake()
    server.housekeeping.wake()
    for t in threads:
        t.join(timeout=10)
    server.leadership.release()
    server.platform.db.dispose()
    log.info("control plane stopped; running jobs keep running and are re-adopted on the next start")


def _leader_loop(server: Server, state: dict[str, bool], announce: Callable[[], None] = lambda: None) -> None:
    """Follow until this process wins the election, lead until it loses it (``ControlLoop.run`` returns on
    ``LeadershipLost``), then release everything and follow again; until ``stop_event``. ``announce``: told
    after ``state`` changed (the workers' readiness, ``_serve_workers``)."""
    stop = server.stop_event
    while not stop.is_set():
        try:
            leads = server.leadership.try_acquire()
        except Exception:  # the database is unreachable: stay a follower and try again
            log.exception("could not take part in the scheduler election")
            leads = False
        if leads:
            state["leader"], state["follower"] = True, False
            announce()
            server.control.run(stop)
            state["leader"], state["follower"] = False, True
            announce()
            server.leadership.release()
            continue  # compete again at once: a lost lock session may be this process's own blip
        state["follower"] = True
        announce()
        server.control.executor.reap()  # launchers this process started while it led
        stop.wait(2.0)


def serve(settings: Settings, on_ready=None) -> None:
    """Run until SIGTERM/SIGINT: in one process (``api_workers`` 1), else as a control process keeping
    ``api_workers`` API processes on the port (``api_workers.py``)."""
    os.umask(0o077)  # the database, keys, code and logs are readable by this user only
    server = build_server(settings)
    if settings.resolved_api_workers > 1:
        if on_ready is not None:
            on_ready(server)
        _serve_workers(server, settings.resolved_api_workers)
        return
    uv = Uvicorn(_uvicorn_config(settings, server.app))
    if on_ready is not None:
        on_ready(server)
    # start-up made the long-lived objects (the app, SQLAlchemy's and pydantic's caches): leave them out
    # of every later full collection, which otherwise walks them all (it halved the API's p99 latency)
    gc.collect()
    gc.freeze()
    uv.run()


def _uvicorn_config(settings: Settings, app: Any, **more: Any) -> uvicorn.Config:
    """How ``dlcloud up`` serves the API, in one process or in workers."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        **more,
    )


def _serve_workers(server: Server, workers: int) -> None:
    """This process runs the control plane's threads and keeps ``workers`` API processes serving the port until
    SIGTERM/SIGINT (uvicorn's supervisor replaces one that dies), then stops them and its threads. Exits 3 when
    the workers cannot start (uvicorn gives up on a worker that fails before serving)."""
    settings = server.settings
    platform = server.platform
    setup = WorkerSetup(settings, os.getpid(), server.control.executor.decided(), platform.isolated, platform.isolation)
    config = _uvicorn_config(
        settings, functools.partial(worker_app, setup), factory=True, workers=workers, timeout_worker_healthcheck=30
    )
    sock = config.bind_socket()  # the port first: a server that cannot have it changes nothing
    here = api_workers.prepare_run_dir(settings)
    rate_table.create(here / api_workers.RATE_TABLE)
    receiver = WakeReceiver(
        here / api_workers.WAKE_SOCKET,
        {api_workers.WAKE_CONTROL: server.control.wake, api_workers.WAKE_SOURCES: server.sources.wake},
    )
    state = {"leader": False, "follower": False}
    ready = here / api_workers.CONTROL_READY

    def announce() -> None:
        if state["leader"] or state["follower"]:
            ready.touch(mode=0o600)
        else:
            ready.unlink(missing_ok=True)

    wakes = threading.Thread(target=receiver.run, args=(server.stop_event,), name="dlcloud-wakes", daemon=True)
    threads = _start_background(server, state, wakes, announce=announce)
    log.info("serving the API with %d worker processes; this process runs the control plane", workers)
    supervisor = Multiprocess(config, sockets=[sock])
    try:
        supervisor.run()
    finally:
        _stop_background(server, threads)  # the wakes' thread ends with the others, then its socket goes
        receiver.close()
        sock.close()
        shutil.rmtree(here, ignore_errors=True)
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        log.error("the API worker processes could not start (see above); stopping")
        raise SystemExit(3)
