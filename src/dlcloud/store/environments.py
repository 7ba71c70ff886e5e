"""Environment queries: user environments (tenant-scoped) and their builds (shared, keyed by spec hash).

Every lookup of an environment takes the owning ``tenant_id``. A build row holds no tenant data beyond the
spec every environment with that hash shares.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dlcloud.schemas.environments import EnvironmentState
from dlcloud.schemas.jobs import TERMINAL_STATES
from dlcloud.store.rows import EnvironmentBuildRow, EnvironmentRow, JobRow

_UNFINISHED = JobRow.state.not_in([s.value for s in TERMINAL_STATES])


def get_environment(s: Session, tenant_id: str, name: str, *, for_update: bool = False) -> EnvironmentRow | None:
    q = select(EnvironmentRow).where(EnvironmentRow.tenant_id == tenant_id, EnvironmentRow.name == name)
    if for_update:
        q = q.with_for_update()
    return s.scalars(q).first()


def list_environments(s: Session, tenant_id: str) -> list[EnvironmentRow]:
    q = select(EnvironmentRow).where(EnvironmentRow.tenant_id == tenant_id).order_by(EnvironmentRow.name)
    return list(s.scalars(q))


def get_build(s: Session, spec_hash: str, *, for_update: bool = False) -> EnvironmentBuildRow | None:
    q = select(EnvironmentBuildRow).where(EnvironmentBuildRow.spec_hash == spec_hash)
    if for_update:
        q = q.with_for_update()
    return s.scalars(q).first()


def builds_of(s: Session, hashes: Iterable[str]) -> dict[str, EnvironmentBuildRow]:
    wanted = sorted(set(hashes))
    if not wanted:
        return {}
    q = select(EnvironmentBuildRow).where(EnvironmentBuildRow.spec_hash.in_(wanted))
    return {b.spec_hash: b for b in s.scalars(q)}


def building_hashes(s: Session) -> list[str]:
    q = select(EnvironmentBuildRow.spec_hash).where(EnvironmentBuildRow.state == EnvironmentState.BUILDING.value)
    return list(s.scalars(q.order_by(EnvironmentBuildRow.created_at)))


def environments_with_hash(s: Session, spec_hash: str) -> int:
    q = select(func.count()).select_from(EnvironmentRow).where(EnvironmentRow.spec_hash == spec_hash)
    return int(s.scalar(q) or 0)


def unfinished_jobs_using(s: Session, tenant_id: str, name: str) -> list[str]:
    """Names of the tenant's jobs that have not ended and run in environment ``name``."""
    q = select(JobRow.name).where(JobRow.tenant_id == tenant_id, JobRow.environment == name, _UNFINISHED)
    return list(s.scalars(q.order_by(JobRow.created_at)))


def unfinished_jobs_with_hash(s: Session, spec_hash: str) -> int:
    q = select(func.count()).select_from(JobRow).where(JobRow.environment_hash == spec_hash, _UNFINISHED)
    return int(s.scalar(q) or 0)
