"""what the platform decides for a study at submit moves out of the study file into ``studies.platform_state``
(``StudyPlatformState``): the trial's datasets pinned to a version, an ASHA study's ``early_stopping.pause``.
The seed it draws was already its own column; the file now keeps ``seed: null`` when the user gave none.
A row written before keeps its decisions inside its spec and gets an empty state: what its user wrote is not
known any more, and its trials run on the same spec as before (``services/studies.run_spec``).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28 23:00:00.000000
"""

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

STUDIES = sa.table(
    "studies",
    sa.column("id", sa.String),
    sa.column("spec", sa.JSON),
    sa.column("seed", sa.BigInteger),
    sa.column("platform_state", sa.JSON),
)
StudyRecord = sa.Row[Any, Any, Any, Any]  # (id, spec, seed, platform_state)
PAGE = 500  # rows read and written at once


def _pages(bind: sa.Connection) -> Iterator[Sequence[StudyRecord]]:
    """The studies' rows in pages by id (no cursor stays open while a page is written)."""
    last = ""
    while True:
        q = sa.select(STUDIES.c.id, STUDIES.c.spec, STUDIES.c.seed, STUDIES.c.platform_state)
        rows = bind.execute(q.where(STUDIES.c.id > last).order_by(STUDIES.c.id).limit(PAGE)).all()
        if not rows:
            return
        yield rows
        last = rows[-1].id


def _merged(row: StudyRecord) -> dict[str, Any]:
    """The spec as 0026 kept it: the decisions in it, and the seed written in."""
    spec = dict(row.spec)
    state = row.platform_state or {}
    trial = dict(spec["trial"])
    if state.get("datasets") is not None:
        trial["datasets"] = list(state["datasets"])
    if state.get("template_data") is not None:
        trial["template"] = {**trial["template"], "data": state["template_data"]}
    if state.get("pause") is not None:
        spec["early_stopping"] = {**(spec.get("early_stopping") or {}), "pause": state["pause"]}
    spec["trial"] = trial
    spec["seed"] = row.seed
    return spec


def upgrade() -> None:
    with op.batch_alter_table("studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_state", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    bind = op.get_bind()
    update = STUDIES.update().where(STUDIES.c.id == sa.bindparam("_id")).values(spec=sa.bindparam("new_spec"))
    for rows in _pages(bind):
        bind.execute(update, [{"_id": r.id, "new_spec": _merged(r)} for r in rows])
    with op.batch_alter_table("studies", schema=None) as batch_op:
        batch_op.drop_column("platform_state")
