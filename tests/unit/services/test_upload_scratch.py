"""The sweep of the upload scratch directory (services/code.py): what requests that died left is removed once
it is old, what live ones are writing is kept."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dlcloud.services.code import sweep_upload_scratch, upload_scratch_dir
from dlcloud.settings import Settings
from dlcloud.storage.local import make_read_only


def test_old_leftovers_go_and_young_ones_stay(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    scratch = upload_scratch_dir(settings)
    receiving = scratch / ".receiving-dead"
    receiving.write_bytes(b"x" * 1000)
    push = scratch / "tmpdead"
    (push / "tree" / "sub").mkdir(parents=True)
    (push / "tree" / "sub" / "f").write_bytes(b"y")
    make_read_only(push / "tree")
    live = scratch / ".receiving-live"
    live.write_bytes(b"z")
    day_ago = time.time() - 2 * 24 * 3600
    for old in (receiving, push):
        os.utime(old, (day_ago, day_ago))

    sweep_upload_scratch(settings, 24 * 3600.0)
    assert sorted(p.name for p in scratch.iterdir()) == [".receiving-live"]
    sweep_upload_scratch(settings, 0.0)
    assert list(scratch.iterdir()) == []
