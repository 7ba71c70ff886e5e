"""Code uploads: stream to a temporary file, check size and checksum, validate, then put into the object store."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from dlcloud.errors import InvalidArchive, InvalidArgument, NotFound, PayloadTooLarge
from dlcloud.schemas.common import format_memory
from dlcloud.schemas.jobs import CodeUpload
from dlcloud.services import storage_quota
from dlcloud.services.auth import Caller
from dlcloud.settings import Settings
from dlcloud.storage.archives import ArchiveLimits, validate_sdist, validate_tar, validate_zip
from dlcloud.storage.local import remove_tree
from dlcloud.storage.objects import ObjectStore
from dlcloud.store.db import Database
from dlcloud.store.ids import new_id
from dlcloud.store.rows import CodeRow, utcnow

KINDS = ("archive", "wheel", "sdist")
FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}$")


def check_content_length(content_length: int | None, limit: int) -> None:
    """Refuse an upload whose declared length is over the limit before reading its body."""
    if content_length is not None and content_length > limit:
        raise PayloadTooLarge(
            f"upload is {content_length} bytes; the limit is {limit} bytes ({format_memory(limit)})",
            details={"limit": limit, "size": content_length},
        )


async def receive_upload(fd: int, chunks: AsyncIterator[bytes], *, limit: int, declared_sha256: str) -> int:
    """Write a streamed body to the open file ``fd`` (closed here); returns its size.

    Raises PayloadTooLarge past ``limit`` bytes and checksum_mismatch when the bytes do not hash to the
    declared (signed) SHA-256. The caller deletes the file on any error.
    """
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "wb") as f:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"upload exceeds the limit of {limit} bytes ({format_memory(limit)})",
                    details={"limit": limit},
                )
            digest.update(chunk)
            f.write(chunk)
    if digest.hexdigest() != declared_sha256:
        raise InvalidArchive(
            "uploaded bytes do not match the declared SHA-256; the upload was corrupted, try again",
            code="checksum_mismatch",
        )
    return size


def _row_model(row: CodeRow) -> CodeUpload:
    return CodeUpload(
        id=row.id, kind=row.kind, filename=row.filename, sha256=row.sha256, size=row.size, created_at=row.created_at
    )


async def upload_code(
    db: Database,
    settings: Settings,
    objects: ObjectStore,
    caller: Caller,
    *,
    kind: str,
    filename: str,
    declared_sha256: str,
    content_length: int | None,
    chunks: AsyncIterator[bytes],
) -> CodeUpload:
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not FILENAME_RE.match(filename):
        raise InvalidArgument("filename must be 1-200 characters of letters, digits, '.', '_', '+', '-'")
    if kind == "wheel" and not filename.endswith(".whl"):
        raise InvalidArgument("a wheel's filename must end in .whl")
    if kind == "sdist" and not filename.endswith((".tar.gz", ".tgz")):
        raise InvalidArgument("an sdist's filename must end in .tar.gz or .tgz")
    check_content_length(content_length, settings.max_upload_bytes)
    limit = storage_quota.upload_allowance(db, objects, caller, content_length, settings.max_upload_bytes)
    scratch = upload_scratch_dir(settings)
    fd, tmp_name = tempfile.mkstemp(prefix=".upload-", dir=scratch)
    tmp = Path(tmp_name)
    try:
        try:
            size = await receive_upload(fd, chunks, limit=limit, declared_sha256=declared_sha256)
        except PayloadTooLarge:
            if limit < settings.max_upload_bytes and (err := storage_quota.over_quota_while_receiving(db, caller)):
                raise err from None
            raise
        limits = ArchiveLimits(settings.max_unpacked_bytes, settings.max_archive_members)
        validate = {"archive": validate_tar, "wheel": validate_zip, "sdist": validate_sdist}[kind]
        try:
            await anyio.to_thread.run_sync(validate, tmp, limits)
        except InvalidArchive as exc:  # named by what the user uploaded, never by where the server keeps it
            raise InvalidArchive(f"{filename}: {exc.message}", details=exc.details) from None
        code_id = new_id("c-")
        # packages keep their own file name: pip reads the name and version from a wheel's name
        key = f"code/{caller.tenant_id}/{code_id}/{filename if kind != 'archive' else 'code.tar.gz'}"
        row = CodeRow(
            id=code_id,
            tenant_id=caller.tenant_id,
            user_id=caller.user_id,
            kind=kind,
            filename=filename,
            sha256=declared_sha256,
            size=size,
            storage_key=key,
            created_at=utcnow(),
        )
        # the object first: a row never names bytes that are not stored (a crash in between leaves an
        # object no row names, which the tenant's deletion sweeps)
        await anyio.to_thread.run_sync(lambda: objects.put_file(key, tmp, sha256=declared_sha256))
        try:
            with db.write() as s:
                storage_quota.check_fits(s, caller.tenant_id, caller.tenant, size)
                s.add(row)
        except BaseException:
            await anyio.to_thread.run_sync(objects.delete, key)
            raise
        return _row_model(row)
    finally:
        tmp.unlink(missing_ok=True)


def upload_scratch_dir(settings: Settings) -> Path:
    """Where the API receives uploads before they are checked and stored: this host's own (0700)."""
    scratch = settings.scratch_dir
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    return scratch


def sweep_upload_scratch(settings: Settings, max_age_seconds: float) -> None:
    """Remove what requests that died with their process (a kill -9 mid-upload or mid-push) left in the
    scratch directory: files and directories not changed for ``max_age_seconds``. A live request's file is
    being written and its push directory is new, so they are younger."""
    cutoff = time.time() - max_age_seconds
    for entry in upload_scratch_dir(settings).iterdir():
        try:
            if entry.lstat().st_mtime < cutoff:
                remove_tree(entry)
        except OSError:  # gone meanwhile, or not ours to remove: the next sweep tries again
            continue


def get_code(db: Database, caller: Caller, code_id: str) -> CodeUpload:
    with db.read() as s:
        row = s.get(CodeRow, code_id)
        if row is None or row.tenant_id != caller.tenant_id:
            raise NotFound(f"code upload {code_id!r} not found")
        return _row_model(row)
