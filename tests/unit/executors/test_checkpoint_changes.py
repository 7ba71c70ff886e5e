"""When a job last changed its checkpoints (``checkpoints.last_change``), read as an attacker's directory would be:
nothing followed, a link or a file where the directory should be is no directory, and a huge directory is read
only in part."""

from __future__ import annotations

import os
from pathlib import Path

from dlcloud.executors.local import checkpoints
from dlcloud.executors.local.checkpoints import last_change


def _at(path: Path, when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


def test_the_latest_change_of_the_directory_or_its_entries(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    (ckpt / "step-100").mkdir(parents=True)
    (ckpt / "latest.pt").write_bytes(b"x")
    _at(ckpt / "step-100", 1_000.0)
    _at(ckpt / "latest.pt", 3_000.0)  # a file rewritten in place: only its own time moves
    _at(ckpt, 2_000.0)
    assert last_change(tmp_path, "checkpoints") == 3_000.0
    _at(ckpt / "latest.pt", 500.0)
    assert last_change(tmp_path, "checkpoints") == 2_000.0  # an entry added or renamed into place moves the directory's


def test_no_directory_is_no_change(tmp_path: Path) -> None:
    assert last_change(tmp_path, "checkpoints") is None
    assert last_change(tmp_path / "gone", "checkpoints") is None
    (tmp_path / "checkpoints").write_text("a file, not a directory")
    assert last_change(tmp_path, "checkpoints") is None


def test_links_are_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "new").write_text("y")
    _at(elsewhere / "new", 9_000.0)
    job = tmp_path / "job"
    job.mkdir()
    (job / "checkpoints").symlink_to(elsewhere)
    assert last_change(job, "checkpoints") is None  # the directory itself a link: no checkpoints
    (job / "checkpoints").unlink()
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "link").symlink_to(elsewhere / "new")
    _at(job / "checkpoints" / "link", 1_000.0)
    _at(job / "checkpoints", 1_000.0)
    assert last_change(job, "checkpoints") == 1_000.0  # the link's own time, not its target's


def test_only_the_first_entries_of_a_huge_directory_are_read(tmp_path: Path, monkeypatch) -> None:
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    for i in range(10):
        (ckpt / f"f{i}").write_text("z")
    listed = [e.name for e in os.scandir(ckpt)]  # the order a directory read gives them
    for name in listed[:-1]:
        _at(ckpt / name, 200.0)
    _at(ckpt / listed[-1], 9_000.0)
    _at(ckpt, 100.0)
    assert last_change(tmp_path, "checkpoints") == 9_000.0
    monkeypatch.setattr(checkpoints, "LAST_CHANGE_MAX_ENTRIES", 3)
    assert last_change(tmp_path, "checkpoints") == 200.0  # the tenth entry is never looked at
