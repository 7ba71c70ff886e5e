"""The node's cache of stored trees (storage/tree_cache.py), on a real S3 server (SeaweedFS) and the local backend.

A tree is fetched once per content, verified, read-only and shared; concurrent acquirers (threads and
processes) fetch once; eviction is least recently used first and never takes a pinned entry; CacheFull says
what is needed, the cap and what is pinned; pins survive a restart; crashes and damage leave no entry.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlcloud.storage.tree_cache as tree_cache_module
from dlcloud.storage.local import LocalObjectStore
from dlcloud.storage.objects import Manifest, ObjectDamaged, ObjectStore, StorageError
from dlcloud.storage.s3 import S3ObjectStore
from dlcloud.storage.tree_cache import CacheFull, TreeCache
from tests.s3server import S3Server, s3_server  # noqa: F401  (the fixture)

SRC = Path(tree_cache_module.__file__).resolve().parents[2]  # the dlcloud the tests import, for subprocesses
WAIT = 60.0


def _wait_for(predicate: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class CountingStore(S3ObjectStore):
    """The S3 store, writing a line to ``count_file`` per tree download; ``before_fetch`` runs before each
    download; ``fail_after_first`` makes downloads stop with a StorageError after the tree's first file."""

    count_file: Path
    before_fetch: Callable[[], None] | None = None
    fail_after_first = False

    def _get_tree(self, prefix: str, manifest: Manifest, dest: Path) -> None:
        with self.count_file.open("a") as f:
            f.write(f"{os.getpid()} {threading.get_ident()}\n")
        if self.before_fetch is not None:
            self.before_fetch()
        if self.fail_after_first:
            super()._get_tree(prefix, Manifest(manifest.entries[:1]), dest)
            raise StorageError("the connection dropped (test)")
        super()._get_tree(prefix, manifest, dest)


def _store_args(server: S3Server, prefix: str) -> dict[str, Any]:
    return {
        "bucket": server.bucket,
        "prefix": prefix,
        "endpoint_url": server.endpoint_url,
        "region": server.region,
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
    }


def _counting_store(server: S3Server, prefix: str, count_file: Path) -> CountingStore:
    args = _store_args(server, prefix)
    store = CountingStore(args.pop("bucket"), args.pop("prefix"), addressing_style="path", **args)
    store.count_file = count_file
    return store


def _fetches(count_file: Path) -> int:
    return len(count_file.read_text().splitlines()) if count_file.exists() else 0


@pytest.fixture
def s3(s3_server: S3Server, tmp_path: Path) -> CountingStore:  # noqa: F811
    return _counting_store(s3_server, s3_server.new_store().prefix, tmp_path / "fetches")


def _put(
    store: ObjectStore, prefix: str, src: Path, files: dict[str, bytes], empty_dirs: tuple[str, ...] = ()
) -> Manifest:
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    for d in empty_dirs:
        (src / d).mkdir(parents=True)
    return store.put_tree(prefix, src)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _staged(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "staging").iterdir())


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "trees").iterdir())


# -- the local backend -----------------------------------------------------------------------------------


def test_local_backend_returns_the_stores_own_tree_and_copies_nothing(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    manifest = _put(store, "datasets/t/d/1", tmp_path / "src", {"a.txt": b"a", "sub/b.bin": os.urandom(500)})
    cache = TreeCache(tmp_path / "cache", store, max_bytes=10)  # a cap the tree would not fit: nothing counts
    path = cache.acquire("datasets/t/d/1", manifest, "attempt-1")
    assert path == store.tree_local_path("datasets/t/d/1")
    assert _files(path).keys() == {"a.txt", "sub/b.bin", ".dlcloud-manifest.json"}
    assert _entries(tmp_path / "cache") == [] and _staged(tmp_path / "cache") == []
    assert cache.holders() == {"attempt-1"} and cache.usage() == (0, 0)
    cache.release("attempt-1")
    assert cache.holders() == set()
    # a record naming other content than the store holds is refused
    other = Manifest.of([*manifest.entries[:1]])
    with pytest.raises(ObjectDamaged, match="other files than its record names"):
        cache.acquire("datasets/t/d/1", other, "attempt-2")
    assert cache.holders() == set()


def test_holders_are_checked(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    manifest = _put(store, "datasets/t/d/1", tmp_path / "src", {"a": b"a"})
    cache = TreeCache(tmp_path / "cache", store, max_bytes=0)
    for bad in ("", ".", "..", "a/b", "../x", "a b", "x" * 129, "a\n"):
        with pytest.raises(ValueError, match="not a valid cache holder"):
            cache.acquire("datasets/t/d/1", manifest, bad)
        with pytest.raises(ValueError, match="not a valid cache holder"):
            cache.release(bad)
    cache.acquire("datasets/t/d/1", manifest, "a-1.B_2" + "x" * 121)  # 128 characters
    assert cache.holders() == {"a-1.B_2" + "x" * 121}


# -- fetching --------------------------------------------------------------------------------------------


def test_first_acquire_fetches_a_read_only_verified_copy_the_second_fetches_nothing(
    s3: CountingStore, tmp_path: Path
) -> None:
    files = {"train/0.bin": os.urandom(300_000), "train/1.bin": os.urandom(1000), "labels.csv": b"x,y\n"}
    manifest = _put(s3, "datasets/t/d/1", tmp_path / "src", files, empty_dirs=("val",))
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=10_000_000)
    path = cache.acquire("datasets/t/d/1", manifest, "attempt-1")
    assert path == root / "trees" / manifest.content_sha256()
    assert _files(path) == files
    assert (path / "val").is_dir() and not any((path / "val").iterdir())
    for p in [path, *path.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode == (0o555 if p.is_dir() else 0o444), p
    assert _fetches(s3.count_file) == 1 and _staged(root) == []

    requests: list[str] = []
    s3._client.meta.events.register("before-call.s3", lambda model, **kw: requests.append(model.name))
    assert cache.acquire("datasets/t/d/1", manifest, "attempt-2") == path  # another holder: the same copy
    assert requests == [] and _fetches(s3.count_file) == 1
    assert cache.holders() == {"attempt-1", "attempt-2"}
    assert cache.usage() == (manifest.size, manifest.size)
    cache.release("attempt-1")
    cache.release("attempt-2")
    assert cache.holders() == set() and cache.usage() == (manifest.size, 0)


def test_other_tenants_with_the_same_content_share_one_copy(s3: CountingStore, tmp_path: Path) -> None:
    files = {"data.bin": os.urandom(10_000)}
    one = _put(s3, "datasets/t-1/d/1", tmp_path / "src1", files)
    two = _put(s3, "datasets/t-2/e/3", tmp_path / "src2", files)
    cache = TreeCache(tmp_path / "cache", s3, max_bytes=10_000_000)
    assert cache.acquire("datasets/t-1/d/1", one, "a-1") == cache.acquire("datasets/t-2/e/3", two, "a-2")
    assert _fetches(s3.count_file) == 1 and cache.usage() == (10_000, 10_000)


CHILD = r"""
import json, os, sys, time
from pathlib import Path

from dlcloud.storage.objects import Manifest
from dlcloud.storage.s3 import S3ObjectStore
from dlcloud.storage.tree_cache import TreeCache

args = json.loads(sys.argv[1])
work = Path(args["work"])


def wait_for(predicate):
    deadline = time.monotonic() + 60
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit("timed out")
        time.sleep(0.01)


class Store(S3ObjectStore):
    def _get_tree(self, prefix, manifest, dest):
        with (work / "fetches").open("a") as f:
            f.write(f"{os.getpid()}\n")
        if args["mode"] == "crash":  # dies with the first file downloaded
            super()._get_tree(prefix, Manifest(manifest.entries[:1]), dest)
            os._exit(3)
        # the fetcher goes on once every acquirer has arrived, so the others come while it fetches
        wait_for(lambda: len(os.listdir(work / "arrived")) == args["acquirers"])
        super()._get_tree(prefix, manifest, dest)


store = Store(addressing_style="path", **args["store"])
cache = TreeCache(Path(args["root"]), store, max_bytes=10_000_000)
manifest = Manifest.from_json(args["manifest"].encode())
(work / "ready" / args["holder"]).touch()
wait_for(lambda: (work / "go").exists())
(work / "arrived" / args["holder"]).touch()
print(json.dumps({"path": str(cache.acquire(args["prefix"], manifest, args["holder"]))}))
"""


def _child(
    server: S3Server, store: S3ObjectStore, root: Path, work: Path, prefix: str, manifest: Manifest, **kw: Any
) -> subprocess.Popen[str]:
    args = {
        "work": str(work),
        "root": str(root),
        "prefix": prefix,
        "manifest": manifest.to_json().decode(),
        "store": _store_args(server, store.prefix),
        "acquirers": 0,
        **kw,
    }
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_threads_and_processes_acquiring_at_once_fetch_once(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    for d in ("ready", "arrived"):
        (work / d).mkdir(parents=True)
    store = _counting_store(s3_server, s3_server.new_store().prefix, work / "fetches")
    manifest = _put(store, "datasets/t/d/1", tmp_path / "src", {f"f{i}": os.urandom(50_000) for i in range(8)})
    root = tmp_path / "cache"
    entry = root / "trees" / manifest.content_sha256()
    procs = [
        _child(s3_server, store, root, work, "datasets/t/d/1", manifest, holder=f"proc-{i}", mode="wait", acquirers=6)
        for i in range(2)
    ]
    # the fetcher goes on once every acquirer has arrived, so the others come while it fetches
    store.before_fetch = lambda: _wait_for(lambda: len(os.listdir(work / "arrived")) == 6, "every acquirer")
    cache = TreeCache(root, store, max_bytes=10_000_000)
    results: dict[str, Path | BaseException] = {}

    def thread(holder: str) -> None:
        try:
            _wait_for(lambda: (work / "go").exists(), "go")
            (work / "arrived" / holder).touch()
            results[holder] = cache.acquire("datasets/t/d/1", manifest, holder)
        except BaseException as exc:
            results[holder] = exc

    threads = [threading.Thread(target=thread, args=(f"thread-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        _wait_for(lambda: len(os.listdir(work / "ready")) == 2, "the processes to start")
        (work / "go").touch()
        outputs = [p.communicate(timeout=WAIT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in threads:
            t.join(timeout=WAIT)
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert json.loads(out)["path"] == str(entry)
    assert results == {f"thread-{i}": entry for i in range(4)}
    assert _fetches(work / "fetches") == 1
    assert _files(entry) == _files(tmp_path / "src")
    assert cache.holders() == {"proc-0", "proc-1", *(f"thread-{i}" for i in range(4))}
    assert _staged(root) == []


# -- the cap ---------------------------------------------------------------------------------------------


def test_least_recently_used_unpinned_entries_go_first_and_pinned_ones_never(s3: CountingStore, tmp_path: Path) -> None:
    trees = {name: _put(s3, f"datasets/t/{name}/1", tmp_path / name, {"x": os.urandom(1000)}) for name in "abcd"}
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=2500)

    def acquire(name: str, holder: str) -> Path:
        return cache.acquire(f"datasets/t/{name}/1", trees[name], holder)

    a, b = acquire("a", "h-a1"), acquire("b", "h-b1")
    cache.release("h-a1")
    cache.release("h-b1")
    assert cache.usage() == (2000, 0)
    acquire("a", "h-a2")  # a is used after b now
    cache.release("h-a2")
    c = acquire("c", "h-c")  # 3000 > 2500: b, the least recently used, goes
    assert a.is_dir() and c.is_dir() and not b.exists()
    assert _entries(root) == sorted(p.name + s for p in (a, c) for s in ("", ".size"))
    assert cache.usage() == (2000, 1000) and _fetches(s3.count_file) == 3

    acquire("a", "h-a3")  # a and c pinned: b finds no room
    with pytest.raises(CacheFull, match=r"1000 bytes.*2500 bytes.*2000 bytes.*pinned.*dataset_cache_max_bytes") as err:
        acquire("b", "h-b2")
    assert err.value.code == "cache_full" and err.value.http_status == 507
    assert err.value.details == {"needed_bytes": 1000, "max_bytes": 2500, "pinned_bytes": 2000}
    assert a.is_dir() and c.is_dir() and not b.exists()
    assert cache.holders() == {"h-a3", "h-c"} and _fetches(s3.count_file) == 3 and _staged(root) == []

    cache.release("h-c")  # now c may go, a still may not
    assert acquire("b", "h-b2") == b and b.is_dir() and a.is_dir() and not c.exists()
    assert cache.usage() == (2000, 2000)

    # a tree larger than the whole cap: refused before anything is fetched or evicted
    with pytest.raises(CacheFull, match=r"3000 bytes.*2500 bytes.*2000 bytes.*pinned.*dataset_cache_max_bytes"):
        cache.acquire("datasets/t/big/1", _put(s3, "datasets/t/big/1", tmp_path / "big", {"x": b"0" * 3000}), "h-x")
    assert a.is_dir() and b.is_dir() and _fetches(s3.count_file) == 4 and "h-x" not in cache.holders()


def test_pins_survive_a_restart_and_released_entries_can_be_evicted(s3: CountingStore, tmp_path: Path) -> None:
    trees = {name: _put(s3, f"datasets/t/{name}/1", tmp_path / name, {"x": os.urandom(1000)}) for name in "abc"}
    root = tmp_path / "cache"
    first = TreeCache(root, s3, max_bytes=2000)
    a = first.acquire("datasets/t/a/1", trees["a"], "h-1")
    b = first.acquire("datasets/t/b/1", trees["b"], "h-2")

    after = TreeCache(root, s3, max_bytes=2000)  # the control plane restarted
    assert after.holders() == {"h-1", "h-2"} and after.usage() == (2000, 2000)
    with pytest.raises(CacheFull):
        after.acquire("datasets/t/c/1", trees["c"], "h-3")
    assert after.acquire("datasets/t/a/1", trees["a"], "h-3") == a and _fetches(s3.count_file) == 2
    after.release("h-1")  # reconciliation: h-1 is gone
    assert after.holders() == {"h-2", "h-3"} and after.usage() == (2000, 2000)
    after.release("h-3")
    assert after.usage() == (2000, 1000)
    c = after.acquire("datasets/t/c/1", trees["c"], "h-4")
    assert not a.exists() and b.is_dir() and c.is_dir() and after.holders() == {"h-2", "h-4"}
    assert not (root / "pins" / a.name).exists() and not (root / "locks" / f"{a.name}.lock").exists()


# -- crashes and damage ----------------------------------------------------------------------------------


def test_a_failed_fetch_leaves_no_entry_and_the_next_acquire_succeeds(s3: CountingStore, tmp_path: Path) -> None:
    files = {"a": os.urandom(5000), "b": os.urandom(5000)}
    manifest = _put(s3, "datasets/t/d/1", tmp_path / "src", files)
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=100_000)
    s3.fail_after_first = True
    with pytest.raises(StorageError, match="connection dropped"):
        cache.acquire("datasets/t/d/1", manifest, "h-1")
    assert _entries(root) == [] and _staged(root) == [] and cache.holders() == set() and cache.usage() == (0, 0)
    assert list((root / "pins").iterdir()) == []
    s3.fail_after_first = False
    assert _files(cache.acquire("datasets/t/d/1", manifest, "h-1")) == files
    assert _fetches(s3.count_file) == 2


def test_a_process_that_dies_mid_fetch_leaves_only_staging_garbage(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    for d in ("ready", "arrived"):
        (work / d).mkdir(parents=True)
    (work / "go").touch()
    store = _counting_store(s3_server, s3_server.new_store().prefix, work / "fetches")
    files = {"a": os.urandom(5000), "b": os.urandom(5000)}
    manifest = _put(store, "datasets/t/d/1", tmp_path / "src", files)
    root = tmp_path / "cache"
    proc = _child(s3_server, store, root, work, "datasets/t/d/1", manifest, holder="dead", mode="crash")
    _out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 3, err
    assert len(_staged(root)) == 1 and _entries(root) == []  # the partial download, invisible
    cache = TreeCache(root, store, max_bytes=100_000)  # the next start cleans it
    assert _staged(root) == [] and cache.usage() == (0, 0)
    assert cache.holders() == {"dead"}  # its pin stays until reconciliation releases it
    assert _files(cache.acquire("datasets/t/d/1", manifest, "h-1")) == files
    cache.release("dead")
    assert cache.holders() == {"h-1"} and _fetches(work / "fetches") == 2


def test_an_entry_without_its_marker_is_absent(s3: CountingStore, tmp_path: Path) -> None:
    files = {"a": os.urandom(5000)}
    manifest = _put(s3, "datasets/t/d/1", tmp_path / "src", files)
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=100_000)
    path = cache.acquire("datasets/t/d/1", manifest, "h-1")
    cache.release("h-1")
    # a crash between renaming the tree into place and writing its marker
    (root / "trees" / f"{path.name}.size").unlink()
    assert cache.usage() == (0, 0)
    assert _files(cache.acquire("datasets/t/d/1", manifest, "h-2")) == files and _fetches(s3.count_file) == 2
    cache.release("h-2")
    (root / "trees" / f"{path.name}.size").unlink()
    TreeCache(root, s3, max_bytes=100_000)  # a start removes it
    assert _entries(root) == []


def test_a_tampered_object_fails_the_acquire_and_leaves_no_entry(
    s3_server: S3Server,  # noqa: F811
    s3: CountingStore,
    tmp_path: Path,
) -> None:
    files = {"a": os.urandom(5000), "b": b"the original"}
    manifest = _put(s3, "datasets/t/d/1", tmp_path / "src", files)
    (entry,) = (e for e in manifest.entries if e.path == "b")
    s3_server.client().put_object(  # same size, the recorded SHA-256 kept
        Bucket=s3.bucket, Key=f"{s3.prefix}/datasets/t/d/1/b", Body=b"the altered!", Metadata={"sha256": entry.sha256}
    )
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=100_000)
    with pytest.raises(ObjectDamaged, match="damaged or altered"):
        cache.acquire("datasets/t/d/1", manifest, "h-1")
    assert _entries(root) == [] and _staged(root) == [] and cache.holders() == set()


def test_a_tree_replaced_under_its_prefix_is_refused(s3: CountingStore, tmp_path: Path) -> None:
    recorded = _put(s3, "datasets/t/d/1", tmp_path / "src1", {"a": b"one"})
    _put(s3, "datasets/t/d/1", tmp_path / "src2", {"a": b"two"})
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=100_000)
    with pytest.raises(ObjectDamaged, match="does not match its manifest entry"):
        cache.acquire("datasets/t/d/1", recorded, "h-1")
    assert _entries(root) == [] and _staged(root) == [] and cache.holders() == set()


def test_trees_that_differ_in_an_empty_directory_are_two_entries(s3: CountingStore, tmp_path: Path) -> None:
    """A tenant's copy with an extra empty class folder must never be what another tenant's job sees."""
    files = {"cats/1.jpg": b"c", "dogs/1.jpg": b"d"}
    plain = _put(s3, "datasets/a/d/1", tmp_path / "a", files)
    planted = _put(s3, "datasets/b/d/1", tmp_path / "b", files, empty_dirs=("zebras",))
    assert plain.artifact_sha256() == planted.artifact_sha256()  # the files' checksum alone cannot tell them apart
    cache = TreeCache(tmp_path / "cache", s3, max_bytes=100_000)
    seen_b = cache.acquire("datasets/b/d/1", planted, "b-1")
    seen_a = cache.acquire("datasets/a/d/1", plain, "a-1")
    assert seen_a != seen_b
    assert sorted(p.name for p in seen_a.iterdir()) == ["cats", "dogs"]
    assert sorted(p.name for p in seen_b.iterdir()) == ["cats", "dogs", "zebras"]


def _damage(entry: Path, how: str) -> None:
    """Change a cached entry behind the cache's back (as root could, or a failing disk)."""
    entry.chmod(0o755)
    (entry / "sub").chmod(0o755)
    target = entry / "sub" / "b"
    if how == "truncated":
        target.chmod(0o644)
        os.truncate(target, 10)
    elif how == "removed":
        target.unlink()
    elif how == "added":
        (entry / "planted").write_bytes(b"x")
    elif how == "replaced by a link":
        target.unlink()
        target.symlink_to(entry / "a")
    (entry / "sub").chmod(0o555)
    entry.chmod(0o555)


@pytest.mark.parametrize("how", ["truncated", "removed", "added", "replaced by a link"])
def test_a_damaged_entry_is_detected_and_fetched_again(s3: CountingStore, tmp_path: Path, how: str) -> None:
    files = {"a": os.urandom(5000), "sub/b": os.urandom(3000)}
    manifest = _put(s3, "datasets/t/d/1", tmp_path / "src", files)
    root = tmp_path / "cache"
    cache = TreeCache(root, s3, max_bytes=100_000)
    entry = cache.acquire("datasets/t/d/1", manifest, "h-1")
    cache.release("h-1")
    _damage(entry, how)
    assert cache.acquire("datasets/t/d/1", manifest, "h-2") == entry
    assert _files(entry) == files and not (entry / "sub" / "b").is_symlink()
    assert _fetches(s3.count_file) == 2 and cache.usage() == (8000, 8000) and _staged(root) == []

    # damaged while another holder still reads it: refused, left to that holder, fetched once it is released
    _damage(entry, how)
    with pytest.raises(ObjectDamaged, match="damaged copy in this node's dataset cache.*1 other job"):
        cache.acquire("datasets/t/d/1", manifest, "h-3")
    assert cache.holders() == {"h-2"} and _fetches(s3.count_file) == 2
    cache.release("h-2")
    assert _files(cache.acquire("datasets/t/d/1", manifest, "h-3")) == files
    assert _fetches(s3.count_file) == 3
