"""The uvicorn server both ``dlcloud up`` and ``dlcloud serve`` run: a clean SIGTERM/SIGINT stop exits 0."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import uvicorn


class Uvicorn(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown; a clean stop exits 0 here."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
