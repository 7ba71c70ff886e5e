"""Saved outputs: what a job leaves in its outputs directory that is not a plain file with a storable name is
left out and named, never followed, and limits bound what the control plane walks and copies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlcloud.executors import outputs
from dlcloud.executors.outputs import BAD_NAME, LINK, SPECIAL, OutputsTooLarge, scan_outputs


def test_links_specials_and_unstorable_names_are_left_out(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "model").mkdir(parents=True)
    (out / "model" / "w.bin").write_bytes(b"weights")
    (out / "only-links").mkdir()
    os.symlink("/etc/passwd", out / "only-links" / "leak")
    os.symlink("/etc", out / "etc")
    os.mkfifo(out / "pipe")
    (out / os.fsdecode(b"\xff-not-utf8")).write_bytes(b"x")
    (out / ".dlcloud-manifest.json").write_text("{}")
    deep = out / "d"
    for _ in range(40):  # deeper than a stored tree may be: the walk stops, without recursion
        deep = deep / "d"
    deep.mkdir(parents=True)
    manifest, left_out = scan_outputs(out, 10_000, 1 << 30)
    assert [e.path for e in manifest.entries] == ["model/w.bin"]
    assert "only-links" in manifest.empty_dirs
    assert left_out["etc"] == LINK and left_out["only-links/leak"] == LINK and left_out["pipe"] == SPECIAL
    assert left_out[".dlcloud-manifest.json"] == BAD_NAME
    assert [k for k, v in left_out.items() if v == BAD_NAME and k.endswith("-not-utf8")]
    assert [k for k, v in left_out.items() if v == BAD_NAME and k.startswith("d/d/d/")]
    manifest.to_json()  # every name it kept can be stored


def test_limits_count_entries_and_apparent_bytes(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    with open(out / "sparse", "wb") as f:
        f.truncate(1 << 30)  # costs the job nothing on disk: counted whole all the same
    with pytest.raises(OutputsTooLarge, match="more than 1048576 bytes"):
        scan_outputs(out, 10_000, 1 << 20)
    (out / "sparse").unlink()
    for i in range(20):
        (out / f"f{i}").write_text("x")
    with pytest.raises(OutputsTooLarge, match="more than 10 files"):
        scan_outputs(out, 10, 1 << 20)
    assert len(scan_outputs(out, 100, 1 << 20)[0].entries) == 20


def test_outputs_are_measured_without_following_links_and_refused_before_a_byte_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``admit`` sees the bytes of the regular files (a link to a large file outside counts nothing) before any
    is hashed: what it raises refuses them, with nothing read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"\0" * 100_000)
    out = tmp_path / "outputs"
    (out / "m").mkdir(parents=True)
    (out / "m" / "w.bin").write_bytes(b"w" * 300)
    (out / "a.txt").write_bytes(b"a" * 20)
    (out / "big").symlink_to(outside / "big.bin")
    (out / "outside").symlink_to(outside)
    seen: list[int] = []
    manifest, _ = scan_outputs(out, 100, 1 << 20, admit=seen.append)
    assert seen == [320] and manifest.size == 320

    class Refused(Exception):
        pass

    def refuse(size: int) -> None:
        raise Refused(size)

    def read(path: Path) -> str:
        raise AssertionError(f"{path} was read")

    monkeypatch.setattr(outputs, "file_sha256", read)
    with pytest.raises(Refused, match="320"):
        scan_outputs(out, 100, 1 << 20, admit=refuse)
