"""the platform's own state of a job moves out of the user's spec into ``jobs.platform_state``
(``JobPlatformState``): the datasets resolved at submit (``resolved_datasets``), the id ``checkpoint_from``
resolved to (``checkpoint_from_id``), and the DLCLOUD_* variables the study driver merged into a trial's
``env``; the spec keeps what the user gave

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 16:00:00.000000
"""

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

JOBS = sa.table("jobs", sa.column("id", sa.String), sa.column("spec", sa.JSON), sa.column("platform_state", sa.JSON))
JobRecord = sa.Row[Any, Any, Any]  # (id, spec, platform_state)
PAGE = 500  # rows read and written at once: a large jobs table is never held in memory whole
RESERVED_PREFIX = "DLCLOUD_"  # a user's env may not hold such names: every one in a stored env is the platform's


def _pages(bind: sa.Connection) -> Iterator[Sequence[JobRecord]]:
    """The jobs' rows (id, spec, platform_state) in pages by id (no cursor stays open while a page is written)."""
    last = ""
    while True:
        q = sa.select(JOBS.c.id, JOBS.c.spec, JOBS.c.platform_state).where(JOBS.c.id > last)
        q = q.order_by(JOBS.c.id).limit(PAGE)
        rows = bind.execute(q).all()
        if not rows:
            return
        yield rows
        last = rows[-1].id


def _rewrite(bind: sa.Connection, columns: tuple[str, ...], change: Callable[[JobRecord], dict[str, Any]]) -> None:
    """Each job's ``columns`` set to what ``change`` makes of its row (bound as new_<column>: an UPDATE's bind
    parameter may not take its column's name)."""
    values: dict[str, Any] = {c: sa.bindparam(f"new_{c}") for c in columns}
    update = JOBS.update().where(JOBS.c.id == sa.bindparam("_id")).values(values)
    for rows in _pages(bind):
        bind.execute(update, [{"_id": r.id, **{f"new_{c}": v for c, v in change(r).items()}} for r in rows])


def _split(row: JobRecord) -> dict[str, Any]:
    """An old row's spec without the platform's keys, and those keys as ``platform_state``."""
    spec = dict(row.spec)
    env = dict(spec.get("env") or {})
    state: dict[str, Any] = {
        "datasets": spec.pop("resolved_datasets", None) or [],
        "checkpoint_from_id": spec.pop("checkpoint_from_id", None),
        "env": {k: env.pop(k) for k in sorted(env) if k.startswith(RESERVED_PREFIX)},
    }
    if "env" in spec:
        spec["env"] = env
    return {"spec": spec, "platform_state": state}


def _merge(row: JobRecord) -> dict[str, Any]:
    """The spec as 0024 kept it: the platform's keys back inside it."""
    spec = dict(row.spec)
    state = row.platform_state or {}
    spec["resolved_datasets"] = list(state.get("datasets") or [])
    if spec.get("checkpoint_from") is not None:
        spec["checkpoint_from_id"] = state.get("checkpoint_from_id")
    if state.get("env"):
        spec["env"] = {**(spec.get("env") or {}), **state["env"]}
    return {"spec": spec}


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_state", sa.JSON(), nullable=False, server_default="{}"))
    _rewrite(op.get_bind(), ("spec", "platform_state"), _split)


def downgrade() -> None:
    _rewrite(op.get_bind(), ("spec",), _merge)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("platform_state")
