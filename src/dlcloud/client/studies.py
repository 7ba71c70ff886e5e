"""Hyperparameter studies (docs/tuning.md)."""

from __future__ import annotations

import builtins
from typing import Any

from dlcloud.client.transport import API, Transport


class StudiesAPI:
    def __init__(self, t: Transport):
        self._t = t

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit a study (the mapping of a study file: name, algorithm, objective, max_trials, trial,
        search_space...). Its trials run as jobs of yours named ``<study>-<number>``.

        Args:
            spec: the study; ``trial`` is a job spec without a name.
        Returns:
            The study, RUNNING.
        Raises:
            InvalidSpec / DlcloudError with code validation_error: the study or its trial is wrong.
            AlreadyExists: the tenant has a study of that name.
            QuotaExceeded: one trial job exceeds the tenant's limits.
        """
        return self._t.request("POST", f"{API}/studies", json_body=spec)

    def list(self, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
        return self._t.request("GET", f"{API}/studies", params={"limit": limit, "offset": offset})

    def get(self, name: str) -> dict[str, Any]:
        """The study: its state, progress (trial counts), the best trial so far and its spec."""
        return self._t.request("GET", f"{API}/studies/{name}")

    def trials(self, name: str) -> builtins.list[dict[str, Any]]:
        """Every trial, by number: state, params, value, job, reason."""
        return self._t.request("GET", f"{API}/studies/{name}/trials")

    def best(self, name: str) -> dict[str, Any]:
        """The best completed trial: ``{"number", "value", "params", "job"}``.

        Raises:
            NotFound: no such study, or no trial has completed yet.
        """
        return self._t.request("GET", f"{API}/studies/{name}/best")

    def stop(self, name: str) -> dict[str, Any]:
        """Stop a RUNNING study: its running trials are cancelled; ``resume`` continues it."""
        return self._t.request("POST", f"{API}/studies/{name}/stop")

    def resume(self, name: str) -> dict[str, Any]:
        """Continue a STOPPED study where it stopped."""
        return self._t.request("POST", f"{API}/studies/{name}/resume")
