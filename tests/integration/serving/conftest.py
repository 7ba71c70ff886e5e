"""Fixtures for the model server's integration tests: the real server (uvicorn) in a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from dlcloud.serving.app import create_serving_app
from dlcloud.serving.config import ServerConfig
from tests.conftest import wait_for

START_TIMEOUT = 120.0  # model loading on a loaded 2-core machine (torch, xgboost, sklearn imports)


@dataclass
class RunningServer:
    """A model server listening on 127.0.0.1; ``url`` is ``http://127.0.0.1:<port>``."""

    host: str
    port: int
    app: Any  # the Starlette app; ``app.state.serving`` is the ServingApp

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def hostport(self) -> str:
        """``host:port``, the form ``tritonclient`` takes."""
        return f"{self.host}:{self.port}"


def answers_200(url: str) -> bool:
    """Whether ``GET url`` answers 200 (False while the server does not accept connections)."""
    try:
        return httpx.get(url, timeout=10).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def run_serving_server(config: ServerConfig, *, wait_ready: bool = True) -> Iterator[RunningServer]:
    """Run ``create_serving_app(config)`` under uvicorn in a thread on a free port, then stop it cleanly.

    Models load in the app's lifespan, before uvicorn reports ``started``; the fixture then polls
    ``/v2/health/ready`` until it answers 200, or with ``wait_ready=False`` only ``/v2/health/live`` (a server
    with a broken model is never ready: the test checks what it answers).
    """
    import uvicorn

    config = config.model_copy(update={"host": "127.0.0.1", "port": 0})
    app = create_serving_app(config)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=0,
        log_level="warning",
        access_log=False,
        lifespan="on",
        loop="uvloop",
        http="httptools",
        ws="none",
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(uv_config)  # installs no signal handlers outside the main thread
    failure: list[BaseException] = []

    def target() -> None:
        try:
            server.run()
        except BaseException as exc:  # reported to the test below instead of as a thread exception
            failure.append(exc)

    thread = threading.Thread(target=target, name="dlcloud-serving-test", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail(f"the model server did not start: {failure[0] if failure else 'timed out'}")
            time.sleep(0.02)
        port = next(s.getsockname()[1] for srv in server.servers for s in (srv.sockets or ()))
        running = RunningServer("127.0.0.1", port, app)
        health = "/v2/health/ready" if wait_ready else "/v2/health/live"
        wait_for(
            lambda: answers_200(running.url + health),
            timeout=max(deadline - time.monotonic(), 1.0),
            what=f"the model server to answer GET {health} with 200",
        )
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=30)
    assert not thread.is_alive(), "the model server did not stop"
    if failure:
        raise failure[0]
