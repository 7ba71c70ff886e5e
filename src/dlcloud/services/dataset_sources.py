"""Dataset versions registered in place: objects already in an allowed bucket become a version without a copy.

This module owns the state of such versions (``dataset_versions.state``); nothing else writes it:

    pending --(every object read, the manifest stored)--> ready
    pending --(a name or limit refused, an object vanished, the source unreadable)--> failed

- ``push_version`` is every push's entry: from an upload it is ``datasets.push_upload``'s, from a source
  ``register_version``'s.
- ``register_version`` (the request) checks the source (``storage/sources.py``: a valid ``s3://`` URL, inside
  ``dataset_source_urls``, apart from the platform's own store) and that something is there, then adds the
  version ``pending`` with its ``source_url``: it reads no object, so a prefix of any size answers at once.
  A refused source writes nothing.
- A worker thread of every server process (``SourceWorker``, ``control/dataset_sources.py``: the loop that
  reads the objects; the writes are this module's) *claims* a pending version (``claim_pending``:
  ``claimed_by`` ``<host>:<pid>:<token>``, ``claimed_at`` renewed by ``renew_claim`` while it reads), reads
  every object for its manifest, stores the manifest at the version's key (``ObjectStore.put_tree_manifest``,
  with ``Manifest.source``) and makes it ready with its checksum, size and file count (``make_ready``) — or
  failed with the reason (``make_failed``). Only the claim's holder may finish it, and only while the row is
  still there (a version deleted meanwhile leaves no manifest behind).
- **Never stuck.** A claim whose process is gone is taken over: at once where the holder was a process of
  this host that no longer runs (a restarted server resumes its own versions), after ``LEASE`` without a
  sign of life otherwise. A pending version is computed again from the start; reading is idempotent.
- In-place versions do not count toward the storage quota (the platform stores only their manifest), and
  deleting one deletes the manifest, never the source objects.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import timedelta

from sqlalchemy.orm import Session

from dlcloud.errors import SourceNotAllowed
from dlcloud.schemas.datasets import DatasetPush, DatasetVersion, DatasetVersionState
from dlcloud.services import datasets
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.storage.objects import Manifest
from dlcloud.storage.sources import Progress, SourceReader, check_source
from dlcloud.store import datasets as store
from dlcloud.store.rows import DatasetRow, DatasetVersionRow, utcnow

log = logging.getLogger(__name__)
LEASE = timedelta(seconds=120)  # a claim without a sign of life for this long is taken over


def reader(platform: Platform) -> SourceReader:
    """The reader of the sources datasets may be registered from; SourceNotAllowed when none is allowed."""
    sources = platform.objects.sources
    if not isinstance(sources, SourceReader):
        raise SourceNotAllowed(
            "registering datasets in place is off on this server: dataset_source_urls is empty; push a local "
            "directory instead, or ask an administrator to allow the bucket",
            details={"allowed": []},
        )
    return sources


# -- the request ------------------------------------------------------------------------------------------


def push_version(
    platform: Platform, caller: Caller, name: str, req: DatasetPush, owner: str | None = None
) -> DatasetVersion:
    """A push: a version registered in place from ``req.source`` (here), else one stored from the upload
    (``datasets.push_upload``). Blocking: run it in a worker thread."""
    if req.source is None:
        return datasets.push_upload(platform, caller, name, req, owner)
    datasets.check_name(name)
    return register_version(platform, caller, name, req, owner)


def register_version(
    platform: Platform, caller: Caller, name: str, req: DatasetPush, owner: str | None = None
) -> DatasetVersion:
    """Add the next version of ``name`` (creating the dataset) from the objects under ``req.source``, pending
    until the worker has computed its manifest. Blocking (one short listing of the source)."""
    assert req.source is not None
    src = check_source(platform.settings, req.source)  # 400 / 403 before anything is read or written
    sources = reader(platform)
    datasets.REGISTRY.check_writable(platform, caller, name, owner, "pushing versions")
    sources.check_not_empty(src)

    def row(dataset: DatasetRow, number: int) -> DatasetVersionRow:
        return datasets.version_row(
            caller,
            req,
            dataset,
            number,
            storage_key=datasets.version_key(caller.tenant_id, dataset.id, number),
            sha256="",
            size_bytes=0,
            file_count=0,
            state=DatasetVersionState.PENDING.value,
            source_url=src.url,
        )

    result = datasets.add_version(platform, caller, name, req, 0, row)
    platform.wake_sources()
    return result


# -- the worker's claims and the state it writes ----------------------------------------------------------


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _holder_gone(holder: str, me: str) -> bool:
    """Whether the process named by a claim is known to be gone: one of this host that no longer runs (or
    an earlier worker of this very process)."""
    host, _, rest = holder.partition(":")
    pid_text, _, token = rest.partition(":")
    my_host, _, my_rest = me.partition(":")
    if host != my_host or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return token != my_rest.partition(":")[2]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def claim_pending(platform: Platform, worker: str) -> str | None:
    """Claim the oldest pending version no live process holds; its id, or None."""
    now = utcnow()
    with platform.db.write() as s:
        for candidate in store.pending_versions(s):
            row = s.get(DatasetVersionRow, candidate.id, with_for_update=True, populate_existing=True)
            if row is None or row.state != DatasetVersionState.PENDING.value:
                continue
            free = (
                row.claimed_by is None
                or row.claimed_at is None
                or row.claimed_at < now - LEASE
                or _holder_gone(row.claimed_by, worker)
            )
            if free:
                if row.claimed_by is not None:
                    log.info("dataset version %s: taking over from %s", row.id, row.claimed_by)
                row.claimed_by, row.claimed_at = worker, now
                return row.id
    return None


def _held(s: Session, version_id: str, worker: str) -> DatasetVersionRow | None:
    row = s.get(DatasetVersionRow, version_id, with_for_update=True, populate_existing=True)
    return (
        row if row is not None and row.state == DatasetVersionState.PENDING.value and row.claimed_by == worker else None
    )


def claimed_source(platform: Platform, version_id: str) -> tuple[str, str] | None:
    """(the key its manifest goes to, its source URL) of a claimed version; None once it is deleted."""
    with platform.db.read() as s:
        row = s.get(DatasetVersionRow, version_id)
        return None if row is None else (row.storage_key, str(row.source_url))


def renew_claim(platform: Platform, version_id: str, worker: str, done: Progress) -> bool:
    """A sign of life of the worker reading the version's objects, with how far it is; False when the version
    was deleted or taken over meanwhile (the reading stops)."""
    with platform.db.write() as s:
        held = _held(s, version_id, worker)
        if held is None:
            return False
        held.claimed_at = utcnow()
        held.state_reason = f"read {done.objects} object(s), {done.bytes} bytes so far"
        return True


def make_ready(platform: Platform, version_id: str, worker: str, key: str, source: str, manifest: Manifest) -> None:
    """pending -> ready, once its manifest is stored at ``key``; a version deleted meanwhile takes the manifest
    with it (one taken over is left to its new holder)."""
    with platform.db.write() as s:
        row = _held(s, version_id, worker)
        if row is not None:
            row.state, row.state_reason = DatasetVersionState.READY.value, None
            row.sha256, row.size_bytes, row.file_count = (
                manifest.artifact_sha256(),
                manifest.size,
                len(manifest.entries),
            )
            row.claimed_by = row.claimed_at = None
            log.info("dataset version %s from %s is ready: %d files", version_id, source, row.file_count)
            return
        gone = s.get(DatasetVersionRow, version_id) is None
    if gone:  # deleted while it was read: its manifest must not stay
        datasets._remove_stored(platform, [key])


def make_failed(platform: Platform, version_id: str, worker: str, reason: str) -> None:
    """pending -> failed, with the reason users see."""
    with platform.db.write() as s:
        row = _held(s, version_id, worker)
        if row is not None:
            row.state, row.state_reason = DatasetVersionState.FAILED.value, reason
            row.claimed_by = row.claimed_at = None
