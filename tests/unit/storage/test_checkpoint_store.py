"""A job's saved checkpoints in the object store (``storage/checkpoint_store.py``), on both backends: saves alternate
between two slots and the pointer names a whole one only; a save that fails half-way, or a last save damaged
afterwards, leaves the one before readable; nothing saved reads as None."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.errors import DlcloudError
from dlcloud.storage import checkpoint_store
from dlcloud.storage.local import LocalObjectStore
from dlcloud.storage.objects import ObjectDamaged, ObjectStore, scan_tree

PREFIX = "jobs/t1/j1/checkpoints"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "store")
        return
    from tests.s3server import s3_server_or_skip

    yield s3_server_or_skip(request).new_store()


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _read(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _save(store: ObjectStore, tmp_path: Path, name: str, files: dict[str, bytes]) -> checkpoint_store.SavedCheckpoint:
    src = _tree(tmp_path / name / "tree", files)
    return checkpoint_store.save(store, PREFIX, src, scan_tree(src))


def test_nothing_saved_reads_as_none(store: ObjectStore, tmp_path: Path) -> None:
    assert checkpoint_store.latest(store, PREFIX) is None
    assert checkpoint_store.restore(store, PREFIX, tmp_path / "out") is None
    assert not (tmp_path / "out").exists()


def test_saves_alternate_slots_and_the_last_one_is_restored(store: ObjectStore, tmp_path: Path) -> None:
    first = _save(store, tmp_path, "one", {"step-1.pt": b"1", "opt/state": b"s1"})
    second = _save(store, tmp_path, "two", {"step-2.pt": b"22"})
    third = _save(store, tmp_path, "three", {"step-3.pt": b"333"})
    assert [first.slot, second.slot, third.slot] == ["a", "b", "a"]
    assert (third.files, third.bytes) == (1, 3)
    assert checkpoint_store.latest(store, PREFIX) == third
    restored = checkpoint_store.restore(store, PREFIX, tmp_path / "out")
    assert restored == third
    assert _read(tmp_path / "out") == {"step-3.pt": b"333"}  # the slot's earlier files went with its rewrite


def test_a_save_that_fails_half_way_leaves_the_one_before(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _save(store, tmp_path, "one", {"step-1.pt": b"1"})
    src = _tree(tmp_path / "two" / "tree", {"step-2.pt": b"22"})
    manifest = scan_tree(src)
    (src / "step-2.pt").write_bytes(b"changed after it was scanned")  # the upload finds it differs: fails
    with pytest.raises(DlcloudError):
        checkpoint_store.save(store, PREFIX, src, manifest)
    assert checkpoint_store.latest(store, PREFIX) == before
    assert checkpoint_store.restore(store, PREFIX, tmp_path / "out") == before
    assert _read(tmp_path / "out") == {"step-1.pt": b"1"}


def _damage_slot(store: ObjectStore, slot: str, rel: str) -> None:
    key = f"{PREFIX}/{slot}/{rel}"
    if isinstance(store, LocalObjectStore):
        path = store.root / key
        path.chmod(0o644)
        path.write_bytes(b"rot")
        return
    store._client.put_object(Bucket=store.bucket, Key=store._full(key), Body=b"rot")  # type: ignore[attr-defined]


def test_a_damaged_last_save_gives_the_one_before(store: ObjectStore, tmp_path: Path) -> None:
    _save(store, tmp_path, "one", {"step-1.pt": b"1"})
    last = _save(store, tmp_path, "two", {"step-2.pt": b"22"})
    _damage_slot(store, last.slot, "step-2.pt")
    restored = checkpoint_store.restore(store, PREFIX, tmp_path / "out")
    assert restored is not None and restored.slot == "a" and restored.saved_at is None
    assert _read(tmp_path / "out") == {"step-1.pt": b"1"}


def test_both_saves_damaged_is_an_error_not_an_empty_start(store: ObjectStore, tmp_path: Path) -> None:
    _save(store, tmp_path, "one", {"step-1.pt": b"1"})
    _save(store, tmp_path, "two", {"step-2.pt": b"22"})
    _damage_slot(store, "a", "step-1.pt")
    _damage_slot(store, "b", "step-2.pt")
    with pytest.raises(ObjectDamaged):
        checkpoint_store.restore(store, PREFIX, tmp_path / "out")


def test_an_unreadable_pointer_is_no_save(store: ObjectStore, tmp_path: Path) -> None:
    _save(store, tmp_path, "one", {"step-1.pt": b"1"})
    bad = tmp_path / "latest"
    for body in (b"not json", b'{"slot": "c", "saved_at": "x", "files": 1, "bytes": 1}', b"x" * 5000):
        bad.write_bytes(body)
        store.put_file(f"{PREFIX}/{checkpoint_store.LATEST}", bad)
        assert checkpoint_store.latest(store, PREFIX) is None
