"""The environment builder: builds the BUILDING environment builds of ``services/env_builds.py`` in the leader
control-plane process (the state machine of a build and its request side live there).

Each tick of the control loop calls ``EnvironmentBuilder.dispatch``, which hands the BUILDING rows this process
is not building yet to a thread pool. Its writes are fenced by the leader's epoch (``leader.py``): a builder
whose process was deposed records nothing, and the next leader builds the row again.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from dlcloud.control.leader import Leadership, LeadershipLost
from dlcloud.control.loop_service import fenced_write
from dlcloud.executors.environments import BuildCancelled, BuildError, Cancellation
from dlcloud.schemas.environments import EnvironmentState
from dlcloud.services import env_builds
from dlcloud.services.platform import Platform
from dlcloud.store import environments as store

log = logging.getLogger(__name__)


class EnvironmentBuilder:
    """Builds the BUILDING builds in a thread pool of ``env_build_workers`` threads.

    ``dispatch`` is cheap (one query) and is called by the control loop on every tick; ``shutdown`` stops
    the running builds (``Cancellation``) and leaves their rows BUILDING for the next leader. Builds are the
    platform's environment backend's, sandboxed as the executor that made it sandboxes them.

    """

    def __init__(self, platform: Platform, leadership: Leadership | None = None):
        self.p = platform
        self.leadership = leadership  # fences the builder's writes; None: unfenced
        self._pool = ThreadPoolExecutor(
            max_workers=platform.settings.env_build_workers, thread_name_prefix="dlcloud-env"
        )
        self._cancel = Cancellation()
        self._lock = threading.Lock()
        self._inflight: set[str] = set()
        self._closed = False

    def dispatch(self) -> int:
        """Start building the BUILDING builds not being built here yet; returns how many were started."""
        with self.p.db.read() as s:
            hashes = store.building_hashes(s)
        started = 0
        with self._lock:
            if self._closed:
                return 0
            for spec_hash in hashes:
                if spec_hash not in self._inflight:
                    self._inflight.add(spec_hash)
                    self._pool.submit(self._run, spec_hash)
                    started += 1
        return started

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        self._cancel.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, spec_hash: str) -> None:
        try:
            self.build(spec_hash)
        except LeadershipLost as exc:  # the control loop stops leading too; the next leader builds it
            log.warning("build of environment %s not recorded: %s", spec_hash[:12], exc)
        except Exception:  # a database error: the row stays BUILDING and the next dispatch tries again
            log.exception("building environment %s failed unexpectedly", spec_hash)
        finally:
            with self._lock:
                self._inflight.discard(spec_hash)
            self.p.wake()  # jobs waiting for this environment may start now

    def build(self, spec_hash: str) -> None:
        """Build one BUILDING build in this thread and record READY or FAILED."""
        with fenced_write(self.p.db, self.leadership) as s:
            spec = env_builds.start_build(s, spec_hash)
        if spec is None:
            return
        log.info("building environment %s (Python %s, inherit %s)", spec_hash[:12], spec.python, spec.inherit)
        try:
            result = self.p.environments.build(spec, spec_hash, self._cancel)
        except BuildCancelled:
            log.info("build of environment %s interrupted by shutdown", spec_hash[:12])
            return
        except BuildError as exc:
            self._finish(spec_hash, EnvironmentState.FAILED, error=str(exc), built=True)
        else:
            self._finish(spec_hash, EnvironmentState.READY, size=result.size_bytes, built=result.built)

    def _finish(
        self,
        spec_hash: str,
        state: EnvironmentState,
        *,
        error: str | None = None,
        size: int | None = None,
        built: bool,
    ) -> None:
        with fenced_write(self.p.db, self.leadership) as s:
            if not env_builds.finish_build(s, spec_hash, state, error=error, size=size, built=built):
                return
        log.info("environment %s is %s%s", spec_hash[:12], state.value, f": {error}" if error else "")
