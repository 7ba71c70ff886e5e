"""User-facing errors name what the user gave, never a path of the server (SQLite and PostgreSQL): an archive
whose entries cannot be unpacked (a file, then a file under it as if it were a directory) is refused naming
the entry, for a dataset push, a model register and a code upload."""

from __future__ import annotations

import hashlib
import io
import tarfile

from dlcloud import signing
from dlcloud.client import Client
from tests.conftest import Env, assert_api_error

API = "/api/v1"


def _colliding_archive() -> bytes:
    """``model/a`` a file, then ``model/a/b``: valid headers, which only unpacking finds impossible."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name in ("model/a", "model/a/b"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def _upload(env: Env, client: Client, what: str, data: bytes, query: str = ""):
    creds = client.transport.creds
    digest = hashlib.sha256(data).hexdigest()
    headers = signing.sign_request(creds.access_key, creds.secret_key, "POST", f"{API}/{what}", query, digest)
    url = f"{API}/{what}" + (f"?{query}" if query else "")
    return env.http.post(url, content=data, headers={**headers.headers, "Content-Type": "application/octet-stream"})


def _assert_no_server_path(env: Env, message: str) -> None:
    for path in (env.settings.data_dir, env.settings.data_dir.resolve(), env.settings.runs_dir):
        assert str(path) not in message, message
    assert "/tmp" not in message and "staging" not in message, message


def test_an_archive_that_cannot_be_unpacked_is_refused_naming_its_entry_not_a_server_path(env: Env) -> None:
    alice = env.new_tenant_user("acme", "alice")
    data = _colliding_archive()

    up = _upload(env, alice, "dataset-uploads", data)
    assert up.status_code == 201, up.text
    resp = env.signed(alice.transport.creds, "POST", f"{API}/datasets/clicks/versions", {"upload": up.json()["id"]})
    err = assert_api_error(resp, 400, "invalid_archive", "cannot unpack the archive: Not a directory: 'model/a/b'")
    _assert_no_server_path(env, err["message"])

    up = _upload(env, alice, "model-uploads", data)
    assert up.status_code == 201, up.text
    body = {"name": "m", "format": "onnx", "upload": up.json()["id"]}
    resp = env.signed(alice.transport.creds, "POST", f"{API}/models", body)
    err = assert_api_error(resp, 400, "invalid_archive", "cannot unpack the archive: Not a directory: 'model/a/b'")
    _assert_no_server_path(env, err["message"])

    # a code upload is checked, not unpacked: refused for what it is, named by the name it was uploaded under
    resp = _upload(env, alice, "code", b"not an archive" * 100, "kind=archive&filename=trainer.tar.gz")
    err = assert_api_error(resp, 400, "invalid_archive", "trainer.tar.gz: not a valid tar")
    _assert_no_server_path(env, err["message"])
