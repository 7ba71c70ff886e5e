"""The local executor's side of checkpoints in the object store (``storage/checkpoint_store.py``).

Saving: the job's checkpoint directory is written by tenant code, possibly while it is read, so it is first copied
into a private directory of the requests' scratch (``settings.scratch_dir``) by the same walk as a
``checkpoint_from`` copy (``checkpoints.copy_checkpoints``: nothing followed, special files never opened, bounded
by ``max_archive_members`` and ``checkpoint_copy_max_bytes`` and the disk's free space); the store reads only that
snapshot, which nothing of the job can reach. Names a stored tree cannot hold are left out and logged.

Restoring: the saved tree is fetched (each file verified) into the scratch, then copied into place by the same walk,
so the job's directory appears whole, owned by the job's sandbox uid, with the modes the job's own copy would
have (directories 0700, files 0600).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from dlcloud.errors import OutputsTooLarge
from dlcloud.executors.base import CheckpointsNotSaved, CheckpointsUnavailable
from dlcloud.executors.local.checkpoints import (
    NoRoom,
    SourceGone,
    TooLarge,
    TooManyEntries,
    copy_checkpoints,
    free_margin,
    size_text,
)
from dlcloud.executors.local.runner import make_private_dirs
from dlcloud.executors.outputs import scan_outputs
from dlcloud.storage import checkpoint_store
from dlcloud.storage.objects import ObjectStore, StorageError

log = logging.getLogger(__name__)

SNAPSHOT = "snapshot"


def save(
    objects: ObjectStore, key: str, job_dir: Path, name: str, scratch: Path, max_entries: int, max_bytes: int
) -> bool:
    """A snapshot of ``job_dir/name`` saved as the job's last checkpoints at ``key``; False when there is nothing
    to save (no such directory, or an empty one: a saved checkpoint is never replaced by nothing). Raises
    CheckpointsNotSaved past the bounds, StorageError when the store fails."""
    make_private_dirs(scratch)
    with tempfile.TemporaryDirectory(prefix="checkpoints-", dir=scratch) as tmp:
        snapshot = Path(tmp) / SNAPSHOT
        try:
            copied = copy_checkpoints(job_dir, name, snapshot, None, max_entries, max_bytes=max_bytes)
        except SourceGone:  # the job was deleted meanwhile
            return False
        except TooManyEntries:
            raise CheckpointsNotSaved(
                f"they hold more than {max_entries} files and directories, the most that is saved (max_archive_members)"
            ) from None
        except TooLarge:
            raise CheckpointsNotSaved(
                f"they take more than {size_text(max_bytes)}, the most that is saved (checkpoint_copy_max_bytes)"
            ) from None
        except NoRoom as exc:
            raise CheckpointsNotSaved(
                f"a snapshot of them ({size_text(exc.need)}) does not fit on the server's disk, which keeps "
                f"{size_text(exc.margin)} free; ask an administrator"
            ) from None
        if not copied.source_found or not copied.files:
            return False
        try:  # apparent sizes: a sparse file or a file of many names counts whole, once a name, as it is sent
            manifest, left_out = scan_outputs(snapshot, max_entries, max_bytes)
        except OutputsTooLarge:
            raise CheckpointsNotSaved(
                f"they hold more than {size_text(max_bytes)} (each name of a file counted, a sparse file whole), "
                "the most that is saved (checkpoint_copy_max_bytes)"
            ) from None
        if not manifest.entries:  # nothing a stored tree can hold: not a checkpoint to replace the last one with
            return False
        saved = checkpoint_store.save(objects, key, snapshot, manifest)
    if copied.left_out or left_out:
        shown = ", ".join(ascii(name) for name in sorted({**copied.left_out, **left_out})[:20])
        log.warning("checkpoints saved at %s without what a tree cannot hold: %s", key, shown)
    log.info("checkpoints saved at %s/%s (%d files, %d bytes)", key, saved.slot, saved.files, saved.bytes)
    return True


def restore(
    objects: ObjectStore,
    key: str,
    dest: Path,
    uid: int | None,
    scratch: Path,
    max_entries: int,
    max_bytes: int,
    whose: str = "",
) -> bool:
    """The last checkpoints saved at ``key`` copied to ``dest`` (which must not exist), owned by ``uid``; False
    when none were saved. ``whose``: for messages, the job they were saved by when it is another
    (``checkpoint_from``). Raises CheckpointsUnavailable when they cannot be read or put in place, StorageError
    when the store cannot be read (the preparation tries again)."""
    of = f" of job {whose} (checkpoint_from)" if whose else ""
    last = checkpoint_store.latest(objects, key)
    if last is None:
        return False
    make_private_dirs(scratch)
    fs = os.statvfs(scratch)  # fetched first into the scratch: it must fit there, the margin kept
    if last.bytes > fs.f_bavail * fs.f_frsize - free_margin(fs):
        raise CheckpointsUnavailable(
            f"the checkpoints{of} saved in the server's storage ({size_text(last.bytes)}) do not fit on this "
            "server's disk; ask an administrator"
        )
    with tempfile.TemporaryDirectory(prefix="restore-", dir=scratch) as tmp:
        try:
            saved = checkpoint_store.restore(objects, key, Path(tmp) / SNAPSHOT, last)
        except StorageError:
            raise
        except Exception as exc:  # damaged past both slots, or the scratch disk full
            log.error("the checkpoints saved at %s could not be read: %s", key, exc)
            raise CheckpointsUnavailable(
                f"the checkpoints{of} saved in the server's storage are damaged; ask an administrator"
            ) from None
        if saved is None:
            return False
        try:
            copy_checkpoints(Path(tmp), SNAPSHOT, dest, uid, max_entries, max_bytes=max_bytes)
        except (TooManyEntries, TooLarge, NoRoom, SourceGone, OSError) as exc:
            log.error("the checkpoints saved at %s could not be put in place: %s", key, exc)
            raise CheckpointsUnavailable(
                f"the checkpoints{of} saved in the server's storage do not fit on this server's disk; "
                "ask an administrator"
            ) from None
    log.info("checkpoints restored from %s/%s (%d files, %d bytes)", key, saved.slot, saved.files, saved.bytes)
    return True
