"""``checkpoint_from`` on this host: the copy of another job's checkpoint directory (``executors/local/
checkpoints.py``) treats the source as an attacker wrote it, and the local executor makes it while preparing the
first attempt. The source directories here are built as a hostile job would leave them: links to files and
directories outside, a FIFO, a socket."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.executors import AttemptReport, Workload
from dlcloud.executors.base import LAUNCH_FAILED
from dlcloud.executors.local import checkpoints
from dlcloud.executors.local.checkpoints import SourceGone, TooManyEntries, copy_checkpoints
from dlcloud.executors.local.executor import LocalExecutor
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

    def swapped(path, *args, **kwargs):  # the check sees a regular file; by the open it is a FIFO
        st = real_stat(path, *args, **kwargs)
        if path == "model.pt" and stat.S_ISREG(st.st_mode):
            os.unlink(job / "checkpoints" / "model.pt")
            os.mkfifo(job / "checkpoints" / "model.pt")
        return st

    monkeypatch.setattr(checkpoints.os, "stat", swapped)
    dest = tmp_path / "checkpoints"
    result = copy_checkpoints(job, "checkpoints", dest, None, 10)
    assert result.left_out == {"model.pt": "special"} and list(dest.iterdir()) == []


# ---- the local executor


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[LocalExecutor]:
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, stop_grace_seconds=1.0)
    ex = LocalExecutor()
    ex.bind(settings, open_object_store(settings), ex.environments(settings))
    yield ex
    ex.reap()


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
