"""A tenant's storage quota: the bytes of its dataset versions, model versions, code uploads, its jobs' saved
outputs and the disk its jobs' checkpoints take.

Dataset versions registered in place (objects left in their own bucket, ``source_url``) do not count: the
platform stores only their manifest.

Checked twice: before an upload's body is read (what is stored already plus the declared length must fit,
so nothing is received that could not be kept; a body without a declared length is cut where it stops
fitting), and when a version is added (its unpacked size is known then), in the transaction that adds it.
Uploads waiting for their register or push do not count; what they become does.

A job's outputs and checkpoints (``JobRow.outputs_bytes``, ``JobRow.checkpoints_bytes``) are written by the
supervision when an attempt ends: the checkpoints as the executor measures them (``record_checkpoints``: they
are on its disk already, so they count, and are never refused); the outputs once measured and before any byte
is copied (``admit_outputs``: over what is left of the quota, nothing is saved and the job is told), counted
from then on, and settled once saved (``settle_outputs``: the previous attempt's go). A job deleted takes both
with it.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from dlcloud.errors import QuotaExceeded
from dlcloud.schemas.common import format_memory
from dlcloud.services.auth import Caller
from dlcloud.storage.objects import ObjectStore
from dlcloud.store.db import Database
from dlcloud.store.rows import JobRow, TenantRow
from dlcloud.store.tenants import get_storage_quota, storage_used


def _refuse(tenant: str, used: int, adding: int | None, limit: int) -> QuotaExceeded:
    what = f"adding {format_memory(adding)} " if adding is not None else ""
    return QuotaExceeded(
        f"tenant {tenant!r} stores {format_memory(used)} of its storage quota of {format_memory(limit)}; {what}"
        "would exceed it: delete dataset or model versions you no longer need, or ask an admin for more",
        details={"resource": "storage", "limit": limit, "used": used, "requested": adding},
    )


def over_quota_while_receiving(db: Database, caller: Caller) -> QuotaExceeded | None:
    """The quota error for a body cut at its allowance, when the quota (not the upload limit) cut it."""
    with db.read() as s:
        quota = get_storage_quota(s, caller.tenant_id)
        return None if quota is None else _refuse(caller.tenant, storage_used(s, caller.tenant_id), None, quota)


def upload_allowance(db: Database, objects: ObjectStore, caller: Caller, content_length: int | None, limit: int) -> int:
    """The most bytes an upload of the caller's tenant may send now: ``limit`` (the upload limit) or less
    where the storage quota leaves less — counting the tenant's uploads that wait for a push or a register
    (they take room until they are used or expire); QuotaExceeded before the body is read when the declared
    length (or any byte, when the quota is used up) would not fit."""
    with db.read() as s:
        quota = get_storage_quota(s, caller.tenant_id)
        if quota is None:
            return limit
        used = storage_used(s, caller.tenant_id)
    used += sum(info.size for info in objects.list(f"uploads/{caller.tenant_id}"))
    room = quota - used
    if room <= 0 or (content_length is not None and content_length > room):
        raise _refuse(caller.tenant, used, content_length, quota)
    return min(limit, room)


def check_fits(s: Session, tenant_id: str, tenant_name: str, adding: int) -> None:
    """In the transaction that adds ``adding`` bytes: the tenant's row is locked, so two additions cannot
    both fit in the room left for one."""
    tenant = s.get(TenantRow, tenant_id, with_for_update=True)
    if tenant is None or tenant.quota_storage is None:
        return
    used = storage_used(s, tenant_id)
    if used + adding > tenant.quota_storage:
        raise _refuse(tenant_name, used, adding, tenant.quota_storage)


def record_checkpoints(s: Session, job_id: str, size: int) -> None:
    """The disk the job's checkpoints take, as the executor measured it when an attempt ended."""
    job = s.get(JobRow, job_id)
    if job is not None:
        job.checkpoints_bytes = size


def admit_outputs(s: Session, job_id: str, size: int) -> int:
    """Before an ended attempt's outputs of ``size`` bytes are copied, in a transaction of their own: refused
    (QuotaExceeded, whose message the job's events show) when they do not fit in what the tenant's storage quota
    leaves, counting the job's saved outputs as gone (the new ones replace them); else counted at once, beside the
    saved ones until ``settle_outputs``. The tenant's row is locked, so an upload cannot take the same room.
    Returns the bytes the job's saved outputs took before (for ``settle_outputs``)."""
    job = s.get(JobRow, job_id)
    if job is None:
        return 0
    before = job.outputs_bytes
    tenant = s.get(TenantRow, job.tenant_id, with_for_update=True)
    if tenant is not None and tenant.quota_storage is not None:
        others = storage_used(s, job.tenant_id) - before
        room = max(0, tenant.quota_storage - others)
        if size > room:
            raise QuotaExceeded(
                f"its outputs ({format_memory(size)}) were not saved: tenant {tenant.name!r} has {format_memory(room)} "
                f"left of its storage quota of {format_memory(tenant.quota_storage)}; keep less in the job's output "
                "directory, delete jobs, dataset or model versions you no longer need, or ask an admin for more",
                details={"resource": "storage", "limit": tenant.quota_storage, "used": others, "requested": size},
            )
    job.outputs_bytes = before + size
    return before


def settle_outputs(s: Session, job_id: str, saved: int | None, before: int) -> None:
    """After the copy: the job's outputs take ``saved`` bytes (the new ones stored, the earlier ones deleted), or
    ``before`` again when nothing new was stored (None)."""
    job = s.get(JobRow, job_id)
    if job is not None:
        job.outputs_bytes = before if saved is None else saved
