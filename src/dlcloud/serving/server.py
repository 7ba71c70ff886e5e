"""Run the model server (``dlcloud serve``): uvicorn with uvloop and httptools, one process."""

from __future__ import annotations

import gc
import logging
import socket
from collections.abc import Callable

import uvicorn

from dlcloud.serving.app import create_serving_app
from dlcloud.serving.config import ServerConfig
from dlcloud.uvicorn_server import Uvicorn


class _ServingUvicorn(Uvicorn):
    """The model server's uvicorn: once started (the lifespan loaded and warmed the models), the collector is
    tuned for serving and ``on_started(port)`` is called."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[int], None] | None) -> None:
        super().__init__(config)
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)  # runs the lifespan: the models are loaded and warmed up
        # Move everything alive now (torch & co., imported while loading, and the models) out of the
        # collector's reach: a full collection then scans only what requests allocate, not the ~100k objects
        # of the libraries, which took 10-300 ms a time and came every ~1500 requests under load.
        gc.collect()
        gc.freeze()
        # A young-generation collection scans what the requests in flight hold, whatever its threshold, so the
        # default (every 700 allocations: every few requests) costs ~3 us per request; 10x fewer, 10x less.
        gc.set_threshold(10_000, 10, 10)
        if self.on_started is not None:
            ports = [s.getsockname()[1] for srv in self.servers for s in (srv.sockets or ())]
            self.on_started(ports[0] if ports else self.config.port)


def run(config: ServerConfig, *, log_level: str = "info", on_started: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; ``on_started(port)`` is called once the socket listens and models loaded."""
    app = create_serving_app(config)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        access_log=False,  # our own structured access log (dlcloud.serving.access) replaces uvicorn's
        lifespan="on",
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=10,
    )
    server = _ServingUvicorn(uv_config, on_started)
    logging.getLogger("dlcloud.serving").setLevel(log_level.upper())
    gc.collect()
    gc.freeze()
    server.run()
