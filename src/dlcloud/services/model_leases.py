"""Deployment leases on model versions: a served version cannot be deleted (this module writes ``model_deployments``).

A version is *deployed* while one of its leases has not expired; deleting it or its model is refused with 409
``model_deployed`` (``refuse_if_deployed``). Every tenant that can read a model may hold leases on it; a lease is
named per holding tenant and belongs to its user: only that user renews or releases it. Expired leases count
nowhere. Leases are written under the model row's lock, which every deletion takes too. Unsharing a model ends
the leases of the tenant it was shared with (``models.unshare_model``).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from dlcloud.errors import ModelDeployed, ModelVersionNotFound, PermissionDenied
from dlcloud.schemas.models import DeploymentLease, ModelDeployment
from dlcloud.services.auth import Caller
from dlcloud.services.model_access import MODELS, shown_name
from dlcloud.services.platform import Platform
from dlcloud.store import models as store
from dlcloud.store.rows import ModelDeploymentRow, ModelVersionRow, utcnow
from dlcloud.store.tenants import user_names


def deployment_model(row: ModelDeploymentRow, tenant: str, holder: str | None) -> ModelDeployment:
    return ModelDeployment(
        name=row.name,
        endpoint=row.endpoint,
        tenant=tenant,
        holder=holder,
        created_at=row.created_at,
        last_seen=row.last_seen,
        expires_at=row.expires_at,
    )


def refuse_if_deployed(s: Session, rows: list[ModelVersionRow], what: str) -> None:
    live = live_leases(s, [r.id for r in rows])
    held = [(r.version, d, t) for r in rows for d, t in live[r.id]]
    if held:
        names = ", ".join(f"v{v} by {d.name} ({t})" for v, d, t in held[:5])
        raise ModelDeployed(
            f"{what} is deployed ({names}); undeploy it first or let its lease expire",
            details={
                "deployments": [
                    {"version": v, "name": d.name, "tenant": t, "expires_at": d.expires_at.isoformat()}
                    for v, d, t in held
                ]
            },
        )


def _lease_version(
    s: Session, caller: Caller, name: str, version: int, owner: str | None
) -> tuple[ModelVersionRow, str]:
    """The version a lease is about, with the model's shown name: any model the caller may read, locked."""
    model, owner_name = MODELS.readable(s, caller, name, owner, lock=True)
    shown = shown_name(name, owner_name, caller)
    row = store.get_version(s, model.tenant_id, model.id, version)
    if row is None:
        raise ModelVersionNotFound(f"model {shown!r} has no version {version}")
    return row, shown


def _check_holder(dep: ModelDeploymentRow, caller: Caller, users: dict[str, str], what: str) -> None:
    if dep.holder_id and dep.holder_id != caller.user_id:
        holder = users.get(dep.holder_id, dep.holder_id)
        raise PermissionDenied(
            f"deployment lease {dep.name!r} is held by user {holder!r}; only its holder can {what} it "
            "(use another deployment name, or let the lease expire)"
        )


def record_deployment(
    platform: Platform, caller: Caller, name: str, version: int, lease: DeploymentLease, owner: str | None = None
) -> ModelDeployment:
    """Create or renew the lease ``lease.name`` on a version (the model server's heartbeat).

    Any tenant that can read the model may hold leases on it (the owner, and the tenants it is shared with):
    a version served anywhere cannot be deleted. Lease names are per holding tenant, and a lease belongs to
    the user who created it: another user's renewal is refused (403).
    """
    with platform.db.write() as s:
        row, _ = _lease_version(s, caller, name, version, owner)
        now = utcnow()
        expires = now + timedelta(seconds=lease.ttl_seconds)
        store.delete_expired_deployments(s, row.id, now)
        dep = store.get_deployment(s, row.id, caller.tenant_id, lease.name)
        if dep is None:
            dep = ModelDeploymentRow(
                model_version_id=row.id,
                tenant_id=caller.tenant_id,
                holder_id=caller.user_id,
                holder_key=caller.access_key,
                name=lease.name,
                endpoint=lease.endpoint,
                created_at=now,
                last_seen=now,
                expires_at=expires,
            )
            s.add(dep)
        else:
            _check_holder(dep, caller, user_names(s, [dep.holder_id]), "renew")
            dep.holder_id, dep.holder_key = caller.user_id, caller.access_key  # adopts a lease without a holder
            dep.endpoint, dep.last_seen, dep.expires_at = lease.endpoint, now, expires
        s.flush()
        return deployment_model(dep, caller.tenant, caller.user)


def release_deployment(
    platform: Platform, caller: Caller, name: str, version: int, deployment: str, owner: str | None = None
) -> None:
    """End the caller's tenant's lease ``deployment`` (idempotent: an unknown or expired lease is no error).

    Only its holder ends a lease: another user of the tenant gets 403; another tenant's call never finds it.
    """
    with platform.db.write() as s:
        row, _ = _lease_version(s, caller, name, version, owner)
        dep = store.get_deployment(s, row.id, caller.tenant_id, deployment)
        if dep is None:
            return
        if dep.expires_at > utcnow():
            _check_holder(dep, caller, user_names(s, [dep.holder_id]), "release")
        s.delete(dep)


def live_leases(s: Session, version_ids: list[str]) -> dict[str, list[tuple[ModelDeploymentRow, str]]]:
    """The leases of each version that have not expired, with their holding tenant's name."""
    return store.live_deployments(s, version_ids, utcnow())
