"""Dataset queries: datasets, versions, labels, shares and the versions jobs read.

Every lookup of a dataset takes the owning ``tenant_id``; versions and labels are reached through a dataset
found that way. Another tenant's dataset is visible only through ``shared_datasets`` / ``is_shared``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from dlcloud.schemas.datasets import DatasetVersionState
from dlcloud.store.registry import Tables
from dlcloud.store.rows import (
    DatasetLabelRow,
    DatasetRow,
    DatasetShareRow,
    DatasetVersionRow,
    JobDatasetRow,
    JobRow,
)

ENDED_JOB_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")
QUEUED_JOB_STATES = ("QUEUED", "RESTARTING")

TABLES = Tables(DatasetRow, DatasetVersionRow, DatasetLabelRow, DatasetShareRow)
get_dataset, list_datasets, shared_datasets = TABLES.get, TABLES.list_entries, TABLES.shared
is_shared, shares_of = TABLES.is_shared, TABLES.shares_of
list_versions, get_version, get_latest_version = TABLES.list_versions, TABLES.get_version, TABLES.get_latest_version


def pending_versions(s: Session) -> list[DatasetVersionRow]:
    """Every tenant's versions registered in place whose manifest is not computed yet, oldest first (for the
    worker that computes them: ``control/dataset_sources.py``)."""
    q = (
        select(DatasetVersionRow)
        .where(DatasetVersionRow.state == DatasetVersionState.PENDING.value)
        .order_by(DatasetVersionRow.created_at)
    )
    return list(s.scalars(q))


def readers(s: Session, version_ids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """version id -> (job name, job's tenant id) of the jobs not yet ended that read it (any tenant's: a
    dataset shared with another tenant may be read by its jobs)."""
    ids = list(version_ids)
    out: dict[str, list[tuple[str, str]]] = {i: [] for i in ids}
    if ids:
        q = (
            select(JobDatasetRow.version_id, JobRow.name, JobRow.tenant_id)
            .join(JobRow, JobRow.id == JobDatasetRow.job_id)
            .where(JobDatasetRow.version_id.in_(ids), JobRow.state.not_in(ENDED_JOB_STATES))
            .order_by(JobRow.name)
        )
        for version_id, job, tenant_id in s.execute(q):
            out[version_id].append((job, tenant_id))
    return out


def reading_jobs(s: Session, version_ids: Iterable[str], tenant_id: str) -> list[JobRow]:
    """The jobs of ``tenant_id`` not yet ended that read any of the versions, locked."""
    ids = list(version_ids)
    if not ids:
        return []
    q = (
        select(JobRow)
        .join(JobDatasetRow, JobDatasetRow.job_id == JobRow.id)
        .where(JobDatasetRow.version_id.in_(ids), JobRow.tenant_id == tenant_id, JobRow.state.not_in(ENDED_JOB_STATES))
        .with_for_update()
    )
    return list(s.scalars(q).unique())


def tenant_bytes(s: Session, tenant_id: str) -> int:
    """Bytes of every dataset version the tenant owns and the platform stores (not those registered in place)."""
    q = select(func.coalesce(func.sum(DatasetVersionRow.size_bytes), 0)).where(
        DatasetVersionRow.tenant_id == tenant_id, DatasetVersionRow.source_url.is_(None)
    )
    return int(s.scalar(q) or 0)


def has_version_under(s: Session, prefix: str) -> bool:
    """Whether some version is stored below ``prefix`` (a push's: ``services/datasets.push_prefix``)."""
    q = select(DatasetVersionRow.id).where(DatasetVersionRow.storage_key.startswith(prefix + "/"))
    return s.scalars(q).first() is not None


def forget_job_reads(s: Session, job_id: str) -> None:
    """The job reads none of the versions it was resolved to any more."""
    s.execute(delete(JobDatasetRow).where(JobDatasetRow.job_id == job_id))


def forget_version_reads(s: Session, version_ids: list[str]) -> None:
    """Every job's record of reading one of the versions goes."""
    s.execute(delete(JobDatasetRow).where(JobDatasetRow.version_id.in_(version_ids)))
