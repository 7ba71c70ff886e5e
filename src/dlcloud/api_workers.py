"""``dlcloud up --api-workers N``: N API processes behind one port, and the control process that started them.

The control process (``server.serve``) builds the platform as one process does, runs the fenced control loop
(leadership, ``control/leader.py``), housekeeping and the dataset-source worker, binds the port, and then keeps
N API processes alive on it (uvicorn's supervisor: a worker that dies, kill -9 included, is replaced within a
second; requests it had answered were committed before their answer, the one it was serving is lost with its
connection, and the client sees the connection close). It serves no request itself.

Each API process (``worker_app``, started by spawning, so it shares nothing of the control process's memory)
builds its own platform handles from the same settings: a database engine (the schema is the control
process's, migrated before any worker starts; its pool a share of one process's), the store, the executor (to
read jobs' logs, infer models' signatures and remove deleted jobs; it never starts a job, and takes the control
process's sandbox probe rather than making its own), the server key. What must be one across the processes is:

- the scheduler: only the control process runs it; a request that changed what it decides (a job submitted,
  cancelled) wakes it through a datagram on a socket of the data dir (``WakeReceiver``, ``wake_sender``), as
  one process calls ``ControlLoop.wake``; a lost datagram costs at most the loop's interval;
- the rate limits: in a table every process maps (``services/rate_table.py``), made by the control process;
- ``/metrics``: the request counters of every worker, summed (prometheus_client's multiprocess mode, in a
  directory the control process empties at start), the dead ones' included;
- replay protection, sessions, quotas: in the database already, as with several ``dlcloud up`` on one database.

An API process dies with the control process (``PR_SET_PDEATHSIG``): a kill -9 of ``dlcloud up`` leaves no
process holding the port. Running jobs keep running and are adopted by the next start, as always.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import shutil
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from dlcloud.api.app import SharedByProcesses, create_app
from dlcloud.executors.base import Executor
from dlcloud.executors.registry import get_executor_class
from dlcloud.scheduler.inventory import build_inventory
from dlcloud.services.platform import Platform
from dlcloud.services.secrets import SecretBox
from dlcloud.settings import Settings
from dlcloud.storage.stores import open_object_store
from dlcloud.store.db import Database

log = logging.getLogger("dlcloud")

WAKE_CONTROL, WAKE_SOURCES = b"c", b"s"
PR_SET_PDEATHSIG = 1
WAKE_SOCKET, RATE_TABLE, METRICS = "wake.sock", "rate-limits", "metrics"
CONTROL_READY = "control-ready"  # present while the control process leads or follows (its election runs)


@dataclass(frozen=True)
class WorkerSetup:
    """What an API process is started with (pickled to it by the spawn): the settings, its control process, and
    what the control process decided at its start that the workers must not decide again (the executor's
    ``decided``: the sandbox probe; the isolation it told)."""

    settings: Settings
    parent: int  # the control process's pid
    executor: dict[str, Any] = field(default_factory=dict)
    isolated: bool = True
    isolation: str = ""

    @property
    def run_dir(self) -> Path:
        return run_dir(self.settings, self.parent)


def run_dir(settings: Settings, control_pid: int) -> Path:
    """The sockets and shared tables of one control process and its workers (0700 in the data dir: no job reaches
    them; one per process, so two ``dlcloud up`` sharing a data dir, a leader and its follower, keep theirs apart)."""
    return settings.data_dir / "run" / str(control_pid)


def prepare_run_dir(settings: Settings) -> Path:
    """This control process's run directory, made empty, after removing those of control processes that are gone;
    the workers' metrics directory named to every process started from now on (the workers import
    prometheus_client after this, so their values go there; this process serves none)."""
    parent = settings.data_dir / "run"
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for entry in parent.iterdir():
        if entry.name.isdigit() and not Path(f"/proc/{entry.name}").exists():
            shutil.rmtree(entry, ignore_errors=True)
    path = run_dir(settings, os.getpid())
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    (path / METRICS).mkdir(mode=0o700)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path / METRICS)
    return path


def build_platform(
    settings: Settings,
    db: Database,
    box: SecretBox,
    executor: Executor,
    *,
    wake: Callable[[], None],
    wake_sources: Callable[[], None],
    isolation: tuple[bool, str] | None = None,
) -> Platform:
    """The platform's handles as every process of ``dlcloud up`` builds them from the settings; ``isolation``:
    (isolated, how) as the control process found it, else asked of the executor here."""
    declared = (
        [(g.index, g.name, g.memory_mb) for g in settings.gpu_inventory] if settings.gpu_inventory is not None else None
    )
    inventory = build_inventory(declared, settings.cpu_capacity, settings.memory_capacity_bytes, settings.host_name)
    objects = open_object_store(settings)
    isolated, how = isolation if isolation is not None else executor.isolation()
    return Platform(
        settings=settings,
        db=db,
        box=box,
        inventory=inventory,
        wake=wake,
        wake_sources=wake_sources,
        isolated=isolated,
        isolation=how,
        objects=objects,
        environments=executor.environments(settings, objects),
        executor=executor,
    )


class WakeReceiver:
    """The control process's end of the wake socket: each datagram wakes the loop it names."""

    def __init__(self, path: Path, wakes: dict[bytes, Callable[[], None]]) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a previous start's
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        self.sock.settimeout(0.5)
        self.path, self.wakes = path, wakes

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                data = self.sock.recv(16)
            except TimeoutError:
                continue
            except OSError:  # closed: stopping
                return
            for byte in set(data):  # a burst of wakes is one wake of each loop named
                wake = self.wakes.get(bytes([byte]))
                if wake is not None:
                    wake()

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


def wake_sender(path: Path, what: bytes) -> Callable[[], None]:
    """A callable that wakes the control process's loop ``what`` names; never blocks nor fails (a full socket
    buffer, or a control process restarting, loses the datagram: the loop's own interval catches up)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    target = str(path)

    def wake() -> None:
        with suppress(OSError):
            sock.sendto(what, target)

    return wake


def _die_with(parent: int) -> None:
    """This process is killed when its parent ends (or now, if it already has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(1)


def worker_app(setup: WorkerSetup) -> FastAPI:
    """The API of one worker process (a uvicorn app factory, called once in each): its own handles on the
    platform, its wakes sent to its control process, its rate limits in the shared table, ready while the control
    process's election runs."""
    _die_with(setup.parent)
    settings, here = setup.settings, setup.run_dir
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = settings.resolved_api_workers
    # the connections of one process, shared out: N workers hold about what one process would
    pool = max(4, 20 // workers)
    db = Database(settings.resolved_database_url, pool_size=pool, max_overflow=pool)
    box = SecretBox.from_file(settings.resolved_server_key_file)
    executor = get_executor_class(settings.executor).from_settings(settings, **setup.executor)
    platform = build_platform(
        settings,
        db,
        box,
        executor,
        wake=wake_sender(here / WAKE_SOCKET, WAKE_CONTROL),
        wake_sources=wake_sender(here / WAKE_SOCKET, WAKE_SOURCES),
        isolation=(setup.isolated, setup.isolation),
    )

    def ready() -> str | None:
        return None if (here / CONTROL_READY).exists() else "control loop not started"

    shared = SharedByProcesses(here / RATE_TABLE, here / METRICS)
    app = create_app(platform, ready_check=ready, shared=shared)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            platform.db.dispose()

    app.router.lifespan_context = lifespan
    gc.collect()  # as one process does (server.serve): the long-lived objects out of every full collection
    gc.freeze()
    return app
