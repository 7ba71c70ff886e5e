"""``register_model`` as the platform completed it at submit (path, format, signature decided) moves into
``jobs.platform_state.register_model`` (``ModelTarget``); the user's spec keeps its ``register_model`` as given.
A row written before keeps the completed form in its spec too: what the user left out is not known any more.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28 20:00:00.000000
"""

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

JOBS = sa.table("jobs", sa.column("id", sa.String), sa.column("spec", sa.JSON), sa.column("platform_state", sa.JSON))
JobRecord = sa.Row[Any, Any, Any]  # (id, spec, platform_state)
PAGE = 500  # rows read and written at once: a large jobs table is never held in memory whole


def _pages(bind: sa.Connection) -> Iterator[Sequence[JobRecord]]:
    """The jobs' rows (id, spec, platform_state) in pages by id (no cursor stays open while a page is written)."""
    last = ""
    while True:
        q = sa.select(JOBS.c.id, JOBS.c.spec, JOBS.c.platform_state).where(JOBS.c.id > last)
        rows = bind.execute(q.order_by(JOBS.c.id).limit(PAGE)).all()
        if not rows:
            return
        yield rows
        last = rows[-1].id


def _rewrite(bind: sa.Connection, column: str, change: Callable[[JobRecord], Any]) -> None:
    """``column`` of each job set to what ``change`` makes of its row; rows it gives None for are left as they are."""
    update = JOBS.update().where(JOBS.c.id == sa.bindparam("_id")).values({column: sa.bindparam("new_value")})
    for rows in _pages(bind):
        params = [{"_id": r.id, "new_value": v} for r in rows if (v := change(r)) is not None]
        if params:
            bind.execute(update, params)


def _to_state(row: JobRecord) -> dict[str, Any] | None:
    """The platform state with the spec's completed register_model in it (None: the spec has none)."""
    target = (row.spec or {}).get("register_model")
    if not target:
        return None
    return {**(row.platform_state or {}), "register_model": target}


def _to_spec(row: JobRecord) -> dict[str, Any] | None:
    """The spec as 0025 kept it: the completed register_model in it (None: the job registers no model)."""
    target = (row.platform_state or {}).get("register_model")
    if not target:
        return None
    return {**row.spec, "register_model": target}


def _without_target(row: JobRecord) -> dict[str, Any] | None:
    state = row.platform_state or {}
    if "register_model" not in state:
        return None
    return {k: v for k, v in state.items() if k != "register_model"}


def upgrade() -> None:
    _rewrite(op.get_bind(), "platform_state", _to_state)


def downgrade() -> None:
    bind = op.get_bind()
    _rewrite(bind, "spec", _to_spec)
    _rewrite(bind, "platform_state", _without_target)
