"""The claims of uploads being used (``upload_claims``): one request at a time turns an upload into a version
(``services/uploads.py`` takes and releases them; ``services/datasets.py`` sweeps those left by a crash)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from dlcloud.store.rows import UploadClaimRow


def stale_claims(s: Session, cutoff: datetime) -> list[str]:
    """The keys of the uploads claimed at ``cutoff`` or before."""
    return list(s.scalars(select(UploadClaimRow.key).where(UploadClaimRow.claimed_at <= cutoff)))


def release_claim(s: Session, key: str) -> None:
    s.execute(delete(UploadClaimRow).where(UploadClaimRow.key == key))
