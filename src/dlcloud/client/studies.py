"""Hyperparameter studies (docs/tuning.md)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from dlcloud.client.transport import API, Transport, spec_body
from dlcloud.schemas.studies import BestTrial, Study, StudyDetail, StudySpec, Trial


class StudiesAPI:
    def __init__(self, t: Transport):
        self._t = t

    def submit(self, spec: StudySpec | Mapping[str, Any]) -> Study:
        """Submit a study (a ``StudySpec``, or the mapping of a study file: name, algorithm, objective,
        max_trials, trial, search_space...). Its trials run as jobs of yours named ``<study>-<number>``.

        Args:
            spec: the study; ``trial`` is a job spec without a name. A mapping is validated as a ``StudySpec``
                first; what it sets is sent as written.
        Returns:
            The study, RUNNING.
        Raises:
            InvalidSpec / DlcloudError with code validation_error: the study or its trial is wrong.
            AlreadyExists: the tenant has a study of that name.
            QuotaExceeded: one trial job exceeds the tenant's limits.
        """
        return self._t.read(Study, "POST", f"{API}/studies", json_body=spec_body(StudySpec, spec))

    def list(self, limit: int = 100, offset: int = 0) -> builtins.list[Study]:
        """Your tenant's studies."""
        return self._t.read_list(Study, f"{API}/studies", params={"limit": limit, "offset": offset})

    def get(self, name: str) -> StudyDetail:
        """The study: its state, progress (trial counts), the best trial so far and its spec."""
        return self._t.read(StudyDetail, "GET", f"{API}/studies/{name}")

    def trials(self, name: str) -> builtins.list[Trial]:
        """Every trial, by number: state, params, value, job, reason."""
        return self._t.read_list(Trial, f"{API}/studies/{name}/trials")

    def best(self, name: str) -> BestTrial:
        """The best completed trial: its number, value, params and job.

        Raises:
            NotFound: no such study, or no trial has completed yet.
        """
        return self._t.read(BestTrial, "GET", f"{API}/studies/{name}/best")

    def stop(self, name: str) -> Study:
        """Stop a RUNNING study: its running trials are cancelled; ``resume`` continues it."""
        return self._t.read(Study, "POST", f"{API}/studies/{name}/stop")

    def resume(self, name: str) -> Study:
        """Continue a STOPPED study where it stopped."""
        return self._t.read(Study, "POST", f"{API}/studies/{name}/resume")
