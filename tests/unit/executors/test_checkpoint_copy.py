"""``checkpoint_from`` on this host: the copy of another job's checkpoint directory (``executors/local/
checkpoints.py``) treats the source as an attacker wrote it, and the local executor makes it while preparing the
first attempt. The source directories here are built as a hostile job would leave them: links to files and
directories outside, a FIFO, a socket, one file under many names (hard links) to make the copy fill the disk. The
copy is bounded (entries, bytes, the disk's free space), stops when the attempt is stopped, and two preparations of
one attempt (a deposed leader and its successor) end with one whole copy."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dlcloud.executors import AttemptReport, Workload
from dlcloud.executors.base import LAUNCH_FAILED
from dlcloud.executors.local import checkpoints
from dlcloud.executors.local.checkpoints import (
    NoRoom,
    SourceGone,
    Stopped,
    TooLarge,
    TooManyEntries,
    copy_checkpoints,
    free_margin,
)
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.local.launcher import STOP_REQUEST_FILE
from dlcloud.settings import Settings
from dlcloud.storage.stores import open_object_store
from tests.conftest import wait_for

SECRET = b"the server's secret\n"


def _hostile_source(tmp_path: Path) -> tuple[Path, Path]:
    """(the source job's directory, a directory outside it holding a secret): its checkpoints link to the secret,
    to the directory holding it, and hold a FIFO, a socket, nested directories, an executable and a sparse file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "server.key").write_bytes(SECRET)
    job = tmp_path / "runs" / "t1" / "j-source"
    ck = job / "checkpoints"
    (ck / "epoch-3" / "optim").mkdir(parents=True)
    (ck / "epoch-3" / "model.pt").write_bytes(b"weights")
    (ck / "epoch-3" / "optim" / "state.bin").write_bytes(b"adam")
    (ck / "run.sh").write_text("#!/bin/sh\n")
    (ck / "run.sh").chmod(0o755)
    (ck / "latest").symlink_to("epoch-3")  # a link inside, to a directory inside: still not followed
    (ck / "key").symlink_to(outside / "server.key")
    (ck / "epoch-3" / "escape").symlink_to(outside)
    os.mkfifo(ck / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(ck / "sock"))
    with open(ck / "sparse.bin", "wb") as f:
        f.truncate(64 * 1024 * 1024)
        f.seek(32 * 1024 * 1024)
        f.write(b"middle")
    return job, outside


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            out[rel] = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return out


def test_the_copy_takes_only_regular_files_and_directories_and_follows_no_link(tmp_path: Path) -> None:
    job, _outside = _hostile_source(tmp_path)
    dest = tmp_path / "new-job" / "checkpoints"
    dest.parent.mkdir()
    result = copy_checkpoints(job, "checkpoints", dest, None, 1000)
    assert _tree(dest) == {
        "epoch-3": "dir",
        "epoch-3/model.pt": "file",
        "epoch-3/optim": "dir",
        "epoch-3/optim/state.bin": "file",
        "run.sh": "file",
        "sparse.bin": "file",
    }
    assert result.left_out == {
        "latest": "link",
        "key": "link",
        "epoch-3/escape": "link",
        "pipe": "special",
        "sock": "special",
    }
    assert SECRET not in b"".join(p.read_bytes() for p in dest.rglob("*") if p.is_file())
    assert (dest / "epoch-3" / "optim" / "state.bin").read_bytes() == b"adam"
    big = dest / "sparse.bin"
    assert big.stat().st_size == 64 * 1024 * 1024
    with open(big, "rb") as f:
        f.seek(32 * 1024 * 1024)
        assert f.read(6) == b"middle"
    assert big.stat().st_blocks * 512 < 8 * 1024 * 1024  # its holes stayed holes
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o700
    assert stat.S_IMODE((dest / "epoch-3" / "model.pt").stat().st_mode) == 0o600
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700
    assert not list(dest.parent.glob(".checkpoints*"))  # the hidden directory it was made in was renamed


def test_the_copy_is_a_copy_the_new_job_may_change_in_place(tmp_path: Path) -> None:
    job, _ = _hostile_source(tmp_path)
    dest = tmp_path / "checkpoints"
    copy_checkpoints(job, "checkpoints", dest, None, 1000)
    src_file, new_file = job / "checkpoints" / "epoch-3" / "model.pt", dest / "epoch-3" / "model.pt"
    assert src_file.stat().st_ino != new_file.stat().st_ino
    with open(new_file, "r+b") as f:  # written in place, as a job appending to its checkpoint does
        f.seek(0)
        f.write(b"changed")
    assert src_file.read_bytes() == b"weights"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another uid needs root")
def test_the_copy_belongs_to_the_jobs_sandbox_uid(tmp_path: Path) -> None:
    job, _ = _hostile_source(tmp_path)
    dest = tmp_path / "checkpoints"
    copy_checkpoints(job, "checkpoints", dest, 234_567, 1000)
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [dest, *dest.rglob("*")]}
    assert owners == {(234_567, 234_567)}


def test_a_checkpoint_dir_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    job = tmp_path / "runs" / "t1" / "j-source"
    job.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "server.key").write_bytes(SECRET)
    (job / "checkpoints").symlink_to(outside)
    dest = tmp_path / "checkpoints"
    result = copy_checkpoints(job, "checkpoints", dest, None, 1000)
    assert dest.is_dir() and list(dest.iterdir()) == [] and result.left_out == {".": "link"}


def test_a_source_that_saved_nothing_gives_an_empty_dir_and_a_deleted_one_fails(tmp_path: Path) -> None:
    job = tmp_path / "runs" / "t1" / "j-quiet"
    job.mkdir(parents=True)
    dest = tmp_path / "a" / "checkpoints"
    dest.parent.mkdir()
    result = copy_checkpoints(job, "checkpoints", dest, None, 1000)
    assert not result.source_found and dest.is_dir() and list(dest.iterdir()) == []
    dest = tmp_path / "b" / "checkpoints"
    dest.parent.mkdir()
    with pytest.raises(SourceGone):
        copy_checkpoints(tmp_path / "runs" / "t1" / "j-deleted", "checkpoints", dest, None, 1000)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_more_entries_than_allowed_copies_nothing(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    for i in range(5):
        (job / "checkpoints" / f"f{i}").write_text("x")
    dest = tmp_path / "new" / "checkpoints"
    dest.parent.mkdir()
    with pytest.raises(TooManyEntries):
        copy_checkpoints(job, "checkpoints", dest, None, 4)
    assert list(dest.parent.iterdir()) == []
    copy_checkpoints(job, "checkpoints", dest, None, 5)
    assert len(list(dest.iterdir())) == 5


@pytest.mark.timeout(30)  # a copy blocked on the FIFO fails here
def test_a_fifo_swapped_in_after_the_check_does_not_block_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the check of an entry and its open, a job could swap a file for a FIFO: the open must not wait
    for a writer (O_NONBLOCK) and the FIFO is left out (fstat)."""
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "model.pt").write_bytes(b"w")
    real_stat = os.stat
    checks = []

    def swapped(path, *args, **kwargs):  # the copy's check sees a regular file; by the open it is a FIFO
        st = real_stat(path, *args, **kwargs)
        if path == "model.pt" and stat.S_ISREG(st.st_mode):
            checks.append(path)
            if len(checks) == 2:  # the first check is the measure's, before the copy
                os.unlink(job / "checkpoints" / "model.pt")
                os.mkfifo(job / "checkpoints" / "model.pt")
        return st

    monkeypatch.setattr(checkpoints.os, "stat", swapped)
    dest = tmp_path / "checkpoints"
    result = copy_checkpoints(job, "checkpoints", dest, None, 10)
    assert len(checks) == 2 and stat.S_ISFIFO(os.lstat(job / "checkpoints" / "model.pt").st_mode)
    assert result.left_out == {"model.pt": "special"} and list(dest.iterdir()) == []


def _disk_use(root: Path) -> int:
    """Bytes ``root``'s files take on disk: their allocated blocks, each file once however many names it has."""
    seen: dict[tuple[int, int], int] = {}
    for p in root.rglob("*"):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def _source(tmp_path: Path, files: dict[str, bytes]) -> Path:
    job = tmp_path / "runs" / "t1" / "j-source"
    for rel, data in files.items():
        (job / "checkpoints" / rel).parent.mkdir(parents=True, exist_ok=True)
        (job / "checkpoints" / rel).write_bytes(data)
    return job


def _dest(tmp_path: Path) -> Path:
    dest = tmp_path / "runs" / "t1" / "j-new" / "checkpoints"
    dest.parent.mkdir(parents=True)
    return dest


def test_the_storage_quota_measures_checkpoints_as_the_copy_does_following_no_link(tmp_path: Path) -> None:
    """``measure_checkpoints`` (a job's checkpoints in its tenant's storage quota): allocated blocks, a file with
    many names once, links to the server's files and directories neither followed nor counted."""
    job, outside = _hostile_source(tmp_path)
    (outside / "huge.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    (job / "checkpoints" / "huge").symlink_to(outside / "huge.bin")
    for i in range(5):
        os.link(job / "checkpoints" / "epoch-3" / "model.pt", job / "checkpoints" / f"model-{i}.pt")
    size, whole = checkpoints.measure_checkpoints(job, "checkpoints", 1000)
    assert whole and size == _disk_use(job / "checkpoints")
    assert size < 2 * 1024 * 1024  # the sparse 64 MiB file counts its blocks; the linked 2 MiB not at all
    assert checkpoints.measure_checkpoints(job, "none", 1000) == (0, True)  # it saved none
    assert checkpoints.measure_checkpoints(tmp_path / "deleted", "checkpoints", 1000) == (0, True)
    size, whole = checkpoints.measure_checkpoints(job, "checkpoints", 3)  # past the bound: what was counted
    assert not whole and size <= _disk_use(job / "checkpoints")
    ck = tmp_path / "runs" / "t1" / "j-link"
    ck.mkdir(parents=True)
    (ck / "checkpoints").symlink_to(outside)  # the directory itself a link: nothing counted
    assert checkpoints.measure_checkpoints(ck, "checkpoints", 1000) == (0, True)


def test_a_file_with_many_names_is_copied_once_and_its_other_names_link_to_that_copy(tmp_path: Path) -> None:
    """One 4 MiB file hard-linked 50 times (a job may, in its own directory) is 4 MiB of disk in the source: the
    copy takes 4 MiB too, not 51 times that, and fits a byte bound that the 51 names counted apart would not."""
    data = os.urandom(4 * 1024 * 1024)
    job = _source(tmp_path, {"weights.bin": data})
    ck = job / "checkpoints"
    (ck / "epoch-1").mkdir()
    for i in range(50):  # links in another directory too: the copy links to its first copy across directories
        os.link(ck / "weights.bin", ck / ("epoch-1" if i % 2 else ".") / f"link-{i}")
    dest = _dest(tmp_path)
    result = copy_checkpoints(job, "checkpoints", dest, None, 1000, max_bytes=8 * 1024 * 1024)
    source_use, copy_use = _disk_use(ck), _disk_use(dest)
    assert source_use >= len(data)  # really allocated, not a hole
    assert copy_use <= source_use + 64 * 1024, (copy_use, source_use)
    names = [p for p in dest.rglob("*") if p.is_file()]
    assert len(names) == 51 and result.files == 51 and result.linked == 50 and result.bytes == source_use
    assert {(p.stat().st_ino, p.stat().st_nlink) for p in names} == {((dest / "weights.bin").stat().st_ino, 51)}
    assert (dest / "epoch-1" / "link-1").read_bytes() == data
    assert (dest / "weights.bin").stat().st_ino != (ck / "weights.bin").stat().st_ino  # never the source's file


def test_checkpoints_past_max_bytes_are_not_copied_and_sparse_files_count_their_blocks(tmp_path: Path) -> None:
    job = _source(tmp_path, {"a.bin": os.urandom(1024 * 1024), "b/b.bin": os.urandom(1024 * 1024)})
    dest = _dest(tmp_path)
    with pytest.raises(TooLarge):
        copy_checkpoints(job, "checkpoints", dest, None, 1000, max_bytes=1536 * 1024)
    assert list(dest.parent.iterdir()) == []  # nothing left, not even the hidden directory
    copy_checkpoints(job, "checkpoints", dest, None, 1000, max_bytes=3 * 1024 * 1024)
    assert (dest / "b" / "b.bin").stat().st_size == 1024 * 1024
    # a 1 GiB file of holes and 6 bytes takes a block or so: it fits in 1 MiB
    sparse = _source(tmp_path / "sparse", {})
    (sparse / "checkpoints").mkdir(parents=True)
    with open(sparse / "checkpoints" / "sparse.bin", "wb") as f:
        f.truncate(1024**3)
        f.seek(512 * 1024**2)
        f.write(b"middle")
    dest = _dest(tmp_path / "sparse")
    result = copy_checkpoints(sparse, "checkpoints", dest, None, 1000, max_bytes=1024 * 1024)
    assert result.bytes <= 1024 * 1024 and (dest / "sparse.bin").stat().st_size == 1024**3


def _fake_statvfs(monkeypatch: pytest.MonkeyPatch, where: Path, size: int, available: int) -> None:
    """``os.statvfs`` of ``where`` says a file system of ``size`` bytes with ``available`` free."""
    real = os.statvfs

    def statvfs(path):
        if Path(path) != where:
            return real(path)
        return os.statvfs_result((4096, 4096, size // 4096, available // 4096, available // 4096, 0, 0, 0, 0, 255))

    monkeypatch.setattr(checkpoints.os, "statvfs", statvfs)


def test_the_copy_leaves_the_disks_margin_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The margin is the larger of 5 % of the file system and 1 GiB; a copy that would eat into it is refused
    before anything is written."""
    gib, mib = 1024**3, 1024**2
    assert free_margin(os.statvfs_result((4096, 4096, 100 * gib // 4096, 0, 0, 0, 0, 0, 0, 255))) == 5 * gib
    assert free_margin(os.statvfs_result((4096, 4096, 10 * gib // 4096, 0, 0, 0, 0, 0, 0, 255))) == gib
    job = _source(tmp_path, {"model.pt": os.urandom(2 * mib)})
    dest = _dest(tmp_path)
    _fake_statvfs(monkeypatch, dest.parent, 100 * gib, 5 * gib + mib)  # 1 MiB over the margin: no room for 2
    with pytest.raises(NoRoom) as refused:
        copy_checkpoints(job, "checkpoints", dest, None, 1000)
    assert refused.value.margin == 5 * gib and refused.value.need >= 2 * mib
    assert list(dest.parent.iterdir()) == []
    _fake_statvfs(monkeypatch, dest.parent, 10 * gib, gib + 4 * mib)  # a small disk: 1 GiB kept, room for 4 MiB
    copy_checkpoints(job, "checkpoints", dest, None, 1000)
    assert (dest / "model.pt").stat().st_size == 2 * mib


def test_a_stop_while_a_file_is_copied_ends_the_copy_at_once_and_leaves_nothing(tmp_path: Path) -> None:
    size = 8 * 1024 * 1024
    job = _source(tmp_path, {"big.bin": os.urandom(size), "small/after.bin": b"x"})
    dest = _dest(tmp_path)
    seen: list[int] = []

    def stop() -> bool:  # asked to stop as soon as part of the big file is there
        partial = list(dest.parent.glob(".checkpoints.copy.*/big.bin"))
        seen.append(partial[0].stat().st_size if partial else 0)
        return seen[-1] > 0

    with pytest.raises(Stopped):
        copy_checkpoints(job, "checkpoints", dest, None, 1000, stop=stop)
    assert 0 < seen[-1] < size, seen  # stopped inside the file, not after it
    assert list(dest.parent.iterdir()) == []


def test_a_source_grown_after_it_was_measured_is_still_bounded(tmp_path: Path) -> None:
    job = _source(tmp_path, {"a.bin": os.urandom(1024 * 1024)})
    dest = _dest(tmp_path)
    asked = []

    def grow() -> bool:  # between the measure (one entry) and the copy, the file grows past the bound
        asked.append(1)
        if len(asked) == 2:
            with open(job / "checkpoints" / "a.bin", "ab") as f:
                f.write(os.urandom(2 * 1024 * 1024))
        return False

    with pytest.raises(TooLarge):
        copy_checkpoints(job, "checkpoints", dest, None, 1000, max_bytes=2 * 1024 * 1024, stop=grow)
    assert len(asked) >= 2 and list(dest.parent.iterdir()) == []


def _copy_in_thread(name: str, dest: Path, job: Path, stop: Callable[[], bool], out: dict) -> threading.Thread:
    def run() -> None:
        try:
            out[name] = copy_checkpoints(job, "checkpoints", dest, None, 1000, stop=stop)
        except Exception as exc:  # the test says which
            out[name] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def test_two_copies_into_one_destination_at_once_end_with_one_whole_copy(tmp_path: Path) -> None:
    """Two preparations of one attempt (a deposed leader and its successor) copy at the same time: each in its
    own hidden directory; the first to finish puts its copy in place, the other keeps that one."""
    files = {f"epoch-{i}/model.pt": os.urandom(256 * 1024) for i in range(8)}
    job = _source(tmp_path, files)
    dest = _dest(tmp_path)
    both_copying = threading.Barrier(2, timeout=30)
    asked: dict[str, int] = {}

    def rendezvous() -> bool:  # the first entry of each copy (not its measure) waits for the other's
        me = threading.current_thread().name
        asked[me] = asked.get(me, 0) + 1
        if asked[me] == 2 * len(files) + 1:  # the copy's first entry, after the measure's (a directory, a file each)
            both_copying.wait()
        return False

    out: dict[str, object] = {}
    for thread in [_copy_in_thread(n, dest, job, rendezvous, out) for n in ("A", "B")]:
        thread.join(60)
    assert all(not isinstance(r, BaseException) for r in out.values()), out
    results = [r for r in out.values() if isinstance(r, checkpoints.CopyResult)]
    assert len(results) == 2 and sorted(r.already_there for r in results) == [False, True]
    assert {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*.pt")} == files
    assert [p.name for p in dest.parent.iterdir()] == ["checkpoints"]  # neither hidden directory left


def test_a_hidden_directory_replaced_while_copying_is_never_put_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _source(tmp_path, {"model.pt": b"weights", "optim.pt": b"adam"})
    dest = _dest(tmp_path)
    moved = tmp_path / "moved"

    def replace_it() -> bool:  # once the copy's hidden directory is there, something else takes its path
        hidden = next(dest.parent.glob(".checkpoints.copy.*"), None)
        if hidden is not None and not moved.exists():
            hidden.rename(moved)
            hidden.mkdir()
            (hidden / "planted").write_bytes(b"not a copy")
        return False

    with pytest.raises(OSError, match="replaced") as failed:
        copy_checkpoints(job, "checkpoints", dest, None, 1000, stop=replace_it)
    assert failed.value.errno == errno.ESTALE and moved.exists() and not dest.exists()
    (impostor,) = dest.parent.glob(".checkpoints.copy.*")  # not the copy's: left as it was
    assert (impostor / "planted").read_bytes() == b"not a copy"


def test_a_hidden_directory_of_a_copy_cut_short_is_removed_and_one_still_copying_is_not(tmp_path: Path) -> None:
    job = _source(tmp_path, {"model.pt": b"weights"})
    dest = _dest(tmp_path)
    for stale in (".checkpoints.copy", ".checkpoints.copy.crashed"):  # an earlier version's name, and a crash's
        (dest.parent / stale / "half").mkdir(parents=True)
    running = dest.parent / ".checkpoints.copy.running"
    running.mkdir()
    fd = os.open(running, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a copy still running holds it
        copy_checkpoints(job, "checkpoints", dest, None, 1000)
    finally:
        os.close(fd)
    assert sorted(p.name for p in dest.parent.iterdir()) == [".checkpoints.copy.running", "checkpoints"]


# ---- the local executor


@pytest.fixture
def make_executor(tmp_path: Path) -> Iterator[Callable[..., LocalExecutor]]:
    made: list[LocalExecutor] = []

    def make(**settings: Any) -> LocalExecutor:
        data = tmp_path / "data"
        data.mkdir()
        s = Settings(data_dir=data, stop_grace_seconds=1.0, **settings)
        ex = LocalExecutor()
        objects = open_object_store(s)
        ex.bind(s, objects, ex.environments(s, objects))
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.reap()


@pytest.fixture
def executor(make_executor: Callable[..., LocalExecutor]) -> LocalExecutor:
    return make_executor()


def _ended(ex: LocalExecutor, handle: str) -> AttemptReport:
    return wait_for(lambda: (r := ex.poll(handle)).state == "exited" and r, what=f"attempt {handle} to end")


def _run(ex: LocalExecutor, job: str, attempt: int, command: str, source: str | None) -> AttemptReport:
    handle = ex.handle("t1", job, attempt)
    ex.start(handle, Workload(job_id=job, tenant_id="t1", attempt=attempt, command=command, checkpoint_from=source))
    return _ended(ex, handle)


def test_the_local_executor_starts_the_first_attempt_from_a_copy_and_keeps_it_after(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    runs = executor.settings.runs_dir
    job, outside = _hostile_source(tmp_path)
    (runs / "t1").mkdir(parents=True)
    job.rename(runs / "t1" / "j-source")
    check = (
        'cd "$DLCLOUD_CHECKPOINT_DIR" && [ "$(cat epoch-3/model.pt)" = weights ] && '
        "[ ! -e key ] && [ ! -L key ] && [ ! -e latest ] && [ ! -e pipe ] && [ ! -e sock ] && [ ! -e epoch-3/escape ] "
        "&& echo more >> epoch-3/model.pt && echo second > attempt-1"
    )
    report = _run(executor, "j-new", 1, check, "j-source")
    assert report.exit_code == 0, (report, executor.log_files(executor.handle("t1", "j-new", 1))[""].read_text())
    # a later attempt keeps the job's own checkpoints: no new copy over what attempt 1 wrote
    report = _run(executor, "j-new", 2, '[ -e "$DLCLOUD_CHECKPOINT_DIR/attempt-1" ]', "j-source")
    assert report.exit_code == 0, report
    mine = runs / "t1" / "j-new" / "checkpoints"
    assert (mine / "epoch-3" / "model.pt").read_bytes() == b"weightsmore\n"
    assert (runs / "t1" / "j-source" / "checkpoints" / "epoch-3" / "model.pt").read_bytes() == b"weights"
    assert (outside / "server.key").read_bytes() == SECRET


def test_the_local_executor_fails_the_launch_when_the_source_was_deleted(executor: LocalExecutor) -> None:
    report = _run(executor, "j-late", 1, "echo ran", "j-gone")
    assert report.exit_code == LAUNCH_FAILED and "was deleted" in report.message, report
    assert "j-gone" in report.message and str(executor.settings.runs_dir) not in report.message
    assert not (executor.settings.runs_dir / "t1" / "j-late" / "checkpoints").exists()
    (executor.settings.runs_dir / "t1" / "j-ran-nothing").mkdir(parents=True)  # ran, saved nothing
    report = _run(executor, "j-empty", 1, '[ -z "$(ls -A "$DLCLOUD_CHECKPOINT_DIR")" ]', "j-ran-nothing")
    assert report.exit_code == 0, report


def _source_job(ex: LocalExecutor, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = ex.settings.runs_dir / "t1" / "j-source" / "checkpoints" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_the_launch_fails_naming_the_bound_when_the_checkpoints_are_too_large_or_the_disk_too_full(
    make_executor: Callable[..., LocalExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = make_executor(checkpoint_copy_max_bytes=1024 * 1024)
    _source_job(ex, {"model.pt": os.urandom(2 * 1024 * 1024)})
    report = _run(ex, "j-big", 1, "echo ran", "j-source")
    assert report.exit_code == LAUNCH_FAILED and "checkpoint_copy_max_bytes" in report.message, report
    assert "more than 1 MiB" in report.message and "j-source" in report.message
    assert str(ex.settings.runs_dir) not in report.message
    assert list((ex.settings.runs_dir / "t1" / "j-big").glob("*checkpoints*")) == []
    (ex.settings.runs_dir / "t1" / "j-source" / "checkpoints" / "model.pt").write_bytes(os.urandom(512 * 1024))
    jd = ex.settings.runs_dir / "t1" / "j-full"
    _fake_statvfs(monkeypatch, jd, 100 * 1024**3, 5 * 1024**3 + 256 * 1024)  # 256 KiB above the 5 GiB kept free
    report = _run(ex, "j-full", 1, "echo ran", "j-source")
    assert report.exit_code == LAUNCH_FAILED and "do not fit on the server's disk" in report.message, report
    assert "keeps 5 GiB free" in report.message and "ask an administrator" in report.message
    assert list(jd.glob("*checkpoints*")) == []


def test_a_stop_while_the_checkpoints_are_copied_ends_the_copy_and_leaves_nothing(
    executor: LocalExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    _source_job(executor, {"model.pt": os.urandom(4 * 1024 * 1024)})
    handle = executor.handle("t1", "j-stopped", 1)
    stop_request = executor.attempt_dir(handle) / STOP_REQUEST_FILE
    copying = threading.Event()
    real_copy_bytes = checkpoints._copy_bytes

    def held(*args):  # holds the copy inside the file until the stop is asked, then copies on
        copying.set()
        wait_for(stop_request.exists, what="the stop request")
        return real_copy_bytes(*args)

    monkeypatch.setattr(checkpoints, "_copy_bytes", held)
    workload = Workload(job_id="j-stopped", tenant_id="t1", attempt=1, command="echo ran", checkpoint_from="j-source")
    executor.start(handle, workload)
    wait_for(copying.is_set, what="the copy to start")
    executor.stop(handle)
    report = _ended(executor, handle)
    assert report.stopped and report.message == "stopped before it started", report
    assert list(executor.attempt_dir(handle).parent.glob("*checkpoints*")) == []
