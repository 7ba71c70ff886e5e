"""e2e fixtures: the real server (``dlcloud up`` on a free port, temp data dir) and the real CLI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import WORKER_ENV, wait_for
from tests.s3server import S3Server

DLCLOUD = str(Path(sys.executable).parent / "dlcloud")
# e2e servers run the API in one process unless a test asks for more: the default (one API process per core,
# and one more for the scheduler) triples the processes each test starts on a 2-core CI machine. What N processes
# change is tested where it is asked for (test_api_workers.py: --api-workers 2) and as a user meets it: the
# README tour starts `dlcloud up` as written, with the default.
SERVER_ENV = {"DLCLOUD_API_WORKERS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    root: Path
    port: int
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. DLCLOUD_DATABASE_URL
    run_as: int | None = None  # a uid (= gid) to run the server as, from root (setpriv)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def env(self) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
        e.update(WORKER_ENV)
        e.update(SERVER_ENV)
        e["XDG_CONFIG_HOME"] = str(self.root / "config")
        e["HOME"] = str(self.root / "home")
        e["COLUMNS"] = "200"
        return {**e, **self.extra_env}

    def start(self) -> None:
        (self.root / "home").mkdir(parents=True, exist_ok=True)
        log = (self.root / "server.log").open("ab")
        argv = [DLCLOUD, "up", "--port", str(self.port), "--data-dir", str(self.data_dir), *self.extra_args]
        if self.run_as is not None:
            argv = ["setpriv", f"--reuid={self.run_as}", f"--regid={self.run_as}", "--clear-groups", "--", *argv]
        self.proc = subprocess.Popen(
            argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"dlcloud up exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.endpoint}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail(f"server not ready in 60 s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def log(self) -> str:
        p = self.root / "server.log"
        return p.read_text(errors="replace")[-5000:] if p.exists() else ""

    def cli(
        self, *args: str, check: bool = True, timeout: float = 180, cwd: Path | None = None
    ) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [DLCLOUD, *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd or self.root
        )
        if check and res.returncode != 0:
            pytest.fail(
                f"dlcloud {' '.join(args)} exited {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
            )
        return res

    def cli_json(self, *args: str) -> object:
        return json.loads(self.cli(*args, "-o", "json").stdout)


@dataclass
class Serve:
    """A running ``dlcloud serve``; its stdout and stderr go to ``log``."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"dlcloud serve exited with {self.proc.returncode}:\n{self.output()[-5000:]}")
        try:
            return httpx.get(f"{self.url}/v2/health/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False


@contextmanager
def dlcloud_serve(args: list[str], env: dict[str, str], log: Path) -> Iterator[Serve]:
    """``dlcloud serve *args --port <free port>``, yielded once ``/v2/health/ready`` answers 200 (up to 120 s).

    The test stops it as it likes (SIGTERM, say); whatever still runs when the block ends is killed.
    """
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [DLCLOUD, "serve", *args, "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    serve = Serve(proc, port, log)
    try:
        wait_for(serve.ready, timeout=120, interval=0.1, what="dlcloud serve to be ready")
        yield serve
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path, free_port())
    s.start()
    try:
        yield s
    finally:
        s.stop()


def s3_storage_server(root: Path, s3: S3Server, **env: str) -> Server:
    """A ``Server`` (not started) whose store is a fresh prefix of the session's SeaweedFS bucket, with the
    endpoint and credentials in AWS_* variables as an operator gives them (docs/storage.md); ``env`` adds
    DLCLOUD_* settings. Its store's URL is ``server.extra_args[1]``."""
    prefix = "e2e-" + secrets.token_hex(6)
    aws = {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
        "DLCLOUD_S3_ADDRESSING_STYLE": "path",
    }
    return Server(root, free_port(), ["--storage-url", f"s3://{s3.bucket}/{prefix}"], extra_env={**aws, **env})


def bucket_keys(s3: S3Server, server: Server) -> list[str]:
    """The keys of every object under the server's prefix, relative to it, sorted."""
    prefix = server.extra_args[1].split("/", 3)[3] + "/"
    keys: list[str] = []
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        keys += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
    return sorted(keys)


def bucket_multipart_uploads(s3: S3Server, server: Server, client: Any = None) -> list[str]:
    """The keys (relative to the server's prefix) of unfinished multipart uploads under it. ``client``: one from
    ``s3.client()`` to reuse (a poll that builds a client each time looks once every tens of milliseconds, and
    misses a phase that short)."""
    prefix = server.extra_args[1].split("/", 3)[3] + "/"
    listed = (client or s3.client()).list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
    return sorted(u["Key"][len(prefix) :] for u in listed.get("Uploads") or ())
