"""Model registry queries: models, versions, labels, shares and deployment leases.

Every lookup of a model takes the owning ``tenant_id``; versions, labels and leases are reached through a
model found that way (and versions are filtered by tenant as well). A model of another tenant is visible
only through ``shared_models`` / ``is_shared``, which check the share row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from dlcloud.store.registry import Tables
from dlcloud.store.rows import (
    ModelDeploymentRow,
    ModelLabelRow,
    ModelRow,
    ModelShareRow,
    ModelVersionRow,
    TenantRow,
)

TABLES = Tables(ModelRow, ModelVersionRow, ModelLabelRow, ModelShareRow)
get_model, list_models, shared_models = TABLES.get, TABLES.list_entries, TABLES.shared
is_shared, shares_of = TABLES.is_shared, TABLES.shares_of
list_versions, get_version, get_latest_version = TABLES.list_versions, TABLES.get_version, TABLES.get_latest_version


def live_deployments(
    s: Session, version_ids: Iterable[str], now: datetime
) -> dict[str, list[tuple[ModelDeploymentRow, str]]]:
    """version id -> [(unexpired lease, holder's tenant name)] sorted by deployment name, then tenant."""
    ids = list(version_ids)
    out: dict[str, list[tuple[ModelDeploymentRow, str]]] = {i: [] for i in ids}
    if not ids:
        return out
    q = (
        select(ModelDeploymentRow, TenantRow.name)
        .join(TenantRow, TenantRow.id == ModelDeploymentRow.tenant_id)
        .where(ModelDeploymentRow.model_version_id.in_(ids), ModelDeploymentRow.expires_at > now)
        .order_by(ModelDeploymentRow.name, TenantRow.name)
    )
    for row, tenant in s.execute(q):
        out[row.model_version_id].append((row, tenant))
    return out


def get_deployment(s: Session, version_id: str, tenant_id: str, name: str) -> ModelDeploymentRow | None:
    """The lease ``name`` that tenant ``tenant_id`` holds on a version (lease names are per holding tenant)."""
    q = select(ModelDeploymentRow).where(
        ModelDeploymentRow.model_version_id == version_id,
        ModelDeploymentRow.tenant_id == tenant_id,
        ModelDeploymentRow.name == name,
    )
    return s.scalars(q).first()


def delete_tenant_deployments(s: Session, model_id: str, tenant_id: str) -> None:
    """End every lease ``tenant_id`` holds on the versions of a model (the model is no longer shared with it)."""
    versions = select(ModelVersionRow.id).where(ModelVersionRow.model_id == model_id)
    s.execute(
        delete(ModelDeploymentRow).where(
            ModelDeploymentRow.tenant_id == tenant_id, ModelDeploymentRow.model_version_id.in_(versions)
        )
    )


def delete_expired_deployments(s: Session, version_id: str, now: datetime) -> None:
    s.execute(
        delete(ModelDeploymentRow).where(
            ModelDeploymentRow.model_version_id == version_id, ModelDeploymentRow.expires_at <= now
        )
    )
