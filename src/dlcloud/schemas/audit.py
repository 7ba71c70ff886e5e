"""Audit events on the wire."""

from __future__ import annotations

from datetime import datetime

from dlcloud.schemas.common import Response


class AuditEvent(Response):
    id: int
    time: datetime
    tenant: str | None
    user: str | None
    access_key: str | None
    action: str
    resource: str | None
    outcome: str
    status_code: int
    error_code: str | None
    request_id: str
    client_address: str | None
