"""Study and trial queries. Every lookup by name takes the tenant: tenant scoping lives here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlcloud.store.rows import AttemptRow, JobRow, StudyRow, StudyTrialRow


def get_study(s: Session, tenant_id: str, name_or_id: str, *, for_update: bool = False) -> StudyRow | None:
    q = select(StudyRow).where(
        StudyRow.tenant_id == tenant_id, (StudyRow.name == name_or_id) | (StudyRow.id == name_or_id)
    )
    if for_update:
        q = q.with_for_update()
    return s.execute(q).scalars().first()


def name_taken(s: Session, tenant_id: str, name: str) -> bool:
    return (
        s.execute(select(StudyRow.id).where(StudyRow.tenant_id == tenant_id, StudyRow.name == name)).first() is not None
    )


def list_studies(s: Session, tenant_id: str, limit: int, offset: int) -> Sequence[StudyRow]:
    q = select(StudyRow).where(StudyRow.tenant_id == tenant_id).order_by(StudyRow.created_at.desc(), StudyRow.id)
    return s.execute(q.limit(limit).offset(offset)).scalars().all()


def list_trials(s: Session, study_id: str) -> Sequence[StudyTrialRow]:
    q = select(StudyTrialRow).where(StudyTrialRow.study_id == study_id).order_by(StudyTrialRow.number)
    return s.execute(q).scalars().all()


def driven_study_ids(s: Session, states: Sequence[str]) -> list[str]:
    """The ids of studies in ``states`` (those the driver works on), oldest first."""
    q = select(StudyRow.id).where(StudyRow.state.in_(list(states))).order_by(StudyRow.created_at, StudyRow.id)
    return list(s.execute(q).scalars())


def job_states(s: Session, job_ids: Sequence[str]) -> dict[str, str]:
    if not job_ids:
        return {}
    rows = s.execute(select(JobRow.id, JobRow.state).where(JobRow.id.in_(list(job_ids))))
    return {r.id: r.state for r in rows}


def job_spans(s: Session, job_ids: Sequence[str]) -> list[tuple[str, int, datetime, datetime | None]]:
    """(job id, GPUs held, started, finished or None) of every attempt of these jobs."""
    if not job_ids:
        return []
    q = select(AttemptRow.job_id, AttemptRow.gpus, AttemptRow.started_at, AttemptRow.finished_at).where(
        AttemptRow.job_id.in_(list(job_ids))
    )
    return [(r.job_id, len(r.gpus or []), r.started_at, r.finished_at) for r in s.execute(q)]
