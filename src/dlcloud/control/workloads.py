"""Workload building: what one attempt of a job runs, decided from its rows, in terms of no host.

The control loop (``scheduling.py`` when it places an attempt, ``supervision.py`` when it starts again one
that was recorded but never launched) turns a job row into a ``Workload``: its command and phases, its env
(``env``, the decrypted ``secret_env``, the DLCLOUD_* variables the platform sets, the attempt's metrics
token among them, and a trial's from its platform state), its code and datasets by storage key (the versions
resolved at submit, ``JobRow.platform_state``), its environment by spec hash, the replicas its recipe makes, its
limits, the job whose checkpoints its own start from (``checkpoint_from``, by the id resolved at submit), and where
the store keeps both jobs' saved checkpoints when it keeps them (``checkpoint_saves``). Where
the attempt runs (directories, local copies, addresses) the executor decides behind its handle.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from dlcloud.control.checkpoint_saves import checkpoints_saved
from dlcloud.executors.base import DatasetMount, Egress, Executor, StoredCode, Workload
from dlcloud.schemas.jobs import DEFAULT_POST_TIMEOUT_SECONDS
from dlcloud.services import metrics, recipes
from dlcloud.services.admission import tenant_processes
from dlcloud.services.job_keys import checkpoints_key
from dlcloud.services.jobs import hparams_env, job_env
from dlcloud.services.platform import Platform
from dlcloud.store.rows import CodeRow, JobRow, TenantRow, utcnow


def build(
    platform: Platform,
    executor: Executor,
    s: Session,
    job: JobRow,
    gpus: tuple[int, ...],
    handle: str,
    ports: list[int],
) -> Workload:
    """The Workload of attempt ``job.attempt`` (already counted) on ``gpus`` with ``ports``. Reads the job's
    code and tenant rows through ``s`` (``s.get``: the placing pass loads them beforehand, so no query runs)."""
    env = _attempt_env(platform, job)
    launch = _launch(executor, job, gpus, handle, ports)
    if launch is not None:
        env.update(launch.env)
    grace = job.spec.get("grace_period")
    keys = _checkpoint_keys(platform, job)
    return Workload(
        job_id=job.id,
        tenant_id=job.tenant_id,
        attempt=job.attempt,
        command=job.command,
        pre_command=job.spec.get("pre_command"),
        post_command=job.spec.get("post_command"),
        post_timeout_seconds=float(job.spec.get("post_timeout") or DEFAULT_POST_TIMEOUT_SECONDS),
        env=env,
        code=_stored_code(s, job),
        environment=job.environment_hash,
        datasets=tuple(DatasetMount(d.name, d.storage_key, d.sha256) for d in job.platform_state.datasets),
        gpus=gpus,
        cpus=job.cpus,
        memory_bytes=job.memory,
        timeout_seconds=_time_left(job),
        grace_seconds=float(grace) if grace is not None else platform.settings.stop_grace_seconds,
        log_max_bytes=platform.settings.job_log_max_bytes,
        replicas=launch.replicas if launch else (),
        checkpoint_from=job.platform_state.checkpoint_from_id,
        checkpoints_key=keys[0],
        checkpoint_from_key=keys[1],
        api_url=platform.settings.resolved_job_api_url,
        publish=tuple(int(p) for p in job.spec.get("publish") or ()),
        **_tenant_terms(platform, s.get(TenantRow, job.tenant_id), len(launch.replicas) if launch else 1),
    )


def _checkpoint_keys(platform: Platform, job: JobRow) -> tuple[str | None, str | None]:
    """Where the store keeps the job's saved checkpoints and those of the job its own start from, where they are
    saved there (``checkpoint_saves.checkpoints_saved``); else (None, None)."""
    if not checkpoints_saved(platform.settings, platform.objects):
        return None, None
    source = job.platform_state.checkpoint_from_id
    return checkpoints_key(job.tenant_id, job.id), checkpoints_key(job.tenant_id, source) if source else None


def _stored_code(s: Session, job: JobRow) -> StoredCode | None:
    row = s.get(CodeRow, job.code_id) if job.code_id else None
    if row is None:
        return None
    return StoredCode(row.storage_key, row.sha256, "archive" if row.kind == "archive" else "package")


def _attempt_env(platform: Platform, job: JobRow) -> dict[str, str]:
    """The job's env, decrypted secret env and platform-given env, with the platform's variables of this
    attempt."""
    env = job_env(platform, job)
    env.update(
        {
            "DLCLOUD_JOB": job.name,
            "DLCLOUD_JOB_ID": job.id,
            "DLCLOUD_ATTEMPT": str(job.attempt),
            "DLCLOUD_ENVIRONMENT": job.environment or "default",
            # where and with what this attempt pushes its metrics (docs/metrics.md): never a user's key
            "DLCLOUD_METRICS_URL": f"{platform.settings.resolved_job_api_url}/api/v1/jobs/{job.id}/metrics",
            "DLCLOUD_METRICS_TOKEN": metrics.issue_token(platform, job.tenant_id, job.id, job.attempt),
        }
    )
    hparams = hparams_env(job.spec)
    if hparams is not None:
        env["DLCLOUD_HPARAMS"] = hparams
    return env


def _launch(
    executor: Executor, job: JobRow, gpus: tuple[int, ...], handle: str, ports: list[int]
) -> recipes.Launch | None:
    """The distributed launch of a job with replica groups or a framework (None: one plain process)."""
    if not job.replica_groups and (job.spec.get("framework") or "none") == "none":
        return None
    per_slot: list[tuple[int, ...]] = [gpus]
    if job.replica_groups:
        per_slot, rest = [], list(gpus)
        for slot in recipes.slots(job.replica_groups):
            per_slot.append(tuple(rest[: slot.gpus]))
            rest = rest[slot.gpus :]
    return recipes.build(
        job.spec,
        job.replica_groups,
        command=job.command,
        job_id=job.id,
        attempt=job.attempt,
        max_restarts=job.max_restarts,
        host=executor.replica_host(handle),
        ports=ports,
        gpus=per_slot,
        as_root=executor.jobs_run_as_root,
    )


def _time_left(job: JobRow) -> float | None:
    """What is left of the job's timeout (counted from its first start), at least half a second."""
    if job.timeout_seconds is None:
        return None
    elapsed = (utcnow() - job.started_at).total_seconds() if job.started_at else 0.0
    return max(job.timeout_seconds - elapsed, 0.5)


def _tenant_terms(platform: Platform, tenant: TenantRow | None, replicas: int) -> dict[str, Any]:
    """What a workload takes from its tenant: its sandbox number, its egress policy, whether it may make user
    namespaces, and its uid's process limit (for a job of ``replicas`` replicas)."""
    return {
        "sandbox_slot": tenant.sandbox_slot if tenant is not None else None,
        "egress": egress(platform, tenant),
        "user_namespaces": bool(tenant is not None and tenant.user_namespaces),
        "tenant_processes": tenant_processes(
            platform.settings, tenant.quota_max_running_jobs if tenant else None, replicas
        ),
    }


def egress(platform: Platform, tenant: TenantRow | None) -> Egress:
    """The tenant's network policy, else the platform's (``job_egress``, ``job_egress_allow``)."""
    if tenant is not None and tenant.egress is not None:
        return Egress(tenant.egress, tuple(tenant.egress_allow or ()))  # type: ignore[arg-type]
    return Egress(platform.settings.job_egress, tuple(platform.settings.job_egress_allow))
