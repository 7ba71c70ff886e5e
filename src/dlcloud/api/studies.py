"""Hyperparameter studies: submit, list, describe, trials, best, stop, resume (docs/tuning.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from dlcloud.api.deps import CallerDep, PlatformDep, set_audit_resource
from dlcloud.api.params import PageLimit, PageOffset, StudyName
from dlcloud.schemas.studies import BestTrial, Study, StudyDetail, StudySpec, Trial
from dlcloud.services import studies as svc

router = APIRouter()


@router.post("/studies", response_model=Study, status_code=status.HTTP_201_CREATED, name="studies.submit")
def submit_study(c: CallerDep, p: PlatformDep, spec: StudySpec, request: Request) -> Study:
    set_audit_resource(request, spec.name)
    return svc.submit_study(p, c, spec)


@router.get("/studies", response_model=list[Study], name="studies.list")
def list_studies(c: CallerDep, p: PlatformDep, limit: PageLimit = 100, offset: PageOffset = 0) -> list[Study]:
    return svc.list_studies(p, c, limit=limit, offset=offset)


@router.get("/studies/{name}", response_model=StudyDetail, name="studies.describe")
def describe_study(c: CallerDep, p: PlatformDep, name: StudyName) -> StudyDetail:
    return svc.describe_study(p, c, name)


@router.get("/studies/{name}/trials", response_model=list[Trial], name="studies.trials")
def list_trials(c: CallerDep, p: PlatformDep, name: StudyName) -> list[Trial]:
    return svc.list_trials(p, c, name)


@router.get("/studies/{name}/best", response_model=BestTrial, name="studies.best")
def best_trial(c: CallerDep, p: PlatformDep, name: StudyName) -> BestTrial:
    return svc.best_trial(p, c, name)


@router.post("/studies/{name}/stop", response_model=Study, name="studies.stop")
def stop_study(c: CallerDep, p: PlatformDep, name: StudyName) -> Study:
    return svc.stop_study(p, c, name)


@router.post("/studies/{name}/resume", response_model=Study, name="studies.resume")
def resume_study(c: CallerDep, p: PlatformDep, name: StudyName) -> Study:
    return svc.resume_study(p, c, name)
