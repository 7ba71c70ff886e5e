"""A tenant's per-uid process limit (as root without a pids cgroup), derived from its quota within the platform's
cap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dlcloud.services.admission import tenant_processes
from dlcloud.settings import Settings
from dlcloud.store.rows import TenantRow


def _platform(tmp_path, **settings) -> SimpleNamespace:
    return SimpleNamespace(settings=Settings(data_dir=tmp_path, **settings))


@pytest.mark.parametrize(
    ("running", "pids", "cap", "expected"),
    [
        (None, 4096, 16384, 16384),  # no running-jobs quota: the platform's cap
        (2, 4096, 16384, 8192),  # what its quota lets it run: 2 jobs of 4096 processes
        (8, 4096, 16384, 16384),  # within the platform's cap
        (3, 100, 0, 300),  # no platform cap: what its quota lets it run
        (2, 0, 16384, 16384),  # no per-job limit to derive from: the platform's cap
    ],
)
def test_a_tenants_process_limit_comes_from_its_quota_within_the_platforms_cap(
    tmp_path, running, pids, cap, expected
) -> None:
    platform = _platform(tmp_path, job_pids_max=pids, tenant_processes_max=cap)
    tenant = TenantRow(quota_max_running_jobs=running)
    assert tenant_processes(platform.settings, tenant.quota_max_running_jobs) == expected


def test_a_gangs_replicas_each_count_a_jobs_processes(tmp_path) -> None:
    settings = _platform(tmp_path, job_pids_max=100, tenant_processes_max=0).settings
    assert tenant_processes(settings, 1, replicas=4) == 400  # one running job: a gang of 4 replicas of 100
    assert tenant_processes(settings, 2, replicas=0) == 200  # no replicas: one process tree per job


def test_without_a_tenant_row_the_platforms_cap_holds(tmp_path) -> None:
    assert tenant_processes(_platform(tmp_path, tenant_processes_max=500).settings, None) == 500
