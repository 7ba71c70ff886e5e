"""Housekeeping (``control/housekeeping.py``), on SQLite and PostgreSQL: one round forgets the nonces past the
clock-skew window and drops the uploads no request used within their time to live; what is younger stays."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from dlcloud.control.housekeeping import Housekeeping
from dlcloud.store import nonces
from dlcloud.store.rows import NonceRow, utcnow
from tests.conftest import Env


def test_a_round_forgets_old_nonces_and_drops_unused_uploads(env: Env, tmp_path: Path) -> None:
    p = env.platform
    skew = p.settings.clock_skew_seconds
    with p.db.engine.begin() as conn:
        nonces.add(
            conn,
            [
                {"access_key": "AKHOUSE", "nonce": "old", "seen_at": utcnow() - timedelta(seconds=3 * skew)},
                {"access_key": "AKHOUSE", "nonce": "new", "seen_at": utcnow()},
            ],
        )
    body = tmp_path / "upload.tar.gz"
    body.write_bytes(b"not used by any request")
    for name in ("old", "new"):
        p.objects.put_file(f"uploads/t-house/{name}.tar.gz", body)
    old_path = p.objects.local_path("uploads/t-house/old.tar.gz")
    assert old_path is not None
    past = time.time() - p.settings.model_upload_ttl_seconds - 60
    os.utime(old_path, (past, past))

    Housekeeping(p).tick()

    with p.db.read() as s:
        left = set(s.scalars(select(NonceRow.nonce).where(NonceRow.access_key == "AKHOUSE")))
    assert left == {"new"}
    assert p.objects.head("uploads/t-house/old.tar.gz") is None
    assert p.objects.head("uploads/t-house/new.tar.gz") is not None
