"""The planner's texts as a job's tenant may read them (docs/isolation.md).

The planner's texts name jobs and tenants by id ("waiting behind job j-...", "behind tenant(s) t-..., t-...",
"preempted by job j-..."); everything the scheduling pass writes into a job's row or events goes through
``TenantView`` first, which keeps the job's own tenant's jobs (by name) and its own tenant (by name) and turns every
other tenant's job into "a job of another tenant" and other tenants into "another tenant" / "N other tenants". A
tenant may learn that it waits behind or was preempted by other tenants' work, and why; never whose.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import Connection

from dlcloud.store import scheduling as store

_ID = r"[a-z]{1,2}-[a-z0-9]{16}"  # store/ids.py
_JOB_REF = re.compile(r"\bjob (j-[a-z0-9]{16})\b")
_TENANTS_AHEAD = re.compile(rf"\btenant\(s\) ((?:{_ID})(?:, {_ID})*)(?: and (\d+) more)?")
_TENANT_REF = re.compile(r"\btenant (t-[a-z0-9]{16})\b")
_ANY_ID = re.compile(rf"\b{_ID}\b")
OTHER_JOB = "a job of another tenant"


class TenantView:
    """Texts of the planner as a job's tenant may read them: its own tenant's jobs and the tenant itself by
    name, other tenants' jobs as "a job of another tenant", other tenants as "another tenant" / "N other
    tenants", and any other id left in the text (a planner message this class does not know yet) as
    "another tenant's object". Names are read once per pass, and only for the ids the texts mention."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._jobs: dict[str, tuple[str, str]] = {}  # job id -> (tenant id, name)
        self._tenants: dict[str, str] | None = None  # tenant id -> name
        self._memo: dict[tuple[str, str], str] = {}

    def job_name(self, job_id: str, tenant_id: str) -> str:
        """``job NAME`` for a job of ``tenant_id``, else ``a job of another tenant``."""
        if job_id not in self._jobs:
            self._jobs[job_id] = store.job_tenant_and_name(self.conn, job_id) or ("", "")
        owner, name = self._jobs[job_id]
        return f"job {name}" if owner == tenant_id and name else OTHER_JOB

    def tenant_name(self, tenant_id: str) -> str:
        if self._tenants is None:
            self._tenants = store.tenant_names(self.conn)
        return self._tenants.get(tenant_id, "")

    def text(self, text: str | None, tenant_id: str) -> str | None:
        """``text`` as a job of ``tenant_id`` may show it (None stays None)."""
        if not text or "-" not in text:
            return text
        key = (text, tenant_id)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = self._translate(text, tenant_id)
        return out

    def _translate(self, text: str, tenant_id: str) -> str:
        text = _JOB_REF.sub(lambda m: self.job_name(m.group(1), tenant_id), text)

        def ahead(m: re.Match[str]) -> str:
            ids = m.group(1).split(", ")
            n = len([i for i in ids if i != tenant_id]) + int(m.group(2) or 0)
            return "1 other tenant" if n == 1 else f"{n} other tenants"

        text = _TENANTS_AHEAD.sub(ahead, text)
        own = self.tenant_name(tenant_id) or "its tenant"
        text = _TENANT_REF.sub(lambda m: f"tenant {own}" if m.group(1) == tenant_id else "another tenant", text)
        return _ANY_ID.sub(lambda m: own if m.group(0) == tenant_id else "another tenant's object", text)
