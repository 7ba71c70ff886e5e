"""A real HTTP server on a free port for the metrics client tests: it records metric pushes and answers canned
GETs, and it can refuse connections (closed socket), answer 503 or 401 for a while.

It stands in for the platform's API, which these tests do not start: the reporter and the CLI are the code
under test and talk HTTP to it as they would to ``dlcloud up``.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PUSH_PATH = "/api/v1/jobs/train/metrics/push"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    status: int


@dataclass
class MetricsStub:
    port: int = field(default_factory=free_port)
    push_status: int = 204  # what a push is answered: 204, 503, 401, 400, 413 ...
    # GET path -> (status, JSON body)
    canned: dict[str, tuple[int, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def push_url(self) -> str:
        return self.url + PUSH_PATH

    def start(self) -> None:
        """Listen (again, on the same port)."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                if data:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, body: Any, status: int) -> None:
                split = urlsplit(self.path)
                with stub._lock:
                    stub.requests.append(
                        Request(self.command, split.path, parse_qs(split.query), dict(self.headers), body, status)
                    )

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = stub.push_status
                self._record(json.loads(raw), status)
                if status == 401:
                    self._answer(401, {"error": {"code": "invalid_token", "message": "token expired"}})
                elif status >= 400:
                    self._answer(status, {"error": {"code": "unavailable", "message": f"HTTP {status}"}})
                else:
                    self._answer(status)

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                status, body = stub.canned.get(
                    path, (404, {"error": {"code": "not_found", "message": f"job {path.split('/')[4]} not found"}})
                )
                self._record(None, status)
                self._answer(status, body)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        """Close the listening socket: connections are refused until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def pushes(self, status: int = 204) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.status == status]

    def points(self) -> list[dict[str, Any]]:
        """The points the server accepted, in the order they came."""
        return [p for r in self.pushes() for p in r.body["points"]]

    def steps(self, metric: str) -> list[int]:
        return [p["step"] for p in self.points() if metric in p["metrics"]]
