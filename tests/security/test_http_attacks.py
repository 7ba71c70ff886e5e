"""Attacks on the API's inputs, each run for real and refused with its own error, leaving every table as it was:
duplicated signature headers, oversized and over-long bodies (in-process, and memory on a real ``dlcloud up``),
tar archives with huge pax or GNU long-name headers, floods of badly signed requests in the audit log, tenant
names probed through shares, names shaped like ids, paths signed as documented (reserved and control
characters, one signature on two paths), and a key asked for another tenant without a user.

The in-process tests run on SQLite and PostgreSQL (the ``env`` fixture); the real-server tests too.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import socket
import tarfile
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
import httpx
import pytest
from sqlalchemy import func, select

from dlcloud import signing
from dlcloud.client import Client, Credentials
from dlcloud.errors import DlcloudError, NotFound
from dlcloud.services import accounting
from dlcloud.store.rows import AuditRow, Base
from tests.conftest import Env, SteppedClock, assert_api_error, build_env, make_settings
from tests.e2e.conftest import Server, free_port
from tests.security.conftest import _drop_database, _fresh_postgres_database

API = "/api/v1"
MiB = 1024 * 1024
SIG = {
    "inputs": [{"name": "pixels", "datatype": "fp32", "shape": [-1, 28, 28]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
}


# --- helpers -------------------------------------------------------------------------------------------------


def _rows(env: Env) -> dict[str, int]:
    """Rows of every table: an attack refused before authentication changes none (nonces, audit included)."""
    with env.platform.db.read() as s:
        return {t.name: int(s.scalar(select(func.count()).select_from(t)) or 0) for t in Base.metadata.sorted_tables}


def _signed(creds: Credentials, method: str, path: str, query: str = "", body: bytes = b"", **kw: Any) -> dict:
    sha = kw.pop("body_sha256", hashlib.sha256(body).hexdigest())
    return signing.sign_request(creds.access_key, creds.secret_key, method, path, query, sha, **kw).headers


@dataclass
class Exchange:
    status: int
    headers: dict[str, str]
    body: bytes
    pulled: int  # body bytes the app asked for

    def json(self) -> Any:
        return json.loads(self.body)


def asgi_request(
    app: Any,
    method: str,
    raw_path: bytes,
    headers: Iterable[tuple[bytes, bytes]],
    chunks: Iterable[bytes] = (),
    query: bytes = b"",
) -> Exchange:
    """One request straight into the ASGI app, the body handed out chunk by chunk only as the app asks."""
    pulled = 0
    out: dict[str, Any] = {"body": b""}

    async def run() -> None:
        source = iter(chunks)

        async def receive() -> dict:
            nonlocal pulled
            chunk = next(source, None)
            if chunk is None:
                return {"type": "http.request", "body": b"", "more_body": False}
            pulled += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": True}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
                out["headers"] = {k.decode(): v.decode() for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                out["body"] += message.get("body", b"")

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "root_path": "",
            "query_string": query,
            "headers": [(b"host", b"testserver"), *headers],
            "client": ("127.0.0.1", 40000),
            "server": ("testserver", 80),
            "state": {},
        }
        await app(scope, receive, send)

    anyio.run(run)
    return Exchange(out["status"], out["headers"], out["body"], pulled)


def _error(status: int, body: Any, want_status: int, code: str, fragment: str | None = None) -> dict:
    assert status == want_status, body
    err = body["error"]
    assert set(err) == {"code", "message", "details"} and err["code"] == code, err
    if fragment is not None:
        assert fragment in err["message"], err["message"]
    return err


class PeakRss:
    """The highest resident set size of this process while the block runs (sampled every 5 ms)."""

    def __enter__(self) -> PeakRss:
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def growth(self) -> int:
        return self.peak - self.start

    @staticmethod
    def _rss(pid: int | str = "self") -> int:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())


def _audit_rows(env: Env, **where: Any) -> list[AuditRow]:
    with env.platform.db.read() as s:
        q = select(AuditRow).order_by(AuditRow.id)
        for name, value in where.items():
            q = q.where(getattr(AuditRow, name) == value)
        rows = list(s.scalars(q))
        s.expunge_all()
        return rows


@pytest.fixture
def small_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """The in-process API with small body limits (64 KiB requests, 256 KiB uploads) and a 1 s audit window."""
    settings = make_settings(
        tmp_path,
        db_url,
        max_request_bytes=64 * 1024,
        max_upload_bytes=256 * 1024,
        auth_failure_audit_window_seconds=1.0,
    )
    e = build_env(settings)
    with e.http:
        yield e
    e.platform.db.dispose()


# --- 1. duplicated headers ----------------------------------------------------------------------------------


def test_a_second_content_sha256_header_cannot_swap_an_uploads_body(env: Env, tmp_path: Path):
    """The reported attack: an upload signed over body A, sent with body B and B's hash in a first copy of the
    header (the route read the first copy, the signature check the last)."""
    signed_body, sent_body = _tar_gz({"train.py": b"print('signed')\n"}), _tar_gz({"train.py": b"import evil\n"})
    query = "filename=code.tar.gz&kind=archive"
    headers = _signed(env.admin_creds, "POST", f"{API}/code", query, signed_body)
    sent = [
        (signing.HEADER_CONTENT_SHA256, hashlib.sha256(sent_body).hexdigest()),
        *headers.items(),
        ("Content-Type", "application/octet-stream"),
    ]
    before = _rows(env)
    resp = env.http.post(f"{API}/code?{query}", content=sent_body, headers=sent)
    err = assert_api_error(resp, 400, "duplicate_header", "x-dlcloud-content-sha256")
    assert err["details"] == {"header": "x-dlcloud-content-sha256"}
    assert _rows(env) == before  # no code row, no nonce, no audit event


@pytest.mark.parametrize(
    "name",
    [
        signing.HEADER_KEY,
        signing.HEADER_TIMESTAMP,
        signing.HEADER_NONCE,
        signing.HEADER_SIGNATURE,
        signing.HEADER_CONTENT_SHA256,
        "X-Dlcloud-Anything",
        "Authorization",
        "Content-Length",
        "Content-Type",
        "Host",
    ],
)
def test_security_headers_sent_twice_are_refused(env: Env, name: str):
    body = json.dumps({"name": "dup", "command": "true"}).encode()
    headers = {**_signed(env.admin_creds, "POST", f"{API}/jobs", body=body), "Content-Type": "application/json"}
    defaults = {"Authorization": "Bearer x", "Content-Length": str(len(body)), "Host": "testserver"}
    value = headers.pop(name, defaults.get(name, "x"))
    sent = [*headers.items(), (name, value), (name.lower(), value)]  # the same value twice is refused too
    before = _rows(env)
    resp = env.http.post(f"{API}/jobs", content=body, headers=sent)
    assert_api_error(resp, 400, "duplicate_header", name.lower())
    assert _rows(env) == before
    assert env.admin.jobs.list() == []


# --- 2. body size limits ------------------------------------------------------------------------------------


def _flood(total: int, chunk: bytes = b"x" * 65536) -> Iterator[bytes]:
    """The body an attacker sends, in chunks (finite: where a limit is missing, the test fails, not the machine)."""
    return itertools.repeat(chunk, total // len(chunk))


def _json_headers(length: int | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    if length is None:
        return [*headers, (b"transfer-encoding", b"chunked")]
    return [*headers, (b"content-length", str(length).encode())]


def test_a_declared_length_over_the_limit_is_refused_without_reading_the_body(env: Env):
    before = _rows(env)
    r = asgi_request(env.app, "POST", f"{API}/jobs".encode(), _json_headers(400 * MiB), _flood(4 * MiB))
    err = _error(
        r.status, r.json(), 413, "payload_too_large", "request body is 419430400 bytes; the limit is 1048576 bytes"
    )
    assert err["details"] == {"limit": env.settings.max_request_bytes}
    assert r.pulled == 0 and r.headers["connection"] == "close"
    # the upload routes have their own, larger limit, also checked before reading and before authentication
    over = env.settings.max_upload_bytes + 1
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(over).encode())]
    r = asgi_request(env.app, "POST", f"{API}/code".encode(), headers, _flood(4 * MiB))
    assert _error(r.status, r.json(), 413, "payload_too_large")["details"] == {"limit": env.settings.max_upload_bytes}
    assert r.pulled == 0
    assert _rows(env) == before  # nothing authenticated, nothing audited


def test_a_body_without_a_length_is_cut_at_the_limit(small_env: Env):
    env = small_env
    before = _rows(env)
    chunk = b"x" * 4096
    for method, path in [("POST", f"{API}/jobs"), ("DELETE", f"{API}/jobs/j1"), ("GET", f"{API}/whoami")]:
        r = asgi_request(env.app, method, path.encode(), _json_headers(None), _flood(4 * MiB, chunk))
        _error(r.status, r.json(), 413, "payload_too_large", "request body exceeds the limit of 65536 bytes")
        assert 64 * 1024 < r.pulled <= 64 * 1024 + len(chunk)  # read up to the limit, not a chunk further
    assert _rows(env) == before


def test_a_chunked_upload_is_cut_at_the_upload_limit(small_env: Env):
    """Authenticated and streaming: the signature is checked first, then the body is cut at max_upload_bytes."""
    env = small_env
    query = "filename=code.tar.gz&kind=archive"
    headers = _signed(env.admin_creds, "POST", f"{API}/code", query, body_sha256="0" * 64)
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    r = asgi_request(
        env.app,
        "POST",
        f"{API}/code".encode(),
        [*raw, (b"transfer-encoding", b"chunked")],
        _flood(4 * MiB, b"y" * 8192),
        query.encode(),
    )
    _error(r.status, r.json(), 413, "payload_too_large", "upload exceeds the limit of 262144 bytes")
    assert r.pulled <= 256 * 1024 + 8192
    assert _rows(env)["code_uploads"] == 0
    assert [e.error_code for e in _audit_rows(env, action="code.upload")] == ["payload_too_large"]
    assert not list(env.settings.code_dir.rglob(".upload-*"))


def test_a_body_is_never_read_past_its_declared_length(small_env: Env):
    env = small_env
    archive = _tar_gz({"train.py": b"print(1)\n"})
    query = "filename=code.tar.gz&kind=archive"
    headers = _signed(env.admin_creds, "POST", f"{API}/code", query, archive)
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    declared = [*raw, (b"content-length", str(len(archive)).encode())]
    before = _rows(env)
    # the declared bytes, then more: refused at the first byte past the declared length
    r = asgi_request(env.app, "POST", f"{API}/code".encode(), declared, [archive, b"trailing"], query.encode())
    _error(r.status, r.json(), 400, "invalid_argument", "longer than its Content-Length")
    # fewer than declared
    headers = _signed(env.admin_creds, "POST", f"{API}/code", query, archive)
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    short = [*raw, (b"content-length", str(len(archive) + 10).encode())]
    r = asgi_request(env.app, "POST", f"{API}/code".encode(), short, [archive], query.encode())
    _error(r.status, r.json(), 400, "invalid_argument", "ended after")
    after = _rows(env)
    assert after["code_uploads"] == before["code_uploads"] == 0
    # the same upload, sent as declared, is stored
    headers = _signed(env.admin_creds, "POST", f"{API}/code", query, archive)
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    ok = [*raw, (b"content-length", str(len(archive)).encode())]
    r = asgi_request(env.app, "POST", f"{API}/code".encode(), ok, [archive], query.encode())
    assert r.status == 201, r.body
    assert _rows(env)["code_uploads"] == 1


@pytest.mark.parametrize("value", [b"-1", b"1e6", b"12 34", b"0x10", b""])
def test_a_malformed_content_length_is_refused(env: Env, value: bytes):
    before = _rows(env)
    r = asgi_request(env.app, "POST", f"{API}/jobs".encode(), [(b"content-length", value)], [b"{}"])
    _error(r.status, r.json(), 400, "invalid_argument", "Content-Length")
    assert r.pulled == 0
    assert _rows(env) == before


# --- 2b. the same on a real server: memory does not grow ----------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def real_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real ``dlcloud up``, one per backend for this module (the tests here leave its tables as they were)."""
    extra_env = {}
    pg = None
    if request.param == "postgres":
        pg = _fresh_postgres_database()
        extra_env["DLCLOUD_DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:5432/{pg[1]}"
    server = Server(tmp_path_factory.mktemp("server"), free_port(), extra_env=extra_env)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        if pg is not None:
            _drop_database(*pg)


def _high_water(server: Server) -> int:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(rest) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


def test_a_huge_unauthenticated_body_costs_the_server_no_memory(real_server: Server):
    """The reported attack: a 400 MiB unauthenticated POST raised the server to 932 MB. Now the 413 comes after
    the headers, before the body is sent; and a body without a length is cut at 1 MiB."""
    port = real_server.port
    base = _high_water(real_server)
    for path, length in [("/api/v1/jobs", 400 * MiB), ("/api/v1/code", 600 * MiB), ("/api/v1/whoami", 400 * MiB)]:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
            )
            sock.sendall(head.encode() + b"{" + b" " * 65535)  # the first 64 KiB of 400 MiB, then we wait
            status, headers, body = _response(sock)
            assert status == 413, body
            assert json.loads(body)["error"]["code"] == "payload_too_large"
            assert headers["connection"] == "close"

    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        sock.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"

        def flood() -> None:
            nonlocal sent
            try:
                while sent < 200 * MiB:
                    sock.sendall(chunk)
                    sent += 0x10000
            except OSError:  # the server answered and closed
                pass

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        status, headers, body = _response(sock)
        assert status == 413 and json.loads(body)["error"]["code"] == "payload_too_large"
        sender.join(timeout=30)
        assert not sender.is_alive()
    assert sent < 32 * MiB  # the server stopped reading at the limit (what the kernel buffered aside)
    assert _high_water(real_server) - base < 48 * MiB
    # nothing was audited: the attacker never authenticated
    with Client(_admin(real_server)) as c:
        assert c.accounting.audit(all_tenants=True) == []


# --- 3. tar archives: pax and GNU long-name headers are bounded before tarfile reads them -------------------


def _tar_gz(files: dict[str, bytes], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _metadata_bomb(path: Path, kind: bytes, size: int, member: str = "model.onnx") -> Path:
    """A .tar.gz whose first header is a ``kind`` metadata member ('x' pax, 'L' GNU long name) of ``size``
    bytes, compressed as a stream (a few hundred KB on disk), then one small file."""
    info = tarfile.TarInfo("././@PaxHeader" if kind != tarfile.GNUTYPE_LONGNAME else "././@LongLink")
    info.type, info.size = kind, size
    gz = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = b"a" * MiB
    with path.open("wb") as f:
        f.write(gz.compress(info.tobuf(format=tarfile.USTAR_FORMAT)))
        for _ in range(size // MiB):
            f.write(gz.compress(block))
        f.write(gz.compress(block[: size % MiB] + b"\0" * (-size % tarfile.BLOCKSIZE)))
        f.write(gz.compress(_raw_tar({member: b"weights"})))
        f.write(gz.flush())
    return path


def _raw_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("kind", "what"), [(tarfile.XHDTYPE, "pax extended header"), (tarfile.GNUTYPE_LONGNAME, "GNU long name or link")]
)
def test_a_huge_pax_or_long_name_header_is_refused_before_it_is_read(env: Env, tmp_path: Path, kind: bytes, what: str):
    bomb = _metadata_bomb(tmp_path / "bomb.tar.gz", kind, 300 * MiB)
    assert bomb.stat().st_size < 2 * MiB  # 300 MiB of header in a small upload
    before = _rows(env)
    for upload in (lambda: env.admin.code.upload(bomb, kind="archive"), lambda: env.admin.models.upload(bomb)):
        with PeakRss() as rss, pytest.raises(DlcloudError, match=f"{what} of {300 * MiB} bytes") as exc:
            upload()
        assert (exc.value.code, exc.value.http_status) == ("invalid_archive", 400)
        assert exc.value.details == {"limit": MiB, "size": 300 * MiB}
        assert rss.growth < 64 * MiB, f"memory grew by {rss.growth // MiB} MiB"
    assert _rows(env)["code_uploads"] == before["code_uploads"] == 0
    assert not [*env.settings.data_dir.rglob(".upload-*"), *env.settings.data_dir.rglob(".receiving-*")]
    # the same archive with a header of that kind of ordinary size is accepted
    small = _metadata_bomb(tmp_path / "small.tar.gz", kind, 200)
    assert env.admin.code.upload(small, kind="archive").id.startswith("c-")


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_archives_with_ordinary_long_names_still_upload(env: Env, tmp_path: Path, fmt: int):
    long_name = "pkg/" + "d" * 120 + "/" + "m" * 150 + ".py"
    path = tmp_path / "code.tar.gz"
    path.write_bytes(_tar_gz({"train.py": b"print(1)\n", long_name: b"x = 1\n"}, fmt))
    assert env.admin.code.upload(path, kind="archive").id.startswith("c-")


def test_sparse_files_are_refused(env: Env, tmp_path: Path):
    buf = io.BytesIO()
    info = tarfile.TarInfo("weights.bin")
    info.size = 4
    info.pax_headers = {"GNU.sparse.map": "0,4", "GNU.sparse.size": "4"}
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(b"abcd"))
    path = tmp_path / "sparse.tar.gz"
    path.write_bytes(buf.getvalue())
    with pytest.raises(DlcloudError, match="sparse files are not allowed") as exc:
        env.admin.code.upload(path, kind="archive")
    assert exc.value.code == "invalid_archive"
    assert _rows(env)["code_uploads"] == 0


# --- 4. authentication failures are counted in the audit log, not written one by one ------------------------


@pytest.fixture
def audit_clock(monkeypatch) -> SteppedClock:
    """The clock of the audit log's failure windows: stopped, so that however slow the machine, the requests of a
    window fall inside it and a new window starts only where the test moves the clock."""
    clock = SteppedClock()
    monkeypatch.setattr(accounting, "time", clock)
    return clock


def test_a_flood_of_badly_signed_requests_writes_two_audit_events(env: Env, audit_clock):
    """The reported attack: 300 badly signed requests naming a tenant's key id wrote 299 rows into its log."""
    victim = env.new_tenant_user("victim", "vera")
    key = victim.transport.creds.access_key
    forged = Credentials("http://testserver", key, "not-the-secret")
    first = env.http.get(f"{API}/whoami", headers=_signed(forged, "GET", f"{API}/whoami"))
    assert_api_error(first, 401, "bad_signature")
    rows = _audit_rows(env, access_key=key)
    assert [(r.action, r.request_id, r.tenant_name) for r in rows] == [
        ("auth.bad_signature", first.headers["x-request-id"], "victim")
    ]  # the first failure is visible at once

    for _ in range(299):
        last = env.http.post(f"{API}/jobs", json={}, headers=_signed(forged, "POST", f"{API}/jobs", body=b"{}"))
        assert last.status_code == 401
    rows = _audit_rows(env, access_key=key)
    assert [(r.action, r.tenant_name, r.status_code) for r in rows] == [("auth.bad_signature", "victim", 401)] * 2
    assert rows[1].resource == "repeated 299 more times within 60 s"
    assert rows[1].request_id == last.headers["x-request-id"]  # the latest repeat's

    # another error code of the same key has its events of its own
    skewed = env.http.get(f"{API}/whoami", headers=_signed(forged, "GET", f"{API}/whoami", timestamp=1))
    assert_api_error(skewed, 401, "clock_skew")
    assert [r.action for r in _audit_rows(env, access_key=key)] == ["auth.bad_signature"] * 2 + ["auth.clock_skew"]
    # the victim tenant's admin reads the count through the API
    lead = env.new_tenant_user("victim", "lead", role="tenant-admin")
    events = lead.accounting.audit(action="auth.bad_signature")
    assert sorted(e.resource or "" for e in events) == ["", "repeated 299 more times within 60 s"]


def test_a_new_window_records_the_next_failure_at_once(tmp_path: Path, db_url: str, audit_clock):
    env = build_env(make_settings(tmp_path, db_url, auth_failure_audit_window_seconds=0.5))
    with env.http:
        key = env.new_tenant_user("victim", "vera").transport.creds.access_key
        forged = Credentials("http://testserver", key, "not-the-secret")
        ids = []
        for pause in (0, 0, 0.6, 0):
            audit_clock.advance(pause)
            ids.append(env.http.get(f"{API}/whoami", headers=_signed(forged, "GET", f"{API}/whoami")))
        rows = _audit_rows(env, access_key=key)
        assert [(r.request_id, r.resource) for r in rows] == [
            (ids[0].headers["x-request-id"], None),
            (ids[1].headers["x-request-id"], "repeated 1 more time within 0.5 s"),
            (ids[2].headers["x-request-id"], None),
            (ids[3].headers["x-request-id"], "repeated 1 more time within 0.5 s"),
        ]
    env.platform.db.dispose()


def test_a_flood_with_made_up_key_ids_is_counted_per_client(env: Env):
    before = _rows(env)["audit_events"]
    for i in range(60):
        creds = Credentials("http://testserver", f"AK{i:018d}", "x")
        assert env.http.get(f"{API}/whoami", headers=_signed(creds, "GET", f"{API}/whoami")).status_code == 401
    rows = _audit_rows(env, action="auth.unknown_access_key")
    assert len(rows) == 2 and rows[1].resource == "repeated 59 more times within 60 s"
    assert {r.tenant_id for r in rows} == {None}  # no tenant's log
    assert _rows(env)["audit_events"] == before + 2


# --- 5. tenant names do not leak through shares -------------------------------------------------------------


def test_share_answers_alike_whether_or_not_the_tenant_exists(env: Env, tmp_path: Path):
    alice = env.new_tenant_user("acme", "alice")
    env.new_tenant_user("beta", "bob")
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(b"weights " * 64)
    alice.models.register("mnist", "onnx", artifact=artifact, signature=SIG)
    before = _rows(env)["model_shares"]
    shared = env.signed(alice.transport.creds, "POST", f"{API}/models/mnist/shares/beta")
    ghost = env.signed(alice.transport.creds, "POST", f"{API}/models/mnist/shares/gamma")
    assert (shared.status_code, ghost.status_code) == (200, 200)
    assert set(shared.json()) == set(ghost.json()) == {"tenant", "created_at"}
    assert (shared.json()["tenant"], ghost.json()["tenant"]) == ("beta", "gamma")
    assert _rows(env)["model_shares"] == before + 1  # only the real one is stored
    assert alice.models.get("mnist").shared_with == ["beta"]
    # unsharing and reading through an owner answer alike as well
    a = env.signed(alice.transport.creds, "DELETE", f"{API}/models/mnist/shares/gamma")
    b = env.signed(alice.transport.creds, "DELETE", f"{API}/models/mnist/shares/default")
    assert (
        (a.status_code, a.json()["error"]["code"]) == (b.status_code, b.json()["error"]["code"]) == (404, "not_found")
    )
    for owner in ("beta", "gamma"):
        r = env.signed(alice.transport.creds, "GET", f"{API}/models/mnist", query=f"owner={owner}")
        assert_api_error(r, 404, "model_not_found", f"model '{owner}/mnist' not found")


def test_tenant_admins_cannot_tell_tenants_apart(env: Env):
    env.new_tenant_user("beta", "bob")
    lead = env.new_tenant_user("acme", "lead", role="tenant-admin")
    creds = lead.transport.creds
    for tenant in ("beta", "gamma"):
        before = _rows(env)["users"], _rows(env)["access_keys"]
        for method, path, body, query in [
            ("POST", f"{API}/keys", {"user": "bob", "tenant": tenant}, ""),
            ("POST", f"{API}/users", {"name": "eve", "tenant": tenant}, ""),
            ("GET", f"{API}/tenants/{tenant}", None, ""),
            ("GET", f"{API}/users", None, f"tenant={tenant}"),
            ("GET", f"{API}/quota", None, f"tenant={tenant}"),
        ]:
            r = env.signed(creds, method, path, body, query)
            assert_api_error(r, 404, "not_found", f"tenant {tenant!r} not found")
        assert (_rows(env)["users"], _rows(env)["access_keys"]) == before


# --- 6. names never taken for ids ---------------------------------------------------------------------------


def test_names_shaped_like_ids_are_refused(env: Env, tmp_path: Path):
    real = env.admin.jobs.submit({"name": "real", "command": "true"})
    for name in (real.id, "j-" + "0" * 16, "m-abcdefghijklmnop", "mv-0123456789abcdef", "c-aaaaaaaaaaaaaaaa"):
        before = _rows(env)
        with pytest.raises(DlcloudError, match="has the shape of an id") as exc:
            env.admin.jobs.submit({"name": name, "command": "true"})
        assert (exc.value.code, exc.value.http_status) == ("invalid_spec", 400)
        artifact = tmp_path / "model.onnx"
        artifact.write_bytes(b"weights")
        with pytest.raises(DlcloudError, match="has the shape of an id") as exc:
            env.admin.models.register(name, "onnx", artifact=artifact, signature=SIG)
        assert (exc.value.code, exc.value.http_status) == ("invalid_argument", 400)
        after = _rows(env)
        assert {t: after[t] for t in ("jobs", "models", "model_versions")} == {
            t: before[t] for t in ("jobs", "models", "model_versions")
        }
    # names that only resemble ids are fine, and each value names one job
    for name in ("j-short", "job-0123456789abcdef", "jj-0123456789abcdef0", "j-0123456789abcdef0"):
        env.admin.jobs.submit({"name": name, "command": "true"})
    assert env.admin.jobs.get(real.id).name == "real"
    assert env.admin.jobs.get("real").id == real.id
    other = env.new_tenant_user("beta", "bob")
    with pytest.raises(NotFound):
        other.jobs.get(real.id)  # another tenant's id is not found


# --- 7. the signed path is the documented one ---------------------------------------------------------------


@pytest.mark.parametrize("escaped", ["%3F", "%23", "%5C", "%25", "%20", "%C3%A9", "%3B", "%2B", "%40"])
def test_paths_signed_as_documented_are_accepted(env: Env, escaped: str):
    """docs/api-auth.md: sign the path percent-decoded once. Each of these was a 401 or reached another path."""
    raw = f"{API}/jobs/a{escaped}b"
    decoded = unquote_to_bytes(raw).decode()
    r = env.http.get(raw, headers=_signed(env.admin_creds, "GET", decoded))
    assert_api_error(r, 404, "not_found", f"job {decoded.rsplit('/', 1)[1]!r} not found")  # authenticated
    # the SDK sends such names encoded and signs them as documented
    with pytest.raises(NotFound):
        env.admin.jobs.get(decoded.rsplit("/", 1)[1])


@pytest.mark.parametrize("escaped", ["%00", "%09", "%0A", "%0D", "%1F", "%7F", "%0a", "%FF", "%C3", "%zz", "%"])
def test_control_characters_and_bad_escapes_in_paths_are_refused(env: Env, escaped: str):
    before = _rows(env)
    raw = f"{API}/jobs/j{escaped}2".encode()
    headers = _signed(env.admin_creds, "GET", unquote_to_bytes(raw).decode("utf-8", "replace"))
    r = asgi_request(env.app, "GET", raw, [(k.lower().encode(), v.encode()) for k, v in headers.items()])
    _error(r.status, r.json(), 400, "invalid_path", "the path")
    assert _rows(env) == before  # refused before the signature: no nonce, no audit event


@pytest.mark.parametrize("char", [b"\x00", b"\t", b"\n", b"\r", b"\x7f", b" "])
def test_raw_control_characters_in_paths_are_refused(env: Env, char: bytes):
    before = _rows(env)
    path = f"{API}/jobs/j".encode() + char + b"2"
    headers = _signed(env.admin_creds, "GET", path.decode("latin-1"))
    r = asgi_request(env.app, "GET", path, [(k.lower().encode(), v.encode()) for k, v in headers.items()])
    _error(r.status, r.json(), 400, "invalid_path", "the path")
    assert _rows(env) == before


def test_one_signature_is_valid_on_one_path_only(env: Env):
    env.admin.jobs.submit({"name": "j2", "command": "true"})
    path = f"{API}/jobs/j2"
    headers = _signed(env.admin_creds, "GET", path)
    before = _rows(env)
    for other, status, code in [
        (f"{API}/jobs/j%0A2", 400, "invalid_path"),  # the reported pair: accepted on both before
        (f"{API}/jobs/j%0a2", 400, "invalid_path"),
        (f"{API}/jobs/j2%0A", 400, "invalid_path"),
        (f"{API}/jobs/j2%3F", 401, "bad_signature"),
        (f"{API}/jobs/j2?x=", 401, "bad_signature"),
        (f"{API}/jobs/J2", 401, "bad_signature"),
        (f"{API}/jobs/j2%20", 401, "bad_signature"),
    ]:
        assert_api_error(env.http.get(other, headers=headers), status, code)
    # nothing above consumed the nonce: the signature is still good, on its own path, once
    assert env.http.get(path, headers=headers).json()["name"] == "j2"
    assert_api_error(env.http.get(path, headers=headers), 401, "replayed_nonce")
    # an escaped unreserved character is the same path (RFC 3986 6.2.2.2), decoded and routed as such
    assert env.http.get(f"{API}/jobs/%6A2", headers=_signed(env.admin_creds, "GET", path)).json()["name"] == "j2"
    assert _rows(env)["jobs"] == before["jobs"]

    # a path holding a decoded '?' is not the path with a query, in either direction
    h = _signed(env.admin_creds, "GET", f"{API}/jobs/a?b")
    assert_api_error(env.http.get(f"{API}/jobs/a?b", headers=h), 401, "bad_signature")
    assert_api_error(env.http.get(f"{API}/jobs/a%3Fb", headers=h), 404, "not_found")
    h = _signed(env.admin_creds, "GET", f"{API}/jobs/a", "b=")
    assert_api_error(env.http.get(f"{API}/jobs/a%3Fb", headers=h), 401, "bad_signature")


def _admin(server: Server) -> Credentials:
    admin = json.loads((server.data_dir / "bootstrap-admin.json").read_text())
    return Credentials(server.endpoint, admin["access_key"], admin["secret_key"])


def test_paths_through_a_real_server_are_signed_as_documented(real_server: Server):
    creds = _admin(real_server)
    with httpx.Client(base_url=real_server.endpoint) as http:
        for escaped in ("%3F", "%23", "%5C", "%25"):
            decoded = f"{API}/jobs/a" + unquote_to_bytes(escaped).decode() + "b"
            r = http.get(f"{API}/jobs/a{escaped}b", headers=_signed(creds, "GET", decoded))
            assert_api_error(r, 404, "not_found")
        for escaped in ("%09", "%0A", "%0D"):
            r = http.get(f"{API}/jobs/j{escaped}2", headers=_signed(creds, "GET", f"{API}/jobs/j2"))
            assert_api_error(r, 400, "invalid_path")


# --- 8. a key for another tenant needs a user ---------------------------------------------------------------


def test_a_key_for_another_tenant_without_a_user_is_refused(env: Env):
    env.new_tenant_user("beta", "bob")
    lead = env.new_tenant_user("acme", "lead", role="tenant-admin")
    for client in (env.admin_creds, lead.transport.creds):
        for tenant in ("beta", "no-such-tenant"):
            before = _rows(env)
            r = env.signed(client, "POST", f"{API}/keys", {"tenant": tenant})
            err = assert_api_error(r, 400, "invalid_argument", f"a key for tenant {tenant!r} needs the user")
            assert "without user a key is always your own" in err["message"]
            after = _rows(env)
            assert after["access_keys"] == before["access_keys"]
    # a key of one's own, naming one's own tenant or none, is still fine
    assert env.signed(env.admin_creds, "POST", f"{API}/keys", {"tenant": "default"}).status_code == 201
    assert env.signed(env.admin_creds, "POST", f"{API}/keys", {}).status_code == 201
