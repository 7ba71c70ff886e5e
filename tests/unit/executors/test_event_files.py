"""Reading TensorBoard event files (``executors/event_files.py`` and the reader it runs): incremental by offset,
a record still being written read once it is whole, TF1 tags whose metadata comes once, and files an attacker
wrote — garbage, a header claiming a huge length, a bad checksum, thousands of tags, links, a FIFO, a reader
that never finishes — each bounded, none blocking the others. Real files, a real reader process; on the local
executor, the reader in its sandbox as the tenant's uid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlcloud.executors import event_files as ef
from dlcloud.executors.base import Workload
from dlcloud.executors.local.executor import TENSORBOARD, LocalExecutor
from dlcloud.settings import Settings
from dlcloud.storage.stores import open_object_store
from tests.tensorboard_files import file_version, framed, huge_header, scalar_event, tensor_event

NOW = time.time()


def _write(path: Path, *records: bytes, mode: str = "ab") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as f:
        for r in records:
            f.write(r)


def _points(read: ef.EventRead) -> list[tuple[str, str, int, float]]:
    return [(s.replica, s.metric, s.step, s.value) for s in read.scalars]


def test_each_pass_reads_what_was_appended_and_a_torn_record_once_it_is_whole(tmp_path: Path) -> None:
    f = tmp_path / "events.out.tfevents.1.host"
    _write(f, framed(file_version(NOW)), *(framed(scalar_event(s, NOW, {"loss": 0.5**s})) for s in range(3)))
    cursor = ef.EventCursor()
    first = ef.read(tmp_path, cursor, since=0)
    assert _points(first) == [("", "loss", s, 0.5**s) for s in range(3)]  # simple_value: float32, exact here
    assert not first.more and not first.problems
    assert ef.read(tmp_path, cursor, since=0).scalars == []  # nothing new: nothing read (no process either)

    torn = framed(scalar_event(4, NOW, {"loss": 0.0625}))
    _write(f, framed(scalar_event(3, NOW, {"loss": 0.25})), torn[:10])  # the writer is in the middle of a record
    assert _points(ef.read(tmp_path, cursor, since=0)) == [("", "loss", 3, 0.25)]
    assert cursor.files[f.name].offset == f.stat().st_size - 10  # the end of the last complete record
    _write(f, torn[10:-3])
    assert ef.read(tmp_path, cursor, since=0).scalars == []
    _write(f, torn[-3:])
    assert _points(ef.read(tmp_path, cursor, since=0)) == [("", "loss", 4, 0.0625)]
    assert not cursor.files[f.name].dead

    # a new cursor (a restarted control plane) reads everything again, from the start
    assert len(ef.read(tmp_path, ef.EventCursor(), since=0).scalars) == 5


def test_runs_prefix_names_tf1_metadata_once_other_plugins_and_replicas(tmp_path: Path) -> None:
    # TF2: tensors of the scalars plugin, metadata with each; TF1 tensor summaries: metadata on the first only
    _write(tmp_path / "validation" / "events.out.tfevents.2", framed(tensor_event(0, NOW, "accuracy", 0.5)))
    _write(
        tmp_path / "train" / "events.out.tfevents.3",
        framed(tensor_event(0, NOW, "lr", 0.1)),
        framed(tensor_event(0, NOW, "hist", 7.0, plugin="histograms")),  # not a scalar, though it holds one
        framed(tensor_event(1, NOW, "lr", 0.05, plugin=None)),
    )
    _write(tmp_path / "worker-1" / "train" / "events.out.tfevents.4", framed(scalar_event(5, NOW, {"loss": 2.0})))
    _write(tmp_path / "notes.txt", b"not an event file")
    cursor = ef.EventCursor()
    read = ef.read(tmp_path, cursor, since=0, replicas=("worker-0", "worker-1"))
    assert sorted(_points(read)) == [
        ("", "train/lr", 0, pytest.approx(0.1)),
        ("", "train/lr", 1, pytest.approx(0.05)),
        ("", "validation/accuracy", 0, 0.5),
        ("worker-1", "train/loss", 5, 2.0),
    ]
    # the next pass knows lr is a scalar although the value it reads carries no metadata
    _write(tmp_path / "train" / "events.out.tfevents.3", framed(tensor_event(2, NOW, "lr", 0.025, plugin=None)))
    assert _points(ef.read(tmp_path, cursor, since=0)) == [("", "train/lr", 2, pytest.approx(0.025))]
    assert read.scalars[0].wall_time == pytest.approx(NOW)


def test_an_earlier_attempts_files_and_records_are_left_alone(tmp_path: Path) -> None:
    old = tmp_path / "events.out.tfevents.old"
    _write(old, framed(scalar_event(1, NOW - 100, {"loss": 1.0})))
    os.utime(old, (NOW - 100, NOW - 100))
    shared = tmp_path / "events.out.tfevents.shared"  # appended by both attempts
    _write(shared, framed(scalar_event(1, NOW - 100, {"acc": 0.5})), framed(scalar_event(2, NOW + 1, {"acc": 0.25})))
    read = ef.read(tmp_path, ef.EventCursor(), since=NOW - 10)
    assert _points(read) == [("", "acc", 2, 0.25)]


def test_hostile_files_are_read_no_more_and_never_block_the_others(tmp_path: Path) -> None:
    good = tmp_path / "z" / "events.out.tfevents.good"
    _write(good, framed(scalar_event(1, NOW, {"ok": 1.0})))
    _write(tmp_path / "events.out.tfevents.garbage", os.urandom(4096))
    # a valid record, then a header whose checksum holds claiming 2^62 bytes: no allocation of that size
    huge = tmp_path / "events.out.tfevents.huge"
    _write(huge, framed(scalar_event(1, NOW, {"before": 3.0})), huge_header(2**62), b"x" * 64)
    bad_crc = bytearray(framed(scalar_event(2, NOW, {"flipped": 1.0})))
    bad_crc[-1] ^= 0xFF
    _write(tmp_path / "events.out.tfevents.crc", framed(scalar_event(1, NOW, {"fine": 1.0})), bytes(bad_crc))
    _write(tmp_path / "events.out.tfevents.proto", framed(os.urandom(200)))  # a whole record that is no Event
    os.mkfifo(tmp_path / "events.out.tfevents.fifo")  # opening it for reading must not hang the walk or reader
    outside = tmp_path.parent / "secret.tfevents"
    _write(outside, framed(scalar_event(1, NOW, {"leaked": 1.0})))
    (tmp_path / "events.out.tfevents.link").symlink_to(outside)
    (tmp_path / "linked-dir").symlink_to(tmp_path.parent)

    cursor = ef.EventCursor()
    read = ef.read(tmp_path, cursor, since=0)
    assert sorted(_points(read)) == [("", "before", 1, 3.0), ("", "fine", 1, 1.0), ("", "z/ok", 1, 1.0)]
    dead = {rel: fc.dead for rel, fc in cursor.files.items() if fc.dead}
    assert set(dead) == {"events.out.tfevents.garbage", "events.out.tfevents.huge", "events.out.tfevents.crc"}
    assert "claims 4611686018427387904 bytes" in dead["events.out.tfevents.huge"]
    assert "checksum" in dead["events.out.tfevents.crc"]
    assert not read.more
    assert len([p for p in read.problems if "read no more" in p]) == 3
    # a dead file is not read again when it grows; the good one goes on
    _write(tmp_path / "events.out.tfevents.garbage", framed(scalar_event(9, NOW, {"late": 1.0})))
    _write(good, framed(scalar_event(2, NOW, {"ok": 2.0})))
    assert _points(ef.read(tmp_path, cursor, since=0)) == [("", "z/ok", 2, 2.0)]


def test_tags_points_and_files_are_bounded_per_pass_and_the_rest_comes_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # thousands of tags: at most MAX_TAGS are followed, in all files together
    _write(tmp_path / "events.out.tfevents.tags", framed(scalar_event(0, NOW, {f"t{i}": i for i in range(3000)})))
    monkeypatch.setattr(ef, "MAX_POINTS_PER_PASS", 500)
    many = tmp_path / "events.out.tfevents.many"
    _write(many, *(framed(scalar_event(s, NOW, {"loss": float(s)})) for s in range(1200)))
    cursor = ef.EventCursor()
    seen: list[tuple[str, str, int, float]] = []
    passes = 0
    while True:
        read = ef.read(tmp_path, cursor, since=0)
        passes += 1
        assert len(read.scalars) <= 500
        seen += _points(read)
        if not read.more:
            break
        assert passes < 10
    assert passes >= 3
    assert sorted(p[2] for p in seen if p[1] == "loss") == list(range(1200))  # every point, once
    # MAX_TAGS tags followed ("loss" is one); of the one record holding more values than a pass may take, what
    # a pass may take, the rest dropped
    assert sum(len(fc.tags) for fc in cursor.files.values()) == ef.MAX_TAGS
    assert len({p[1] for p in seen if p[1] != "loss"}) == 500

    # more event files than followed: the first MAX_FILES, said once per pass
    monkeypatch.setattr(ef, "MAX_FILES", 3)
    other = tmp_path / "more"
    for i in range(5):
        _write(other / f"events.out.tfevents.{i}", framed(scalar_event(0, NOW, {"x": float(i)})))
    read = ef.read(other, ef.EventCursor(), since=0)
    assert len(read.scalars) == 3 and any("more than 3 event files" in p for p in read.problems)


def test_a_reader_that_never_finishes_gives_up_on_its_file_only(tmp_path: Path, monkeypatch) -> None:
    _write(tmp_path / "a" / "events.out.tfevents.1", framed(scalar_event(1, NOW, {"x": 1.0})))
    _write(tmp_path / "b" / "events.out.tfevents.1", framed(scalar_event(1, NOW, {"y": 1.0})))
    monkeypatch.setattr(ef, "WALL_SECONDS", 0.001)  # killed before it answers: as a reader stuck on a file
    cursor = ef.EventCursor()
    for _ in range(ef.MAX_FAILURES):
        read = ef.read(tmp_path, cursor, since=0)
        assert read.scalars == [] and read.problems
    assert cursor.files["a/events.out.tfevents.1"].dead.startswith("the reader failed on it 3 times (was killed")
    monkeypatch.setattr(ef, "WALL_SECONDS", 20.0)
    assert _points(ef.read(tmp_path, cursor, since=0)) == [("", "b/y", 1, 1.0)]


def test_the_local_executor_reads_as_the_tenants_uid_in_its_sandbox_and_opens_nothing(tmp_path: Path) -> None:
    ex = LocalExecutor()
    if not ex.sandbox.enabled:
        pytest.skip(f"no sandbox on this host: {ex.sandbox.reason}")
    settings = Settings(data_dir=tmp_path / "data")
    objects = open_object_store(settings)
    ex.bind(settings, objects, ex.environments(settings, objects))
    handle = ex.handle("t1", "j1", 1)
    top = Path(handle).parent / TENSORBOARD
    top.mkdir(parents=True, mode=0o700)
    f = top / "train" / "events.out.tfevents.1"
    _write(f, framed(scalar_event(3, NOW, {"loss": 0.5})))
    os.chmod(f, 0o600)
    os.chmod(f.parent, 0o700)
    uid = ex.sandbox.uid_for(7)
    if uid is not None:  # as the tenant's jobs would have left them: theirs, closed to everyone else
        for p in (top, f.parent, f):
            os.chown(p, uid, uid)
    prefix = ex.reader_prefix([top], 7)
    assert prefix is not None and prefix[0] == ex.sandbox.bwrap
    if uid is not None:
        assert f"--reuid={uid}" in prefix
    # what a parser made to run the attacker's code could do in there: read the directory; nothing else
    secret = settings.data_dir / "server.key"
    secret.write_text("not for tenants")
    listener = socket.create_server(("127.0.0.1", 0))
    probe = f"""
import os, socket, sys
print(sorted(os.listdir({str(top)!r})))
for i, attempt in enumerate((lambda: open({str(top / "x")!r}, "w"), lambda: open({str(secret)!r}),
                lambda: socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=2))):
    try:
        attempt()
        sys.exit(f"allowed: {{i}}")
    except OSError:
        pass
"""
    done = subprocess.run([*prefix, sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    listener.close()
    assert done.returncode == 0 and done.stdout.strip() == "['train']", done.stderr
    read = ex.read_event_files(handle, ef.EventCursor(), since=0, sandbox_slot=7, replicas=())
    assert _points(read) == [("", "train/loss", 3, 0.5)]
    assert (f.stat().st_mode & 0o777, f.parent.stat().st_mode & 0o777) == (0o600, 0o700)  # nothing opened up
    assert f.stat().st_uid == (uid if uid is not None else os.getuid())


def test_the_local_executor_gives_every_attempt_a_tensorboard_dir_and_each_replica_its_own(tmp_path: Path) -> None:
    ex = LocalExecutor()
    settings = Settings(data_dir=tmp_path / "data")
    objects = open_object_store(settings)
    ex.bind(settings, objects, ex.environments(settings, objects))
    handle = ex.handle("t1", "j2", 1)
    run = ex._prepare(handle, Workload(job_id="j2", tenant_id="t1", attempt=1, command="true"), Path(handle))
    assert run is not None
    top = Path(handle).parent / TENSORBOARD
    # in a sandbox the job sees it at a neutral path (job_view.py); bare, at the host's
    seen = "/job/tensorboard" if ex.runner.sandbox.enabled else str(top)
    assert run.env["DLCLOUD_TENSORBOARD_DIR"] == seen and top in run.data_dirs
