"""Datasets registered in place from objects already in a bucket (a real SeaweedFS), on SQLite and PostgreSQL:
the allow-list and the store's own prefix are enforced before anything is written, the version is pending
until a worker has read every object, jobs read the objects from the source verified against the manifest, a
changed object is refused and never cached, and a pending version survives a restart of its worker."""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud.client import Client
from dlcloud.control import dataset_sources as source_worker
from dlcloud.errors import DlcloudError
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.services import dataset_sources
from dlcloud.storage.objects import ObjectDamaged
from dlcloud.storage.tree_cache import TreeCache
from dlcloud.store.rows import DatasetRow, DatasetVersionRow, utcnow
from dlcloud.store.tenants import storage_used
from tests.conftest import Env, assert_api_error, build_env, make_settings, wait_for
from tests.s3server import S3Server, s3_server_or_skip

API = "/api/v1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
OBJECTS = {
    "train/part-0.csv": b"a,b\n1,2\n",
    "train/part-1.csv": b"a,b\n3,4\n" * 100,
    "labels.json": b'{"0": "no", "1": "yes"}',
    "empty": b"",
}


@dataclass
class World:
    env: Env
    server: S3Server
    bucket: str
    source: str  # s3://bucket/src-.../clicks: OBJECTS, in the allowed location
    allowed: str  # s3://bucket/src-...
    store_prefix: str  # the platform store's prefix in the same bucket
    alice: Client

    def put(self, rel: str, data: bytes) -> None:
        key = self.source.split("/", 3)[3] + "/" + rel
        self.server.client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def register(self, name: str, source: str | None = None) -> dict:
        return self.alice.datasets.push(name, source=source or self.source)

    def row(self, version: int = 1) -> Row:
        with self.env.platform.db.read() as s:
            r = s.scalars(select(DatasetVersionRow).where(DatasetVersionRow.version == version)).one()
            return Row(r.storage_key, r.state, r.tenant_id)


@dataclass(frozen=True)
class Row:
    storage_key: str
    state: str
    tenant_id: str


def _s3_settings(monkeypatch: pytest.MonkeyPatch, server: S3Server) -> None:
    """The credentials as an operator gives them: in the server's environment, where boto3 reads them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", server.region)


def _world(request, tmp_path: Path, db_url: str, monkeypatch, *, storage: str, executor=None, **settings) -> World:
    server = s3_server_or_skip(request)
    _s3_settings(monkeypatch, server)
    area = f"src-{secrets.token_hex(4)}"
    allowed = f"s3://{server.bucket}/{area}"
    store = server.new_store()
    storage_url = store.url if storage == "s3" else None
    values = {"dataset_source_urls": [allowed], "s3_addressing_style": "path", **settings}
    env = build_env(make_settings(tmp_path, db_url, storage_url=storage_url, **values), executor)
    alice = env.new_tenant_user("acme", "alice")
    world = World(env, server, server.bucket, f"{allowed}/clicks", allowed, store.prefix, alice)
    for rel, data in OBJECTS.items():
        world.put(rel, data)
    return world


@pytest.fixture
def world(request, tmp_path: Path, db_url: str, monkeypatch) -> Iterator[World]:
    """An S3 store and an allowed source in the same bucket; no control loop (tests run the worker)."""
    w = _world(request, tmp_path, db_url, monkeypatch, storage="s3")
    with w.env.http:
        yield w
    w.env.platform.db.dispose()


def _checksum(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256(b"dlcloud-artifact-manifest-v1\n")
    for rel, data in sorted(files.items(), key=lambda kv: kv[0].encode()):
        digest.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\0{len(data)}\n".encode())
    return digest.hexdigest()


def _store_keys(w: World) -> list[str]:
    listed = w.server.client().list_objects_v2(Bucket=w.bucket, Prefix=w.store_prefix + "/")
    return sorted(o["Key"][len(w.store_prefix) + 1 :] for o in listed.get("Contents", []))


def _counts(env: Env) -> tuple[int, int]:
    with env.platform.db.read() as s:
        return (
            int(s.scalar(select(func.count()).select_from(DatasetRow)) or 0),
            int(s.scalar(select(func.count()).select_from(DatasetVersionRow)) or 0),
        )


def test_a_version_registered_in_place_is_pending_then_ready_and_reads_the_source(world: World, tmp_path) -> None:
    w, env = world, world.env
    v = w.register("clicks")
    assert (v.version, v.state, v.source, v.sha256, v.file_count) == (1, "pending", w.source, "", 0)
    # until it is ready nothing reads it: files, download, a job
    with pytest.raises(DlcloudError, match="being registered in place") as err:
        w.alice.datasets.files("clicks", 1)
    assert err.value.code == "dataset_version_not_ready"
    with pytest.raises(DlcloudError, match="being registered in place"):
        w.alice.jobs.submit({"name": "early", "command": "true", "datasets": ["clicks@1"]})
    assert w.alice.datasets.version("clicks", 1).state == "pending"

    assert source_worker.prepare_pending(env.platform) == 1
    v = w.alice.datasets.version("clicks", 1)
    assert v.state == "ready" and v.state_reason is None
    assert v.sha256 == _checksum(OBJECTS)
    assert (v.file_count, v.size_bytes) == (len(OBJECTS), sum(map(len, OBJECTS.values())))
    files = w.alice.datasets.files("clicks", 1)
    assert {f.path: f.sha256 for f in files} == {k: hashlib.sha256(d).hexdigest() for k, d in OBJECTS.items()}
    # the platform stores the manifest only; the objects stay where they are
    stored = _store_keys(w)
    assert len(stored) == 1 and stored[0].startswith("datasets/") and stored[0].endswith("/1/.dlcloud-manifest.json")
    # no bytes count toward the tenant's storage quota: the platform stores none of them
    with env.platform.db.read() as s:
        assert storage_used(s, w.row().tenant_id) == 0

    got = w.alice.datasets.download("clicks", 1, tmp_path / "dl")
    assert {p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()} == OBJECTS

    # this host's dataset cache fetches it from the source, verified, like any version
    cache = TreeCache(tmp_path / "cache", env.platform.objects, 10**9)
    key = w.row().storage_key
    manifest = env.platform.objects.tree_manifest(key)
    assert manifest.source == w.source and manifest.artifact_sha256() == v.sha256
    local = cache.acquire(key, manifest, "holder-1")
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()} == OBJECTS

    # deleting the version deletes the manifest, never the source's objects
    w.alice.datasets.delete_version("clicks", 1)
    assert _store_keys(w) == []
    prefix = w.source.split("/", 3)[3]
    listed = w.server.client().list_objects_v2(Bucket=w.bucket, Prefix=prefix + "/")
    assert sorted(o["Key"][len(prefix) + 1 :] for o in listed["Contents"]) == sorted(OBJECTS)


def test_refused_sources_write_nothing(request, world: World, tmp_path, db_url, monkeypatch, subtests) -> None:
    w, env = world, world.env
    cases = [
        (f"s3://{w.bucket}/elsewhere/clicks", 403, "source_not_allowed", f"allowed: {w.allowed} (and below)"),
        (f"s3://{w.bucket}/{w.store_prefix}/datasets", 403, "source_not_allowed", "the platform's own storage"),
        ("s3://other-bucket/clicks", 403, "source_not_allowed", "is not a dataset source this server allows"),
        (f"{w.source}/../../elsewhere", 400, "invalid_argument", "'..'"),
        (f"s3://{w.bucket}/{w.allowed.split('/', 3)[3]}//clicks", 400, "invalid_argument", "no empty"),
        (f"{w.source}?versionId=1", 400, "invalid_argument", "no credentials"),
        ("gs://bucket/clicks", 400, "invalid_argument", "is not an s3:// URL"),
        ("file:///etc", 400, "invalid_argument", "is not an s3:// URL"),
        ("s3://B/clicks", 400, "invalid_argument", "bucket name"),
        (f"{w.allowed}/nothing-here", 400, "invalid_argument", "there is no object under"),
    ]
    for source, status, code, fragment in cases:
        with subtests.test(source=source):
            resp = env.signed(w.alice.transport.creds, "POST", f"{API}/datasets/clicks/versions", {"source": source})
            assert_api_error(resp, status, code, fragment)
    with subtests.test("upload and source together"):
        body = {"source": w.source, "upload": "du-0123456789abcdef"}
        resp = env.signed(w.alice.transport.creds, "POST", f"{API}/datasets/clicks/versions", body)
        assert resp.status_code == 422, resp.text
    assert _counts(env) == (0, 0)
    assert _store_keys(w) == []


def test_the_store_itself_is_refused_even_where_the_allow_list_covers_it(request, tmp_path, db_url, monkeypatch):
    w = _world(request, tmp_path, db_url, monkeypatch, storage="s3")
    w.env.platform.settings.dataset_source_urls.append(f"s3://{w.bucket}")  # the whole bucket, store included
    with w.env.http:
        for source in (
            f"s3://{w.bucket}/{w.store_prefix}",
            f"s3://{w.bucket}/{w.store_prefix}/datasets",
            f"s3://{w.bucket}",
        ):
            resp = w.env.signed(w.alice.transport.creds, "POST", f"{API}/datasets/clicks/versions", {"source": source})
            assert_api_error(resp, 403, "source_not_allowed", "is the platform's own storage")
        assert _counts(w.env) == (0, 0)
        # another prefix of the same bucket is fine
        assert w.register("clicks").state == "pending"
    w.env.platform.db.dispose()


def test_registering_in_place_is_off_without_an_allow_list(request, tmp_path, db_url, monkeypatch) -> None:
    w = _world(request, tmp_path, db_url, monkeypatch, storage="local", dataset_source_urls=[])
    with w.env.http:
        resp = w.env.signed(w.alice.transport.creds, "POST", f"{API}/datasets/clicks/versions", {"source": w.source})
        err = assert_api_error(resp, 403, "source_not_allowed", "registering datasets in place is off")
        assert err["details"] == {"allowed": []}
        assert _counts(w.env) == (0, 0)
    w.env.platform.db.dispose()


def test_an_object_changed_after_registration_is_refused_and_never_cached(world: World, tmp_path) -> None:
    w, env = world, world.env
    w.register("clicks")
    source_worker.prepare_pending(env.platform)
    w.put("train/part-0.csv", b"a,b\n9,9\n")  # same size, other bytes
    key = w.row().storage_key
    manifest = env.platform.objects.tree_manifest(key)
    cache = TreeCache(tmp_path / "cache", env.platform.objects, 10**9)
    with pytest.raises(ObjectDamaged, match="changed in its bucket after the dataset version was registered"):
        cache.acquire(key, manifest, "holder-1")
    assert cache.usage() == (0, 0) and cache.holders() == set()
    assert not any((tmp_path / "cache" / "trees").iterdir())
    with pytest.raises(DlcloudError, match="checksum"):
        w.alice.datasets.download("clicks", 1, tmp_path / "dl")
    assert not (tmp_path / "dl").exists()


def test_a_job_reads_a_version_registered_in_place(request, tmp_path, db_url, monkeypatch) -> None:
    """A running platform on local storage: the job's data comes from the source through this host's cache."""
    from tests.integration.test_datasets import READER, _tar_gz

    w = _world(request, tmp_path, db_url, monkeypatch, storage="local", executor=LocalExecutor())
    env = w.env
    assert env.control is not None
    stop = threading.Event()
    loop = threading.Thread(target=env.control.run, args=(stop,), daemon=True)
    worker = source_worker.SourceWorker(env.platform)
    background = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    loop.start()
    background.start()
    try:
        with env.http:
            assert w.register("click-log").state == "pending"
            worker.wake()
            v = wait_for(
                lambda: (x := w.alice.datasets.version("click-log", 1)).state != "pending" and x, 30, what="ready"
            )
            assert v.state == "ready", v
            code = tmp_path / "code.tar.gz"
            code.write_bytes(_tar_gz({"reader.py": READER.encode()}))
            up = w.alice.code.upload(code)
            spec = {"name": "reader", "code": up.id, "command": "python reader.py", "datasets": ["click-log@1"]}
            w.alice.jobs.submit(spec)
            job = wait_for(lambda: (j := w.alice.jobs.get("reader")).state in TERMINAL and j, 60, what="reader")
            lines = [line.text for line in w.alice.jobs.logs("reader") if line.stream == "stdout"]
            assert job.state == "SUCCEEDED", (job.reason, lines)
            seen = json.loads(lines[0])
            assert seen["files"] == sorted(OBJECTS) and seen["part1"] == 100
            path = Path(seen["datasets"]["click-log"])
            # the source's objects, in this host's cache: not the local store's directory, which holds the manifest
            cache = env.settings.data_dir / "cache" / "datasets"
            assert len([p for p in (cache / "trees").iterdir() if p.is_dir()]) == 1
            assert path == Path("/datasets/click-log") or path.is_relative_to(cache)  # sandboxed, or bare
            assert env.control.executor.data_cache.holders() == set()
    finally:
        stop.set()
        env.control.wake()
        worker.wake()
        loop.join(timeout=10)
        background.join(timeout=10)
        env.platform.db.dispose()


def test_names_and_limits_the_rules_refuse_fail_the_version(request, tmp_path, db_url, monkeypatch, subtests) -> None:
    w = _world(request, tmp_path, db_url, monkeypatch, storage="s3", max_archive_members=6)
    cases = [
        ("reserved", {"ok.txt": b"x", ".dlcloud-manifest.json": b"{}"}, "names starting with '.dlcloud-' are reserved"),
        ("clash", {"a": b"x", "a/b": b"y"}, "is both a file and a directory"),
        ("many", {f"f{i}": b"x" for i in range(7)}, "more than 6 files and directories"),
        ("deep", {"/".join(["d"] * 33) + "/f": b"x"}, "levels deep"),
    ]
    with w.env.http:
        for n, (name, objects, reason) in enumerate(cases, start=1):
            with subtests.test(name):
                for rel, data in objects.items():
                    key = f"{w.allowed.split('/', 3)[3]}/{name}/{rel}"
                    w.server.client().put_object(Bucket=w.bucket, Key=key, Body=data)
                w.register("bad", f"{w.allowed}/{name}")
                source_worker.prepare_pending(w.env.platform)
                v = w.alice.datasets.version("bad", n)
                assert v.state == "failed" and reason in v.state_reason, v
                with pytest.raises(DlcloudError, match="failed to register") as err:
                    w.alice.datasets.files("bad", n)
                assert err.value.code == "dataset_version_not_ready"
                with pytest.raises(DlcloudError, match="failed to register"):
                    w.alice.jobs.submit({"name": f"j{n}", "command": "true", "datasets": [f"bad@{n}"]})
        assert _store_keys(w) == []  # a failed version stores nothing
    w.env.platform.db.dispose()


def test_a_pending_version_survives_a_restart(world: World) -> None:
    w, env = world, world.env
    w.register("clicks")
    host = socket.gethostname()

    def claim(holder: str, age: timedelta) -> None:
        with env.platform.db.write() as s:
            row = s.scalars(select(DatasetVersionRow)).one()
            row.claimed_by, row.claimed_at = holder, utcnow() - age

    # another host's worker, alive a moment ago: left to it
    claim("other-host:123:abcd", timedelta(seconds=1))
    assert source_worker.prepare_pending(env.platform) == 0
    assert w.row().state == "pending"
    # ... until its claim is older than the lease: taken over
    claim("other-host:123:abcd", dataset_sources.LEASE + timedelta(seconds=1))
    assert source_worker.prepare_pending(env.platform) == 1
    assert w.row().state == "ready"

    # a server of this host that crashed (its process is gone) mid-read: resumed at once by the next start
    w.register("clicks")
    dead = _dead_pid()
    with env.platform.db.write() as s:
        row = s.scalars(select(DatasetVersionRow).where(DatasetVersionRow.version == 2)).one()
        row.claimed_by, row.claimed_at = f"{host}:{dead}:0000", utcnow()
    worker = source_worker.SourceWorker(env.platform)  # the restarted server's
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: w.row(2).state == "ready", 30, what="the resumed version to be ready")
    finally:
        stop.set()
        worker.wake()
        thread.join(timeout=10)
    assert w.alice.datasets.version("clicks", 2).sha256 == _checksum(OBJECTS)


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
