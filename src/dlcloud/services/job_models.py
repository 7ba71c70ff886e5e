"""Registering a model from a job that succeeded: the spec's ``register_model`` (docs/jobs.md).

When supervision records a job's SUCCEEDED, it hands the job to ``register_after_success``, which registers
``register_model.path`` of the job's saved outputs as a new version of ``register_model.name`` in a worker
thread, the way ``dlcloud models register --from-job`` would (``models.register_model``), as the job's user.

Invariants:
- Only a SUCCEEDED job registers, once, after its outputs were saved (supervision saves them before it
  records the attempt's end).
- The outcome is one job event (``job_states.note``, no state change): ``model NAME version N registered
  ...`` or ``model NAME not registered: WHY``. A failed registration never changes the job's state.
- The version's metrics are the last value of each metric the job's final attempt reported (main process).
- Not crash-safe: a control plane that stops between the job's end and the registration does not register
  it later; the event is then missing, and ``dlcloud models register --from-job`` does the same by hand.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from dlcloud.errors import DlcloudError
from dlcloud.schemas.models import FromJob, ModelRegister
from dlcloud.schemas.users import Role
from dlcloud.services import job_states, models
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.store import metrics as metric_store
from dlcloud.store.rows import JobRow, TenantRow, UserRow

log = logging.getLogger(__name__)
MAX_METRICS = 256


def register_after_success(platform: Platform, job_id: str) -> threading.Thread:
    """Register the job's model in a worker thread (inspecting an artifact may take seconds); the thread."""
    thread = threading.Thread(
        target=register_from_job, args=(platform, job_id), name=f"register-model-{job_id}", daemon=True
    )
    thread.start()
    return thread


def _last_metrics(rows: list[tuple[str, int, str, int, float, Any]], attempt: int) -> dict[str, float]:
    """The value at the highest step of each metric of ``attempt``'s main process."""
    out: dict[str, float] = {}
    for metric, att, replica, _step, value, _time in rows:  # ordered by metric, attempt, replica, step
        if att == attempt and replica == "" and math.isfinite(value) and len(metric) <= 128:
            out[metric] = value
    return dict(list(out.items())[:MAX_METRICS])


def register_from_job(platform: Platform, job_id: str) -> str:
    """Register the model ``register_model`` names from the job's outputs; the event's reason (recorded)."""
    caller: Caller | None = None
    with platform.db.read() as s:
        job = s.get(JobRow, job_id)
        if job is None:
            return "job deleted before its model was registered"
        target = job.platform_state.register_model
        if target is None:
            return "the job registers no model"
        user = s.get(UserRow, job.user_id)
        tenant = s.get(TenantRow, job.tenant_id)
        if user is not None and tenant is not None:
            caller = Caller(
                tenant_id=tenant.id,
                tenant=tenant.name,
                user_id=user.id,
                user=user.name,
                role=Role(user.role),
                access_key=f"job:{job_id}",
            )
        rows = metric_store.read_points(s, job.id, (), job.attempt, "")
        attempt, job_name, user_id = job.attempt, job.name, job.user_id
    name = target.name
    try:
        if caller is None:
            raise DlcloudError(f"the job's user {user_id} no longer exists", "not_found")
        req = ModelRegister(
            name=name,
            format=target.format,
            from_job=FromJob(job=job_id, path=target.path),
            signature=target.signature,
            metrics=_last_metrics(rows, attempt),
            description=target.description or f"registered by job {job_name} when it succeeded",
        )
        version = models.register_model(platform, caller, req)
        reason = f"model {name} version {version.version} registered from {target.path}"
    except DlcloudError as exc:
        reason = f"model {name} not registered: {exc.message}"
    except Exception:  # whatever went wrong, the job's owner learns that it did
        log.exception("job %s: registering model %s failed", job_id, name)
        reason = f"model {name} not registered: an internal error (see the server log)"
    log.info("job %s: %s", job_id, reason)
    with platform.db.write() as s:
        row = s.get(JobRow, job_id)
        if row is not None:
            job_states.note(s, row, reason)
    return reason
