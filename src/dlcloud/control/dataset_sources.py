"""The dataset-source worker: computes the manifests of dataset versions registered in place.

It runs in every server process, leader or follower (``server.py`` starts it; claims keep two processes from
computing one version), on the loop-service base without a leadership: its writes are not fenced. Each tick
claims one pending version, reads its objects from the source and stores its manifest; the claim, its renewal and
the version's state are ``services/dataset_sources.py``'s (the one writer of that state machine), which the
request side (``register_version``) wakes through ``Platform.wake_sources``.
"""

from __future__ import annotations

import logging
import time

from dlcloud.control.loop_service import LoopService
from dlcloud.errors import DlcloudError
from dlcloud.services import dataset_sources as sources
from dlcloud.services import datasets
from dlcloud.services.platform import Platform
from dlcloud.storage.sources import Progress, check_source

log = logging.getLogger(__name__)
HEARTBEAT = 10.0  # seconds between the signs of life of a claim while its objects are read
POLL = 5.0  # seconds between two looks at the queue when nothing wakes the worker


class _Abandoned(Exception):
    """The version being prepared was deleted or taken over: stop reading its objects."""


def prepare_one(platform: Platform, worker: str) -> bool:
    """Claim one pending version and compute it to ready or failed; False when none was waiting."""
    version_id = sources.claim_pending(platform, worker)
    if version_id is None:
        return False
    claimed = sources.claimed_source(platform, version_id)
    if claimed is None:
        return True
    key, source = claimed
    last = time.monotonic()

    def alive(done: Progress) -> None:
        nonlocal last
        if time.monotonic() - last < HEARTBEAT:
            return
        last = time.monotonic()
        if not sources.renew_claim(platform, version_id, worker, done):
            raise _Abandoned()

    try:
        reader = sources.reader(platform)
        src = check_source(platform.settings, source)  # the allow-list may have changed since
        manifest = reader.scan(src, datasets._limits(platform), alive)
        platform.objects.put_tree_manifest(key, manifest)
    except _Abandoned:
        log.info("dataset version %s: deleted or taken over while its objects were read", version_id)
        return True
    except DlcloudError as exc:
        log.warning("dataset version %s from %s failed: %s", version_id, source, exc.message)
        sources.make_failed(platform, version_id, worker, exc.message)
        return True
    except Exception as exc:
        log.exception("dataset version %s from %s failed", version_id, source)
        sources.make_failed(platform, version_id, worker, f"internal error ({type(exc).__name__}); see the server log")
        return True
    sources.make_ready(platform, version_id, worker, key, source, manifest)
    return True


def prepare_pending(platform: Platform, worker: str | None = None) -> int:
    """Compute every pending version there is now (tests); how many were handled."""
    worker = worker or sources.new_worker_id()
    count = 0
    while prepare_one(platform, worker):
        count += 1
    return count


class SourceWorker(LoopService):
    """The loop that computes pending versions, one a tick: woken by a registration (``wake``), else every
    ``POLL``; a tick that computed one wakes the next at once, so a queue drains with ``stop`` looked at between
    two versions."""

    name = "dataset source worker"

    def __init__(self, platform: Platform) -> None:
        super().__init__(platform)  # every process runs one: no leadership fences it
        self.id = sources.new_worker_id()

    def interval(self) -> float:
        return POLL

    def tick(self) -> None:
        if prepare_one(self.p, self.id):
            self.wake()
