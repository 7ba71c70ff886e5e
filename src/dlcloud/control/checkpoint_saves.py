"""Checkpoints into the object store: when a running job changed its checkpoints, and when an attempt ends.

Where the settings say so (``checkpoints_saved``: ``checkpoint_store`` on, or auto with a store off this host), every
attempt's workload names the job's key (``job_keys.checkpoints_key``) and the key of the job its own start from
(``checkpoint_from``), and the supervision asks the executor to save (``Executor.save_checkpoints``):

- while an attempt runs, once the executor reports a change to its checkpoints (``AttemptReport.checkpoint_at``)
  that is at least ``QUIET_SECONDS`` old (a checkpoint being written is not taken half-way, as far as a pause
  tells) and newer than the one saved last, at most once every ``checkpoint_save_interval_seconds``; on the
  savers' pool, where one tenant's saves take turns with the others' and never run two at a time (so a save
  while running and the one at the end never write the job's slots at once);
- when the attempt ends, whatever ended it (a preemption included: the job's processes have exited, within
  their grace period, and the checkpoints are as they left them), before its end is recorded, with its outputs
  (``supervision._save_outputs``: the store down, tried again as they are).

A save that finds the checkpoints past its bounds tells the job, once per attempt; the store down while it runs
is logged and the next change tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from dlcloud.control.fair_pool import FairPool
from dlcloud.errors import DlcloudError
from dlcloud.executors.base import Executor
from dlcloud.services.job_keys import checkpoints_key
from dlcloud.settings import Settings
from dlcloud.storage.objects import ObjectStore, StorageError
from dlcloud.store.rows import utcnow

log = logging.getLogger(__name__)
QUIET_SECONDS = 5.0  # a change to a running job's checkpoints is saved once they were left alone this long


def checkpoints_saved(settings: Settings, objects: ObjectStore) -> bool:
    """Whether jobs' checkpoints are saved into the object store (settings ``checkpoint_store``)."""
    return settings.checkpoint_store == "on" or (settings.checkpoint_store == "auto" and not objects.on_this_host)


class CheckpointSaves:
    """The saves of running attempts' checkpoints, and the save at an attempt's end (see the module)."""

    def __init__(
        self,
        executor: Executor,
        settings: Settings,
        objects: ObjectStore,
        pool: FairPool,
        tell: Callable[[str, int, str], None],
    ) -> None:
        self.on = checkpoints_saved(settings, objects)
        self.executor = executor
        self.interval = settings.checkpoint_save_interval_seconds
        self.pool = pool
        self.tell = tell  # (job id, attempt number, what): a note on the job
        self._saved: dict[str, tuple[datetime, float]] = {}  # handle -> (the change saved, monotonic when)
        self._told: set[str] = set()  # the handles of attempts told their checkpoints were not saved

    def forget(self, live: set[str]) -> None:
        """Drop what is kept of attempts that ended (``live``: the handles of those that did not)."""
        for gone in set(self._saved) - live:
            del self._saved[gone]
        self._told &= live

    def running(self, tenant_id: str, job_id: str, number: int, handle: str, at: datetime) -> None:
        """A running attempt's checkpoints last changed at ``at``: saved once quiet, if not saved since."""
        if not self.on or utcnow() - at < timedelta(seconds=QUIET_SECONDS):
            return
        last = self._saved.get(handle)
        if last is not None and (last[0] >= at or time.monotonic() - last[1] < self.interval):
            return

        def task() -> None:
            try:
                self._save(tenant_id, job_id, number, handle)
            except StorageError as exc:  # the next change, or the end, tries again
                log.error("job %s attempt %d: checkpoints not saved yet: %s", job_id, number, exc.message)
                return
            self._saved[handle] = (at, time.monotonic())

        if self.pool.running:
            self.pool.submit(tenant_id, ("checkpoints", handle), task)
        else:
            task()

    def at_end(self, tenant_id: str, job_id: str, number: int, handle: str) -> None:
        """The ended attempt's checkpoints, as it left them. StorageError goes to the caller (tried again)."""
        if self.on:
            self._save(tenant_id, job_id, number, handle)

    def _save(self, tenant_id: str, job_id: str, number: int, handle: str) -> None:
        try:
            self.executor.save_checkpoints(handle, checkpoints_key(tenant_id, job_id))
        except StorageError:
            raise
        except DlcloudError as exc:  # past the bounds a save copies: the last saved stays the last saved
            if handle not in self._told:
                self._told.add(handle)
                self.tell(job_id, number, f"its checkpoints were not saved to the server's storage: {exc.message}")
