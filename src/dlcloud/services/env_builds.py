"""Environment builds: the content-addressed builds behind environments (the request side; the builder that
makes them is the control plane's, ``control/env_builder.py``).

This module owns the ``environment_builds`` table; every build state change goes through it (the builder,
``control/env_builder.py``, records its outcome with ``finish_build``)::

    (no row) ──request_build──> BUILDING ──finish_build──> READY
                                  ^    └───finish_build──> FAILED ──request_build (a retry)──┘

Invariants:
- One row per spec hash (``executors.environments.BuildSpec.spec_hash``), shared by every environment of
  any tenant with that spec and by the built-ins: a spec is built once, however many ask for it at once.
- Builds run in the leader control-plane process only: each tick of the control loop calls
  ``EnvironmentBuilder.dispatch`` (``control/env_builder.py``), which hands the BUILDING rows this process is
  not building yet to a thread pool. A control plane that stops or crashes mid-build leaves the row BUILDING;
  the next leader builds it again from scratch. The builder's writes are fenced by the leader's epoch
  (``control/leader.py``): a builder whose process was deposed records nothing, and the next leader builds
  the row again.
- What a build makes (a venv, an image) is the platform's environment backend's (``Platform.environments``,
  made by the executor): it builds one hash once however many builders ask, so the second finds it finished.
- A build is removed (row, built environment and log) only when no environment refers to it, no unfinished
  job runs in it and it is not a built-in's; its files only while no builder builds it (``discard``).
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlcloud.executors.environments import BuildSpec
from dlcloud.schemas.environments import EnvironmentState
from dlcloud.services.platform import Platform
from dlcloud.store import environments as store
from dlcloud.store.rows import EnvironmentBuildRow, utcnow

log = logging.getLogger(__name__)
BUILDING, READY, FAILED = EnvironmentState.BUILDING.value, EnvironmentState.READY.value, EnvironmentState.FAILED.value


def request_build(s: Session, spec: BuildSpec, spec_hash: str) -> EnvironmentBuildRow:
    """The build of ``spec``, locked: created BUILDING when new, sent back to BUILDING when it FAILED."""
    row = store.get_build(s, spec_hash, for_update=True)
    if row is None:
        row = EnvironmentBuildRow(
            spec_hash=spec_hash, state=BUILDING, spec=spec.to_json(), error=None, builds=0, created_at=utcnow()
        )
        try:
            with s.begin_nested():
                s.add(row)
        except IntegrityError:  # created by a concurrent request (PostgreSQL): use that one
            found = store.get_build(s, spec_hash, for_update=True)
            if found is None:
                raise
            row = found
    elif row.state == FAILED:
        row.state, row.error, row.finished_at = BUILDING, None, None
        row.spec = spec.to_json()  # the same spec; wheels may have been uploaded again under new paths
    return row


def start_build(s: Session, spec_hash: str) -> BuildSpec | None:
    """The spec of a BUILDING build about to be built here (its start time recorded); None when it is not
    BUILDING any more (built by another leader, or forgotten)."""
    row = store.get_build(s, spec_hash, for_update=True)
    if row is None or row.state != BUILDING:
        return None
    row.started_at = utcnow()
    return BuildSpec.from_json(row.spec)


def finish_build(
    s: Session,
    spec_hash: str,
    state: EnvironmentState,
    *,
    error: str | None = None,
    size: int | None = None,
    built: bool,
) -> bool:
    """Record how a BUILDING build ended: READY (``size``) or FAILED (``error``, for users); ``built``: the
    backend built it (False: it found it built). False, and nothing written, when it is not BUILDING any more."""
    if state not in (EnvironmentState.READY, EnvironmentState.FAILED):
        raise ValueError(f"a build ends READY or FAILED, not {state}")
    row = store.get_build(s, spec_hash, for_update=True)
    if row is None or row.state != BUILDING:
        return False
    row.state, row.error, row.size_bytes, row.finished_at = state.value, error, size, utcnow()
    if built:
        row.builds += 1
    return True


def forget_if_unused(s: Session, spec_hash: str, keep: set[str]) -> bool:
    """Delete the build row when nothing needs it any more; True if the caller should remove its files."""
    if spec_hash in keep:
        return False
    build = store.get_build(s, spec_hash, for_update=True)
    if build is None or build.state == BUILDING:
        return False
    if store.environments_with_hash(s, spec_hash) or store.unfinished_jobs_with_hash(s, spec_hash):
        return False
    s.delete(build)
    return True


def remove_files(platform: Platform, spec_hash: str) -> None:
    """Remove a forgotten build's environment and log, unless someone wants the hash again meanwhile."""

    def wanted() -> bool:
        with platform.db.read() as s:
            return store.get_build(s, spec_hash) is not None

    try:
        platform.environments.discard(spec_hash, wanted)
    except OSError:  # the rows are gone; a leftover directory is only disk space
        log.exception("could not remove the environment build %s", spec_hash)
