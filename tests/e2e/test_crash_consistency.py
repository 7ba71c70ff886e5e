"""kill -9 of the control plane (``dlcloud up``) in the middle of storing data, with the real server and CLI:
during a large dataset upload (while the API receives it, while it stores it in the bucket, while the push
stores the version's files) and while this host's dataset cache fetches a version for a job. Nothing partial
is ever visible (no version, no object, no cache entry), what the crash leaves is what the server's sweeps
remove, and the retry completes with the right bytes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dlcloud.services.code import sweep_upload_scratch
from dlcloud.services.datasets import sweep_abandoned_pushes
from dlcloud.settings import Settings
from dlcloud.storage.local import LocalObjectStore
from dlcloud.storage.objects import scan_tree
from dlcloud.store.db import Database
from tests.conftest import wait_for
from tests.e2e.conftest import (
    DLCLOUD,
    Server,
    bucket_keys,
    bucket_multipart_uploads,
    free_port,
    s3_storage_server,
)
from tests.s3server import S3Server, s3_server_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serial]

MiB = 1024 * 1024
# 5 MiB parts (the least S3 allows): a file of a few tens of MiB is a multipart upload of several parts,
# so there is time to kill the server while one is open
SMALL_PARTS = {"DLCLOUD_S3_MULTIPART_THRESHOLD_BYTES": str(5 * MiB), "DLCLOUD_S3_MULTIPART_CHUNK_BYTES": str(5 * MiB)}


def _random_file(path: Path, mib: int) -> Path:
    """Incompressible, so that the upload is as large as the file."""
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MiB))
    return path


def _scratch(server: Server) -> Path:
    return server.data_dir / "tmp" / "uploads"


def _receiving(server: Server) -> bool:
    """The API is receiving an upload into its scratch directory."""
    scratch = _scratch(server)
    try:
        return any(p.name.startswith(".receiving-") and p.stat().st_size > 0 for p in scratch.iterdir())
    except FileNotFoundError:
        return False


def _kill_when(server: Server, proc: subprocess.Popen[str], phase: Callable[[], bool], what: str) -> None:
    """Poll ``phase`` while the CLI runs and kill -9 the server the moment it holds; fails if the CLI
    finished first."""
    wait_for(lambda: proc.poll() is not None or phase(), timeout=180, interval=0.002, what=what)
    if proc.poll() is not None:
        pytest.fail(f"the CLI ended before {what}: {proc.returncode}\n{proc.stderr.read() if proc.stderr else ''}")
    server.kill9()
    proc.wait(timeout=60)
    assert proc.returncode != 0  # the CLI saw the server go


def _create(server: Server, name: str, src: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [DLCLOUD, "datasets", "create", name, "--from", str(src), "-o", "json"],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=server.root,
    )


# large enough that each phase lasts long enough to be seen by polling on a loaded 2-core machine (a store of
# 32 MiB in 5 MiB parts could finish between two listings of the bucket's multipart uploads)
BIG_MIB = 96
UPLOAD_PHASES = [
    pytest.param("s3", "receiving", id="s3-while-receiving"),
    pytest.param("s3", "storing", id="s3-while-storing-the-upload"),
    pytest.param("s3", "pushing", id="s3-while-pushing-the-version"),
    pytest.param("local", "pushing", id="local-while-pushing-the-version"),
]


def _stored(server: Server, s3: S3Server | None, area: str) -> list[str]:
    """The objects (complete ones: what a reader could see) under ``area/`` of the server's store."""
    if s3 is not None:
        return [k for k in bucket_keys(s3, server) if k.startswith(f"{area}/")]
    root = server.data_dir / area
    # names starting with .dlcloud- are the local store's bookkeeping, never read as objects
    return sorted(
        p.relative_to(server.data_dir).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".dlcloud-")
    )


@pytest.mark.parametrize(("backend", "phase"), UPLOAD_PHASES)
def test_kill9_during_a_large_upload_leaves_nothing_visible_and_the_retry_completes(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, phase: str
) -> None:
    s3: S3Server | None = None
    if backend == "s3":
        s3 = s3_server_or_skip(request)
        server = s3_storage_server(tmp_path / "server", s3, **SMALL_PARTS)
    else:
        server = Server(tmp_path / "server", free_port())
    src = tmp_path / "big"
    src.mkdir()
    (src / "a.txt").write_text("stored first\n")
    _random_file(src / "big.bin", BIG_MIB)
    server.start()
    try:
        client = s3.client() if s3 is not None else None  # one for every poll: see bucket_multipart_uploads

        def open_multipart(area: str) -> bool:
            listed = bucket_multipart_uploads(s3, server, client) if s3 is not None else []
            return any(k.startswith(f"{area}/") for k in listed)

        phases: dict[str, Callable[[], bool]] = {
            "receiving": lambda: _receiving(server),
            "storing": lambda: open_multipart("uploads"),
            "pushing": (
                (lambda: open_multipart("datasets"))
                if s3 is not None
                else (lambda: any((server.data_dir / ".dlcloud-staging").glob("tree-*")))
            ),
        }
        _kill_when(server, _create(server, "big", src), phases[phase], f"the upload to be {phase}")

        server.start()
        # what a reader sees right after the restart: no dataset, and in the store no file of a version, only
        # (killed while pushing) some of the files of the push, under the name of its upload, which no row has
        listed = server.cli_json("datasets", "list")
        assert listed == []
        uploads_after_crash = _stored(server, s3, "uploads")
        datasets_after_crash = _stored(server, s3, "datasets")
        # an upload is stored whole or not at all: one stored before the crash is complete and waits for
        # a push (or its expiry); none is while it is received or stored
        assert len(uploads_after_crash) == (1 if phase == "pushing" else 0), uploads_after_crash
        assert all(k.split("/")[2] == "pushes" for k in datasets_after_crash), datasets_after_crash

        # the retry completes, with the right bytes
        res = server.cli("datasets", "create", "big", "--from", str(src), "-o", "json")
        version = json.loads(res.stdout)
        assert version["sha256"] == scan_tree(src).artifact_sha256()
        assert (version["file_count"], version["size_bytes"]) == (2, BIG_MIB * MiB + len("stored first\n"))
        files = server.cli_json("datasets", "files", "big")
        assert isinstance(files, list)
        assert {f["path"]: f["sha256"] for f in files} == {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()
        }
        [described] = server.cli_json("datasets", "versions", "big")
        assert described["version"] == version["version"]

        # what the crash left is invisible and removed by the server's sweeps (run every minute, for what is a
        # day old: here for everything)
        if s3 is not None:
            store = s3.new_store(server.extra_args[1].split("/", 3)[3])
            if phase != "receiving":
                assert bucket_multipart_uploads(s3, server), "killed mid-upload, yet no multipart upload was open"
            store.sweep(0.0)
            assert bucket_multipart_uploads(s3, server) == []
        else:
            assert any((server.data_dir / ".dlcloud-staging").iterdir())
            LocalObjectStore(server.data_dir).sweep(0.0)
            assert list((server.data_dir / ".dlcloud-staging").iterdir()) == []
        assert list(_scratch(server).iterdir()), "the crash left nothing in the scratch directory?"
        sweep_upload_scratch(Settings(data_dir=server.data_dir), 0.0)
        assert list(_scratch(server).iterdir()) == []
        db = Database(Settings(data_dir=server.data_dir).resolved_database_url)
        try:
            swept = sweep_abandoned_pushes(db, store if s3 is not None else LocalObjectStore(server.data_dir), 0.0)
        finally:
            db.dispose()
        assert swept == (1 if phase == "pushing" else 0)
        server.cli("datasets", "delete", "big", "--yes")
        assert _stored(server, s3, "datasets") == []
    finally:
        server.stop()


VERIFY = r"""
import hashlib, json, os, pathlib, sys

root = pathlib.Path(os.environ["DLCLOUD_DATASET_CORPUS"])
expected = json.loads(pathlib.Path("expected.json").read_text())
seen = {
    p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(root.rglob("*"))
    if p.is_file() and not p.name.startswith(".dlcloud-")
}
print(json.dumps({"root": str(root), "files": seen}))
sys.exit(0 if seen == expected else "the dataset's files are not the ones pushed")
"""


class _CacheWatch:
    """Checks, every few milliseconds until ``stop()``, that each entry of the dataset cache that is complete
    (its ``.size`` marker is there) holds every file of the tree at its full size; counts the fetches in
    progress it saw."""

    def __init__(self, cache: Path, sizes: dict[str, int]) -> None:
        self.trees, self.staging, self.sizes = cache / "trees", cache / "staging", sizes
        self.violations: list[str] = []
        self.fetching_seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _check(self) -> None:
        if self.staging.is_dir() and any(self.staging.glob("fetch-*/tree")):
            self.fetching_seen += 1
        if not self.trees.is_dir():
            return
        for marker in self.trees.glob("*.size"):
            entry = marker.with_suffix("")
            try:
                found = {p.relative_to(entry).as_posix(): p.stat().st_size for p in entry.rglob("*") if p.is_file()}
            except FileNotFoundError:  # evicted between the two looks: nothing was shown half
                continue
            if marker.exists() and found != self.sizes:
                self.violations.append(f"{entry.name}: complete by its marker, yet holds {found}")

    def _run(self) -> None:
        while not self._stop.wait(0.003):
            self._check()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_kill9_while_the_dataset_cache_fetches_shows_no_partial_entry_and_the_job_succeeds(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    s3 = s3_server_or_skip(request)
    server = s3_storage_server(tmp_path / "server", s3, **SMALL_PARTS)
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(4):  # 48 MiB to fetch; a repeated random block packs small, so the push itself is quick
        block = os.urandom(16 * 1024)
        (src / f"shard-{i}.bin").write_bytes(block * (12 * 64))
    expected = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}
    code = tmp_path / "verify"
    code.mkdir()
    (code / "verify.py").write_text(VERIFY)
    (code / "expected.json").write_text(json.dumps(expected))
    cache = server.data_dir / "cache" / "datasets"
    server.start()
    watch = _CacheWatch(cache, {p.name: p.stat().st_size for p in src.iterdir()})
    try:
        server.cli("datasets", "create", "corpus", "--from", str(src))
        # the fetch is watched while the CLI is still running: it can be over before a CLI process has exited
        submit = subprocess.Popen(
            [DLCLOUD, "jobs", "submit", "--name", "verify", "--code", str(code), "--command", "python verify.py",
             "--dataset", "corpus"],
            env=server.env, cwd=server.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: any(cache.glob("staging/fetch-*/tree/*")), timeout=120, interval=0.002,
                 what="the dataset cache to fetch the version")  # fmt: skip
        server.kill9()
        submit.wait(timeout=60)  # its answer may be lost with the server; a fetch means the job was recorded
        assert list(cache.glob("trees/*.size")) == []  # killed mid-fetch: no entry is complete
        assert list(cache.glob("staging/fetch-*")), "the crash left no fetch in progress behind?"

        server.start()
        server.cli("jobs", "logs", "verify", "--follow", timeout=300)
        job = server.cli_json("jobs", "describe", "verify")
        lines = server.cli("jobs", "logs", "verify").stdout.splitlines()
        assert isinstance(job, dict) and job["state"] == "SUCCEEDED", (job.get("reason"), lines)
        seen = json.loads(next(line for line in lines if line.startswith("{")))
        assert seen["files"] == expected
        # one complete entry, holding exactly the version's bytes the job read; the fetch the crash
        # cut short is gone, and so is the job's pin once it ended
        (marker,) = cache.glob("trees/*.size")
        entry = marker.with_suffix("")
        assert seen["root"] == "/datasets/corpus"  # the entry, bound where the job finds its datasets
        assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in entry.iterdir()} == expected
        assert list(cache.glob("staging/*")) == []
        wait_for(lambda: not any(cache.glob("pins/*/*")), timeout=60, what="the job's pin to be released")
    finally:
        watch.stop()
        server.stop()
    assert watch.violations == []
    assert watch.fetching_seen > 0
