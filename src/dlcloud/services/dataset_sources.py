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
- A worker thread of every server process (``SourceWorker``) *claims* a pending version (``claimed_by``
  ``<host>:<pid>:<token>``, ``claimed_at`` renewed every ``HEARTBEAT`` while it reads), reads every object
  for its manifest, stores the manifest at the version's key (``ObjectStore.put_tree_manifest``, with
  ``Manifest.source``) and makes it ready with its checksum, size and file count — or failed with the
  reason. Only the claim's holder may finish it, and only while the row is still there (a version deleted
  meanwhile leaves no manifest behind).
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
import threading
import time
from datetime import timedelta

from sqlalchemy.orm import Session

from dlcloud.errors import DlcloudError, SourceNotAllowed
from dlcloud.schemas.datasets import DatasetPush, DatasetVersion, DatasetVersionState
from dlcloud.services import datasets
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.storage.sources import Progress, SourceReader, check_source
from dlcloud.store import datasets as store
from dlcloud.store.rows import DatasetRow, DatasetVersionRow, utcnow

log = logging.getLogger(__name__)
LEASE = timedelta(seconds=120)  # a claim without a sign of life for this long is taken over
HEARTBEAT = 10.0  # seconds between the signs of life of a claim while its objects are read
POLL = 5.0  # seconds between two looks at the queue when nothing wakes the worker


class _Abandoned(Exception):
    """The version being prepared was deleted or taken over: stop reading its objects."""


def _reader(platform: Platform) -> SourceReader:
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
    reader = _reader(platform)
    if owner is not None and owner != caller.tenant:
        with platform.db.read() as s:
            datasets._writable(s, caller, name, owner, "pushing versions")
    reader.check_not_empty(src)

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


# -- the worker -------------------------------------------------------------------------------------------


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


def _claim(platform: Platform, worker: str) -> str | None:
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


def prepare_one(platform: Platform, worker: str) -> bool:
    """Claim one pending version and compute it to ready or failed; False when none was waiting."""
    version_id = _claim(platform, worker)
    if version_id is None:
        return False
    with platform.db.read() as s:
        row = s.get(DatasetVersionRow, version_id)
        if row is None:
            return True
        key, source = row.storage_key, str(row.source_url)
    last = time.monotonic()

    def alive(done: Progress) -> None:
        nonlocal last
        if time.monotonic() - last < HEARTBEAT:
            return
        last = time.monotonic()
        with platform.db.write() as s:
            held = _held(s, version_id, worker)
            if held is None:
                raise _Abandoned()
            held.claimed_at = utcnow()
            held.state_reason = f"read {done.objects} object(s), {done.bytes} bytes so far"

    try:
        reader = _reader(platform)
        src = check_source(platform.settings, source)  # the allow-list may have changed since
        manifest = reader.scan(src, datasets._limits(platform), alive)
        platform.objects.put_tree_manifest(key, manifest)
    except _Abandoned:
        log.info("dataset version %s: deleted or taken over while its objects were read", version_id)
        return True
    except DlcloudError as exc:
        log.warning("dataset version %s from %s failed: %s", version_id, source, exc.message)
        _fail(platform, version_id, worker, exc.message)
        return True
    except Exception as exc:
        log.exception("dataset version %s from %s failed", version_id, source)
        _fail(platform, version_id, worker, f"internal error ({type(exc).__name__}); see the server log")
        return True
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
            return True
        gone = s.get(DatasetVersionRow, version_id) is None
    if gone:  # deleted while it was read: its manifest must not stay
        datasets._remove_stored(platform, [key])
    return True


def _fail(platform: Platform, version_id: str, worker: str, reason: str) -> None:
    with platform.db.write() as s:
        row = _held(s, version_id, worker)
        if row is not None:
            row.state, row.state_reason = DatasetVersionState.FAILED.value, reason
            row.claimed_by = row.claimed_at = None


def prepare_pending(platform: Platform, worker: str | None = None) -> int:
    """Compute every pending version there is now (tests, and the worker's pass); how many were handled."""
    worker = worker or new_worker_id()
    count = 0
    while prepare_one(platform, worker):
        count += 1
    return count


class SourceWorker:
    """The thread that computes pending versions: woken by a registration (``wake``), else every ``POLL``."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.id = new_worker_id()
        self._wake = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                while not stop.is_set() and prepare_one(self.platform, self.id):
                    pass
            except Exception:  # keep the worker alive across transient database errors
                log.exception("dataset source worker pass failed")
            self._wake.wait(POLL)
