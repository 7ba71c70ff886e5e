"""A job's checkpoints saved in the object store, replaced without ever leaving less than the last whole save.

Under the job's checkpoints prefix (``services/job_keys.checkpoints_key``) the store keeps two trees, the slots
``a`` and ``b``, and one small object, ``latest`` (JSON: which slot holds the last whole save, when it was saved,
its files and bytes). A save writes the slot ``latest`` does not name (``put_tree``: visible whole or not at all)
and then points ``latest`` at it (one write of a small object, which replaces the old one whole on S3 and on the
local store). A crash, a full bucket or a failed upload at any step leaves ``latest`` naming a whole tree: the one
saved before.

A restore reads the slot ``latest`` names; that tree missing or damaged, the other slot (the save before it, when
there was one): a checkpoint saved earlier is worth more than none. Two saves of one job at once (a deposed leader
and its successor) write the same slot; the one that loses leaves that slot damaged or mixed, which its manifest's
checksums tell at the restore, and the other slot is read instead.

What is saved is what the executor hands over: a directory only the platform writes (a snapshot of the job's
checkpoint directory, never the directory the job is still writing), and its manifest.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dlcloud.errors import DlcloudError
from dlcloud.storage.objects import Manifest, ObjectDamaged, ObjectMissing, ObjectStore, StorageError

log = logging.getLogger(__name__)

SLOTS = ("a", "b")
LATEST = "latest"
MAX_LATEST_BYTES = 4096  # the pointer is a few dozen bytes: anything longer is not one


@dataclass(frozen=True)
class SavedCheckpoint:
    """One whole save: the slot holding it, when it was saved (ISO 8601, UTC; None: the save before the last,
    read because the last one could not be), its files and their bytes."""

    slot: str
    saved_at: str | None
    files: int
    bytes: int


def latest(objects: ObjectStore, prefix: str) -> SavedCheckpoint | None:
    """The last whole save under ``prefix``; None when none was ever saved (or its pointer is unreadable, which
    no save of dlcloud's leaves). StorageError when the store cannot be read."""
    try:
        data = b"".join(objects.iter_bytes(f"{prefix}/{LATEST}"))
    except ObjectMissing:
        return None
    try:
        if len(data) > MAX_LATEST_BYTES:
            raise ValueError("too long")
        body = json.loads(data)
        saved = SavedCheckpoint(str(body["slot"]), str(body["saved_at"]), int(body["files"]), int(body["bytes"]))
        if saved.slot not in SLOTS:
            raise ValueError(f"no slot {saved.slot!r}")
    except (ValueError, KeyError, TypeError) as exc:
        log.error("the saved checkpoints at %s have an unreadable pointer (%s): taken as none", prefix, exc)
        return None
    return saved


def save(objects: ObjectStore, prefix: str, src: Path, manifest: Manifest) -> SavedCheckpoint:
    """Store the directory ``src`` (whose files ``manifest`` lists) as the job's last saved checkpoints, in the
    slot the last save did not use; only once that tree is whole does ``latest`` name it."""
    before = latest(objects, prefix)
    slot = SLOTS[1] if before is not None and before.slot == SLOTS[0] else SLOTS[0]
    objects.put_tree(f"{prefix}/{slot}", src, manifest)
    saved = SavedCheckpoint(slot, datetime.now(UTC).isoformat(), len(manifest.entries), manifest.size)
    fd, name = tempfile.mkstemp(prefix=".latest-", dir=src.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(saved), f)
        objects.put_file(f"{prefix}/{LATEST}", Path(name))
    finally:
        os.unlink(name)
    return saved


def restore(
    objects: ObjectStore, prefix: str, dest: Path, saved: SavedCheckpoint | None = None
) -> SavedCheckpoint | None:
    """Write the job's last saved checkpoints into ``dest`` (created; it must not exist), each file verified
    against its manifest; None when none were saved. ``saved``: the pointer as the caller just read it
    (``latest``), else read here. That tree unreadable, the save before it; neither: ObjectDamaged.
    StorageError (the store down) goes to the caller, which tries again later."""
    saved = saved or latest(objects, prefix)
    if saved is None:
        return None
    other = SLOTS[1] if saved.slot == SLOTS[0] else SLOTS[0]
    for slot in (saved.slot, other):
        try:
            manifest = objects.get_tree(f"{prefix}/{slot}", dest)
        except StorageError:
            raise
        except DlcloudError as exc:  # missing or damaged: the other slot, the save before
            log.error("the saved checkpoints at %s/%s cannot be read: %s", prefix, slot, exc.message)
            _empty(dest)
            continue
        if slot == saved.slot:
            return saved
        return SavedCheckpoint(slot, None, len(manifest.entries), manifest.size)
    raise ObjectDamaged(prefix, "holds no whole saved checkpoint")


def _empty(dest: Path) -> None:
    """``dest`` as a failed read may have left it, emptied for the next one (never following a link)."""
    if not dest.exists():
        return
    for root, dirs, files in os.walk(dest, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            path = os.path.join(root, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                os.rmdir(path)
