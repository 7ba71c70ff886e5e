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

A save that finds the checkpoints past its bounds tells the job, once per attempt; a save while running that
fails otherwise (the store down, the server's disk full) is logged, and the next is tried no sooner than
``RETRY_SECONDS`` later (each try copies the whole directory again). At the end, a failure other than the store's
is told and leaves the outputs' save alone (``supervision``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from dlcloud.control.fair_pool import FairPool
from dlcloud.executors.base import CheckpointsNotSaved, Executor
from dlcloud.services.job_keys import checkpoints_key
from dlcloud.settings import Settings
from dlcloud.storage.objects import ObjectStore, StorageError
from dlcloud.store.rows import utcnow

log = logging.getLogger(__name__)
QUIET_SECONDS = 5.0  # a change to a running job's checkpoints is saved once they were left alone this long
RETRY_SECONDS = 60.0  # after a failed save of a running attempt's checkpoints, the next waits this long


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
        self._lock = threading.Lock()  # the saves run on the pool's threads, the rest on the loop's
        self._saved: dict[str, tuple[datetime, float]] = {}  # handle -> (the change saved, monotonic when)
        self._failed: dict[str, float] = {}  # handle -> when (monotonic) its last save while running failed
        self._told: set[str] = set()  # the handles of attempts told their checkpoints were not saved

    def forget(self, live: set[str]) -> None:
        """Drop what is kept of attempts that ended (``live``: the handles of those that did not)."""
        with self._lock:
            for kept in (self._saved, self._failed):
                for gone in set(kept) - live:
                    del kept[gone]
            self._told &= live

    def running(self, tenant_id: str, job_id: str, number: int, handle: str, at: datetime) -> None:
        """A running attempt's checkpoints last changed at ``at``: saved once quiet, if not saved since."""
        if not self.on or utcnow() - at < timedelta(seconds=QUIET_SECONDS):
            return
        now = time.monotonic()
        with self._lock:
            last, failed = self._saved.get(handle), self._failed.get(handle)
        if last is not None and (last[0] >= at or now - last[1] < self.interval):
            return
        if failed is not None and now - failed < RETRY_SECONDS:
            return

        def task() -> None:
            try:
                self._save(tenant_id, job_id, number, handle)
            except Exception as exc:  # the store down, the disk full: tried again later, and at the end
                log.error("job %s attempt %d: checkpoints not saved yet: %s", job_id, number, exc)
                with self._lock:
                    self._failed[handle] = time.monotonic()
                return
            with self._lock:
                self._saved[handle] = (at, time.monotonic())
                self._failed.pop(handle, None)

        if self.pool.running:
            self.pool.submit(tenant_id, ("checkpoints", handle), task)
        else:
            task()

    def at_end(self, tenant_id: str, job_id: str, number: int, handle: str) -> None:
        """The ended attempt's checkpoints, as it left them. StorageError goes to the caller (tried again); any
        other failure is logged and told, and the attempt ends all the same."""
        if not self.on:
            return
        try:
            self._save(tenant_id, job_id, number, handle)
        except StorageError:
            raise
        except Exception:
            log.exception("job %s attempt %d: checkpoints not saved", job_id, number)
            self.tell(job_id, number, "its checkpoints could not be saved to the server's storage (see the server log)")

    def _save(self, tenant_id: str, job_id: str, number: int, handle: str) -> None:
        try:
            self.executor.save_checkpoints(handle, checkpoints_key(tenant_id, job_id))
        except CheckpointsNotSaved as exc:  # past the bounds a save copies: the last saved stays the last saved
            with self._lock:
                told = handle in self._told
                self._told.add(handle)
            if not told:
                self.tell(job_id, number, f"its checkpoints were not saved to the server's storage: {exc.message}")
