"""Archive uploads that wait in the object store for the request that uses them (a model register, a
dataset push): ``uploads/<tenant>/<upload id>.tar.gz``.

Rules: an upload is received into this host's scratch directory, checked against the SHA-256 its client
signed and against the archive limits (and the caller's own check), then stored; only then does it get an
id. It belongs to its tenant (another tenant's id is "not found"); the request that uses it deletes it, and
one that no request used is dropped after ``model_upload_ttl_seconds``.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
from sqlalchemy.exc import IntegrityError

from dlcloud.errors import InvalidArgument, InvalidState, NotFound, PayloadTooLarge
from dlcloud.schemas.common import Response
from dlcloud.services import storage_quota
from dlcloud.services.auth import Caller
from dlcloud.services.code import check_content_length, receive_upload, upload_scratch_dir
from dlcloud.services.platform import Platform
from dlcloud.storage.objects import ObjectMissing, ObjectStore
from dlcloud.store import uploads as upload_store
from dlcloud.store.ids import new_id
from dlcloud.store.rows import UploadClaimRow, utcnow

R = TypeVar("R", bound=Response)


def upload_key(tenant_id: str, upload_id: str) -> str:
    return f"uploads/{tenant_id}/{upload_id}.tar.gz"


def sweep_uploads(objects: ObjectStore, max_age_seconds: float) -> None:
    """Drop uploads no request used within ``max_age_seconds``."""
    cutoff = time.time() - max_age_seconds
    for info in list(objects.list("uploads")):
        if info.modified is not None and info.modified < cutoff:
            objects.delete(info.key)


@dataclass(frozen=True)
class Incoming:
    """An upload as its request brings it: the SHA-256 its client signed, the length it declared, its body."""

    declared_sha256: str
    content_length: int | None
    chunks: AsyncIterator[bytes]


async def store_upload(
    platform: Platform,
    caller: Caller,
    incoming: Incoming,
    id_prefix: str,
    check: Callable[[Path], dict[str, Any]],
    answer: type[R],
) -> R:
    """Receive, check (``check(path)`` in a worker thread: raise to refuse) and store an upload; its read model
    ``answer``: id, checksum, size, when it expires unused, and the fields ``check`` returned."""
    settings = platform.settings
    content_length, declared_sha256 = incoming.content_length, incoming.declared_sha256
    check_content_length(content_length, settings.max_upload_bytes)
    limit = storage_quota.upload_allowance(
        platform.db, platform.objects, caller, content_length, settings.max_upload_bytes
    )
    objects = platform.objects
    await anyio.to_thread.run_sync(sweep_uploads, objects, settings.model_upload_ttl_seconds)
    fd, tmp_name = tempfile.mkstemp(prefix=".receiving-", dir=upload_scratch_dir(settings))
    tmp = Path(tmp_name)
    try:
        try:
            size = await receive_upload(fd, incoming.chunks, limit=limit, declared_sha256=declared_sha256)
        except PayloadTooLarge:
            if limit < settings.max_upload_bytes and (
                err := storage_quota.over_quota_while_receiving(platform.db, caller)
            ):
                raise err from None
            raise
        checked = await anyio.to_thread.run_sync(check, tmp)
        upload_id = new_id(id_prefix)
        key = upload_key(caller.tenant_id, upload_id)
        await anyio.to_thread.run_sync(lambda: objects.put_file(key, tmp, sha256=declared_sha256))
    finally:
        tmp.unlink(missing_ok=True)
    expires = utcnow() + timedelta(seconds=settings.model_upload_ttl_seconds)
    return answer.model_validate(
        {"id": upload_id, "sha256": declared_sha256, "size": size, "expires_at": expires, **checked}
    )


def _stored_key(platform: Platform, caller: Caller, upload_id: str, id_re: re.Pattern[str]) -> str | None:
    """The stored upload's key, or None when there is no such upload of the caller's tenant."""
    if not id_re.match(upload_id):
        return None
    key = upload_key(caller.tenant_id, upload_id)
    return key if platform.objects.head(key) is not None else None


@contextlib.contextmanager
def use_upload(
    platform: Platform, caller: Caller, upload_id: str, id_re: re.Pattern[str], dest_dir: Path, used_by: str, what: str
) -> Iterator[tuple[str, Path]]:
    """(key, local copy in ``dest_dir``) of an upload of ``what`` (e.g. 'the artifact') waiting for the request
    ``used_by`` (e.g. 'a register'), claimed for this request while the block runs: another request for the
    same upload is refused meanwhile, so one upload never becomes two versions. The block deletes the upload
    when it used it; a claim left by a crash is taken over once it is older than the upload's time to live."""
    key = _stored_key(platform, caller, upload_id, id_re)
    missing = InvalidArgument(
        f"upload {upload_id!r} not found: it was used by {used_by} already, expired or never existed; "
        f"upload {what} again"
    )
    if key is None:
        raise missing
    _claim(platform, key, upload_id)
    try:
        local = dest_dir / "upload.tar.gz"
        try:
            platform.objects.get_file(key, local)
        except ObjectMissing:  # used or expired just now
            raise missing from None
        yield key, local
    finally:
        with platform.db.write() as s:
            upload_store.release_claim(s, key)


def _claim(platform: Platform, key: str, upload_id: str) -> None:
    now = utcnow()
    stale = now - timedelta(seconds=platform.settings.model_upload_ttl_seconds)
    busy = InvalidState(f"upload {upload_id!r} is being used by another request right now; an upload makes one version")
    try:
        with platform.db.write() as s:
            row = s.get(UploadClaimRow, key, with_for_update=True)
            if row is not None and row.claimed_at > stale:
                raise busy
            if row is None:
                s.add(UploadClaimRow(key=key, claimed_at=now))
            else:
                row.claimed_at = now
    except IntegrityError:  # another request claimed it between our read and our insert (PostgreSQL)
        raise busy from None


def delete_upload(platform: Platform, caller: Caller, upload_id: str, id_re: re.Pattern[str]) -> None:
    key = _stored_key(platform, caller, upload_id, id_re)
    if key is None:
        raise NotFound(f"upload {upload_id!r} not found")
    platform.objects.delete(key)
